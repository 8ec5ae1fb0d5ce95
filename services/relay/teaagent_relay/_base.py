"""What both sides of the relay share: the node's trust, its store and queues, the stored forms.

The relay has two sides (:class:`~teaagent_relay._relay.Relay` joins them): this node's own
requests, which it stores, fans out and counts (``_origin.py``), and the requests peers sent it,
which it keeps for this node's approver and answers for (``_inbox.py``). Both read what is here.

Stored forms (all in the node's store, ``teaagent.store``):

- a request (own or received) is the JSON envelope ``{"request": ..., "signature": <wire>}``, the
  request exactly as its origin signed it;
- a decision is ``{"statement": <rebuilt from the request>, "signature": <wire>}``, stored only
  after it verified, so a certificate is built from stored decisions without checking them again
  (the origin's agent verifies the certificate itself anyway);
- a delivery (queue ``deliveries``, target = the peer's agent id) carries
  ``{"path": "/v1/...", "body": {...}}``; the worker looks the peer's relay URL up in the node
  configuration when it delivers;
- an inbox entry (queue ``inbox``, target ``approver``) carries ``{"origin", "request_id"}`` for the
  node's approver, which may also list ``GET /v1/inbox``;
- a withdrawal (own request or received one) is ``{"statement": <rebuilt from the request>,
  "signature": <wire>}`` on the request's outcome, stored only after it verified; it is queued for
  every peer's relay (``/v1/inbox/{id}/withdrawal``) as a decision is queued for its origin;
- a settlement (own request approved or denied here) is its evidence, ``{"certificate": ...}`` or
  ``{"denials": [...]}``, queued for every peer's relay (``/v1/inbox/{id}/settled``) when the
  outcome is recorded; a received one is stored on the inbox item, verbatim, only after it verified.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from teaagent._reload import Trust, TrustReloader
from teaagent.config import NodeConfig
from teaagent.errors import QuorumError, SignatureError, StatementTimeError, StoreError
from teaagent.quorum import (
    check_withdrawal_time,
    is_dev_signature,
    verify_withdrawal,
    wire_signature,
    withdrawal_problem,
)
from teaagent.store import REDIS_ERRORS, Store
from teaagent.trust import SignerKey
from teaagent_relay._errors import ApiError
from teaagent_relay._metrics import RelayMetrics
from teaagent_relay._protocol import decision_bytes, sentence
from teaagent_relay._settings import Settings

__all__ = ["MAX_WAIT_SECONDS", "RelayBase", "delivery", "envelope", "redis_failures", "whose_keys"]

MAX_WAIT_SECONDS: Final = 60.0  # one long-poll; proxies commonly cut idle HTTP at 60-100 s


def whose_keys(keys: Sequence[SignerKey], peer: str) -> str:
    """A peer's configured keys as a phrase for messages."""
    return f"the key configured for {peer}" if len(keys) == 1 else f"the keys configured for {peer}"


def envelope(document: bytes) -> tuple[dict[str, Any], str]:
    """A stored request's envelope: the request as its origin signed it, and the signature."""
    parsed = json.loads(document)
    return parsed["request"], parsed["signature"]


def delivery(path: str, body: dict[str, Any]) -> bytes:
    """A delivery's payload: the peer relay's ``path`` and the JSON ``body`` to post there."""
    return json.dumps({"path": path, "body": body}, separators=(",", ":")).encode()


@contextmanager
def redis_failures(store: Store) -> Iterator[None]:
    """Turn a Redis error of a direct client call into the store's ``StoreError``."""
    try:
        yield
    except REDIS_ERRORS as exc:  # a cluster client's own refusals are no RedisError
        raise StoreError(f"Redis at {store.url} failed: {exc}") from exc


