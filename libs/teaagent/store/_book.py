"""The engine under both request books: accept once, count, withdraw, settle, read, wait and list.

A node keeps two books of the same shape (``teaagent.store._keys``): its own requests
(``RequestBook``, by request id) and the requests peers sent it (``InboxBook``, by origin and
request id). Each request is a handful of keys under its own hash tag, changed only by Lua
scripts; each book also keeps an index of every ref and a set of the pending ones, sorted by
expiry, for listing. What differs between one server and a Redis Cluster (whether steps on other
hash tags may share a round trip or a script) is the book's ``Shape`` (``_shapes``), chosen once
when the book is built.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis.exceptions

from teaagent.errors import RequestNotFoundError, StoreError
from teaagent.store._connection import (
    REDIS_ERRORS,
    AsyncClient,
    StoreOptions,
    converting,
    describe_redis_error,
)
from teaagent.store._keys import REQUEST_RETENTION_SECONDS, Keys, RequestKeys
from teaagent.store._reads import read_request, read_wait_start, request_read
from teaagent.store._refs import MAX_EVENTS, Acceptance, Ref, check_decision, check_document, now_seconds
from teaagent.store._results import (
    AcceptResult,
    DecisionResult,
    DecisionToCount,
    QueuedDecision,
    RequestState,
    SettleResult,
    StoredRequest,
    WithdrawResult,
    decision_result,
    delivery_state,
    not_stored,
    request_state,
    settled,
    stored_request,
)
from teaagent.store._scripts import AsyncScripts
from teaagent.store._shapes import Outgoing, Shape, shape_of

if TYPE_CHECKING:
    from teaagent.store._queue import DeliveryQueue

__all__ = ["Answer", "Book"]

MAX_LISTED = 1000  # one listing call returns at most this many requests

# Each recorded answer of a batch: the result, or the error recording it alone would have raised.
Answer = DecisionResult | RequestNotFoundError | StoreError | ValueError | TypeError

logger = logging.getLogger(__name__)


def _record_args(kind: str, signer: str, decision: bytes, now: int, policy: str) -> list[Any]:
    """``record_decision``'s ARGV; the policy only when there is one (version 1 calls stay as they were)."""
    args: list[Any] = [kind, signer, decision, now, MAX_EVENTS]
    if policy:
        args.append(policy)
    return args


def _record_keys(keys: RequestKeys) -> list[str]:
    return [keys.outcome, keys.decisions, keys.events]


def _checked(
    decisions: Sequence[tuple[DecisionToCount, Callable[[], Ref]]],
) -> tuple[list[Any], list[int], list[tuple[Ref, list[Any]]]]:
    """Each ``(decision, its ref)`` checked: the answers so far (the error of each refused one), the
    answer slot of each call to send, and each call's ref and ``record_decision`` ARGV."""
    answers: list[Any] = []
    calls: list[tuple[Ref, list[Any]]] = []
    sent: list[int] = []
    for item, where in decisions:
        try:
            check_decision(item.kind, item.signer, item.decision)
            ref = where()
        except (ValueError, TypeError) as exc:
            answers.append(exc)
            continue
        sent.append(len(answers))
        answers.append(StoreError("not sent"))  # replaced by the caller
        args = _record_args(item.kind, item.signer, item.decision, now_seconds(item.now), item.policy)
        calls.append((ref, args))
    return answers, sent, calls


