"""How a request book groups its steps: on one server, or on a Redis Cluster (a strategy per shape).

A request's keys share one hash tag; a book's index and pending set, an origin's held set, a
rate-limit window and a queue each have another (``teaagent.store._keys``). On one server every
key is on one node, so the steps of one operation may share a round trip or one script: storing
a request is its index entries and ``accept_request`` in one pipeline, submitting one is
``submit_request.lua``, receiving one is ``receive_request.lua``, and this node's decision on one
it received, recorded and queued for the origin, is ``record_send.lua``. On a cluster the steps whose keys
have other hash tags go one by one, in the scripts' order, and a step left undone by a crash is
completed by the caller's repeat. A book picks its shape once, when it is built (``shape_of``).

Each shape, ``OneServer`` and ``Cluster``, runs the four operations whose steps touch keys of more
than one hash tag: ``accept`` (the index entries, then ``accept_request``: its ``{status, state}``;
Redis errors raised as they are, for the caller to convert), ``submit`` (``RequestBook.submit``),
``receive`` (``InboxBook.receive``: look, hold in the origin's ``held_key``, charge, accept,
queue, mark) and ``record_send`` (``InboxBook.record_and_queue``: record, unlist once settled,
queue when counted).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import redis.asyncio.cluster
import redis.exceptions

from teaagent.errors import RequestConflictError, StoreError
from teaagent.store._connection import AsyncClient, converting
from teaagent.store._refs import Acceptance, Ref
from teaagent.store._results import AcceptResult, Intake, ReceiveResult, counted, received, settled
from teaagent.store._scripts import AsyncScripts

if TYPE_CHECKING:
    from teaagent.store._queue import DeliveryQueue

__all__ = [
    "CLUSTER",
    "ONE_SERVER",
    "Cluster",
    "Deliveries",
    "OneServer",
    "Outgoing",
    "Parts",
    "Sent",
    "Shape",
    "shape_of",
]

logger = logging.getLogger(__name__)

Deliveries = Sequence[tuple[str, bytes]]  # (target, payload): a peer and the body its relay is sent
# A recorded decision's delivery: (target, payload, expires_at), its request's origin, the body its
# relay is sent, the request's expiry.
Outgoing = tuple[str, bytes, int]
# What record_send answers for each call: its record_decision reply (or the Redis error of that call
# alone), and the entry id of its queued delivery, None when it was not queued, or the StoreError
# of a full queue.
Sent = tuple[Any, "str | StoreError | None"]


class Parts(Protocol):
    """What a shape runs a book's steps with: the book's own client, scripts and sets, and its
    steps on one request's keys (``teaagent.store._book.Book`` has them all)."""

    _client: AsyncClient
    _scripts: AsyncScripts
    _url: str
    _index_key: str  # every ref, by expiry
    _pending_key: str  # the pending refs only

    async def _accept(self, one: Acceptance) -> AcceptResult: ...

    async def _exists(self, ref: Ref) -> bool: ...

    async def _mark_queued(self, ref: Ref, entry_id: str) -> bool: ...

    def _unlisting_keys(self, ref: Ref) -> list[str]: ...

    async def _record_many(self, calls: list[tuple[Ref, list[Any]]]) -> list[Any]: ...


def _list_entries(pipe: Any, book: Parts, one: Acceptance) -> None:
    """Queue the accept's index entries on ``pipe``: NX (a document refused after must not move the
    stored request's entry), and a TTL that only grows."""
    for key in (book._index_key, book._pending_key):
        pipe.zadd(key, {one.ref.member: one.expires_at}, nx=True)
        pipe.pexpire(key, one.ttl_ms, nx=True)
        pipe.pexpire(key, one.ttl_ms, gt=True)


