"""The store tests' requests: ids, documents, the example clock, and what they read back from Redis.

``round_trips`` counts the store's writes to Redis and the commands each carried; ``PATHS`` runs a
test on one server's script and on a cluster's steps (the book's shape).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
import redis.asyncio

from teaagent.store import REQUEST_RETENTION_SECONDS, Store, StoreOptions
from teaagent.store._scripts import script_source

T = TypeVar("T")
NOW = 1_764_570_000  # PROTOCOL.md's example clock; scripts take time from the caller, never the server
EXPIRES = NOW + 120
FAIL_FAST = StoreOptions(socket_timeout=0.3, connect_timeout=0.5, retries=0)
DOC = b'{"request":{"request_id":"...","tool_name":"shell.run"},"signature":"AAAA"}'
APPROVAL = b'{"statement":{"type":"teaagent.approval","signer":"beta"},"signature":"AAAA"}'  # read as JSON


def new_id() -> str:
    return secrets.token_hex(16)


Run = Callable[[Callable[[Store], Awaitable[Any]]], Any]


async def accepted(store: Store, *, required: int = 2, peers: int = 3, expires_at: int = EXPIRES) -> str:
    request_id = new_id()
    result = await store.requests.accept(
        request_id, DOC, required_approvals=required, peers=peers, expires_at=expires_at, now=NOW
    )
    assert result.created
    return request_id


async def events(store: Store, request_id: str) -> list[dict[bytes, bytes]]:
    entries: Any = await store.client.xrange(store.keys.request(request_id).events)
    return [fields for _id, fields in entries]


def outcome_events(entries: list[dict[bytes, bytes]]) -> list[dict[bytes, bytes]]:
    return [fields for fields in entries if fields[b"type"] == b"outcome"]


@contextlib.contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The store's round trips while inside: one entry per write to Redis, the number of commands it
    carried (read back from the bytes sent, by hiredis)."""
    import hiredis
    from redis.asyncio.connection import AbstractConnection

    trips: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        reader = hiredis.Reader()
        if isinstance(command, str):
            command = command.encode()
        reader.feed(command if isinstance(command, bytes) else b"".join(command))
        count = 0
        while reader.gets() is not False:
            count += 1
        trips.append(count)
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    try:
        yield trips
    finally:
        monkeypatch.undo()


PATHS = pytest.mark.parametrize("path", ["script", "steps"])  # one server's script, or a cluster's steps


async def documents_read(redis_url: str, call: Callable[[], Awaitable[T]]) -> tuple[int, T]:
    """The stored documents Redis served (its own count of GET calls) while ``call`` ran, and its answer."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        before = (await client.info("commandstats")).get("cmdstat_get", {}).get("calls", 0)
        answer = await call()
        after = (await client.info("commandstats")).get("cmdstat_get", {}).get("calls", 0)
    finally:
        await client.aclose()
    return after - before, answer


async def decided_in_inbox(
    store: Store,
    origin: str,
    count: int,
    *,
    expires_at: int,
    now: int,
    document: Callable[[str], bytes] = lambda _request_id: DOC,
) -> list[str]:
    """Write ``count`` items from ``origin``, each approved here, in pipelines (well under a second).

    The store's own scripts, as ``InboxBook.accept`` and ``record_decision`` run them, only not one
    round trip each: what ten thousand items approved over a busy day leave in the store.
    """
    accept, record = [
        await store.client.script_load(script_source(name)) for name in ("accept_request", "record_decision")
    ]
    request_ids = [new_id() for _ in range(count)]
    index = store.keys.inbox_index()
    for start in range(0, count, 1000):
        async with store.client.pipeline(transaction=False) as pipe:
            for request_id in request_ids[start : start + 1000]:
                keys = store.keys.inbox_item(origin, request_id)
                pipe.zadd(index, {f"{origin}/{request_id}": expires_at})
                pipe.evalsha(
                    accept, 3, keys.doc, keys.outcome, keys.events,
                    document(request_id), 1, 1, expires_at, now, REQUEST_RETENTION_SECONDS, 1000,
                )  # fmt: skip
                pipe.evalsha(
                    record, 3, keys.outcome, keys.decisions, keys.events,
                    "approval", "beta", APPROVAL, now, 1000,
                )  # fmt: skip
            await pipe.execute()
    await store.client.expire(index, expires_at - now + REQUEST_RETENTION_SECONDS)
    last = await store.inbox.get(origin, request_ids[-1])
    assert last is not None
    assert last.state == "approved"
    return request_ids