class Book:
    """The engine shared by a node's own requests and its inbox; the public classes name the refs."""

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
        self._client = client
        self._blocking = blocking or client  # the outcome waits' XREAD BLOCK, on a pool of its own
        self._scripts = scripts
        self._keys = keys
        self._url = url
        # Every ref by expiry, and the pending members of the index only, same scores.
        self._index_key, self._pending_key = self._sets(keys)
        self._options = options
        self._shape: Shape = shape_of(client)  # one server, or a cluster: how steps may be grouped

    def _sets(self, keys: Keys) -> tuple[str, str]:
        """The book's index and pending set."""
        raise NotImplementedError

    def _ref(self, member: str) -> Ref:
        """The ref of index member ``member``."""
        raise NotImplementedError

    def _acceptance(
        self,
        ref: Ref,
        document: bytes,
        expires_at: int,
        now: int | None,
        *,
        required_approvals: int = 1,
        peers: int = 1,
    ) -> Acceptance:
        """One accept, checked and encoded: the ``accept_request`` script's keys and arguments."""
        check_document("document", document)
        if required_approvals < 1 or peers < required_approvals:
            raise ValueError(
                f"required_approvals must be between 1 and peers ({peers}), not {required_approvals}"
            )
        at = now_seconds(now)
        return Acceptance(
            ref=ref,
            document=document,
            required=required_approvals,
            peers=peers,
            expires_at=expires_at,
            at=at,
            ttl_ms=(max(expires_at - at, 0) + REQUEST_RETENTION_SECONDS) * 1000,
            args=[document, required_approvals, peers, expires_at, at, REQUEST_RETENTION_SECONDS, MAX_EVENTS],
        )

    async def _accept(self, one: Acceptance) -> AcceptResult:
        with converting(self._url):
            # The index entries go first: a listed ref may lack its request (skipped), never the
            # reverse, so a crash between the two steps never leaves a pending request unlisted.
            status, state = await self._shape.accept(self, one)
            if state != b"pending":
                # Accepted already expired, or a repeat of a settled request: not pending after all.
                await self._unlist_pending([one.ref.member])
        return one.result(status, state)

    async def _exists(self, ref: Ref) -> bool:
        with converting(self._url):
            return bool(await self._client.exists(ref.keys.doc))

    async def _mark_queued(self, ref: Ref, entry_id: str) -> bool:
        with converting(self._url):
            marked = await self._scripts.run("mark_queued", [ref.keys.outcome], [entry_id])
        return bool(marked)

    def _recording(self, calls: list[tuple[Ref, list[Any]]]) -> tuple[str, list[tuple[list[str], list[Any]]]]:
        """The script, and its calls' keys and arguments, that record each ``(ref, args)``
        (``record_decision``'s ARGV); the script is ``record_unlist`` when the calls take what they
        settle out of the pending set (and its origin's held set) themselves.

        A lone call on one server does (no step after it). A batch unlists what it settled after,
        in one command for all of it (:meth:`_unlist_pending`), cheaper than a ZREM in each call;
        so does every call on a cluster, where the sets are on other nodes.
        """
        if len(calls) > 1 or not self._shape.spans_tags:
            return "record_decision", [(_record_keys(ref.keys), args) for ref, args in calls]
        return "record_unlist", [(self._unlisting_keys(ref), [ref.member, *args]) for ref, args in calls]

    def _unlisting_keys(self, ref: Ref) -> list[str]:
        """``record_unlist``'s keys for ``ref``: its counting keys, the pending set, its held sets."""
        return [*_record_keys(ref.keys), self._pending_key, *self._held([ref.member])]

    async def _record(
        self, ref: Ref, *, kind: str, signer: str, decision: bytes, now: int | None, policy: str = ""
    ) -> DecisionResult:
        script, [(keys, args)] = self._recording(
            [(ref, _record_args(kind, signer, decision, now_seconds(now), policy))]
        )
        with converting(self._url):
            reply = await self._scripts.run(script, keys, args)
        result = decision_result(reply, ref.label)
        if result.decided and script == "record_decision":
            await self._unlist_pending([ref.member])
        return result

    async def _settle_expiry(self, ref: Ref, now: int | None) -> DecisionResult:
        """``record_decision`` with no decision: settles ``expired`` when ``now`` is past the expiry."""
        return await self._record(ref, kind="", signer="", decision=b"", now=now)

    async def _close(
        self, ref: Ref, script: str, name: str, evidence: bytes, now: int | None
    ) -> tuple[RequestState, bool]:
        """Run ``withdraw`` or ``settle_elsewhere`` (the origin's verified ``name``, ``evidence``):
        the state after it, and whether this call changed it."""
        check_document(name, evidence)
        with converting(self._url):
            state, changed = await self._scripts.run(
                script, [ref.keys.outcome, ref.keys.events], [evidence, now_seconds(now), MAX_EVENTS]
            )
        if state == b"unknown":
            raise not_stored(ref.label)
        result = request_state(state)
        if changed and result not in ("approved", "denied"):  # closed here: no longer pending
            await self._unlist_pending([ref.member])
        return result, bool(changed)

    async def _withdraw(self, ref: Ref, withdrawal: bytes, now: int | None) -> WithdrawResult:
        state, changed = await self._close(ref, "withdraw", "withdrawal", withdrawal, now)
        return WithdrawResult(state=state, withdrawn=changed and state == "withdrawn")

    async def _settle_elsewhere(self, ref: Ref, settlement: bytes, now: int | None) -> SettleResult:
        state, changed = await self._close(ref, "settle_elsewhere", "settlement", settlement, now)
        return SettleResult(state=state, changed=changed)

    def _held(self, members: list[str]) -> dict[str, list[str]]:
        """The sets that count ``members`` against a cap (an inbox's origins'), each with its members."""
        return {}

    async def _unlist_pending(self, members: list[str]) -> None:
        """Remove settled requests from the pending set, and from their origin's held set in an
        inbox: a step after the script, not inside it (but for a decision on one server:
        ``record_unlist``).

        The sets have no hash tag of a request, so on a Redis Cluster no request's script may
        touch them. Never raises: the outcome is settled and stored by then, and a member left
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

    async def _record_many(self, calls: list[tuple[Ref, list[Any]]]) -> list[Any]:
        """Record each ``(ref, args)`` (``record_decision``'s ARGV) in one pipeline; return the raw replies.

        No transaction: each script call is atomic on its own and they touch different requests'
        keys (on a cluster, the client splits the pipeline by node). A reply is the exception
        Redis answered for that call alone (``raise_on_error=False``). The requests the batch
        settled leave the pending set in one more command (a lone call on one server: in its own
        script, :meth:`_recording`).

        Raises:
            StoreError: Redis is unreachable or failed (the whole pipeline).
        """
        script, script_calls = self._recording(calls)
        try:
            replies = await self._scripts.run_many(script, script_calls)
        except REDIS_ERRORS as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc
        if script == "record_decision":
            await self._unlist_pending(
                [ref.member for (ref, _args), reply in zip(calls, replies, strict=True) if settled(reply)]
            )
        return replies

    async def _record_batch(
        self, decisions: Sequence[tuple[DecisionToCount, Callable[[], Ref]]]
    ) -> list[Answer]:
        """``record_decision`` for each ``(decision, its ref)``, in one pipeline.

        The answer for each is its result, or the error recording it alone would have raised.

        Raises:
            StoreError: Redis is unreachable or failed (the whole pipeline).
        """
        answers, sent, calls = _checked(decisions)
        if not calls:
            return answers
        for slot, (ref, _args), reply in zip(sent, calls, await self._record_many(calls), strict=True):
            answers[slot] = self._answer(reply, ref)
        return answers

    async def _record_queue_batch(
        self,
        decisions: Sequence[tuple[DecisionToCount, Callable[[], Ref], Outgoing]],
        queue: DeliveryQueue,
        inbox: DeliveryQueue,
    ) -> list[QueuedDecision | Exception]:
        """:meth:`_record_batch`, and each decision a call counted queued on ``queue``: its
        ``(target, payload, expires_at)``, under its request's id; each item it settled and queued
        then leaves the approver's queue, ``inbox``.

        On one server each is one ``record_send`` call, all in one pipeline; on a cluster the
        records, then the counted ones' entries, each in one pipeline, then the settled items'
        approver entries. The answer for each is a
        :class:`QueuedDecision`, or the error recording it alone would have raised; a full queue
        is a ``StoreError`` (the decision is recorded: a repeat of it is queued by its caller).

        Raises:
            StoreError: Redis is unreachable or failed (the whole pipeline).
            ValueError: an entry the queue would refuse (nothing is sent then).
        """
        answers: list[QueuedDecision | Exception]
        answers, sent, calls = _checked([(item, where) for item, where, _outgoing in decisions])
        if not calls:
            return answers
        entries = []
        for slot in sent:
            item, _where, (target, payload, expires_at) = decisions[slot]
            entries.append((target, item.request_id, payload, expires_at))
        replies = await self._shape.record_send(self, calls, queue, entries, inbox)
        for slot, (ref, _args), (reply, entry_id) in zip(sent, calls, replies, strict=True):
            answer = self._answer(reply, ref)
            if not isinstance(answer, DecisionResult):
                answers[slot] = answer  # the error recording it alone would have raised
            elif isinstance(entry_id, StoreError):
                answers[slot] = entry_id  # recorded; the queue was full
            else:
                answers[slot] = QueuedDecision(answer, entry_id)
        return answers

    def _answer(self, reply: Any, ref: Ref) -> Answer:
        """One recorded decision's answer from its script's ``reply`` (a Redis error for it alone)."""
        if isinstance(reply, redis.exceptions.RedisError):
            return StoreError(describe_redis_error(self._url, reply))
        try:
            return decision_result(reply, ref.label)
        except RequestNotFoundError as exc:
            return exc

    async def _get(self, ref: Ref, *, deliveries: bool = False) -> StoredRequest | None:
        with converting(self._url):
            read = await read_request(self._scripts, ref.keys, deliveries=deliveries)
        stored = stored_request(ref.request_id, ref.origin, read.document, read.outcome, read.decisions)
        if stored is None or not read.deliveries:
            return stored
        states = {}
        for peer, raw in sorted(read.deliveries.items()):
            state = delivery_state(raw)
            if state is not None:
                states[_name(peer)] = state
        return dataclasses.replace(stored, deliveries=states)

    async def _get_many(self, refs: list[Ref]) -> list[StoredRequest | None]:
        """:meth:`_get` for many refs in one pipeline of ``read_request`` calls, in order: each item
        is read at one instant, but no transaction holds the batch.

        Raises:
            redis.exceptions.RedisError: the server failed (callers convert it).
        """
        if not refs:
            return []
        replies = await self._scripts.run_many(
            "read_request", [([ref.keys.doc, ref.keys.outcome, ref.keys.decisions], []) for ref in refs]
        )
        found: list[StoredRequest | None] = []
        for ref, reply in zip(refs, replies, strict=True):
            if isinstance(reply, Exception):
                raise reply
            read = request_read(reply)
            found.append(
                stored_request(ref.request_id, ref.origin, read.document, read.outcome, read.decisions)
            )
        return found

    async def _wait(
        self,
        ref: Ref,
        timeout: float,
        clock: Callable[[], float],
        counted: tuple[int, int] | None = None,
    ) -> None:
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0 seconds, not {timeout}")
        deadline = time.monotonic() + timeout
        keys = ref.keys
        with converting(self._url):
            # One script reads the state and the last event id, so no outcome slips between them.
            start = await read_wait_start(self._scripts, keys)
            if start.state is None:
                raise not_stored(ref.label)
            state, expires_at = request_state(start.state), int(start.expires_at or 0)
            if counted is not None and (int(start.approvals or 0), int(start.denials or 0)) != counted:
                return  # the counts moved since the caller last looked: it wants to know at once
            last_id: bytes | str = start.last_id or "0-0"
            while state == "pending":
                now = clock()
                if int(now) > expires_at:
                    state = (await self._settle_expiry(ref, int(now))).state
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
                            state = request_state(fields.get(b"state"))
                        elif counted is not None and fields.get(b"type") == b"decision":
                            now_counted = (int(fields.get(b"approvals", 0)), int(fields.get(b"denials", 0)))
                            moved = moved or now_counted != counted
                if moved:
                    return

    async def list_requests(
        self, *, state: RequestState | None = "pending", now: int | None = None, limit: int = 100
    ) -> list[StoredRequest]:
        """Return the book's requests (own, or received) in order of expiry, only those in ``state``.

        ``state=None`` lists the pending ones first, then the others: decided or expired requests
        never hide a pending one, whatever ``limit``. Pending ones come from the pending set,
        which holds no decided request: a pending listing never reads a decided one, however many
        sort before it. Cost: O(log N + limit + S) with S the stale members met (a request settled
        by a call that crashed before removing it, or a ref whose request is not, or not yet,
        stored); each settled one is removed as it is met, so it costs once. Other states are read
        from the index's first ``limit`` entries in expiry order.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``limit`` is out of range.
        """
        if not 1 <= limit <= MAX_LISTED:
            raise ValueError(f"limit must be between 1 and {MAX_LISTED}, not {limit}")
        at = now_seconds(now)
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
                return [item for _member, item in await self._read(names) if item.state == state]
            pending = await self._page(self._pending_key, at, limit, pending_only=True)
            if state == "pending" or len(pending) == limit:
                return [item for _member, item in pending]
            # The rest, by expiry: every pending one is listed already (the set ran out first).
            rest = await self._page(
                self._index_key,
                "-inf",
                limit - len(pending),
                skip=frozenset(name for name, _item in pending),
                pending_only=False,
            )
        return [item for _member, item in pending + rest]

    async def _page(
        self,
        key: str,
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
            gone: list[str] = []
            for name, item in await self._read(chosen):
                if not pending_only or item.state == "pending":
                    found.append((name, item))
                else:
                    gone.append(name)
            if gone:
                await self._unlist_pending(gone)  # pending_only: key is the pending set
            # Removed members no longer take a place: the next page starts right after the used ones.
            offset += used - len(gone)
            if used == len(names) and len(names) < page:
                break  # the set ended
        return found

    async def _read(self, names: list[str]) -> list[tuple[str, StoredRequest]]:
        """Read the requests of index members ``names`` in one pipeline, in order, leaving out the
        ones not stored."""
        stored = await self._get_many([self._ref(name) for name in names])
        return [(name, item) for name, item in zip(names, stored, strict=True) if item is not None]


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
