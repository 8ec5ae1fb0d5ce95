"""The store's asyncio client is redis-py's own, as documented, and survives what a library must.

``make_async_client`` builds ``redis.asyncio.Redis`` on a ``BlockingConnectionPool`` sized to the
calls in flight (hiredis parses: a dependency). These tests hold it, on the real server or on a
scripted one, to the failures issue 29 lists: a cancellation mid-reply, a server closing mid-reply,
a timeout that fails only its own caller, a reconnect, TLS; and, on
both, no reply is ever served to another command. ``CommandBatches``, which sends the calls of one
moment as one redis-py pipeline, is held to the same: each caller its own reply or error, a
cancelled or timed-out caller alone, a batch never sent twice, and the same on a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import redis
import redis.asyncio
import redis.exceptions
from redis.utils import HIREDIS_AVAILABLE
from relay_support import until, wait_until

from teaagent.store import StoreOptions
from teaagent.store._connection import CommandBatches, make_async_client, make_batches, make_sync_client

BLOCK_SECONDS = 10  # a blocking read's own timeout: far past the client's, on any host


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(scenario())  # type: ignore[arg-type]


def _blocked(admin: redis.Redis, client_id: int) -> bool:
    """Whether the server's connection ``client_id`` waits in a blocking command."""
    return any("b" in entry.get("flags", "") for entry in admin.client_list(client_id=[client_id]))


@pytest.mark.anyio
async def test_the_store_client_is_redis_pys_own_on_a_blocking_pool_sized_to_the_calls_in_flight() -> None:
    client = make_async_client("redis://127.0.0.1:1/0", StoreOptions(max_connections=48))
    assert type(client) is redis.asyncio.Redis
    pool = client.connection_pool
    assert type(pool) is redis.asyncio.BlockingConnectionPool
    assert pool.max_connections == 48
    assert pool.connection_class is redis.asyncio.Connection  # redis-py's, not a subclass of ours
    assert HIREDIS_AVAILABLE  # so its connections parse with hiredis
    await client.aclose()


class _ScriptedRedis:
    """A server that speaks enough RESP for the handshake, ``GET`` and ``PING``, scripted per key.

    ``GET hold`` is answered only once ``release`` is set; ``GET half`` gets half a reply, then the
    connection is closed; ``GET bad`` is refused; any other ``GET k`` answers ``k``. ``gets`` is
    every key asked for, in order of arrival.
    """

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.connections = 0
        self.gets: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> _ScriptedRedis:
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
                        self.gets.append(key)
                        answer = b"$%d\r\n%s\r\n" % (len(key), key)
                        if key == b"bad":
                            answer = b"-ERR bad key\r\n"
                        if key == b"hold":
                            await self.release.wait()
                        elif key == b"half":
                            writer.write(answer[: len(answer) // 2])
                            await writer.drain()
                            return
                        writer.write(answer)
                    else:
                        writer.write(b"+OK\r\n")
                    await writer.drain()
        except (asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()


def test_a_timeout_fails_its_own_caller_only_and_no_later_command_reads_its_reply() -> None:
    async def scenario() -> tuple[str, float, list[Any], Any]:
        async with _ScriptedRedis() as server:
            client = make_async_client(server.url, StoreOptions(socket_timeout=1, retries=0))
            try:
                held = asyncio.create_task(client.get("hold"))
                await asyncio.sleep(0.1)
                others = await asyncio.gather(*(client.get(f"k{n}") for n in range(8)))  # all answered
                begun = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError) as raised:
                    await held
                waited = time.monotonic() - begun
                server.release.set()  # the late reply goes to the connection that was dropped
                return str(raised.value), waited, others, await client.get("k")
            finally:
                await client.aclose()

    message, waited, others, later = run(scenario)
    assert message.startswith("Timeout reading from")
    assert waited < 30
    assert others == [b"k%d" % n for n in range(8)]
    assert later == b"k"


def test_a_server_closing_mid_reply_fails_that_call_and_the_next_answers_on_a_fresh_connection() -> None:
    async def scenario() -> tuple[type[BaseException], Any, int]:
        async with _ScriptedRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=0, max_connections=1))
            try:
                assert await client.get("k") == b"k"
                with pytest.raises(redis.exceptions.ConnectionError) as raised:
                    await client.get("half")
                return raised.type, await client.get("k"), server.connections
            finally:
                await client.aclose()

    kind, later, connections = run(scenario)
    assert (kind, later, connections) == (redis.exceptions.ConnectionError, b"k", 2)


