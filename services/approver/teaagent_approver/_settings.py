"""The approver's settings: where its node configuration lives, and the few knobs operators and tests turn."""

from __future__ import annotations

from typing import Final

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from teaagent.service import StoreSettings

__all__ = ["MAX_BODY_BYTES", "Settings"]

MAX_BODY_BYTES: Final = 64 * 1024  # a statement and its signature, not a file upload


class Settings(StoreSettings):
    """The approver service's settings, read from the environment.

    ``config`` comes from ``TEAAGENT_CONFIG`` (shared with the other services and the CLI); the
    approver's own knobs from ``TEAAGENT_APPROVER_<NAME>``.

    Attributes:
        config: The node configuration file (``node.toml``); required.
        redis_prefix: The key prefix of this node's store; ``ta:<agent_id>`` when None. It must be
            the relay's (``TEAAGENT_RELAY_REDIS_PREFIX``): the approver reads the relay's inbox queue.
        relay_url: This node's relay; ``relay_url`` of node.toml when None.
        engine: Apply the rules to the inbox (off: only operators decide, through the HTTP API).
        poll_seconds: The longest one wait for news of the inbox (a request the relay queues).
        takeover_seconds: How long a decision recorded by another approver process may stay
            unfinished (unsigned, or not sent) before this one finishes it: that process died.
        concurrency: Inbox items decided at once (signatures, relay calls in flight).
        audit_fsync: Flush each audit record to the disk before the decision leaves.
        web: Serve the operators' web inbox under ``/web``.
        web_session_seconds: How long a sign-in to the web inbox lasts.
    """

    model_config = SettingsConfigDict(env_prefix="TEAAGENT_APPROVER_")

    relay_url: str | None = None
    engine: bool = True
    poll_seconds: float = Field(default=30.0, ge=0, le=60)
    takeover_seconds: float = Field(default=10.0, gt=0, le=3600)
    concurrency: int = Field(default=256, ge=1, le=1024)
    audit_fsync: bool = False
    web: bool = True
    web_session_seconds: float = Field(default=8 * 3600.0, gt=0, le=7 * 24 * 3600)
