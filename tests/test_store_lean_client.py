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
    _Lane,
    _pack,
    _PackedConnection,
    _PackedUnixConnection,
    _shareable,
    _Shared,
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


def test_the_store_client_is_lean_on_packing_connections() -> None:
    client = make_async_client("redis://127.0.0.1:1/0", StoreOptions())  # nothing connects here
    assert isinstance(client, LeanRedis)
    assert isinstance(client.connection_pool, QuickBlockingPool)
    assert client.connection_pool.connection_class is _PackedConnection
    assert isinstance(client.pipeline(), LeanPipeline)
    unix = make_async_client("unix:///nowhere/redis.sock", StoreOptions())
    assert unix.connection_pool.connection_class is _PackedUnixConnection


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "pooled"])
def test_commands_answer_as_redis_py_answers_without_its_command_layer(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    layered: list[object] = []
    original = redis.asyncio.Redis.execute_command

    async def counted(self: redis.asyncio.Redis, *args: Any, **options: Any) -> Any:
        layered.append(args[0])
        return await original(self, *args, **options)

    key = f"{redis_prefix}:lean:{{{shared}}}"

    async def scenario() -> list[Any]:
        client = make_async_client(redis_url, StoreOptions(), shared=shared)
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


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "pooled"])
@pytest.mark.parametrize("transaction", [True, False])
def test_a_pipeline_answers_as_redis_pys_own_pipeline(
    redis_url: str, redis_prefix: str, transaction: bool, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    own: list[int] = []
    original = redis.asyncio.client.Pipeline.execute

    async def counted(self: redis.asyncio.client.Pipeline, raise_on_error: bool = True) -> Any:
        own.append(1)
        return await original(self, raise_on_error)

    monkeypatch.setattr(redis.asyncio.client.Pipeline, "execute", counted)

    async def scenario() -> tuple[list[Any], list[Any], int]:
        client = make_async_client(redis_url, StoreOptions(), shared=shared)
        try:
            results = []
            for lean in (True, False):
                key = f"{redis_prefix}:pipe:{{{transaction}-{lean}-{shared}}}"
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


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "pooled"])
@pytest.mark.parametrize("transaction", [True, False])
def test_a_pipeline_raises_a_failed_command_as_redis_py_does_and_stays_in_step(
    redis_url: str, redis_prefix: str, transaction: bool, shared: bool
) -> None:
    key = f"{redis_prefix}:errors:{{{transaction}-{shared}}}"

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
        client = make_async_client(redis_url, StoreOptions(max_connections=1), shared=shared)
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


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "pooled"])
def test_a_transaction_with_a_command_refused_while_queued_raises_that_refusal(
    redis_url: str, redis_prefix: str, shared: bool
) -> None:
    key = f"{redis_prefix}:queued:{{{shared}}}"

    async def scenario() -> tuple[str, str, Any]:
        client = make_async_client(redis_url, StoreOptions(max_connections=1), shared=shared)
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
        client = make_async_client(
            redis_url, StoreOptions(socket_timeout=2, retries=0, max_connections=1), shared=False
        )
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
        client = make_async_client(redis_url, StoreOptions(max_connections=1), shared=False)
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
        client = make_async_client(redis_url, StoreOptions(max_connections=1), shared=False)
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
        client = make_async_client(redis_url, StoreOptions(max_connections=1), shared=False)
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


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "pooled"])
def test_a_write_the_server_does_not_take_in_time_fails_and_drops_the_connection(shared: bool) -> None:
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
            f"redis://127.0.0.1:{port}",
            StoreOptions(socket_timeout=2, retries=0, max_connections=1),
            shared=shared,
        )
        try:
            assert await client.get("k") == b"v"
            begun = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError) as raised:
                await client.set("big", b"x" * 64_000_000)  # more than the socket buffers hold
            waited = time.monotonic() - begun
            if shared:
                lane = _lane(client)
                dropped = lane.failure is not None and not lane.connection.is_connected
            else:
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


# -- the shared connection ------------------------------------------------------------------------


def _lane(client: Any) -> _Lane:
    shared = client._shared
    assert isinstance(shared, _Shared)
    lane = shared._lane
    assert lane is not None, "no command has opened the shared connection"
    return lane