class RelayBase:
    """One node's relay as both sides see it: its configuration, its store, and its trust."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        store: Store,
        settings: Settings,
        metrics: RelayMetrics,
        stopping: asyncio.Event | None = None,
        trust: TrustReloader | None = None,
    ) -> None:
        # What peers and keys verify with: one snapshot per call (``trust = self.trust``), swapped
        # whole by a reload (SIGHUP, POST /v1/reload; teaagent._reload).
        self.reloader = (
            trust if trust is not None else TrustReloader(config, what=f"the relay of {config.agent_id}")
        )
        # Set when the service stops: every long-poll answers at once with the state as it is.
        self.stopping = stopping if stopping is not None else asyncio.Event()
        self.store = store
        self.metrics = metrics
        self.agent_id = config.agent_id
        self.token = config.load_token()
        self.own_key = config.own_public_key()
        # What this node's own requests and withdrawals verify with: its node key, which its agent signs with.
        self.own_node_key = (SignerKey(line=self.own_key.to_line(), source="this node's key"),)
        self.allow_dev = config.quorum.allow_dev_signatures
        # Own requests go out on it to the peers' relays, and this node's decisions to their origins.
        self.deliveries = store.queue(
            "deliveries",
            max_attempts=None,  # a peer down for hours gets the delivery once back, until expiry
            min_idle_seconds=settings.delivery_min_idle_seconds,
            retry_base_seconds=settings.delivery_retry_base_seconds,
            retry_cap_seconds=settings.delivery_retry_cap_seconds,
        )
        # The same queue with one attempt: retry_later on it dead-letters at once (a permanent refusal).
        self.dead_letters = store.queue("deliveries", max_attempts=1)
        self._open(settings)

    def _open(self, settings: Settings) -> None:
        """Build a side's own state, once, at the end of ``__init__`` (each side adds its part)."""

    @property
    def trust(self) -> Trust:
        """The trust in use now (peers, their keys, this node's keys): read once per call, then kept."""
        return self.reloader.trust

    @property
    def config(self) -> NodeConfig:
        """The node configuration, its trust as of the last reload."""
        return self.reloader.trust.config

    def _not_this_node(self, named: str) -> ApiError:
        """403 ``forbidden``: a document names ``named`` (its origin, say) where this node must stand."""
        return ApiError(403, "forbidden", sentence(f"{named} is not this node ({self.agent_id})"))

    def _verified_withdrawal(
        self,
        request: dict[str, Any],
        statement: dict[str, Any],
        signature: str,
        keys: Sequence[SignerKey],
        *,
        whose: str,
        now: float,
    ) -> bytes:
        """Check a withdrawal of ``request`` (PROTOCOL.md, Withdrawal); return its stored form.

        1. the carried statement is the withdrawal rebuilt from the request, types included;
        2. it is not dated beyond the clock skew in this node's future;
        3. its signature verifies with one of ``keys``, the keys the origin's requests verify
           with here, allowed by its namespaces and validity to sign at ``withdrawn_at``.

        Raises:
            ApiError: 422 ``invalid`` (not a withdrawal of this request, dated in the future), 403
                ``bad_signature`` (it does not verify with any of ``keys``).
        """
        problem = withdrawal_problem(request, statement)
        if problem is not None:
            raise ApiError(422, "invalid", sentence(problem))
        try:
            check_withdrawal_time(statement["withdrawn_at"], now)
        except StatementTimeError as exc:
            raise ApiError(422, "invalid", str(exc)) from exc
        if not isinstance(signature, str) or is_dev_signature(signature):
            # A development signature stands for a signer's vote in experiments, never for an origin.
            raise ApiError(403, "bad_signature", f"The withdrawal is not signed with {whose}.")
        try:
            rebuilt = verify_withdrawal(request, statement, signature, keys)
        except QuorumError as exc:  # withdrawal_problem said None: not reached, but never a 500
            raise ApiError(422, "invalid", str(exc)) from exc
        except (SignatureError, ValueError, TypeError) as exc:
            raise ApiError(
                403,
                "bad_signature",
                sentence(f"the withdrawal does not verify with {whose}: {str(exc).strip().rstrip('.')}"),
            ) from exc
        return decision_bytes(rebuilt, wire_signature(signature))