class OneServer:
    """Every key on one node: an operation's steps share one round trip, or are one script."""

    spans_tags = True  # a script may touch keys of several hash tags

    async def accept(self, book: Parts, one: Acceptance) -> tuple[bytes, bytes]:
        # Both in one pipeline, in that order (Redis runs a connection's commands in order, and
        # its append-only file keeps them so): one round trip, and the server syncs both at once.
        async with book._client.pipeline(transaction=False) as pipe:
            _list_entries(pipe, book, one)
            pipe.execute_command(*book._scripts.command("accept_request", one.keys, one.args))
            *listed, reply = await pipe.execute(raise_on_error=False)
        for failed in listed:
            if isinstance(failed, Exception):
                raise failed
        if isinstance(reply, redis.exceptions.NoScriptError):
            # The server lost the script (a restart, a flush): the index is in; load it and run it.
            await book._scripts.load("accept_request", one.keys)
            reply = await book._scripts.run("accept_request", one.keys, one.args)
        elif isinstance(reply, Exception):
            raise reply
        status, state = reply
        return status, state

    async def submit(
        self, book: Parts, one: Acceptance, queue: DeliveryQueue, deliveries: Deliveries, now: int | None
    ) -> AcceptResult:
        """One script (``submit_request.lua``): one round trip and one sync, and no crash between
        storing and queueing."""
        request_id, expires_at = one.ref.request_id, one.expires_at
        entries = [
            queue.entry(target, request_id, payload, expires_at, now=now) for target, payload in deliveries
        ]
        keys = [*one.keys, book._index_key, book._pending_key, queue.stream]
        # Every entry of one queue has the same arguments (its fields are fixed): one width.
        args = [
            one.ref.member,
            expires_at,
            one.ttl_ms,
            *one.args,
            len(entries),
            len(entries[0]) if entries else 0,
        ]
        for entry in entries:
            args.extend(entry)
        with converting(book._url):
            status, state, *entry_ids = await book._scripts.run("submit_request", keys, args)
        accepted = one.result(status, state)
        for entry_id in entry_ids:
            queue.entry_id(entry_id)  # "" is a full queue: StoreError
        return accepted

    async def receive(
        self, book: Parts, one: Acceptance, intake: Intake, payload: bytes, now: int | None, held_key: str
    ) -> ReceiveResult:
        """One script (``receive_request.lua``): one round trip and one sync, and no crash between
        two steps."""
        limiter, queue = intake.limiter, intake.queue
        window_key, charge = limiter.charge(intake.window, intake.limit, now=now)
        entry = queue.entry(intake.target, one.ref.request_id, payload, one.expires_at, now=now)
        keys = [
            *one.keys,
            book._index_key,
            book._pending_key,
            window_key,
            queue.stream,
            held_key,
        ]
        hold = [intake.max_pending, one.held_ms]
        args = [one.ref.member, one.expires_at, one.ttl_ms, *charge, *one.args, *hold, *entry]
        with converting(book._url):
            reply = await book._scripts.run("receive_request", keys, args)
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
        return received(limiter.decision(remaining), accepted, queued)

    async def record_send(
        self,
        book: Parts,
        calls: list[tuple[Ref, list[Any]]],
        queue: DeliveryQueue,
        entries: Sequence[tuple[str, str, bytes, int]],
        inbox: DeliveryQueue,
    ) -> list[Sent]:
        """One script per decision (``record_send.lua``), all in one pipeline: recorded, queued
        when counted and out of the approver's queue (``inbox``) once queued, in one round trip, and
        no crash between the steps."""
        script_calls = []
        for (ref, args), entry in zip(calls, entries, strict=True):
            enqueue = queue.entry(*entry)
            unlist = [ref.member, *args]
            keys = [*book._unlisting_keys(ref), queue.stream, inbox.stream]
            script_calls.append((keys, [len(unlist), *unlist, *enqueue]))
        with converting(book._url):
            replies = await book._scripts.run_many("record_send", script_calls)
        sent: list[Sent] = []
        for reply in replies:
            if isinstance(reply, Exception):
                sent.append((reply, None))
                continue
            *recorded, entry_id = reply
            sent.append((recorded, None if entry_id == 0 else _entry(queue, entry_id)))
        return sent


