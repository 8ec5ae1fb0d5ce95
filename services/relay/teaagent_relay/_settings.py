"""The relay's settings: where its node configuration lives, and the few knobs operators and tests turn."""

from __future__ import annotations

from typing import Final

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from teaagent.service import StoreSettings
from teaagent.store import MAX_PENDING_PER_ORIGIN

__all__ = [
    "DEFAULT_INBOX_RATE_LIMIT",
    "DEFAULT_INBOX_RATE_WINDOW_SECONDS",
    "MAX_BODY_BYTES",
    "Settings",
]

DEFAULT_INBOX_RATE_LIMIT: Final = (
    600  # requests per origin per window: ten a second, far above any agent's pace
)
DEFAULT_INBOX_RATE_WINDOW_SECONDS: Final = 60.0

# Peers' decisions already on their way when a request is decided arrive within this: the evidence
# then goes only to the peers still silent (automatic approvers answer in milliseconds; people are
# not waiting on a second).
SETTLEMENT_GRACE_SECONDS: Final = 1.0

MAX_BODY_BYTES: Final = 64 * 1024  # a signed tool call or decision, not a file upload


class Settings(StoreSettings):
    """The relay service's settings, read from the environment.

    ``config`` comes from ``TEAAGENT_CONFIG`` (shared with the other services and the CLI); the
    relay's own knobs from ``TEAAGENT_RELAY_<NAME>`` (``TEAAGENT_RELAY_DELIVER=0`` and so on).

    Attributes:
        config: The node configuration file (``node.toml``); required.
        redis_prefix: The key prefix of this node's store; ``ta:<agent_id>`` when None. Tests and
            demos that put several nodes on one Redis give each its own.
        deliver: Run the delivery worker (off only for benchmarks that measure intake alone).
        inbox_rate_limit: Requests accepted per peer origin per window (a burst of that many, then
            one back every window / limit, see ``teaagent.tools``); past it, 429.
        inbox_rate_window_seconds: The window of ``inbox_rate_limit``.
        inbox_max_pending: Pending requests one peer origin may hold in this node's inbox
            (``teaagent.store.MAX_PENDING_PER_ORIGIN``); past it, 429 ``origin_full`` until one of
            them is decided, withdrawn or expires. The window alone lets an origin keep a day's
            worth of requests waiting, enough to fill the approver's queue for every origin.
        delivery_min_idle_seconds: How long a claimed delivery may sit unacknowledged before
            another consumer takes it over (the claimer crashed). Keep it above the delivery
            timeout, which is derived from it.
        delivery_retry_base_seconds: The first retry's backoff; it doubles per failure.
        delivery_retry_cap_seconds: The longest backoff between two attempts.
        delivery_batches: Send a peer the deliveries due to it at one moment in one
            ``POST /v1/deliveries`` (``teaagent_relay._worker``); off (``0``), each is its own call.
        settlement_grace_seconds: How long, once one of this node's requests is decided here, the
            relay waits for the decisions of its other peers already on their way before it sends
            the evidence to those still silent (``teaagent_relay._origin``); 0 sends it at once.
    """

    model_config = SettingsConfigDict(env_prefix="TEAAGENT_RELAY_")

    deliver: bool = True
    inbox_rate_limit: int = Field(default=DEFAULT_INBOX_RATE_LIMIT, ge=1, le=100_000)
    inbox_rate_window_seconds: float = Field(default=DEFAULT_INBOX_RATE_WINDOW_SECONDS, gt=0, le=3600)
    inbox_max_pending: int = Field(default=MAX_PENDING_PER_ORIGIN, ge=1, le=100_000)
    delivery_min_idle_seconds: float = Field(default=60.0, ge=1.0, le=3600)
    delivery_retry_base_seconds: float = Field(default=0.5, gt=0, le=60)
    delivery_retry_cap_seconds: float = Field(default=30.0, gt=0, le=3600)
    delivery_batches: bool = True
    settlement_grace_seconds: float = Field(default=SETTLEMENT_GRACE_SECONDS, ge=0, le=60)
