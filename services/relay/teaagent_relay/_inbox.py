"""The relay's inbox side: the requests peers sent this node, kept for its approver.

A peer's relay delivers a request its origin signed (``POST /v1/inbox``); the relay checks it,
charges the origin's window, stores it and queues it for this node's approver, which lists it
(``GET /v1/inbox``, long-polled) and hands back this node's signed decision, queued for the
origin. An origin's signed withdrawal, or the verified evidence of the outcome at the origin,
closes an item here; a sweep keeps the approver's queue from only growing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Final

from teaagent._batch import Coalescer
from teaagent._canonical import canonical
from teaagent._reload import Trust
from teaagent._words import moment
from teaagent.errors import QuorumError, RequestNotFoundError
from teaagent.quorum import is_expired, request_problem, request_time_problem, verify_settlement
from teaagent.store import DecisionToCount, Intake, Outgoing, QueuedDecision, RequestState, StoredRequest
from teaagent.store._inbox_view import inbox_item_view
from teaagent_relay._base import MAX_WAIT_SECONDS, RelayBase, delivery, envelope, redis_failures, whose_keys
from teaagent_relay._errors import ApiError
from teaagent_relay._protocol import (
    check_request_signature,
    check_statement,
    sentence,
    verify_decision,
)
from teaagent_relay._settings import Settings
from teaagent_relay._writer import store_error

__all__ = ["APPROVER_TARGET", "Inbox"]

logger = logging.getLogger("teaagent.relay")

APPROVER_TARGET: Final = "approver"  # the inbox queue's only consumer
INBOX_WAKE_SECONDS: Final = 1.0  # one block of an inbox long-poll, under the store's socket timeout
INBOX_SWEEP_BATCH: Final = 500  # inbox queue entries looked at per sweep; the next sweep goes on from there
# Requests this process verified and stored lately, kept for its approver's decisions on them: an
# automatic decision comes back within moments, and then needs no read of the stored request.
KEPT_REQUESTS: Final = 2048


@dataclass(frozen=True)
class RateLimit:
    """A per-origin window: ``max_calls`` per ``window_seconds``."""

    max_calls: int
    window_seconds: float


def _own_decision(stored: StoredRequest) -> bytes | None:
    """This node's recorded decision on a received request (only this node decides its inbox), or None."""
    return next(iter(stored.approvals.values()), None) or next(iter(stored.denials.values()), None)


def _origin_of(document: dict[str, Any], what: str) -> str:
    """The origin a received ``document`` (a withdrawal, a settlement, a statement) names.

    Raises:
        ApiError: 422 ``invalid`` when it is not a string.
    """
    origin = document.get("origin")
    if not isinstance(origin, str):
        raise ApiError(422, "invalid", f"The {what}'s origin is not a string.")
    return origin


def _not_a_peer(origin: object) -> ApiError:
    return ApiError(403, "forbidden", sentence(f"{origin!r} is not a configured peer of this node"))


# The states in which no decision of this node counts any more, and what its origin did.
_CLOSED: Final = {"withdrawn": "was withdrawn by its origin", "settled": "was already decided at its origin"}


def _closed(state: str, request_id: str, origin: str) -> ApiError:
    """409 ``withdrawn`` or ``settled``: a decision on the request no longer counts."""
    return ApiError(
        409, state, f"Request {request_id} {_CLOSED[state]} {origin}; no decision on it counts any more."
    )


def _decision_entry(
    origin: str, request: dict[str, Any], statement: dict[str, Any], wire: str
) -> tuple[str, str, bytes, int]:
    """The delivery of this node's decision on ``request`` to its origin's relay: the queue entry's
    target, request id, payload and expiry."""
    body = {"statement": statement, "signature": wire}
    path = f"/v1/requests/{request['request_id']}/decisions"
    return origin, request["request_id"], delivery(path, body), request["expires_at"]


def _not_in_inbox(request_id: str, origin: str) -> ApiError:
    return ApiError(404, "not_found", f"No request {request_id} from {origin} is in this node's inbox.")


