"""Stored requests: accept once, count verified decisions atomically, wait for the outcome by XREAD."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import redis.asyncio.cluster
import redis.exceptions

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.store._connection import (
    REDIS_ERRORS,
    AsyncClient,
    StoreOptions,
    converting,
    describe_redis_error,
)
from teaagent.store._keys import (
    AGENT_ID_PATTERN,
    MAX_DOCUMENT_BYTES,
    REQUEST_RETENTION_SECONDS,
    Keys,
    RequestKeys,
)
from teaagent.store._reads import read_request, read_wait_start
from teaagent.store._scripts import AsyncScripts

if TYPE_CHECKING:
    from teaagent.store._queue import DeliveryQueue
    from teaagent.store._ratelimit import AsyncRedisRateLimiter, RateLimitSpec
    from teaagent.tools import RateDecision

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_PENDING_PER_ORIGIN",
    "AcceptResult",
    "DecisionKind",
    "DecisionResult",
    "DecisionToCount",
    "DeliveryState",
    "DeliveryStateName",
    "InboxBook",
    "Intake",
    "ReceiveResult",
    "RequestBook",
    "RequestState",
    "SettleResult",
    "StoredRequest",
    "WithdrawResult",
]

# withdrawn: the origin withdrew it (PROTOCOL.md, Withdrawal); final, as the other decided states are
# settled: an inbox item its origin decided (approved or denied) before this node did, on verified
# evidence (docs/protocol.md, Settlement); final too
RequestState = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]
DecisionKind = Literal["approval", "denial"]
DeliveryStateName = Literal["pending", "delivered", "failing", "given_up"]

MAX_EVENTS = 1000  # a request sees one event per decision plus two; the bound only guards against abuse
MAX_LISTED = 1000  # one listing call returns at most this many requests
_DECISION_KINDS = ("approval", "denial")
_STATES: tuple[RequestState, ...] = ("pending", "approved", "denied", "expired", "withdrawn", "settled")
_DELIVERY_STATES: tuple[DeliveryStateName, ...] = ("pending", "delivered", "failing", "given_up")
MAX_DELIVERY_ERROR_CHARS = 500  # the last error is one sentence, not a traceback
# Pending requests one origin may hold in this node's inbox: more than any operator works through,
# and a hundred origins at it still leave room in the approver's queue (MAX_QUEUE_LENGTH, 100,000),
# so one peer, however fast its window lets it send, cannot crowd the others out.
MAX_PENDING_PER_ORIGIN = 1_000

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AcceptResult:
    """What storing a request did: ``created`` is False when the very same document was stored before.

    ``stored`` is the request as this very call stored it, when it created it pending: what a read
    right after would return (no decision yet, no delivery tried), without that read. None
    otherwise: a repeat or a request accepted already decided is read from the store.
    """

    created: bool
    state: RequestState
    stored: StoredRequest | None = None


@dataclass(frozen=True)
class Intake:
    """Where :meth:`InboxBook.receive` charges a received request and queues it.

    ``window`` of ``limiter`` (``origin:<id>``) allows ``limit``; the request goes to ``target``
    (``approver``) on ``queue``; its origin may hold at most ``max_pending`` pending requests in
    the inbox.
    """

    limiter: AsyncRedisRateLimiter
    window: str
    limit: RateLimitSpec
    queue: DeliveryQueue
    target: str
    max_pending: int = MAX_PENDING_PER_ORIGIN


@dataclass(frozen=True)
class ReceiveResult:
    """What :meth:`InboxBook.receive` did with a peer's request.

    ``stored_before``: the request (or another document under its id) was stored already; nothing
    was charged or written, and the caller reads it to answer a repeat. ``held`` (with ``full``
    True): its origin already holds that many pending requests here, its cap; nothing was charged
    or written. Otherwise ``decision`` is the origin's window's answer; when it allowed the call,
    ``accepted`` says how the request was stored and ``entry_id`` is its entry on the approver's
    queue (None when it was not pending).
    """

    stored_before: bool
    decision: RateDecision | None = None
    accepted: AcceptResult | None = None
    entry_id: str | None = None
    full: bool = False
    held: int | None = None


@dataclass(frozen=True)
class DecisionResult:
    """The counting state after one decision was recorded.

    ``counted`` is True when this decision changed the count: a signer's first approval (unless it
    denied), or its first denial (which takes its approval away, PROTOCOL.md rule 6);
    ``decided`` is True when this very call settled the outcome (exactly one call ever sees it).
    """

    state: RequestState
    approvals: int
    denials: int
    counted: bool
    decided: bool


@dataclass(frozen=True)
class WithdrawResult:
    """What a withdrawal did: ``withdrawn`` is True when this very call withdrew the request.

    ``state`` is the request's state after it: ``withdrawn`` (by this call, or before: a repeat),
    or the final state it had reached first (``approved``, ``denied``, ``expired``).
    """

    state: RequestState
    withdrawn: bool


@dataclass(frozen=True)
class SettleResult:
    """What recording a settlement did: ``changed`` is True when this very call wrote it.

    ``state`` is the item's state after it: ``settled`` (by this call, or before), this node's own
    decision (``approved``, ``denied``, which keep it), or ``withdrawn``/``expired``.
    """

    state: RequestState
    changed: bool


@dataclass(frozen=True)
class DecisionToCount:
    """One verified decision for :meth:`RequestBook.record_decisions` (``record_decision``'s arguments)."""

    request_id: str
    kind: DecisionKind
    signer: str
    decision: bytes
    now: int | None = None  # Unix seconds; None is the current time
    # A version 2 request's policy as the script reads it (QuorumPolicy.script_form); "" for version 1.
    policy: str = ""


def _record_args(kind: str, signer: str, decision: bytes, now: int, policy: str) -> list[Any]:
    """``record_decision``'s ARGV; the policy only when there is one (version 1 calls stay as they were)."""
    args: list[Any] = [kind, signer, decision, now, MAX_EVENTS]
    if policy:
        args.append(policy)
    return args


@dataclass(frozen=True)
class DeliveryState:
    """How the delivery of one own request to one peer's relay went, as the delivery worker saw it.

    ``state`` is ``pending`` (queued, not tried yet), ``delivered`` (the peer's relay answered
    2xx), ``failing`` (the last attempt failed; another is scheduled) or ``given_up`` (refused
    for good, or the request expires before another attempt). ``attempts`` counts the attempts
    made; ``error`` is the last failure's sentence, or None; ``at`` the Unix time of the record.
    """

    state: DeliveryStateName
    attempts: int
    error: str | None
    at: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``GET /v1/requests/{id}``'s ``deliveries`` values)."""
        return {"state": self.state, "attempts": self.attempts, "error": self.error, "at": self.at}


def _delivery_state(raw: bytes) -> DeliveryState | None:
    """Read a stored delivery record; None when it is not one (it is display, never a failure)."""
    try:
        data = json.loads(raw)
        state = data["state"]
        if state not in _DELIVERY_STATES:
            return None
        error = data.get("error")
        return DeliveryState(
            state=state,
            attempts=int(data.get("attempts", 0)),
            error=str(error) if error is not None else None,
            at=float(data.get("at", 0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class StoredRequest:
    """A stored request with its counting state and the decisions counted for it, bytes verbatim."""

    request_id: str
    origin: str | None  # the sending peer for an inbox item; None for the node's own requests
    document: bytes
    state: RequestState
    required: int
    peers: int
    expires_at: int
    accepted_at: int
    decided_at: int | None
    approvals: dict[str, bytes] = field(default_factory=dict)  # signer -> bytes; never one that denied
    denials: dict[str, bytes] = field(default_factory=dict)
    queued: bool = False  # an inbox item queued for the approver (InboxBook.mark_queued)
    withdrawal: bytes | None = None  # the origin's verified withdrawal, verbatim, once withdrawn
    settlement: bytes | None = None  # the origin's verified outcome evidence, verbatim (inbox items)
    # peer -> how the request's delivery to its relay went (own requests, RequestBook.get only)
    deliveries: dict[str, DeliveryState] = field(default_factory=dict)

    @property
    def decided(self) -> bool:
        """True once the outcome is settled (it never changes afterwards)."""
        return self.state != "pending"


def _now(now: int | None) -> int:
    return int(time.time()) if now is None else now


def _state(raw: bytes | str | None) -> RequestState:
    text = raw.decode() if isinstance(raw, bytes) else raw
    for state in _STATES:
        if text == state:
            return state
    raise ValueError(f"stored state {text!r} is not a request state")


def _received(decision: RateDecision, accepted: AcceptResult, entry_id: str | None) -> ReceiveResult:
    """A request taken in by ``InboxBook.receive``; ``accepted.stored`` is marked queued when it was."""
    if entry_id is not None and accepted.stored is not None:
        accepted = dataclasses.replace(accepted, stored=dataclasses.replace(accepted.stored, queued=True))
    return ReceiveResult(stored_before=False, decision=decision, accepted=accepted, entry_id=entry_id)


def _held_ms(one: _Acceptance) -> int:
    """An origin's held set lives until its latest ref expires (a ref counts only until then)."""
    return (max(one.expires_at - one.at, 0) + 1) * 1000


def _check_document(name: str, document: bytes) -> None:
    if not isinstance(document, bytes) or not document:
        raise TypeError(f"{name} must be non-empty bytes")
    if len(document) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{name} is {len(document)} bytes, above the limit of {MAX_DOCUMENT_BYTES}")


@dataclass(frozen=True)
class _Acceptance:
    """One accept, checked and encoded (``_Book._acceptance``), and how its reply reads."""

    member: str
    request_id: str
    origin: str | None
    label: str
    document: bytes
    required: int
    peers: int
    expires_at: int
    at: int
    ttl_ms: int  # the index entries' TTL
    keys: list[str]
    args: list[Any]

    def result(self, status: bytes, state: bytes) -> AcceptResult:
        """The ``accept_request`` script's ``{status, state}``, read.

        Raises:
            RequestConflictError: other bytes hold the id (``conflict``).
        """
        if status == b"conflict":
            raise RequestConflictError(
                f"{self.label} already exists with a different document; the new one is refused"
            )
        created, accepted = status == b"created", _state(state)
        stored = None
        if created and accepted == "pending":
            # What accept_request.lua wrote, field for field (tests/test_store_requests.py holds
            # it to a read of the store).
            stored = StoredRequest(
                request_id=self.request_id,
                origin=self.origin,
                document=self.document,
                state="pending",
                required=self.required,
                peers=self.peers,
                expires_at=self.expires_at,
                accepted_at=self.at,
                decided_at=None,
            )
        return AcceptResult(created=created, state=accepted, stored=stored)


class _Book:
    """The engine shared by a node's own requests and its inbox; the public classes name the ids."""

    def __init__(
        self,
        client: AsyncClient,
        scripts: AsyncScripts,
        *,
        url: str,
        index_key: str,
        pending_key: str,
        options: StoreOptions,
        blocking: AsyncClient | None = None,
    ) -> None:
        self._client = client
        self._blocking = blocking or client  # the outcome waits' XREAD BLOCK, on a pool of its own
        self._scripts = scripts
        self._url = url
        self._index_key = index_key
        self._pending_key = pending_key  # the pending members of the index only, same scores
        self._options = options
        # On one server every key is on one node, so the steps of one operation may share a round
        # trip or a script; on a cluster the steps whose keys have other hash tags go one by one.
        self._one_server = not isinstance(client, redis.asyncio.cluster.RedisCluster)

    def _ref(self, member: str) -> tuple[RequestKeys, str, str | None]:
        """The keys, the request id and the origin (None: this node's own) of index member ``member``."""
        raise NotImplementedError

    def _acceptance(
        self,
        member: str,
        document: bytes,
        *,
        required_approvals: int,
        peers: int,
        expires_at: int,
        now: int | None,
    ) -> _Acceptance:
        """One accept, checked and encoded: the ``accept_request`` script's keys and arguments."""
        keys, request_id, origin = self._ref(member)
        _check_document("document", document)
        if required_approvals < 1 or peers < required_approvals:
            raise ValueError(
                f"required_approvals must be between 1 and peers ({peers}), not {required_approvals}"
            )
        at = _now(now)
        return _Acceptance(
            member=member,
            request_id=request_id,
            origin=origin,
            label=f"request {request_id}" if origin is None else f"request {request_id} from {origin}",
            document=document,
            required=required_approvals,
            peers=peers,
            expires_at=expires_at,
            at=at,
            ttl_ms=(max(expires_at - at, 0) + REQUEST_RETENTION_SECONDS) * 1000,
            keys=[keys.doc, keys.outcome, keys.events],
            args=[document, required_approvals, peers, expires_at, at, REQUEST_RETENTION_SECONDS, MAX_EVENTS],
        )

    async def _accept(self, one: _Acceptance) -> AcceptResult:
        member, expires_at = one.member, one.expires_at
        with converting(self._url):
            # The index entries go first: a listed ref may lack its request (skipped), never the
            # reverse, so a crash between the two steps never leaves a pending request unlisted.
            # NX: a document refused below must not move the stored request's entry. On one
            # server both steps go in one pipeline, in that order (Redis runs a connection's
            # commands in order, and its append-only file keeps them so): one round trip, and
            # the server syncs both at once. On a cluster the index is on another slot: it is
            # written first, then the request.
            together = self._one_server
            async with self._client.pipeline(transaction=False) as pipe:
                for key in (self._index_key, self._pending_key):
                    pipe.zadd(key, {member: expires_at}, nx=True)
                    pipe.pexpire(key, one.ttl_ms, nx=True)
                    pipe.pexpire(key, one.ttl_ms, gt=True)
                if together:
                    pipe.execute_command(*self._scripts.command("accept_request", one.keys, one.args))
                replies = await pipe.execute(raise_on_error=False)
            reply = replies[-1] if together else None
            if isinstance(reply, redis.exceptions.NoScriptError):
                # The server lost the script (a restart, a flush): the index is in; load it and run it.
                await self._scripts.load("accept_request", one.keys)
                reply = None
            for failed in replies[: -1 if together else None]:
                if isinstance(failed, Exception):
                    raise failed
            if isinstance(reply, Exception):
                raise reply
            if reply is None:
                reply = await self._scripts.run("accept_request", one.keys, one.args)
            status, state = reply
            if state != b"pending":
                # Accepted already expired, or a repeat of a settled request: not pending after all.
                await self._unlist_pending([member])
        return one.result(status, state)

    async def _record(
        self,
        keys: RequestKeys,
        member: str,
        *,
        kind: str,
        signer: str,
        decision: bytes,
        now: int | None,
        label: str,
        policy: str = "",
    ) -> DecisionResult:
        with converting(self._url):
            reply = await self._scripts.run(
                "record_decision",
                [keys.outcome, keys.decisions, keys.events],
                _record_args(kind, signer, decision, _now(now), policy),
            )
        result = _decision_result(reply, label)
        if result.decided:
            await self._unlist_pending([member])
        return result

    async def _withdraw(
        self, keys: RequestKeys, member: str, *, withdrawal: bytes, now: int | None, label: str
    ) -> WithdrawResult:
        _check_document("withdrawal", withdrawal)
        with converting(self._url):
            state, changed = await self._scripts.run(
                "withdraw", [keys.outcome, keys.events], [withdrawal, _now(now), MAX_EVENTS]
            )
        if state == b"unknown":
            raise RequestNotFoundError(f"{label} is not stored here (it never arrived, or it expired)")
        result = _state(state)
        if changed:
            await self._unlist_pending([member])
        return WithdrawResult(state=result, withdrawn=bool(changed) and result == "withdrawn")

    async def _settle_elsewhere(
        self, keys: RequestKeys, member: str, *, settlement: bytes, now: int | None, label: str
    ) -> SettleResult:
        _check_document("settlement", settlement)
        with converting(self._url):
            state, changed = await self._scripts.run(
                "settle_elsewhere", [keys.outcome, keys.events], [settlement, _now(now), MAX_EVENTS]
            )
        if state == b"unknown":
            raise RequestNotFoundError(f"{label} is not stored here (it never arrived, or it expired)")
        result = _state(state)
        if changed and result in ("settled", "expired"):
            await self._unlist_pending([member])
        return SettleResult(state=result, changed=bool(changed))

    def _held(self, members: list[str]) -> dict[str, list[str]]:
        """The sets that count ``members`` against a cap (an inbox's origins'), each with its members."""
        return {}

    async def _unlist_pending(self, members: list[str]) -> None:
        """Remove settled requests from the pending set, and from their origin's held set in an
        inbox: a step after the script, not inside it.

        The sets have no hash tag of a request, so no request's script may touch them (Redis
        Cluster). Never raises: the outcome is settled and stored by then, and a member left
        behind (by a failure here or a crash before it) is skipped and removed by the next pending
        listing; in a held set it counts until that listing, or until its request expires.
        """
        if not members:
            return
        held = self._held(members)
        try:
            if not held:
                await self._client.zrem(self._pending_key, *members)
                return
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zrem(self._pending_key, *members)
                for key, refs in held.items():
                    pipe.zrem(key, *refs)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            logger.warning(
                "settled requests stay in %s until a listing removes them: %s",
                self._pending_key,
                describe_redis_error(self._url, exc),
            )

    async def _record_many(self, calls: list[tuple[RequestKeys, str, list[Any]]]) -> list[Any]:
        """Send ``record_decision`` once per ``(keys, member, args)`` in one pipeline; return the raw replies.

        No transaction: each script call is atomic on its own and they touch different requests'
        keys (on a cluster, the client splits the pipeline by node). A reply is the exception
        Redis answered for that call alone (``raise_on_error=False``). The requests the batch
        settled then leave the pending set, in one more command.

        Raises:
            StoreError: Redis is unreachable or failed (the whole pipeline).
        """

        async def send(chosen: list[tuple[RequestKeys, str, list[Any]]]) -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                for keys, _member, args in chosen:
                    pipe.execute_command(
                        *self._scripts.command(
                            "record_decision", [keys.outcome, keys.decisions, keys.events], args
                        )
                    )
                return list(await pipe.execute(raise_on_error=False))

        try:
            replies = await send(calls)
            lost = [
                index
                for index, reply in enumerate(replies)
                if isinstance(reply, redis.exceptions.NoScriptError)
            ]
            if lost:
                # A restarted, flushed or promoted node lost the script: those calls did not run.
                # Load it where they run (their nodes, on a cluster) and send them again.
                await self._scripts.load("record_decision", [calls[index][0].outcome for index in lost])
                for index, reply in zip(lost, await send([calls[index] for index in lost]), strict=True):
                    replies[index] = reply
        except REDIS_ERRORS as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc
        await self._unlist_pending(
            [member for (_keys, member, _args), reply in zip(calls, replies, strict=True) if _settled(reply)]
        )
        return replies

    async def _record_batch(
        self,
        decisions: Sequence[tuple[DecisionToCount, Callable[[], tuple[RequestKeys, str]]]],
        label: Callable[[int], str],
    ) -> list[DecisionResult | RequestNotFoundError | StoreError | ValueError | TypeError]:
        """``record_decision`` for each ``(decision, its keys and pending member)``, in one pipeline.

        The answer for each is its result, or the error recording it alone would have raised;
        ``label(index)`` names the request of the decision at ``index`` in its errors.

        Raises:
            StoreError: Redis is unreachable or failed (the whole pipeline).
        """
        answers: list[DecisionResult | RequestNotFoundError | StoreError | ValueError | TypeError] = []
        calls: list[tuple[RequestKeys, str, list[Any]]] = []
        sent: list[int] = []  # the answer slot of each call
        for item, where in decisions:
            try:
                _check_decision(item.kind, item.signer, item.decision)
                keys, member = where()
            except (ValueError, TypeError) as exc:
                answers.append(exc)
                continue
            sent.append(len(answers))
            answers.append(StoreError("not sent"))  # replaced below
            args = _record_args(item.kind, item.signer, item.decision, _now(item.now), item.policy)
            calls.append((keys, member, args))
        if not calls:
            return answers
        for slot, reply in zip(sent, await self._record_many(calls), strict=True):
            if isinstance(reply, redis.exceptions.RedisError):
                answers[slot] = StoreError(describe_redis_error(self._url, reply))
                continue
            try:
                answers[slot] = _decision_result(reply, label(slot))
            except RequestNotFoundError as exc:
                answers[slot] = exc
        return answers

    async def _get(
        self, keys: RequestKeys, request_id: str, origin: str | None, *, deliveries: bool = False
    ) -> StoredRequest | None:
        with converting(self._url):
            read = await read_request(self._scripts, keys, deliveries=deliveries)
        stored = _stored(request_id, origin, read.document, read.outcome, read.decisions)
        if stored is None or not read.deliveries:
            return stored
        states = {}
        for peer, raw in sorted(read.deliveries.items()):
            state = _delivery_state(raw)
            if state is not None:
                states[_name(peer)] = state
        return dataclasses.replace(stored, deliveries=states)

    async def _wait(
        self,
        keys: RequestKeys,
        member: str,
        timeout: float,
        clock: Callable[[], float],
        label: str,
        counted: tuple[int, int] | None = None,
    ) -> None:
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, not {timeout}")
        deadline = time.monotonic() + timeout
        with converting(self._url):
            # One script reads the state and the last event id, so no outcome slips between them.
            start = await read_wait_start(self._scripts, keys)
            if start.state is None:
                raise RequestNotFoundError(f"{label} is not stored here (it never arrived, or it expired)")
            state, expires_at = _state(start.state), int(start.expires_at or 0)
            if counted is not None and (int(start.approvals or 0), int(start.denials or 0)) != counted:
                return  # the counts moved since the caller last looked: it wants to know at once
            last_id: bytes | str = start.last_id or "0-0"
            while state == "pending":
                now = clock()
                if int(now) > expires_at:
                    settled = await self._record(
                        keys, member, kind="", signer="", decision=b"", now=int(now), label=label
                    )
                    state = settled.state
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                # Wake just after expiry to settle it; never block longer than the socket allows.
                block = min(remaining, self._options.max_block_seconds, expires_at + 1 - now)
                reply = await self._blocking.xread(
                    {keys.events: last_id}, count=64, block=max(1, int(block * 1000))
                )
                moved = False
                for _stream, entries in _stream_entries(reply):
                    for entry_id, fields in entries:
                        last_id = entry_id
                        if fields.get(b"type") == b"outcome":
                            state = _state(fields.get(b"state"))
                        elif counted is not None and fields.get(b"type") == b"decision":
                            now_counted = (int(fields.get(b"approvals", 0)), int(fields.get(b"denials", 0)))
                            moved = moved or now_counted != counted
                if moved:
                    return

    async def _list(
        self,
        build: Callable[[str], tuple[RequestKeys, str, str | None]],
        state: RequestState | None,
        now: int | None,
        limit: int,
    ) -> list[StoredRequest]:
        """List up to ``limit`` requests: the pending ones first, exactly, then (``state=None``) the rest.

        Pending ones come from the pending set, which holds no decided request: however many
        decided or expired requests sort before a pending one, it is found on the first page.
        Cost: O(log N + limit + S) with S the stale members met (a request settled by a call
        that crashed before removing it, or a ref whose request is not, or not yet, stored); each
        settled one is removed as it is met, so it costs once. Other states are read from the
        index's first ``limit`` entries in expiry order, as before.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``limit`` is out of range.
        """
        if not 1 <= limit <= MAX_LISTED:
            raise ValueError(f"limit must be between 1 and {MAX_LISTED}, not {limit}")
        at = _now(now)
        with converting(self._url):
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(self._index_key, "-inf", at - REQUEST_RETENTION_SECONDS)
                # Past expires_at a request is expired, never pending (it may not be settled yet).
                pipe.zremrangebyscore(self._pending_key, "-inf", f"({at}")
                await pipe.execute()
            if state not in (None, "pending"):
                members = await self._client.zrangebyscore(
                    self._index_key, "-inf", "+inf", start=0, num=limit
                )
                names = [_name(member) for member in members]
                return [item for _member, item in await self._read(build, names) if item.state == state]
            pending = await self._page(self._pending_key, build, at, limit, pending_only=True)
            if state == "pending" or len(pending) == limit:
                return [item for _member, item in pending]
            # The rest, by expiry: every pending one is listed already (the set ran out first).
            rest = await self._page(
                self._index_key,
                build,
                "-inf",
                limit - len(pending),
                skip=frozenset(name for name, _item in pending),
                pending_only=False,
            )
        return [item for _member, item in pending + rest]

    async def _page(
        self,
        key: str,
        build: Callable[[str], tuple[RequestKeys, str, str | None]],
        low: int | str,
        want: int,
        *,
        skip: frozenset[str] = frozenset(),
        pending_only: bool,
    ) -> list[tuple[str, StoredRequest]]:
        """Read sorted set ``key`` from score ``low`` on, page by page, until ``want`` stored requests.

        Members in ``skip`` are passed over unread. With ``pending_only`` (the pending set), a
        member whose request is stored but settled is removed as it is met, so no later listing
        reads it again. A member whose request is not stored is passed over, not removed: its
        request may be on its way (the sets are written first); it leaves at its expiry.
        """
        found: list[tuple[str, StoredRequest]] = []
        offset = 0
        while len(found) < want:
            need = want - len(found)
            page = need + len(skip)  # names cost little; only the chosen ones are read
            names = [
                _name(m) for m in await self._client.zrangebyscore(key, low, "+inf", start=offset, num=page)
            ]
            chosen: list[str] = []
            used = 0
            for position, name in enumerate(names):
                if len(chosen) == need:
                    break
                used = position + 1
                if name not in skip:
                    chosen.append(name)
            settled: list[str] = []
            for name, item in await self._read(build, chosen):
                if not pending_only or item.state == "pending":
                    found.append((name, item))
                else:
                    settled.append(name)
            if settled:
                await self._unlist_pending(settled)  # pending_only: key is the pending set
            # Removed members no longer take a place: the next page starts right after the used ones.
            offset += used - len(settled)
            if used == len(names) and len(names) < page:
                break  # the set ended
        return found

    async def _read(
        self, build: Callable[[str], tuple[RequestKeys, str, str | None]], names: list[str]
    ) -> list[tuple[str, StoredRequest]]:
        """Read the requests of index members ``names`` in one pipeline, in order, leaving out the
        ones not stored."""
        if not names:
            return []
        refs = [build(name) for name in names]
        async with self._client.pipeline(transaction=False) as pipe:
            for keys, _request_id, _origin in refs:
                pipe.get(keys.doc)
                pipe.hgetall(keys.outcome)
                pipe.hgetall(keys.decisions)
            replies = await pipe.execute()
        read: list[tuple[str, StoredRequest]] = []
        for index, (name, (_keys, request_id, origin)) in enumerate(zip(names, refs, strict=True)):
            document, outcome, decisions = replies[3 * index : 3 * index + 3]
            stored = _stored(request_id, origin, document, outcome, decisions)
            if stored is not None:
                read.append((name, stored))
        return read


def _name(member: Any) -> str:
    """A sorted-set member as text (the client answers bytes)."""
    return member.decode() if isinstance(member, bytes) else str(member)


def _stream_entries(reply: Any) -> list[tuple[Any, list[tuple[Any, dict[bytes, bytes]]]]]:
    """Normalise an XREAD reply (a RESP2 list or a RESP3 mapping) to ``[(stream, entries)]``."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply.items())
    return [(stream, entries) for stream, entries in reply]


def _stored(
    request_id: str,
    origin: str | None,
    document: bytes | None,
    outcome: dict[bytes, bytes],
    decisions: dict[bytes, bytes],
) -> StoredRequest | None:
    if document is None or not outcome:
        return None
    approvals: dict[str, bytes] = {}
    denials: dict[str, bytes] = {}
    for name, value in decisions.items():
        kind, _, signer = name.decode().partition(":")
        (approvals if kind == "approval" else denials)[signer] = value
    decided_at = outcome.get(b"decided_at")
    return StoredRequest(
        request_id=request_id,
        origin=origin,
        document=document,
        state=_state(outcome[b"state"]),
        required=int(outcome[b"required"]),
        peers=int(outcome[b"peers"]),
        expires_at=int(outcome[b"expires_at"]),
        accepted_at=int(outcome[b"accepted_at"]),
        decided_at=int(decided_at) if decided_at is not None else None,
        approvals=approvals,
        denials=denials,
        queued=b"queued" in outcome,
        withdrawal=outcome.get(b"withdrawal"),
        settlement=outcome.get(b"settlement"),
    )


def _decision_result(reply: Any, label: str) -> DecisionResult:
    """Read ``record_decision``'s answer: state, approvals, denials, counted, decided.

    Raises:
        RequestNotFoundError: the script found no request (``label`` names it in the message).
    """
    state, approvals, denials, counted, decided = reply
    if state == b"unknown":
        raise RequestNotFoundError(f"{label} is not stored here (it never arrived, or it expired)")
    return DecisionResult(
        state=_state(state),
        approvals=int(approvals),
        denials=int(denials),
        counted=bool(counted),
        decided=bool(decided),
    )


def _settled(reply: Any) -> bool:
    """True when a raw ``record_decision`` reply says that call settled the outcome."""
    if isinstance(reply, Exception):
        return False
    try:
        return _decision_result(reply, "").decided
    except (RequestNotFoundError, ValueError, TypeError):
        return False


def _check_decision(kind: str, signer: str, decision: bytes) -> None:
    if kind not in _DECISION_KINDS:
        raise ValueError(f"decision kind must be 'approval' or 'denial', not {kind!r}")
    if not AGENT_ID_PATTERN.fullmatch(signer):
        raise ValueError(f"signer {signer!r} is not a valid agent id")
    _check_document("decision", decision)


class RequestBook(_Book):
    """This node's own requests: stored when its agent submits one, counted as peers decide.

    Every method is one or two round trips; the counting is one Lua script, so concurrent relay
    workers recording decisions for the same request settle its outcome exactly once.
    """

    def __init__(
        self,
        client: AsyncClient,
        scripts: AsyncScripts,
        *,
        keys: Keys,
        url: str,
        options: StoreOptions,
        blocking: AsyncClient | None = None,
    ) -> None:
        super().__init__(
            client,
            scripts,
            url=url,
            index_key=keys.request_index(),
            pending_key=keys.request_pending(),
            options=options,
            blocking=blocking,
        )
        self._keys = keys

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
        return await self._accept(
            self._acceptance(
                request_id,
                document,
                required_approvals=required_approvals,
                peers=peers,
                expires_at=expires_at,
                now=now,
            )
        )

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
        one = self._acceptance(
            request_id,
            document,
            required_approvals=required_approvals,
            peers=peers,
            expires_at=expires_at,
            now=now,
        )
        if not self._one_server:
            return await self._submit_in_steps(one, queue, deliveries, now)
        entries = [
            queue.entry(target, request_id, payload, expires_at, now=now) for target, payload in deliveries
        ]
        keys = [*one.keys, self._index_key, self._pending_key, queue.stream]
        # Every entry of one queue has the same arguments (its fields are fixed): one width.
        args = [
            one.member,
            expires_at,
            one.ttl_ms,
            *one.args,
            len(entries),
            len(entries[0]) if entries else 0,
        ]
        for entry in entries:
            args.extend(entry)
        with converting(self._url):
            status, state, *entry_ids = await self._scripts.run("submit_request", keys, args)
        accepted = one.result(status, state)
        for entry_id in entry_ids:
            queue.entry_id(entry_id)  # "" is a full queue: StoreError
        return accepted

    async def _submit_in_steps(
        self, one: _Acceptance, queue: DeliveryQueue, deliveries: Sequence[tuple[str, bytes]], now: int | None
    ) -> AcceptResult:
        """:meth:`submit` on a cluster: the request accepted, then its deliveries queued."""
        accepted = await self._accept(one)
        if accepted.state == "pending":
            await asyncio.gather(
                *(
                    queue.enqueue(target, one.request_id, payload, one.expires_at, now=now)
                    for target, payload in deliveries
                )
            )
        return accepted

    async def get(self, request_id: str) -> StoredRequest | None:
        """Return the stored request, or None when it is not (or no longer) stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``request_id`` is malformed.
        """
        return await self._get(self._keys.request(request_id), request_id, None, deliveries=True)

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
        _check_decision(kind, signer, decision)
        return await self._record(
            self._keys.request(request_id),
            request_id,
            kind=kind,
            signer=signer,
            decision=decision,
            now=now,
            label=f"request {request_id}",
            policy=policy,
        )

    async def record_decisions(
        self, decisions: Sequence[DecisionToCount]
    ) -> list[DecisionResult | RequestNotFoundError | StoreError | ValueError | TypeError]:
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
            [(item, functools.partial(self._where, item.request_id)) for item in decisions],
            lambda index: f"request {decisions[index].request_id}",
        )

    def _where(self, request_id: str) -> tuple[RequestKeys, str]:
        """The keys and the pending member of an own request."""
        return self._keys.request(request_id), request_id

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
        if state not in _DELIVERY_STATES:
            raise ValueError(f"delivery state must be one of {', '.join(_DELIVERY_STATES)}, not {state!r}")
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
        return await self._withdraw(
            self._keys.request(request_id),
            request_id,
            withdrawal=withdrawal,
            now=now,
            label=f"request {request_id}",
        )

    async def settle_expiry(self, request_id: str, *, now: int | None = None) -> DecisionResult:
        """Mark the request expired if ``now`` is past its expiry and nothing settled it before.

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: ``request_id`` is malformed.
        """
        return await self._record(
            self._keys.request(request_id),
            request_id,
            kind="",
            signer="",
            decision=b"",
            now=now,
            label=f"request {request_id}",
        )

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
        keys = self._keys.request(request_id)
        label = f"request {request_id}"
        await self._wait(keys, request_id, timeout, clock, label, counted)
        stored = await self._get(keys, request_id, None, deliveries=True)
        if stored is None:
            raise RequestNotFoundError(f"{label} is not stored here (it never arrived, or it expired)")
        return stored

    async def list_requests(
        self, *, state: RequestState | None = "pending", now: int | None = None, limit: int = 100
    ) -> list[StoredRequest]:
        """Return stored requests in order of expiry, only those in ``state``.

        ``state=None`` lists the pending ones first, then the others: decided or expired requests
        never hide a pending one, whatever ``limit`` (see ``_Book._list`` for the cost).

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``limit`` is out of range.
        """
        return await self._list(self._ref, state, now, limit)

    def _ref(self, member: str) -> tuple[RequestKeys, str, str | None]:
        return self._keys.request(member), member, None


class InboxBook(_Book):
    """Requests received from peer origins, keyed by ``(origin, request_id)``, and this node's decision.

    The node's own decision is counted with ``required = peers = 1``: its first approval settles
    ``approved``, its first denial ``denied``, so a decided item leaves the pending listing, and
    nothing recorded after that changes it (rule 6 never applies here: a decided item counts no more).
    """

    def __init__(
        self,
        client: AsyncClient,
        scripts: AsyncScripts,
        *,
        keys: Keys,
        url: str,
        options: StoreOptions,
    ) -> None:
        super().__init__(
            client,
            scripts,
            url=url,
            index_key=keys.inbox_index(),
            pending_key=keys.inbox_pending(),
            options=options,
        )
        self._keys = keys

    def _ref(self, member: str) -> tuple[RequestKeys, str, str | None]:
        origin, _, request_id = member.partition("/")
        return self._keys.inbox_item(origin, request_id), request_id, origin

    def _held(self, members: list[str]) -> dict[str, list[str]]:
        held: dict[str, list[str]] = {}
        for member in members:
            try:
                key = self._keys.inbox_held(member.partition("/")[0])
            except ValueError:
                continue  # no ref of a request this inbox took in
            held.setdefault(key, []).append(member)
        return held

    async def accept(
        self, origin: str, request_id: str, document: bytes, *, expires_at: int, now: int | None = None
    ) -> AcceptResult:
        """Store a verified request from ``origin`` once; the same bytes again are the same request.

        Raises:
            RequestConflictError: other bytes are already stored for this origin and id.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id, or a document too large.
            TypeError: ``document`` is not bytes.
        """
        return await self._accept(self._item(origin, request_id, document, expires_at=expires_at, now=now))

    def _item(
        self, origin: str, request_id: str, document: bytes, *, expires_at: int, now: int | None
    ) -> _Acceptance:
        """One received request's accept, checked and encoded (:meth:`accept`, :meth:`receive`)."""
        return self._acceptance(
            f"{origin}/{request_id}",
            document,
            required_approvals=1,
            peers=1,
            expires_at=expires_at,
            now=now,
        )

    async def receive(
        self,
        origin: str,
        request_id: str,
        document: bytes,
        *,
        expires_at: int,
        intake: Intake,
        payload: bytes,
        now: int | None = None,
    ) -> ReceiveResult:
        """Take a verified request from ``origin`` in: hold, charge, store, queue and mark it; or say why not.

        A peer relay's steps for a new request, in their order: nothing when the request is stored
        already (``stored_before``: the caller reads it and answers a repeat, and no window is
        charged); else the request is counted against what its origin may hold pending in this
        inbox, ``intake.max_pending`` (``full`` when it holds that many already: nothing is
        charged or written); else one call against the intake's window (a refusal writes
        nothing: the hold is taken back); else :meth:`accept`, then, while it is pending, one entry
        ``payload`` for the intake's target on its queue, and :meth:`mark_queued`. A request leaves
        its origin's count when it is decided, withdrawn or expires. On one server the five are
        one script (``receive_request.lua``): one round trip and one sync, and no crash between
        two of them. On a cluster their keys have several hash tags, so they run one by one, as
        their own methods do; a crash between two leaves the item unqueued or unmarked, and the
        origin's repeat completes it (a hold left behind counts the request once until it expires).

        Raises:
            StoreError: Redis is unreachable or failed, or the queue is full (the request is stored
                then, not queued).
            ValueError: a malformed origin, id, window or limit, a document too large, or an entry
                the queue refuses.
            TypeError: ``document`` or ``payload`` is not bytes.
        """
        one = self._item(origin, request_id, document, expires_at=expires_at, now=now)
        if intake.max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {intake.max_pending}")
        held_key = self._keys.inbox_held(origin)
        if not self._one_server:
            return await self._receive_in_steps(origin, one, intake, payload, now, held_key)
        limiter, queue = intake.limiter, intake.queue
        window_key, charge = limiter.charge(intake.window, intake.limit, now=now)
        entry = queue.entry(intake.target, request_id, payload, expires_at, now=now)
        keys = [*one.keys, self._index_key, self._pending_key, window_key, queue.stream, held_key]
        hold = [intake.max_pending, _held_ms(one)]
        args = [one.member, expires_at, one.ttl_ms, *charge, *one.args, *hold, *entry]
        with converting(self._url):
            reply = await self._scripts.run("receive_request", keys, args)
        status = reply[0]
        if status == b"stored":
            return ReceiveResult(stored_before=True)
        if status == b"full":
            return ReceiveResult(stored_before=False, full=True, held=int(reply[1]))
        if status == b"refused":
            return ReceiveResult(stored_before=False, decision=limiter.decision(reply[1]))
        _created, state, remaining, entry_id = reply
        accepted = one.result(b"created", state)
        queued = queue.entry_id(entry_id) if accepted.state == "pending" else None
        return _received(limiter.decision(remaining), accepted, queued)

    async def _receive_in_steps(
        self, origin: str, one: _Acceptance, intake: Intake, payload: bytes, now: int | None, held_key: str
    ) -> ReceiveResult:
        """:meth:`receive` on a cluster: each step its own call, in the script's order."""
        if await self.exists(origin, one.request_id):
            return ReceiveResult(stored_before=True)
        hold = [one.member, one.expires_at, one.at, intake.max_pending, _held_ms(one)]
        with converting(self._url):
            held = await self._scripts.run("hold", [held_key], hold)
        if held < 0:
            return ReceiveResult(stored_before=False, full=True, held=-held)
        decision = await intake.limiter.hit(intake.window, intake.limit, now=now)
        if not decision.allowed:
            with converting(self._url):
                await self._client.zrem(held_key, one.member)  # as the script takes its hold back
            return ReceiveResult(stored_before=False, decision=decision)
        try:
            accepted = await self._accept(one)
        except RequestConflictError:
            return ReceiveResult(stored_before=True)  # stored between the look and here: a concurrent copy
        entry_id = None  # accepted already expired: _accept took it out of the pending and held sets
        if accepted.state == "pending":
            entry_id = await intake.queue.enqueue(
                intake.target, one.request_id, payload, one.expires_at, now=now
            )
            await self.mark_queued(origin, one.request_id, entry_id)
        return _received(decision, accepted, entry_id)

    async def get(self, origin: str, request_id: str) -> StoredRequest | None:
        """Return the received request, or None when it is not (or no longer) stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        return await self._get(self._keys.inbox_item(origin, request_id), request_id, origin)

    async def exists(self, origin: str, request_id: str) -> bool:
        """True when a request from ``origin`` is stored under ``request_id``: one EXISTS, cheaper
        than :meth:`get` on the path of every new request.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        keys = self._keys.inbox_item(origin, request_id)
        with converting(self._url):
            return bool(await self._client.exists(keys.doc))

    async def mark_queued(self, origin: str, request_id: str, entry_id: str) -> bool:
        """Note that the received request was queued for the approver (``StoredRequest.queued``).

        Queue the entry first, then mark: an unmarked item is queued again by the next repeat
        of the request, a marked one never (a captured request re-posted cannot fill the queue).

        Returns:
            True when marked; False when no such request is stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        keys = self._keys.inbox_item(origin, request_id)
        with converting(self._url):
            marked = await self._scripts.run("mark_queued", [keys.outcome], [entry_id])
        return bool(marked)

    async def record_decision(
        self,
        origin: str,
        request_id: str,
        *,
        kind: DecisionKind,
        signer: str,
        decision: bytes,
        now: int | None = None,
    ) -> DecisionResult:
        """Record this node's signed decision on a received request (the first one settles it).

        Raises:
            RequestNotFoundError: no such request was received (or it expired and was removed).
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin, id, kind or signer, or a decision too large.
            TypeError: ``decision`` is not bytes.
        """
        _check_decision(kind, signer, decision)
        return await self._record(
            self._keys.inbox_item(origin, request_id),
            f"{origin}/{request_id}",
            kind=kind,
            signer=signer,
            decision=decision,
            now=now,
            label=f"request {request_id} from {origin}",
        )

    async def settle(
        self, origin: str, request_id: str, *, settlement: bytes, now: int | None = None
    ) -> SettleResult:
        """Mark a received request ``settled`` on its origin's verified evidence (``settle_elsewhere``).

        A pending item becomes ``settled`` (final); an item this node decided keeps its decision and
        gains the evidence; a withdrawn, expired or already settled one is left as it is.

        Raises:
            RequestNotFoundError: no such request was received (or it expired and was removed).
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id, or evidence too large.
            TypeError: ``settlement`` is not bytes.
        """
        return await self._settle_elsewhere(
            self._keys.inbox_item(origin, request_id),
            f"{origin}/{request_id}",
            settlement=settlement,
            now=now,
            label=f"request {request_id} from {origin}",
        )

    async def withdraw(
        self, origin: str, request_id: str, *, withdrawal: bytes, now: int | None = None
    ) -> WithdrawResult:
        """Mark a received request ``withdrawn`` by its origin (see :meth:`RequestBook.withdraw`).

        An item this node decided first keeps its decision (``approved``/``denied``).

        Raises:
            RequestNotFoundError: no such request was received (or it expired and was removed).
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id, or a withdrawal too large.
            TypeError: ``withdrawal`` is not bytes.
        """
        return await self._withdraw(
            self._keys.inbox_item(origin, request_id),
            f"{origin}/{request_id}",
            withdrawal=withdrawal,
            now=now,
            label=f"request {request_id} from {origin}",
        )

    def _where(self, origin: str, request_id: str) -> tuple[RequestKeys, str]:
        """The keys and the pending member of a received request."""
        return self._keys.inbox_item(origin, request_id), f"{origin}/{request_id}"

    async def get_many(self, refs: Sequence[tuple[str, str]]) -> list[StoredRequest | None]:
        """:meth:`get` for many ``(origin, request_id)`` in one round trip (a pipeline, in order).

        Each item's document, outcome and decisions are read together, but no transaction holds
        the batch (on a cluster, the client splits the pipeline by node): a decision recorded
        meanwhile may show in one item's outcome and not in its decisions. The document never
        changes, which is what the relay's own-decision path reads it for.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        if not refs:
            return []
        keys = [self._keys.inbox_item(origin, request_id) for origin, request_id in refs]
        with converting(self._url):
            async with self._client.pipeline(transaction=False) as pipe:
                for item in keys:
                    pipe.get(item.doc)
                    pipe.hgetall(item.outcome)
                    pipe.hgetall(item.decisions)
                replies = await pipe.execute()
        return [
            _stored(request_id, origin, *replies[3 * index : 3 * index + 3])
            for index, (origin, request_id) in enumerate(refs)
        ]

    async def record_decisions(
        self, decisions: Sequence[tuple[str, DecisionToCount]]
    ) -> list[DecisionResult | RequestNotFoundError | StoreError | ValueError | TypeError]:
        """:meth:`record_decision` for many ``(origin, decision)`` in one round trip, pipelined.

        Each is recorded exactly as :meth:`record_decision` records it alone; the answer for each
        is its result or the error it alone would have raised (see ``RequestBook.record_decisions``).

        Raises:
            StoreError: Redis is unreachable or failed (recording again is harmless).
        """
        return await self._record_batch(
            [(item, functools.partial(self._where, origin, item.request_id)) for origin, item in decisions],
            lambda index: f"request {decisions[index][1].request_id} from {decisions[index][0]}",
        )

    async def list_requests(
        self, *, state: RequestState | None = "pending", now: int | None = None, limit: int = 100
    ) -> list[StoredRequest]:
        """Return received requests in order of expiry, only those in ``state``.

        ``state=None`` lists the pending ones first, then the others: decided or expired items
        never hide a pending one, whatever ``limit``. A pending listing reads the pending set,
        never the decided items: O(log N + limit) (see ``_Book._list``).

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``limit`` is out of range.
        """
        return await self._list(self._ref, state, now, limit)
