"""The origin's book: this node's own requests, stored when its agent submits one, counted as peers decide."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from teaagent.store._book import Answer, Book
from teaagent.store._connection import converting
from teaagent.store._keys import AGENT_ID_PATTERN, Keys
from teaagent.store._refs import Acceptance, Ref, check_decision
from teaagent.store._results import (
    DELIVERY_STATES,
    AcceptResult,
    DecisionKind,
    DecisionResult,
    DecisionToCount,
    DeliveryStateName,
    StoredRequest,
    WithdrawResult,
    not_stored,
)

if TYPE_CHECKING:
    from teaagent.store._queue import DeliveryQueue

__all__ = ["RequestBook"]

MAX_DELIVERY_ERROR_CHARS = 500  # the last error is one sentence, not a traceback


class RequestBook(Book):
    """This node's own requests: stored when its agent submits one, counted as peers decide.

    Every method is one or two round trips; the counting is one Lua script, so concurrent relay
    workers recording decisions for the same request settle its outcome exactly once.
    """

    def _sets(self, keys: Keys) -> tuple[str, str]:
        return keys.request_index(), keys.request_pending()

    def _ref(self, member: str) -> Ref:
        """An own request's ref: its id is its member."""
        return Ref(self._keys.request(member), member, member, None)

    async def accept(
        self,
        request_id: str,
        document: bytes,
        *,
        required_approvals: int,
        peers: int,
        expires_at: int,
        now: int | None = None,
    ) -> AcceptResult:
        """Store a verified request once; the same bytes again are the same request.

        Queue its deliveries after this returns, whether ``created`` or not: enqueueing is a separate
        step (another hash tag), and a client retrying after a crash must complete it.

        Args:
            request_id: the request's id (32 lowercase hex characters).
            document: the signed request exactly as received; kept verbatim.
            required_approvals: approvals needed (``>= 1``).
            peers: number of peers asked (``>= required_approvals``).
            expires_at: Unix seconds after which the request is expired.
            now: Unix seconds, the caller's clock (default: the system clock).

        Raises:
            RequestConflictError: other bytes are already stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed id, a document too large, or impossible counting parameters.
            TypeError: ``document`` is not bytes.
        """
        return await self._accept(self._own(request_id, document, required_approvals, peers, expires_at, now))

    def _own(
        self, request_id: str, document: bytes, required: int, peers: int, expires_at: int, now: int | None
    ) -> Acceptance:
        """One own request's accept, checked and encoded (:meth:`accept`, :meth:`submit`)."""
        ref = self._ref(request_id)
        return self._acceptance(ref, document, expires_at, now, required_approvals=required, peers=peers)

    async def submit(
        self,
        request_id: str,
        document: bytes,
        *,
        required_approvals: int,
        peers: int,
        expires_at: int,
        queue: DeliveryQueue,
        deliveries: Sequence[tuple[str, bytes]],
        now: int | None = None,
    ) -> AcceptResult:
        """:meth:`accept`, then, while the request is pending, one entry on ``queue`` per delivery.

        ``deliveries`` are ``(target, payload)``: a peer and the body its relay is sent. They are
        queued for a repeat as well (a client retrying after a crash completes them; a peer
        takes a request once), never for a conflict (the caller decides what a conflict sends).
        On one server it is one script (``submit_request.lua``): one round trip and one sync, and
        no crash between storing and queueing. On a cluster the queue has another hash tag: the
        request is accepted, then its deliveries are queued, as :meth:`accept` and
        :meth:`DeliveryQueue.enqueue` do.

        Raises:
            RequestConflictError: other bytes are already stored under ``request_id``.
            StoreError: Redis is unreachable or failed, or ``queue`` is full (the request is
                stored then; a repeat queues what is missing).
            ValueError: as :meth:`accept`, or an entry ``queue`` refuses.
            TypeError: ``document`` or a payload is not bytes.
        """
        one = self._own(request_id, document, required_approvals, peers, expires_at, now)
        return await self._shape.submit(self, one, queue, deliveries, now)

    async def get(self, request_id: str) -> StoredRequest | None:
        """Return the stored request, or None when it is not (or no longer) stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``request_id`` is malformed.
        """
        return await self._get(self._ref(request_id), deliveries=True)

    async def record_decision(
        self,
        request_id: str,
        *,
        kind: DecisionKind,
        signer: str,
        decision: bytes,
        now: int | None = None,
        policy: str = "",
    ) -> DecisionResult:
        """Count one decision whose signature the caller has already verified.

        PROTOCOL.md "Counting", as :class:`teaagent.quorum.Tally` folds it: each signer counts
        once, and a signer that denied counts as a denial only. So a repeat, and an approval of a
        signer that denied, are no-ops (``counted`` is False); a denial of a signer that approved
        counts and removes the approval (it is no longer in ``StoredRequest.approvals``). The
        outcome is settled once (approved, denied, or expired when ``now`` is past ``expires_at``)
        and never changes: once decided, nothing more is recorded. A version 2 request's
        ``policy`` (``QuorumPolicy.script_form``) decides instead of its threshold.

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed id, kind or signer, or a decision too large.
            TypeError: ``decision`` is not bytes.
        """
        check_decision(kind, signer, decision)
        ref = self._ref(request_id)
        return await self._record(ref, kind=kind, signer=signer, decision=decision, now=now, policy=policy)

    async def record_decisions(self, decisions: Sequence[DecisionToCount]) -> list[Answer]:
        """Count many verified decisions in one round trip: ``record_decision`` for each, pipelined.

        Each decision is counted exactly as :meth:`record_decision` counts it (same script, same
        arguments), independently of the others, in the order given (a signer's approval and
        its denial, in the same batch or not, count as its denial). The answer for each is its
        result, or the error that ``record_decision`` would have raised for it alone.

        Raises:
            StoreError: Redis is unreachable or failed; none, some or all of the decisions may
                have been counted (recording them again is harmless: a repeat is not counted).
        """
        return await self._record_batch(
            [(item, functools.partial(self._ref, item.request_id)) for item in decisions]
        )

    async def record_delivery(
        self,
        request_id: str,
        peer: str,
        *,
        state: DeliveryStateName,
        attempts: int,
        error: str | None = None,
        now: float | None = None,
    ) -> bool:
        """Note how the delivery of a stored request to ``peer``'s relay went (``StoredRequest.deliveries``).

        One script on the request's own keys (its hash tag), living as long as the request.
        ``delivered`` is final (a later failure of a repeated delivery never hides it), and
        ``pending`` is written only when nothing is known yet.

        Returns:
            True when written; False when kept as it was, or no such request is stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed id, peer or state, or negative attempts.
        """
        keys = self._keys.request(request_id)
        if not AGENT_ID_PATTERN.fullmatch(peer):
            raise ValueError(f"peer {peer!r} is not a valid agent id")
        if state not in DELIVERY_STATES:
            raise ValueError(f"delivery state must be one of {', '.join(DELIVERY_STATES)}, not {state!r}")
        if attempts < 0:
            raise ValueError(f"attempts must be >= 0, not {attempts}")
        text = " ".join(error.split())[:MAX_DELIVERY_ERROR_CHARS] if error else None
        at = time.time() if now is None else now
        record = json.dumps(
            {"state": state, "attempts": attempts, "error": text, "at": round(at, 3)}, separators=(",", ":")
        )
        with converting(self._url):
            written = await self._scripts.run(
                "record_delivery", [keys.outcome, keys.deliveries], [peer, state, record]
            )
        return bool(written)

    async def withdraw(self, request_id: str, *, withdrawal: bytes, now: int | None = None) -> WithdrawResult:
        """Mark a pending request ``withdrawn``, a final state, keeping its verified withdrawal.

        One script: a decision recorded afterwards is not counted (the state stays withdrawn), a
        repeat changes nothing (``withdrawn`` False, state ``withdrawn``), a request decided or
        expired first keeps that state (an expiry due is settled here). The request leaves the
        pending listing.

        Args:
            request_id: The request's id.
            withdrawal: The origin's withdrawal ``{"statement", "signature"}``, verified, as bytes.
            now: Unix seconds, the caller's clock (default: the system clock).

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed id, or a withdrawal too large.
            TypeError: ``withdrawal`` is not bytes.
        """
        return await self._withdraw(self._ref(request_id), withdrawal, now)

    async def settle_expiry(self, request_id: str, *, now: int | None = None) -> DecisionResult:
        """Mark the request expired if ``now`` is past its expiry and nothing settled it before.

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: ``request_id`` is malformed.
        """
        return await self._settle_expiry(self._ref(request_id), now)

    async def wait_outcome(
        self,
        request_id: str,
        timeout: float,
        *,
        clock: Callable[[], float] = time.time,
        counted: tuple[int, int] | None = None,
    ) -> StoredRequest:
        """Block until the request is decided or ``timeout`` seconds pass, then return it.

        Blocks on XREAD of the request's events stream (no polling loop); settles expiry itself
        when the request expires during the wait. The returned state is still ``pending`` when
        the timeout came first. With ``counted`` (the approvals and denials the caller last saw),
        it also returns as soon as the counted decisions differ from those: one long-poll serves a
        caller that shows progress for the whole wait.

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed id or a negative timeout.
        """
        ref = self._ref(request_id)
        await self._wait(ref, timeout, clock, counted)
        stored = await self._get(ref, deliveries=True)
        if stored is None:
            raise not_stored(ref.label)
        return stored
