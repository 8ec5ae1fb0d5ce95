"""The store's asyncio client: redis-py's, with its command layer trimmed, answering as redis-py answers.

``make_async_client`` builds a ``LeanRedis`` on a ``QuickBlockingPool`` of connections that pack in C
with hiredis; these tests hold each trimmed part to what redis-py's own would send, return and raise,
on the real server, and to what a failure must leave behind: nothing lost, no reply served twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.client
import redis.exceptions
from relay_support import until

from teaagent.store import StoreOptions
from teaagent.store._connection import (
    LeanPipeline,
    LeanRedis,
    QuickBlockingPool,
    _PackedConnection,
    _PackedUnixConnection,
    make_async_client,
)


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args",
    [
        ("GET", "k"),
        ("SET", b"k", "value with spaces", "EX", 600),
        ("SCRIPT LOAD", "return 1"),  # a multi-word name is split, as redis-py splits it
        (b"CONFIG GET", b"maxmemory"),
        ("HSET", "h", "f", 1.5, "g", -0.0, "i", 10**20, "j", float("inf")),
        ("SET", "k", bytearray(b"\x00\xff"), "GET"),
        ("SET", "k", memoryview(b"mv")),
        ("SET", "ключ", "値"),
        ("EVALSHA", "ab" * 20, 1, "key:{x}", "v" * 70_000),  # past redis-py's buffer cutoff
    ],
)
def test_a_command_is_packed_into_the_bytes_redis_py_would_send(args: tuple[Any, ...]) -> None:
    ours = b"".join(_PackedConnection().pack_command(*args))
    theirs = b"".join(redis.asyncio.Connection().pack_command(*args))
    assert ours == theirs


def test_what_redis_py_refuses_to_pack_is_refused_as_a_data_error() -> None:
    for value in (True, None, object()):
        with pytest.raises(redis.exceptions.DataError):
            _PackedConnection().pack_command("SET", "k", value)


def test_the_store_client_is_lean_on_packing_connections(redis_url: str) -> None:
    client = make_async_client(redis_url, StoreOptions())
    assert isinstance(client, LeanRedis)
    assert isinstance(client.connection_pool, QuickBlockingPool)
    assert client.connection_pool.connection_class is _PackedConnection
    assert isinstance(client.pipeline(), LeanPipeline)
    unix = make_async_client("unix:///nowhere/redis.sock", StoreOptions())
    assert unix.connection_pool.connection_class is _PackedUnixConnection


def test_commands_answer_as_redis_py_answers_without_its_command_layer(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    layered: list[object] = []
    original = redis.asyncio.Redis.execute_command

    async def counted(self: redis.asyncio.Redis, *args: Any, **options: Any) -> Any:
        layered.append(args[0])
        return await original(self, *args, **options)

    key = f"{redis_prefix}:lean:{{one}}"

    async def scenario() -> list[Any]:
        client = make_async_client(redis_url, StoreOptions())
        try:
            monkeypatch.setattr(redis.asyncio.Redis, "execute_command", counted)
            sha = await client.script_load("return redis.call('SET', KEYS[1], ARGV[1])")
            answers = [
                await client.evalsha(sha, 1, f"{key}:s", "v"),
                await client.get(f"{key}:s"),
                await client.hset(f"{key}:h", mapping={"a": "1", "b": "2"}),
                await client.hgetall(f"{key}:h"),
                await client.zadd(f"{key}:z", {"m": 1.5}),
                await client.zrange(f"{key}:z", 0, -1, withscores=True),
                await client.exists(f"{key}:s", f"{key}:none"),
            ]
            with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
                await client.lpush(f"{key}:s", "x")
            with pytest.raises(redis.exceptions.NoScriptError):
                await client.evalsha("0" * 40, 0)
            answers.append(await client.get(f"{key}:s"))  # the connection stayed in step
            return answers
        finally:
            monkeypatch.undo()
            await client.delete(f"{key}:s", f"{key}:h", f"{key}:z")
            await client.aclose()

    assert run(scenario) == [b"OK", b"v", 2, {b"a": b"1", b"b": b"2"}, 1, [(b"m", 1.5)], 1, b"v"]
    assert layered == []  # none went through Redis.execute_command


def _pipeline_commands(pipe: redis.asyncio.client.Pipeline, key: str) -> None:
    pipe.set(f"{key}:s", "v", ex=600)
    pipe.get(f"{key}:s")
    pipe.hset(f"{key}:h", mapping={"a": "1"})
    pipe.hgetall(f"{key}:h")
    pipe.zadd(f"{key}:z", {"m": 2.0})
    pipe.zrange(f"{key}:z", 0, -1, withscores=True)
    pipe.xadd(f"{key}:x", {"f": "v"}, id="1-1")
    pipe.xrevrange(f"{key}:x", "+", "-", count=1)
    pipe.exists(f"{key}:s")
    pipe.expire(f"{key}:s", 600)


@pytest.mark.parametrize("transaction", [True, False])
def test_a_pipeline_answers_as_redis_pys_own_pipeline(
    redis_url: str, redis_prefix: str, transaction: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    own: list[int] = []
    original = redis.asyncio.client.Pipeline.execute

    async def counted(self: redis.asyncio.client.Pipeline, raise_on_error: bool = True) -> Any:
        own.append(1)
        return await original(self, raise_on_error)

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", counted)

    async def scenario() -> tuple[list[Any], list[Any], int]:
        client = make_async_client(redis_url, StoreOptions())
        try:
            results = []
            for lean in (True, False):
                key = f"{redis_prefix}:pipe:{{{transaction}-{lean}}}"
                if lean:
                    pipe: redis.asyncio.client.Pipeline = client.pipeline(transaction=transaction)
                else:
                    pipe = redis.asyncio.client.Pipeline(
                        client.connection_pool, client.response_callbacks, transaction, None
                    )
                async with pipe:
                    _pipeline_commands(pipe, key)
                    results.append(await pipe.execute())
                if lean:
                    lean_calls = len(own)
                await client.delete(f"{key}:s", f"{key}:h", f"{key}:z", f"{key}:x")
            return results[0], results[1], lean_calls
        finally:
            await client.aclose()

    ours, theirs, lean_calls = run(scenario)
    assert ours == theirs
    assert ours[1] == b"v"
    assert ours[3] == {b"a": b"1"}
    assert ours[5] == [(b"m", 2.0)]
    assert lean_calls == 0  # the lean one never fell back to redis-py's execute


@pytest.mark.parametrize("transaction", [True, False])
def test_a_pipeline_raises_a_failed_command_as_redis_py_does_and_stays_in_step(
    redis_url: str, redis_prefix: str, transaction: bool
) -> None:
    key = f"{redis_prefix}:errors:{{{transaction}}}"

    async def outcome(client: redis.asyncio.Redis, pipe: redis.asyncio.client.Pipeline) -> tuple[Any, ...]:
        await client.set(f"{key}:s", "text")
        async with pipe:
            pipe.get(f"{key}:s")
            pipe.lpush(f"{key}:s", "x")  # WRONGTYPE when it runs
            pipe.get(f"{key}:s")
            with pytest.raises(redis.exceptions.ResponseError) as raised:
                await pipe.execute()
        async with pipe:
            pipe.get(f"{key}:s")
            pipe.lpush(f"{key}:s", "x")
            kept = await pipe.execute(raise_on_error=False)
        after = await client.get(f"{key}:s")
        return str(raised.value), kept[0], type(kept[1]), str(kept[1]), after

    async def scenario() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        client = make_async_client(redis_url, StoreOptions(max_connections=1))
        try:
            ours = await outcome(client, client.pipeline(transaction=transaction))
            theirs = await outcome(
                client,
                redis.asyncio.client.Pipeline(
                    client.connection_pool, client.response_callbacks, transaction, None
                ),
            )
            return ours, theirs
        finally:
            await client.delete(f"{key}:s")
            await client.aclose()

    ours, theirs = run(scenario)
    assert ours == theirs
    assert "Command # 2" in ours[0]
    assert "WRONGTYPE" in ours[0]
    assert ours[1:3] == (b"text", redis.exceptions.ResponseError)
    assert ours[4] == b"text"


def test_a_transaction_with_a_command_refused_while_queued_raises_that_refusal(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:queued:{{one}}"

    async def scenario() -> tuple[str, str, Any]:
        client = make_async_client(redis_url, StoreOptions(max_connections=1))
        messages = []
        try:
            for pipe in (
                client.pipeline(transaction=True),
                redis.asyncio.client.Pipeline(client.connection_pool, client.response_callbacks, True, None),
            ):
                async with pipe:
                    pipe.set(key, "v")
                    pipe.execute_command("NO-SUCH-COMMAND", "x")
                    with pytest.raises(redis.exceptions.ResponseError) as raised:
                        await pipe.execute()
                messages.append(str(raised.value))
            return messages[0], messages[1], await client.get(key)
        finally:
            await client.aclose()

    ours, theirs, stored = run(scenario)
    assert ours == theirs
    assert "unknown command" in ours
    assert stored is None  # EXECABORT: nothing of the transaction ran, the connection is in step


def _blocked(admin: redis.Redis, client_id: int) -> bool:
    """Whether the server's connection ``client_id`` waits in a blocking command."""
    return any("b" in entry.get("flags", "") for entry in admin.client_list(client_id=[client_id]))