def _connections(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


@pytest.mark.parametrize(
    ("args", "options", "shareable"),
    [
        (("GET", "k"), {}, True),
        (("EVALSHA", "ab" * 20, 1, "k", "v"), {}, True),
        (("SCRIPT LOAD", "return 1"), {}, True),
        (("XREAD", "COUNT", 1, "STREAMS", "s", "0-0"), {}, True),
        (("XREADGROUP", "GROUP", "g", "c", "COUNT", 1, "STREAMS", "s", ">"), {}, True),
        (("XREAD", "COUNT", 1, "BLOCK", 100, "STREAMS", "s", "$"), {}, False),
        ((b"XREADGROUP", b"GROUP", b"g", b"c", b"block", 0, b"STREAMS", b"s", b">"), {}, False),
        (("BLPOP", "l", 1), {}, False),
        (("BZPOPMIN", "z", 1), {}, False),
        (("WAIT", 1, 0), {}, False),
        (("CLIENT ID",), {}, False),
        (("CLIENT", "SETNAME", "x"), {}, False),
        (("SELECT", 1), {}, False),
        (("MULTI",), {}, False),
        (("WATCH", "k"), {}, False),
        (("SUBSCRIBE", "c"), {}, False),
        (("SCRIPT DEBUG", "YES"), {}, False),
        (("SCRIPT", "DEBUG", "YES"), {}, False),
        (("GET", "k"), {redis.client.NEVER_DECODE: True}, False),
        (("GET", "k"), {redis.client.EMPTY_RESPONSE: []}, False),
    ],
)
def test_only_commands_that_answer_at_once_and_leave_the_connection_as_it_was_are_shared(
    args: tuple[Any, ...], options: dict[str, Any], shareable: bool
) -> None:
    assert _shareable(args, options) is shareable
    assert _shareable(args, options) is shareable  # the second time from the kept verdicts


def test_many_callers_share_one_connection_and_each_gets_its_own_replies(
    redis_url: str, redis_prefix: str
) -> None:
    admin = redis.Redis.from_url(redis_url)
    callers, rounds = 64, 20

    async def caller(client: LeanRedis, number: int) -> list[Any]:
        key = f"{redis_prefix}:many:{{{number}}}"
        wrong = []
        for round_ in range(rounds):
            value = f"{number}-{round_}".encode()
            await client.set(f"{key}:s", value, ex=600)
            if await client.get(f"{key}:s") != value:
                wrong.append(("get", number, round_))
            async with client.pipeline(transaction=True) as pipe:
                pipe.incr(f"{key}:n")
                pipe.get(f"{key}:s")
                pipe.hset(f"{key}:h", "f", value)
                counted, got, _added = await pipe.execute()
            if (counted, got) != (round_ + 1, value):
                wrong.append(("transaction", number, round_))
            async with client.pipeline(transaction=False) as pipe:
                pipe.hget(f"{key}:h", "f")
                pipe.exists(f"{key}:s", f"{key}:none")
                if await pipe.execute() != [value, 1]:
                    wrong.append(("pipeline", number, round_))
        await client.delete(f"{key}:s", f"{key}:n", f"{key}:h")
        return wrong

    async def scenario() -> tuple[list[Any], int]:
        client = make_async_client(redis_url, StoreOptions())
        assert isinstance(client, LeanRedis)
        try:
            before = _connections(admin)
            outcomes = await asyncio.gather(*(caller(client, number) for number in range(callers)))
            return [entry for outcome in outcomes for entry in outcome], _connections(admin) - before
        finally:
            await client.aclose()

    try:
        wrong, made = run(scenario)
    finally:
        admin.close()
    assert wrong == []
    assert made == 1  # 64 callers, one connection


def test_a_blocking_command_takes_a_pooled_connection_and_the_shared_one_keeps_answering(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:blocking:{{one}}"
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[Any, bool, Any, Any]:
        client = make_async_client(redis_url, StoreOptions(socket_timeout=30))
        try:
            await client.set(f"{key}:s", "mine")
            await client.xadd(f"{key}:x", {"f": "old"}, id="1-1")
            blocked_before = int(admin.info("clients")["blocked_clients"])
            popping = asyncio.create_task(client.blpop([f"{key}:l"], timeout=BLOCK_SECONDS))
            reading = asyncio.create_task(client.xread({f"{key}:x": "$"}, block=BLOCK_SECONDS * 1000))
            assert await until(
                lambda: int(admin.info("clients")["blocked_clients"]) >= blocked_before + 2, timeout=30
            ), "the blocking reads never blocked"
            got = await client.get(f"{key}:s")  # answers while both wait
            still_waiting = not popping.done() and not reading.done()
            await client.rpush(f"{key}:l", "item")
            await client.xadd(f"{key}:x", {"f": "new"}, id="2-1")
            return got, still_waiting, await popping, await reading
        finally:
            await client.delete(f"{key}:s", f"{key}:l", f"{key}:x")
            await client.aclose()

    try:
        got, still_waiting, popped, read = run(scenario)
    finally:
        admin.close()
    assert (got, still_waiting) == (b"mine", True)
    assert list(popped) == [f"{key}:l".encode(), b"item"]
    assert read == [[f"{key}:x".encode(), [(b"2-1", {b"f": b"new"})]]]


def test_a_shared_connection_the_server_dropped_is_replaced_and_the_command_answers(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:shared-dropped:{{one}}"
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[Any, bool, bool]:
        client = make_async_client(redis_url, StoreOptions())
        try:
            await client.set(key, "mine")
            first = _lane(client)
            lane_id = await first.call(_pack(("CLIENT", "ID")))  # the lane's own, on TCP or a Unix socket
            admin.client_kill_filter(_id=lane_id)
            got = await client.get(key)  # on a new connection: the lane saw the close, or the retry did
            return (
                got,
                _lane(client) is not first,
                isinstance(first.failure, redis.exceptions.ConnectionError),
            )
        finally:
            await client.delete(key)
            await client.aclose()

    try:
        assert run(scenario) == (b"mine", True, True)
    finally:
        admin.close()


def test_a_shared_connection_is_replaced_when_idle_past_the_health_check_interval(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[bool, int, bool]:
        client = make_async_client(redis_url, StoreOptions(health_check_interval=30))
        try:
            await client.ping()
            first = _lane(client)
            before = _connections(admin)
            await client.ping()
            kept = _lane(client) is first
            first.used_at -= 31  # as if idle past the interval
            await client.ping()
            return kept, _connections(admin) - before, first.failure is not None
        finally:
            await client.aclose()

    try:
        assert run(scenario) == (True, 1, True)
    finally:
        admin.close()


def test_a_client_used_on_a_second_event_loop_opens_its_own_shared_connection(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:loops:{{one}}"
    client = make_async_client(redis_url, StoreOptions())

    async def first() -> Any:
        await client.set(key, "mine")
        return await client.get(key)

    async def second() -> Any:
        try:
            return await client.get(key)
        finally:
            await client.delete(key)
            await client.aclose()

    assert run(first) == b"mine"
    assert run(second) == b"mine"


class _FakeRedis:
    """A server that speaks enough RESP for the client's handshake, ``GET`` and ``PING``, scripted per key.

    ``GET hold`` is answered only once ``release`` is set; ``GET push`` is answered after a RESP3
    push; ``GET twice`` is answered twice; any other ``GET k`` answers ``k``.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _FakeRedis:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import hiredis

        self.connections += 1
        commands = hiredis.Reader()
        try:
            while data := await reader.read(65536):
                commands.feed(data)
                while (command := commands.gets()) is not False:
                    name = command[0].upper()
                    if name == b"HELLO":
                        writer.write(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                    elif name == b"PING":
                        writer.write(b"+PONG\r\n")
                    elif name == b"GET":
                        key = command[1]
                        answer = b"$%d\r\n%s\r\n" % (len(key), key)
                        if key == b"hold":
                            await self.release.wait()
                        elif key == b"push":
                            writer.write(b">2\r\n$7\r\nmessage\r\n$1\r\nx\r\n")
                        elif key == b"twice":
                            writer.write(answer)
                        writer.write(answer)
                    else:
                        writer.write(b"+OK\r\n")
                    await writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()


def test_a_reply_later_than_the_socket_timeout_fails_its_caller_and_no_later_command_reads_it() -> None:
    async def scenario() -> tuple[str, float, Any, int]:
        async with _FakeRedis() as server:
            client = make_async_client(server.url, StoreOptions(socket_timeout=1, retries=0))
            try:
                begun = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError) as raised:
                    await client.get("hold")
                waited = time.monotonic() - begun
                server.release.set()  # the late reply goes to the connection that was dropped
                return str(raised.value), waited, await client.get("k"), server.connections
            finally:
                await client.aclose()

    message, waited, later, connections = run(scenario)
    assert message == "Timeout reading from socket"
    assert 0.9 <= waited < 30
    assert (later, connections) == (b"k", 2)


def test_a_cancelled_caller_takes_its_reply_off_the_shared_connection() -> None:
    async def scenario() -> tuple[Any, int, bool]:
        async with _FakeRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=0))
            try:
                await client.ping()
                lane = _lane(client)
                held = asyncio.create_task(client.get("hold"))
                assert await until(lambda: bool(lane._pending), timeout=30)
                held.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await held
                behind = asyncio.create_task(client.get("k"))  # queued behind the cancelled one
                server.release.set()
                return await behind, server.connections, _lane(client) is lane
            finally:
                await client.aclose()

    assert run(scenario) == (b"k", 1, True)


def test_a_push_message_on_the_shared_connection_is_no_commands_reply() -> None:
    async def scenario() -> list[Any]:
        async with _FakeRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=0))
            try:
                return list(await asyncio.gather(client.get("push"), client.get("k")))
            finally:
                await client.aclose()

    assert run(scenario) == [b"push", b"k"]


def test_a_reply_no_command_asked_for_drops_the_shared_connection() -> None:
    async def scenario() -> tuple[Any, type[BaseException] | None, Any, int]:
        async with _FakeRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=0))
            try:
                first = await client.get("twice")
                lane = _lane(client)
                assert await until(lambda: lane.failure is not None, timeout=30), "the extra reply was taken"
                return first, type(lane.failure), await client.get("k"), server.connections
            finally:
                await client.aclose()

    first, failure, later, connections = run(scenario)
    assert (first, failure, later, connections) == (b"twice", redis.exceptions.ConnectionError, b"k", 2)


def test_closing_the_client_fails_the_calls_waiting_on_the_shared_connection() -> None:
    async def scenario() -> tuple[type[BaseException], bool]:
        async with _FakeRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=0))
            await client.ping()
            lane = _lane(client)
            held = asyncio.create_task(client.get("hold"))
            assert await until(lambda: bool(lane._pending), timeout=30)
            await client.aclose()
            with pytest.raises(redis.exceptions.ConnectionError) as raised:
                await held
            return raised.type, lane._reading.done()

    assert run(scenario) == (redis.exceptions.ConnectionError, True)