def test_with_retries_a_server_closing_mid_reply_is_ridden_out() -> None:
    async def scenario() -> tuple[Any, Any]:
        async with _ScriptedRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=1, max_connections=1))
            try:
                with pytest.raises(redis.exceptions.ConnectionError):
                    await client.get("half")  # the retry is closed mid-reply too
                return await client.get("k"), server.connections
            finally:
                await client.aclose()

    assert run(scenario) == (b"k", 3)


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


def test_a_cancelled_caller_mid_reply_leaves_the_other_callers_their_replies() -> None:
    async def scenario() -> tuple[list[Any], Any]:
        async with _ScriptedRedis() as server:
            client = make_async_client(server.url, StoreOptions(retries=0, max_connections=4))
            try:
                held = asyncio.create_task(client.get("hold"))
                await asyncio.sleep(0.1)
                held.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await held
                server.release.set()
                answered = await asyncio.gather(*(client.get(f"k{n}") for n in range(8)))
                return answered, await client.get("k")
            finally:
                await client.aclose()

    answered, later = run(scenario)
    assert answered == [b"k%d" % n for n in range(8)]
    assert later == b"k"


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


def test_a_pipeline_whose_replies_are_late_fails_and_serves_no_late_reply_later(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:late:{{one}}"
    admin = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[type[BaseException], Any, Any]:
        client = make_async_client(redis_url, StoreOptions(socket_timeout=0.5, retries=0, max_connections=1))
        try:
            await client.set(key, "mine")
            client_id = await client.client_id()
            async with client.pipeline(transaction=False) as pipe:
                pipe.blpop([f"{key}:empty"], timeout=BLOCK_SECONDS)  # answers nil, past the socket timeout
                pipe.get(key)
                with pytest.raises(redis.exceptions.TimeoutError) as raised:
                    await pipe.execute()
            assert await until(lambda: not _blocked(admin, client_id), timeout=30), "the BLPOP never ended"
            got = await client.get(key)
            async with client.pipeline(transaction=True) as pipe:
                pipe.get(key)
                piped = (await pipe.execute())[0]
            return raised.type, got, piped
        finally:
            await client.delete(key)
            await client.aclose()

    try:
        assert run(scenario) == (redis.exceptions.TimeoutError, b"mine", b"mine")
    finally:
        admin.close()


def test_callers_beyond_the_pool_wait_their_turn_and_all_are_answered(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:turns:{{one}}"

    async def scenario() -> list[Any]:
        client = make_async_client(redis_url, StoreOptions(max_connections=2))
        try:
            await client.set(key, "mine")
            return list(await asyncio.gather(*(client.get(key) for _ in range(50))))
        finally:
            await client.delete(key)
            await client.aclose()

    assert run(scenario) == [b"mine"] * 50


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    where = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(where, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_the_store_client_speaks_tls_and_refuses_a_certificate_it_does_not_trust(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    """A TLS endpoint in front of the real server (its build has no TLS of its own): ``rediss://``."""
    cert, key = _self_signed(tmp_path)
    upstream = urlsplit(redis_url)
    name = f"{redis_prefix}:tls:{{one}}"

    async def connect_upstream() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if upstream.scheme == "unix":
            return await asyncio.open_unix_connection(upstream.path)
        return await asyncio.open_connection(upstream.hostname, upstream.port or 6379)

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def terminate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await connect_upstream()
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def scenario() -> tuple[Any, list[Any], type[BaseException]]:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        server = await asyncio.start_server(terminate, "127.0.0.1", 0, ssl=context)
        port = server.sockets[0].getsockname()[1]
        password = f":{quote(upstream.password, safe='')}@" if upstream.password else ""
        trusted = make_async_client(
            f"rediss://{password}127.0.0.1:{port}/0?ssl_ca_certs={quote(str(cert))}", StoreOptions()
        )
        untrusted = make_async_client(f"rediss://{password}127.0.0.1:{port}/0", StoreOptions(retries=0))
        try:
            await trusted.set(name, "mine")
            got = await trusted.get(name)
            async with trusted.pipeline(transaction=True) as pipe:
                pipe.get(name)
                pipe.delete(name)
                piped = await pipe.execute()
            with pytest.raises(redis.exceptions.ConnectionError) as refused:
                await untrusted.ping()
            return got, piped, refused.type
        finally:
            await trusted.aclose()
            await untrusted.aclose()
            server.close()

    assert run(scenario) == (b"mine", [b"mine", 1], redis.exceptions.ConnectionError)


# -- the calls of one moment as one pipeline (CommandBatches) ---------------------------------------


def _batches(url: str, **options: Any) -> CommandBatches:
    return CommandBatches(make_async_client(url, StoreOptions(retries=0, **options)))


def test_a_moments_calls_are_one_pipeline_and_a_refused_call_fails_its_own_caller_only() -> None:
    async def scenario() -> tuple[list[Any], int, list[bytes]]:
        async with _ScriptedRedis() as server:
            batches = _batches(server.url)
            try:
                keys = ["k0", "k1", "bad", "k3"]
                answers = await asyncio.gather(
                    *(batches.execute("GET", k) for k in keys), return_exceptions=True
                )
                return answers, server.connections, server.gets
            finally:
                await batches.aclose()

    answers, connections, gets = run(scenario)
    assert [answers[0], answers[1], answers[3]] == [b"k0", b"k1", b"k3"]
    assert isinstance(answers[2], redis.exceptions.ResponseError)
    assert "bad key" in str(answers[2])
    assert connections == 1  # one pipeline on one connection, not a connection per caller
    assert gets == [b"k0", b"k1", b"bad", b"k3"]


def test_a_bad_script_call_in_a_batch_fails_its_caller_only_on_the_real_server(
    redis_url: str, redis_prefix: str
) -> None:
    key = f"{redis_prefix}:batch:{{one}}"

    async def scenario() -> list[Any]:
        batches = _batches(redis_url)
        try:
            return list(
                await asyncio.gather(
                    batches.execute("EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", 1, key, "v"),
                    batches.execute("EVALSHA", "0" * 40, 1, key),  # no such script
                    batches.execute("EVAL", "return redis.call('INCR', KEYS[1])", 1, key),  # not a number
                    batches.execute("GET", key),
                    return_exceptions=True,
                )
            )
        finally:
            await batches.client.delete(key)
            await batches.aclose()

    stored, missing, wrong, got = run(scenario)
    assert (stored, got) == (b"OK", b"v")
    assert isinstance(missing, redis.exceptions.NoScriptError)
    assert isinstance(wrong, redis.exceptions.ResponseError)
    assert "not an integer" in str(wrong)


def test_a_caller_cancelled_before_its_batch_is_sent_is_left_out_one_cancelled_after_leaves_the_rest() -> (
    None
):
    async def scenario() -> tuple[list[Any], list[bytes]]:
        async with _ScriptedRedis() as server:
            batches = _batches(server.url)
            try:
                gone = asyncio.create_task(batches.execute("GET", "gone"))
                await asyncio.sleep(0)  # queued, not yet sent
                gone.cancel()
                held = asyncio.create_task(batches.execute("GET", "hold"))
                other = asyncio.create_task(batches.execute("GET", "k1"))
                assert await until(lambda: b"hold" in server.gets, timeout=30)
                held.cancel()  # mid-batch: its reply is still to come
                with pytest.raises(asyncio.CancelledError):
                    await held
                server.release.set()
                answered = [await other, await batches.execute("GET", "k2")]
                return answered, server.gets
            finally:
                await batches.aclose()

    answered, gets = run(scenario)
    assert answered == [b"k1", b"k2"]
    assert gets == [b"hold", b"k1", b"k2"]  # "gone" never reached the server


def test_a_callers_own_deadline_fails_that_caller_only() -> None:
    async def scenario() -> tuple[type[BaseException], Any, Any]:
        async with _ScriptedRedis() as server:
            batches = _batches(server.url)
            try:
                other = asyncio.create_task(batches.execute("GET", "k1"))
                with pytest.raises(TimeoutError) as raised:
                    await asyncio.wait_for(batches.execute("GET", "hold"), 0.2)
                server.release.set()
                return raised.type, await other, await batches.execute("GET", "k2")
            finally:
                await batches.aclose()

    assert run(scenario) == (TimeoutError, b"k1", b"k2")


def test_a_server_closing_mid_batch_fails_its_callers_once_and_sends_nothing_again() -> None:
    async def scenario() -> tuple[list[Any], Any, list[bytes], int]:
        async with _ScriptedRedis() as server:
            batches = _batches(server.url)
            try:
                failed = await asyncio.gather(
                    *(batches.execute("GET", key) for key in ("k0", "half", "k2")), return_exceptions=True
                )
                return failed, await batches.execute("GET", "k3"), server.gets, server.connections
            finally:
                await batches.aclose()

    failed, later, gets, connections = run(scenario)
    assert [type(error) for error in failed] == [redis.exceptions.ConnectionError] * 3
    assert later == b"k3"
    # Sent once: no retry on a fresh connection (a script in it may have run), not even of k2,
    # which the server closed before reading.
    assert gets == [b"k0", b"half", b"k3"]
    assert connections == 2


def test_batches_can_be_switched_off_for_the_benchs_before_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAAGENT_REDIS_BATCHES", "0")
    assert make_batches("redis://127.0.0.1:1/0", StoreOptions()) is None
    monkeypatch.setenv("TEAAGENT_REDIS_BATCHES", "1")
    batches = make_batches("redis://127.0.0.1:1/0", StoreOptions(retries=5))
    assert batches is not None
    assert batches.client.connection_pool.connection_kwargs["retry"].get_retries() == 0  # never resent
    asyncio.run(batches.aclose())


def test_closing_a_client_closes_its_connections_on_the_server(redis_url: str) -> None:
    # A client built on a pool passed in left its connections open on aclose(): each relay or
    # approver app a process started and stopped kept one to the server until the process ended.
    admin = redis.Redis.from_url(redis_url)
    name = f"teaagent-close-{time.monotonic_ns()}"

    def ours() -> int:
        return sum(1 for entry in admin.client_list() if entry.get("name") == name)

    # The server may answer the next CLIENT LIST before it has read the closed sockets: their end is
    # waited for, with a deadline that a connection left open outlasts (by default a Redis server
    # never closes an idle client).
    async def scenario() -> tuple[int, int]:
        client = make_async_client(redis_url, StoreOptions(max_connections=4))
        await asyncio.gather(*(client.execute_command("CLIENT", "SETNAME", name) for _ in range(3)))
        opened = ours()
        await client.aclose()
        await until(lambda: ours() == 0, timeout=10.0)
        return opened, ours()

    sync = make_sync_client(redis_url, StoreOptions(max_connections=4))
    try:
        opened, left = run(scenario)
        sync.execute_command("CLIENT", "SETNAME", name)
        sync_opened = ours()
        sync.close()
        wait_until(lambda: ours() == 0, timeout=10.0)
        sync_left = ours()
    finally:
        admin.close()

    assert (opened >= 1, left) == (True, 0)
    assert (sync_opened, sync_left) == (1, 0)