BLOCK_SECONDS = 10  # a blocking read's own timeout: far past the client's, on any host


def test_a_pipeline_whose_replies_are_late_fails_and_serves_no_late_reply_later(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:late:{{one}}"
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[type[BaseException], Any, Any]:
        client = make_async_client(redis_url, StoreOptions(socket_timeout=2, retries=0, max_connections=1))
        try:
            await client.set(key, "mine")
            client_id = await client.client_id()  # the one connection the pipeline takes
            async with client.pipeline(transaction=False) as pipe:
                pipe.blpop([f"{key}:empty"], timeout=BLOCK_SECONDS)  # answers nil, past the socket timeout
                pipe.get(key)
                with pytest.raises(redis.exceptions.TimeoutError) as raised:
                    await pipe.execute()
            # Until the BLPOP no longer waits: its connection is closed, or (were it kept) it has
            # answered, and its late replies would be read next.
            assert await until(lambda: not _blocked(admin, client_id), timeout=30), "the BLPOP never ended"
            first = await client.get(key)
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(key)
                second = (await pipe.execute())[0]
            return raised.type, first, second
        finally:
            await client.delete(key)
            await client.aclose()

    try:
        assert run(scenario) == (redis.exceptions.TimeoutError, b"mine", b"mine")
    finally:
        admin.close()


def test_a_cancelled_read_leaves_no_reply_for_the_next_command(redis_url: str, redis_prefix: str) -> None:
    key = f"{redis_prefix}:cancelled:{{one}}"
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[Any, Any]:
        client = make_async_client(redis_url, StoreOptions(max_connections=1))
        try:
            await client.set(key, "mine")
            client_id = await client.client_id()
            waiting = asyncio.create_task(client.blpop([f"{key}:empty"], timeout=BLOCK_SECONDS))
            assert await until(lambda: _blocked(admin, client_id), timeout=30), "the BLPOP never blocked"
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            # Until the BLPOP no longer waits: its connection was dropped, or (were it kept) its nil
            # has been sent, to be read by the next command.
            assert await until(lambda: not _blocked(admin, client_id), timeout=30), "the BLPOP never ended"
            got = await client.get(key)
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(key)
                piped = (await pipe.execute())[0]
            return got, piped
        finally:
            await client.delete(key)
            await client.aclose()

    try:
        assert run(scenario) == (b"mine", b"mine")
    finally:
        admin.close()


def test_a_connection_the_server_dropped_is_replaced_and_the_command_answers(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:dropped:{{one}}"
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[Any, Any, bool]:
        client = make_async_client(redis_url, StoreOptions(max_connections=1))
        try:
            await client.set(key, "mine")
            first_id = await client.client_id()
            admin.client_kill_filter(_id=first_id)
            got = await client.get(key)  # on a fresh connection: reconnected, or retried
            admin.client_kill_filter(_id=await client.client_id())
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(key)
                piped = (await pipe.execute())[0]
            return got, piped, await client.client_id() != first_id
        finally:
            await client.delete(key)
            await client.aclose()

    try:
        assert run(scenario) == (b"mine", b"mine", True)
    finally:
        admin.close()


def test_an_idle_connection_goes_back_without_the_pools_locks(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow: list[int] = []
    original = redis.asyncio.BlockingConnectionPool.release

    async def counted(self: redis.asyncio.BlockingConnectionPool, connection: Any) -> None:
        slow.append(1)
        await original(self, connection)

    monkeypatch.setattr(redis.asyncio.BlockingConnectionPool, "release", counted)

    async def scenario() -> tuple[int, int]:
        client = make_async_client(redis_url, StoreOptions(max_connections=1))
        pool = client.connection_pool
        try:
            for _ in range(20):
                await client.ping()
                async with client.pipeline() as pipe:
                    pipe.ping()
                    await pipe.execute()
            quick = len(slow)
            # With a caller waiting for the only connection, the release goes the pool's way and wakes it.
            held = await pool.get_connection()
            other = asyncio.create_task(pool.get_connection())
            deadline = time.monotonic() + 30
            while not getattr(pool._condition, "_waiters", None):
                assert time.monotonic() < deadline, "the second caller never waited"
                await asyncio.sleep(0.01)
            await pool.release(held)
            second = await asyncio.wait_for(other, 30)
            await pool.release(second)
            return quick, len(slow)
        finally:
            await client.aclose()

    quick, total = run(scenario)
    assert quick == 0
    assert total >= 1


def test_a_write_the_server_does_not_take_in_time_fails_and_drops_the_connection() -> None:
    """A server that answers the handshake, then stops reading: a large write cannot leave."""
    import hiredis

    async def scenario() -> tuple[list[bytes], type[BaseException], str, bool, float]:
        seen: list[bytes] = []
        reading = asyncio.Event()
        reading.set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            commands = hiredis.Reader()
            try:
                while True:
                    await reading.wait()
                    data = await reader.read(65536)
                    if not data:
                        return
                    commands.feed(data)
                    while (command := commands.gets()) is not False:
                        name = command[0].upper()
                        seen.append(name)
                        if name == b"HELLO":
                            writer.write(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                        elif name == b"PING":
                            writer.write(b"+PONG\r\n")
                        elif name == b"GET":
                            writer.write(b"$1\r\nv\r\n")
                            reading.clear()  # from now on nothing is read
                        else:
                            writer.write(b"+OK\r\n")
            except asyncio.CancelledError:
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = make_async_client(
            f"redis://127.0.0.1:{port}", StoreOptions(socket_timeout=2, retries=0, max_connections=1)
        )
        try:
            assert await client.get("k") == b"v"
            begun = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError) as raised:
                await client.set("big", b"x" * 64_000_000)  # more than the socket buffers hold
            waited = time.monotonic() - begun
            pool = client.connection_pool
            dropped = all(not connection.is_connected for connection in pool._available_connections)
            return seen, raised.type, str(raised.value), dropped, waited
        finally:
            await client.aclose()
            server.close()

    seen, kind, message, dropped, waited = run(scenario)
    assert b"GET" in seen
    assert b"SET" not in seen  # the write never reached the server whole
    assert (kind, message, dropped) == (redis.exceptions.TimeoutError, "Timeout writing to socket", True)
    assert 1.9 <= waited < 30  # the socket timeout, not sooner, not forever