class Cluster:
    """Keys of other hash tags on other nodes: each step its own call, in the one-server script's order."""

    spans_tags = False  # a script touches keys of one hash tag only

    async def accept(self, book: Parts, one: Acceptance) -> tuple[bytes, bytes]:
        # The index is on another slot: it is written first, then the request.
        async with book._client.pipeline(transaction=False) as pipe:
            _list_entries(pipe, book, one)
            await pipe.execute()
        status, state = await book._scripts.run("accept_request", one.keys, one.args)
        return status, state

    async def submit(
        self, book: Parts, one: Acceptance, queue: DeliveryQueue, deliveries: Deliveries, now: int | None
    ) -> AcceptResult:
        """The request accepted, then its deliveries queued in one pipeline, in their order (the
        queue has another hash tag), as ``RequestBook.accept`` and ``DeliveryQueue.enqueue_many`` do."""
        accepted = await book._accept(one)
        if accepted.state == "pending":
            request_id, expires_at = one.ref.request_id, one.expires_at
            entries = [(target, request_id, payload, expires_at) for target, payload in deliveries]
            for answer in await queue.enqueue_many(entries, now=now):
                if isinstance(answer, StoreError):
                    raise answer  # a full queue: the request is stored; a repeat queues what is missing
        return accepted

    async def receive(
        self, book: Parts, one: Acceptance, intake: Intake, payload: bytes, now: int | None, held_key: str
    ) -> ReceiveResult:
        """Each step its own call. The window is charged once per request (``hit_once``): a delivery
        retried after a later step failed (a master restarting) is not charged again."""
        request_id = one.ref.request_id
        if await book._exists(one.ref):
            return ReceiveResult(stored_before=True)
        hold = [one.ref.member, one.expires_at, one.at, intake.max_pending, one.held_ms]
        with converting(book._url):
            held = await book._scripts.run("hold", [held_key], hold)
        if held < 0:
            return ReceiveResult(stored_before=False, full=True, held=-held)
        decision = await intake.limiter.hit_once(
            intake.window, intake.limit, one.ref.member, ttl_ms=one.held_ms, now=now
        )
        if not decision.allowed:
            with converting(book._url):
                await book._client.zrem(held_key, one.ref.member)  # as the script takes its hold back
            return ReceiveResult(stored_before=False, decision=decision)
        try:
            accepted = await book._accept(one)
        except RequestConflictError:
            return ReceiveResult(stored_before=True)  # stored between the look and here: a concurrent copy
        entry_id = None  # accepted already expired: _accept took it out of the pending and held sets
        if accepted.state == "pending":
            entry_id = await intake.queue.enqueue(intake.target, request_id, payload, one.expires_at, now=now)
            await book._mark_queued(one.ref, entry_id)
        return received(decision, accepted, entry_id)

    async def record_send(
        self,
        book: Parts,
        calls: list[tuple[Ref, list[Any]]],
        queue: DeliveryQueue,
        entries: Sequence[tuple[str, str, bytes, int]],
        inbox: DeliveryQueue,
    ) -> list[Sent]:
        """The records in one pipeline (``Book._record_many``), then the counted ones' deliveries in
        another (the queue has another hash tag), in their order; then the settled and queued
        items' entries leave the approver's queue (``inbox``), best effort: the inbox sweep
        removes what a failure or a crash left (sending the decision again first). An entry the
        queue refuses is refused before anything is sent, as on one server."""
        for entry in entries:
            queue.entry(*entry)  # ValueError, TypeError: nothing sent
        replies = await book._record_many(calls)
        sending = [index for index, reply in enumerate(replies) if counted(reply)]
        queued = await queue.enqueue_many([entries[index] for index in sending]) if sending else []
        entry_ids: dict[int, str | StoreError] = dict(zip(sending, queued, strict=True))
        done = [
            calls[index][0]
            for index, entry_id in entry_ids.items()
            if isinstance(entry_id, str) and settled(replies[index])
        ]
        await _leave_inbox(book, done, inbox)
        return [(reply, entry_ids.get(index)) for index, reply in enumerate(replies)]


async def _leave_inbox(book: Parts, refs: list[Ref], inbox: DeliveryQueue) -> None:
    """Take the approver's queue entries of ``refs`` (their outcome's ``queued`` field) out of
    ``inbox``; never raises: the inbox sweep removes what is left."""
    if not refs:
        return
    try:
        with converting(book._url):
            async with book._client.pipeline(transaction=False) as pipe:
                for ref in refs:
                    pipe.hget(ref.keys.outcome, "queued")
                queued = await pipe.execute()
        await inbox.remove([entry.decode() for entry in queued if entry])
    except StoreError as exc:
        logger.warning("decided inbox items stay in the approver's queue until its sweep: %s", exc)


def _entry(queue: DeliveryQueue, entry_id: Any) -> str | StoreError:
    """The queue's entry id from an ``enqueue`` reply, or the StoreError of a full queue."""
    try:
        return queue.entry_id(entry_id)
    except StoreError as exc:
        return exc


Shape = OneServer | Cluster  # what a book runs its accept, submit, receive and record_send with

ONE_SERVER = OneServer()
CLUSTER = Cluster()


def shape_of(client: AsyncClient) -> Shape:
    """The shape of the deployment ``client`` talks to: a Redis Cluster, or one server."""
    return CLUSTER if isinstance(client, redis.asyncio.cluster.RedisCluster) else ONE_SERVER