class Inbox(RelayBase):
    """The requests peers sent this node: received, listed, decided by this node, closed."""

    def _open(self, settings: Settings) -> None:
        super()._open(settings)
        self.inbox_limit = RateLimit(settings.inbox_rate_limit, settings.inbox_rate_window_seconds)
        self.inbox_max_pending = settings.inbox_max_pending
        self._sweep_cursor: str | None = None  # where the next inbox sweep goes on
        # This node's own decisions (its approver's, many at once): the reads, the records (each
        # with its delivery to the origin) and the queued repeats of concurrent calls each share
        # one round trip.
        self._inbox_reads: Coalescer[tuple[str, str], StoredRequest | None] = Coalescer(
            self._read_inbox, "teaagent-relay-inbox-reads", wrap=store_error
        )
        self._inbox_writes: Coalescer[tuple[str, DecisionToCount, Outgoing], QueuedDecision] = Coalescer(
            self._record_and_queue, "teaagent-relay-own-decisions", wrap=store_error
        )
        self._enqueues: Coalescer[tuple[str, str, bytes, int], str] = Coalescer(
            self._enqueue_deliveries, "teaagent-relay-enqueues", wrap=store_error
        )
        # (origin, request id) -> the request as this process verified it and the store took it in.
        self._kept: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()

    def _keep(self, origin: str, request: dict[str, Any]) -> None:
        """Keep ``request`` of ``origin``, whose signature this process verified and which the
        store holds, for :meth:`decide`; the oldest goes when ``KEPT_REQUESTS`` are kept."""
        self._kept[(origin, request["request_id"])] = request
        self._kept.move_to_end((origin, request["request_id"]))
        while len(self._kept) > KEPT_REQUESTS:
            self._kept.popitem(last=False)

    def _verified_kept(self, origin: str, request_id: str) -> dict[str, Any] | None:
        """The request :meth:`_keep` kept, while ``origin`` is still a configured peer; else None."""
        if origin not in self.config.peers:
            return None
        return self._kept.get((origin, request_id))

    def _peer_origin(self, document: dict[str, Any], what: str) -> tuple[str, Trust]:
        """The configured peer a received ``document`` names as its origin, and the trust that says so.

        The trust is one snapshot, for the check here and the verification after the reads between.

        Raises:
            ApiError: 422 the origin is not a string; 403 it is not a configured peer of this node.
        """
        origin = _origin_of(document, what)
        trust = self.trust
        if origin not in trust.peer_keys:
            raise _not_a_peer(origin)
        return origin, trust

    async def _stored_item(self, origin: str, request_id: str) -> StoredRequest:
        """The inbox item of ``origin``'s request ``request_id``.

        Raises:
            ApiError: 404 when no such item is in the inbox.
            StoreError: Redis failed.
        """
        stored = await self.store.inbox.get(origin, request_id)
        if stored is None:
            raise _not_in_inbox(request_id, origin)
        return stored

    async def receive_withdrawal(
        self, request_id: str, statement: dict[str, Any], signature: str
    ) -> dict[str, Any]:
        """Mark a received request ``withdrawn`` on its origin's signed word.

        Checked before anything is written: the origin is a configured peer, the request is in the
        inbox, the statement is its withdrawal, and the signature verifies with the key the
        origin's requests verify with here. An item this node already decided keeps its decision
        (its decision is on its way; the origin counts nothing any more); an expired one stays
        expired. Both answer 200 with that state, so the origin's delivery ends.

        Raises:
            ApiError: 422 malformed or not a withdrawal of that request; 403 unknown origin or bad
                signature; 404 no such request from that origin.
            StoreError: Redis failed.
        """
        origin, trust = self._peer_origin(statement, "withdrawal")
        if statement.get("request_id") != request_id:
            raise ApiError(422, "invalid", "The withdrawal's request_id is not the request in the path.")
        stored = await self._stored_item(origin, request_id)
        request, _signature = envelope(stored.document)
        origin_keys = trust.peer_keys[origin]  # every key of the origin, each with its limits
        data = self._verified_withdrawal(
            request,
            statement,
            signature,
            origin_keys,
            whose=whose_keys(origin_keys, origin),
            now=time.time(),
        )
        try:
            result = await self.store.inbox.withdraw(
                origin, request_id, withdrawal=data, now=int(time.time())
            )
        except RequestNotFoundError:
            raise _not_in_inbox(request_id, origin) from None
        if result.withdrawn:
            logger.info("request %s of %s withdrawn by its origin", request_id, origin)
        return {
            "request_id": request_id,
            "origin": origin,
            "state": result.state,
            "withdrawn": result.withdrawn,
        }

    async def receive_settlement(self, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Mark a received request ``settled`` on the verified evidence of its outcome at its origin.

        The origin's relay is not trusted here: ``body`` names the origin (``origin``) and carries
        ``certificate`` (approved) or ``denials`` (denied), which must prove that outcome of the
        very request stored here under this node's own configuration and the origin's keys
        (:func:`teaagent.quorum.verify_settlement`). Nothing is written before it did. An item this
        node decided keeps its decision (and gains the evidence); a withdrawn or expired one stays.

        Raises:
            ApiError: 422 malformed, or evidence that does not prove it (``unverified``); 403 unknown
                origin; 404 no such request from that origin.
            StoreError: Redis failed.
        """
        origin, trust = self._peer_origin(body, "settlement")
        stored = await self._stored_item(origin, request_id)
        request, _signature = envelope(stored.document)
        evidence = {name: value for name, value in body.items() if name != "origin"}
        try:
            settled = verify_settlement(
                request, evidence, trust.config.quorum, trust.peer_keys[origin], now=time.time()
            )
        except QuorumError as exc:
            self.metrics.decisions.labels("settlement", "rejected").inc()
            raise ApiError(422, "unverified", sentence(str(exc))) from None
        try:
            result = await self.store.inbox.settle(
                origin, request_id, settlement=canonical(evidence), now=int(time.time())
            )
        except RequestNotFoundError:
            raise _not_in_inbox(request_id, origin) from None
        if result.changed:
            logger.info("request %s of %s %s at its origin", request_id, origin, settled.outcome)
        return {
            "request_id": request_id,
            "origin": origin,
            "state": result.state,
            "settled": settled.to_dict(),
        }

    async def receive(self, request: dict[str, Any], signature: str) -> tuple[bool, dict[str, Any]]:
        """Accept a peer's request into the inbox and queue it for the approver; idempotent.

        PROTOCOL.md "What a peer's relay refuses": everything is checked before the origin's
        window is charged, and an exact repeat of a stored request is charged to no window, so a
        captured request (it travels to every peer) re-posted forever never shuts the origin out.
        Each origin may hold at most ``inbox_max_pending`` pending requests here, so no peer can
        fill the approver's queue for the others.

        Raises:
            ApiError: 403 unknown origin, not addressed to this node, or a bad signature; 422
                malformed, created too far ahead (``invalid``) or already expired (``expired``);
                429 the origin's window is full (``rate_limited``), or it holds its cap of pending
                requests here (``origin_full``); 409 another document holds the id.
            StoreError: Redis failed.
        """
        origin = request.get("origin")
        trust = self.trust  # one snapshot for the check and the verification
        if isinstance(origin, str) and origin not in trust.peer_keys:
            raise _not_a_peer(origin)
        problem = request_problem(request)
        if problem is not None:
            raise ApiError(422, "invalid", sentence(problem))
        assert isinstance(origin, str)  # request_problem checked it
        request_id = request["request_id"]
        now = time.time()
        ahead = request_time_problem(request, now)
        if ahead is not None:
            raise ApiError(422, "invalid", sentence(ahead))
        if is_expired(now, request["expires_at"]):
            # 422, as for the skew above: a well-formed document this node can no longer take (not
            # 410/409, which speak of the target resource's state; not 429, which would invite a
            # retry). Its own code, so an origin can tell it from a malformed one. Checked before
            # the signature and the window, as the skew is: time is free, Ed25519 and Redis are not.
            raise ApiError(
                422,
                "expired",
                f"Request {request_id} expired at {moment(request['expires_at'], now)}; this node no longer "
                "accepts it.",
            )
        if self.agent_id not in request["peers"]:
            raise ApiError(
                403,
                "forbidden",
                f"This node ({self.agent_id}) is not among the peers of request {request_id}.",
            )
        origin_keys = trust.peer_keys[origin]  # every key of the origin, each with its limits
        wire = check_request_signature(
            request,
            signature,
            origin_keys,
            allow_dev=self.allow_dev,
            whose=whose_keys(origin_keys, origin),
        )
        document = canonical({"request": request, "signature": wire})
        # Already here: a repeat (or a clash) is answered from the store and charges nothing. Else
        # the origin's window, then the request stored and queued for the approver: on one server
        # one script, on a cluster one step each (InboxBook.receive).
        payload = json.dumps({"origin": origin, "request_id": request_id}).encode()
        intake = Intake(
            self.store.rate_limiter,
            f"origin:{origin}",
            self.inbox_limit,
            self.store.inbox_queue,
            APPROVER_TARGET,
            max_pending=self.inbox_max_pending,
        )
        for _attempt in range(2):
            got = await self.store.inbox.receive(
                origin,
                request_id,
                document,
                expires_at=request["expires_at"],
                intake=intake,
                payload=payload,
            )
            if not got.stored_before:
                break
            stored = await self.store.inbox.get(origin, request_id)
            if stored is not None:
                return await self._repeat(origin, request, stored)
            # Gone between the two reads (it expired): taken in again, as a new request.
        else:
            raise self._clash(origin, request_id)
        if got.full:
            # Its share of the inbox, not its pace: room comes back as its requests are decided,
            # withdrawn or expire, so 429 (the origin's relay retries) with nothing charged.
            raise ApiError(
                429,
                "origin_full",
                f"{origin} already holds {got.held} pending requests in this node's inbox, its limit "
                f"of {self.inbox_max_pending}; one must be decided, withdrawn or expire first.",
            )
        decision = got.decision
        assert decision is not None  # not stored before: the window answered
        if not decision.allowed:
            retry_after = max(1, math.ceil(decision.retry_after))
            raise ApiError(
                429,
                "rate_limited",
                f"{origin} is over its limit of {self.inbox_limit.max_calls} requests per "
                f"{self.inbox_limit.window_seconds:g} seconds; retry in {retry_after} s.",
                headers={"Retry-After": str(retry_after)},
            )
        accepted = got.accepted
        assert accepted is not None  # allowed: stored
        self._keep(origin, request)
        return await self._received(
            origin, request, created=accepted.created, state=accepted.state, queued=got.entry_id is not None
        )

    async def _repeat(
        self, origin: str, request: dict[str, Any], stored: StoredRequest
    ) -> tuple[bool, dict[str, Any]]:
        """Answer a request already stored from ``origin``: the same request again, or a clash.

        The same request is the same canonical request document, whoever's copy of the signature
        it carries (ECDSA signatures differ each time; both verified): the first one stays.

        Raises:
            ApiError: 409 another request document holds the id.
            StoreError: Redis failed.
        """
        if canonical(envelope(stored.document)[0]) != canonical(request):
            raise self._clash(origin, request["request_id"])
        return await self._received(origin, request, created=False, state=stored.state, queued=stored.queued)

    @staticmethod
    def _clash(origin: str, request_id: str) -> ApiError:
        return ApiError(
            409,
            "conflict",
            f"Request {request_id} from {origin} is already stored with a different document.",
        )

    async def _received(
        self, origin: str, request: dict[str, Any], *, created: bool, state: RequestState, queued: bool
    ) -> tuple[bool, dict[str, Any]]:
        """Count a stored (or repeated) request; queue it for the approver once, while it is pending.

        Raises:
            StoreError: Redis failed.
        """
        request_id = request["request_id"]
        self.metrics.quorum_requests.labels("inbox", "created" if created else "duplicate").inc()
        if state == "pending" and not queued:
            # Also for a repeat of an item not marked queued: the origin repeats only when it got no
            # answer, maybe before this step. A marked one is never queued again, so repeats (free of
            # the window) cannot fill the queue; a crash before the mark costs one extra entry.
            payload = json.dumps({"origin": origin, "request_id": request_id}).encode()
            entry_id = await self.store.inbox_queue.enqueue(
                APPROVER_TARGET, request_id, payload, request["expires_at"]
            )
            await self.store.inbox.mark_queued(origin, request_id, entry_id)
        return created, {"request_id": request_id, "origin": origin, "state": state, "created": created}

    async def sweep_inbox_queue(self, now: float | None = None) -> int:
        """Remove the inbox queue's entries whose request no longer waits for this node's approver.

        The queue holds one entry per received request for the approver. Approvers that decide
        through ``POST /v1/inbox/{id}/decision`` never claim it. This node's decision takes its
        item's entry out once it is queued for the origin (``InboxBook.record_and_queue``); a
        request may also be withdrawn, settled at its origin or expire undecided, so without this
        the stream would only grow (and, full, refuse new requests). An entry whose request was
        decided here is one whose decision may not have been queued (a full queue, a crash between
        the two steps on a cluster): the decision is queued for its origin once more first.
        Looks at ``INBOX_SWEEP_BATCH`` entries per call (their items read in one round trip), each
        call after the last one's (then from the oldest again), so requests still waiting at the
        head never hide the ones behind them; removes those decided, expired or gone.
        :attr:`inbox_sweep_behind` says whether more is behind the page it looked at.

        Returns:
            How many entries were removed.

        Raises:
            StoreError: Redis failed.
        """
        at = time.time() if now is None else now
        queue = self.store.inbox_queue
        entries = await queue.entries(INBOX_SWEEP_BATCH, after=self._sweep_cursor)
        self._sweep_cursor = entries[-1].entry_id if len(entries) == INBOX_SWEEP_BATCH else None
        done = []
        named: list[tuple[str, str, str]] = []  # entry id, origin, request id
        for entry in entries:
            try:
                origin = json.loads(entry.payload)["origin"]
            except (ValueError, KeyError, TypeError):
                origin = None
            if isinstance(origin, str):
                named.append((entry.entry_id, origin, entry.request_id))
            else:
                done.append(entry.entry_id)  # an entry this relay cannot read waits for nobody
        read = await self._read_inbox([(origin, request_id) for _entry_id, origin, request_id in named])
        for (entry_id, origin, _request_id), stored in zip(named, read, strict=True):
            if isinstance(stored, Exception):
                stored = None  # a malformed origin or id: waits for nobody either
            if stored is None or stored.state == "expired" or at > stored.expires_at:
                done.append(entry_id)
            elif stored.state != "pending":
                # Decided here: send the decision once more before forgetting the entry, in case
                # the relay died between recording it and queueing it (a repeat counts once).
                raw = _own_decision(stored)
                if raw is not None:
                    decision = json.loads(raw)
                    await self._send_decision(
                        origin, envelope(stored.document)[0], decision["statement"], decision["signature"]
                    )
                done.append(entry_id)
        return await queue.remove(done)

    @property
    def inbox_sweep_behind(self) -> bool:
        """Whether the last sweep stopped at a full page, with more of the inbox queue behind it."""
        return self._sweep_cursor is not None

    def _inbox_item(self, stored: StoredRequest, now: float) -> dict[str, Any]:
        return inbox_item_view(stored, now)  # the approver reads its news as the same item

    async def inbox(self, state: RequestState | None, limit: int, wait: float) -> list[dict[str, Any]]:
        """List received requests; with ``wait``, block until one is there (XREAD on the inbox queue).

        Raises:
            StoreError: Redis failed.
        """
        deadline = time.monotonic() + min(wait, MAX_WAIT_SECONDS)
        stream = self.store.keys.queue(self.store.inbox_queue.name).stream
        waiting = self.metrics.long_polls.labels("inbox").track_inprogress() if wait > 0 else nullcontext()
        with waiting:
            return await self._wait_inbox(stream, state, limit, deadline)

    async def _wait_inbox(
        self, stream: str, state: RequestState | None, limit: int, deadline: float
    ) -> list[dict[str, Any]]:
        while True:
            # The stream's last id first: an item queued after it wakes the block below.
            with redis_failures(self.store):
                last: Any = await self.store.client.xrevrange(stream, "+", "-", count=1)
            last_id: Any = last[0][0] if last else "0-0"
            stored = await self.store.inbox.list_requests(state=state, limit=limit)
            now = time.time()
            items = [self._inbox_item(item, now) for item in stored]
            remaining = deadline - time.monotonic()
            if items or remaining <= 0 or self.stopping.is_set():
                return items
            with redis_failures(self.store):
                await self.store.blocking.xread(
                    {stream: last_id}, count=1, block=max(1, int(min(remaining, INBOX_WAKE_SECONDS) * 1000))
                )

    async def inbox_item(self, request_id: str, origin: str | None) -> dict[str, Any]:
        """Return one received request, by id (and origin, when several origins used that id).

        Raises:
            ApiError: 404 unknown, 409 ambiguous, 422 an origin that is not an agent id.
            StoreError: Redis failed.
        """
        stored = await self._find_inbox(request_id, origin)
        return self._inbox_item(stored, time.time())

    async def _read_inbox(self, refs: list[tuple[str, str]]) -> list[StoredRequest | Exception | None]:
        """``InboxBook.get`` of each ``(origin, request_id)``, one pipeline (the coalescer's send)."""
        answers: list[StoredRequest | Exception | None] = []
        valid: list[tuple[str, str]] = []
        for origin, request_id in refs:
            try:
                self.store.keys.inbox_item(origin, request_id)
            except ValueError as exc:
                answers.append(exc)
                continue
            answers.append(None)
            valid.append((origin, request_id))
        found = iter(await self.store.inbox.get_many(valid))
        return [answer if isinstance(answer, Exception) else next(found) for answer in answers]

    async def _record_and_queue(
        self, decisions: list[tuple[str, DecisionToCount, Outgoing]]
    ) -> list[QueuedDecision | Exception]:
        """``InboxBook.record_and_queue`` of each decision, on the deliveries queue (each settled
        item then leaves the approver's queue): one round trip."""
        return await self.store.inbox.record_and_queue(decisions, self.deliveries, self.store.inbox_queue)

    async def _enqueue_deliveries(self, entries: list[tuple[str, str, bytes, int]]) -> list[str | Exception]:
        """``DeliveryQueue.enqueue`` of each entry, one pipeline (the coalescer's send)."""
        return list(await self.deliveries.enqueue_many(entries))

    async def _find_inbox(self, request_id: str, origin: str | None) -> StoredRequest:
        origins = [origin] if origin is not None else list(self.config.peers)
        if origin is not None and origin not in self.config.peers:
            raise _not_in_inbox(request_id, origin)
        found = [
            item
            for item in await asyncio.gather(*(self._inbox_reads.call((o, request_id)) for o in origins))
            if item
        ]
        if not found:
            where = f" from {origin}" if origin is not None else ""
            raise ApiError(404, "not_found", f"No request {request_id}{where} is in this node's inbox.")
        if len(found) > 1:
            names = ", ".join(sorted(str(item.origin) for item in found))
            raise ApiError(
                409,
                "conflict",
                f"Several origins ({names}) sent a request {request_id}; name one with ?origin=.",
            )
        return found[0]

    async def decide(self, request_id: str, statement: dict[str, Any], signature: str) -> dict[str, Any]:
        """Record this node's own signed decision on a received request and queue it for the origin.

        Raises:
            ApiError: 404 unknown request; 422 not a statement of it; 403 not signed by this node
                or a bad signature; 409 this node decided otherwise before, or the request expired.
            StoreError: Redis failed.
        """
        origin = _origin_of(statement, "statement")
        # A request this process took in is used as it verified it: no read. Its state is the
        # record's answer below (withdrawn or settled since, or gone: refused as after a read).
        request = self._verified_kept(origin, request_id)
        if request is None:
            stored = await self._find_inbox(request_id, origin)  # one coalesced read, origin given
            if stored.state in _CLOSED:
                raise _closed(stored.state, request_id, origin)
            request, _signature = envelope(stored.document)
        signer = statement.get("signer")
        if signer != self.agent_id:
            self.metrics.decisions.labels("own", "rejected").inc()
            raise ApiError(
                403,
                "forbidden",
                sentence(f"the statement is signed as {signer!r}, not as this node ({self.agent_id})"),
            )
        now = time.time()
        own_keys = self.trust.own_keys
        try:
            kind, signer, rebuilt = check_statement(request, statement, configured=(self.agent_id,), now=now)
            wire, data = verify_decision(
                kind,
                rebuilt,
                signature,
                own_keys,
                allow_dev=self.allow_dev,
                whose="this node's own key" if len(own_keys) == 1 else "this node's keys",
            )
        except ApiError:
            self.metrics.decisions.labels("own", "rejected").inc()
            raise
        if is_expired(now, request["expires_at"]):
            raise ApiError(
                409,
                "conflict",
                f"Request {request_id} expired at {moment(request['expires_at'], now)}; a decision can no "
                "longer count.",
            )
        # Recorded, and queued for the origin only when it counted as this node's decision: a
        # contrary one never leaves. One step on one server; two on a cluster.
        target, _request_id, payload, expires_at = _decision_entry(origin, request, rebuilt, wire)
        try:
            queued = await self._inbox_writes.call(
                (
                    origin,
                    DecisionToCount(request_id, kind, signer, data, int(now)),
                    (target, payload, expires_at),
                )
            )
        except RequestNotFoundError:
            self._kept.pop((origin, request_id), None)
            raise _not_in_inbox(request_id, origin) from None
        result = queued.result
        if result.state in _CLOSED and not result.counted:
            raise _closed(result.state, request_id, origin)  # withdrawn or settled since it was read or kept
        if not result.counted:
            self._refuse_another(await self.store.inbox.get(origin, request_id), signer, data, request_id)
            # The same decision again: queued once more, as the inbox sweep queues it, for a relay
            # that died between recording and queueing on a cluster (the origin counts a signer once).
            await self._send_decision(origin, request, rebuilt, wire)
        self.metrics.decisions.labels("own", "counted" if result.counted else "duplicate").inc()
        return {
            "request_id": request["request_id"],
            "origin": origin,
            "signer": signer,
            "kind": kind,
            "this_node": "approved" if kind == "approval" else "denied",
            "counted": result.counted,
            "note": f"This node's decision, sent to {origin}; the request's outcome is counted there.",
        }

    async def _send_decision(
        self, origin: str, request: dict[str, Any], statement: dict[str, Any], wire: str
    ) -> None:
        await self._enqueues.call(_decision_entry(origin, request, statement, wire))

    @staticmethod
    def _refuse_another(stored: StoredRequest | None, signer: str, data: bytes, request_id: str) -> None:
        """409 when this node already decided the request with another decision (PROTOCOL.md rule 5)."""
        if stored is None:
            return
        previous = stored.approvals.get(signer) or stored.denials.get(signer)
        if previous is not None and previous != data:
            decided = "approved" if signer in stored.approvals else "denied"
            raise ApiError(
                409, "conflict", f"This node already {decided} request {request_id} with another decision."
            )
