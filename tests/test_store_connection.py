"""Connections: Redis errors become one readable StoreError sentence, passwords never show."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass

import pytest
import redis

from teaagent.errors import StoreError, TeaAgentError
from teaagent.store import (
    StoreOptions,
    connect,
    connect_sync,
    open_store,
    redact_url,
)
from teaagent.store import _store as store_module

FAST_FAIL = StoreOptions(connect_timeout=0.5, socket_timeout=0.5, retries=1)


@dataclass(frozen=True)
class Limit:
    max_calls: int
    window_seconds: float


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket closes


def test_store_error_is_a_teaagent_error() -> None:
    assert issubclass(StoreError, TeaAgentError)


def test_unreachable_redis_is_one_sentence_naming_the_server() -> None:
    port = closed_port()
    store = connect_sync(f"redis://127.0.0.1:{port}/0", prefix="ta:alpha", options=FAST_FAIL)
    expected = rf"^Redis at redis://127\.0\.0\.1:{port}/0 is unreachable: Connection refused$"
    with pytest.raises(StoreError, match=expected):
        store.ping()
    with pytest.raises(StoreError, match=r"is unreachable: Connection refused$"):
        store.rate_limiter.hit("tool:fs.read", Limit(1, 1.0))
    store.close()


@pytest.mark.anyio
async def test_async_unreachable_redis_says_the_same_and_hides_the_password() -> None:
    port = closed_port()

    async def scenario() -> None:
        store = connect(f"redis://:s3cret@127.0.0.1:{port}/0", prefix="ta:alpha", options=FAST_FAIL)
        try:
            await store.requests.get("0" * 32)
        finally:
            await store.aclose()

    expected = rf"^Redis at redis://:\*\*\*@127\.0\.0\.1:{port}/0 is unreachable"
    with pytest.raises(StoreError, match=expected) as caught:
        await scenario()
    assert "s3cret" not in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.exceptions.ConnectionError)


def test_wrong_password_is_refused_credentials(redis_url: str) -> None:
    if "@" not in redis_url:
        pytest.skip("the session's Redis has no password")
    wrong = redis_url.split("://", 1)[0] + "://:wrong@" + redis_url.split("@", 1)[1]
    store = connect_sync(wrong, prefix="ta:alpha", options=FAST_FAIL)
    with pytest.raises(StoreError, match=r"refused the credentials"):
        store.ping()
    store.close()


@pytest.mark.anyio
async def test_open_store_refuses_an_unreachable_server_before_the_block_runs() -> None:
    port = closed_port()

    async def scenario() -> None:
        async with open_store(f"redis://127.0.0.1:{port}/0", prefix="ta:alpha", options=FAST_FAIL):
            raise AssertionError("the block must not run")

    with pytest.raises(StoreError, match="is unreachable"):
        await scenario()


@pytest.mark.anyio
async def test_ping_answers_on_the_real_server(redis_url: str, redis_prefix: str) -> None:
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        assert store.ping() > 0

    async def scenario() -> float:
        async with open_store(redis_url, prefix=redis_prefix) as store:
            return await store.ping()

    assert await scenario() > 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("embedded", "redis_url 'embedded' names no server"),
        ("http://127.0.0.1:6379", "redis_url must start with redis://"),
        ("127.0.0.1:6379", "redis_url must start with redis://"),
    ],
)
def test_connect_refuses_urls_it_cannot_use(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        connect_sync(url, prefix="ta:alpha")
    with pytest.raises(ValueError, match=message):
        connect(url, prefix="ta:alpha")


@pytest.mark.anyio
async def test_open_store_embedded_needs_a_data_dir() -> None:
    async def scenario() -> None:
        async with open_store("embedded", prefix="ta:alpha"):
            raise AssertionError("the block must not run")

    with pytest.raises(ValueError, match="needs the node's data_dir"):
        await scenario()


def test_connect_refuses_a_bad_prefix() -> None:
    with pytest.raises(ValueError, match="key prefix"):
        connect_sync("redis://127.0.0.1:6379/0", prefix="ta:{alpha}")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("rediss://user:pw@example.com:6380/2", "rediss://user:***@example.com:6380/2"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=1"),
    ],
)
def test_redact_url_hides_only_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "options",
    [
        {"socket_timeout": 0},
        {"connect_timeout": -1},
        {"retries": -1},
        {"max_connections": 0},
        {"blocking_connections": 0},
    ],
)
def test_store_options_refuse_impossible_values(options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        StoreOptions(**options)  # type: ignore[arg-type]


def test_blocking_reads_stay_under_the_socket_timeout() -> None:
    assert StoreOptions(socket_timeout=4.0).max_block_seconds < 4.0


def _blocked_xreads(redis_url: str) -> int:
    with redis.Redis.from_url(redis_url) as client:
        entries = client.client_list()
    return sum(1 for entry in entries if entry.get("cmd") == "xread" and "b" in entry.get("flags", ""))


@pytest.mark.anyio
async def test_long_polls_waiting_in_redis_leave_the_commands_their_connections(
    redis_url: str, redis_prefix: str
) -> None:
    # Two connections for commands, six outcome long-polls blocking (XREAD BLOCK, 20 s at a time):
    # on one shared pool the look-up below would find no free connection and fail after its wait.
    options = StoreOptions(max_connections=2, socket_timeout=40.0)

    async def scenario() -> tuple[bool, int]:
        async with connect(redis_url, prefix=redis_prefix, options=options) as store:
            request_id = "c0ffee" * 5 + "00"
            now = int(time.time())
            await store.requests.accept(
                request_id, b"{}", required_approvals=1, peers=1, expires_at=now + 600, now=now
            )
            waits = [asyncio.create_task(store.requests.wait_outcome(request_id, 30)) for _ in range(6)]
            deadline = time.monotonic() + 30
            while _blocked_xreads(redis_url) < 6:
                assert time.monotonic() < deadline, "the long-polls never blocked"
                await asyncio.sleep(0.02)
            found = await store.requests.get(request_id)
            answered_while_blocked = not any(wait.done() for wait in waits)
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
            assert found is not None
            return answered_while_blocked, len(found.document)

    assert await scenario() == (True, 2)


@pytest.mark.anyio
async def test_a_server_older_than_redis_7_is_refused_in_one_sentence(
    redis_url: str, redis_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every server here is recent: the minimum is raised past it, so that the real one is "too old".
    async with open_store(redis_url, prefix=redis_prefix) as store:
        info = await store.client.info("server")
    monkeypatch.setattr(store_module, "MIN_REDIS_VERSION", (99, 0))
    with pytest.raises(StoreError) as refused:
        async with open_store(redis_url, prefix=redis_prefix):
            pytest.fail("the block ran on a server refused as too old")
    assert str(refused.value) == (
        f"Redis at {redact_url(redis_url)} is version {info['redis_version']}; teaagent needs Redis 99.0 "
        "or later (or Valkey 7.2 or later)."
    )


@pytest.mark.parametrize(
    ("text", "parsed"), [("7.2.4", (7, 2, 4)), ("6.2.14", (6, 2, 14)), ("8.0.0-rc1", (8, 0, 0)), ("x", ())]
)
def test_a_servers_version_is_read_by_its_numbers(text: str, parsed: tuple[int, ...]) -> None:
    assert store_module._version(text) == parsed
    assert (store_module._version(text) >= store_module.MIN_REDIS_VERSION) == (parsed >= (7, 0))
