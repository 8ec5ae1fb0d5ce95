"""Benchmark of the Redis rate limiter against a bare EVALSHA and the ``limits`` library.

``bench_ratelimit(redis_url, seconds)`` measures sequential round trips, one connection each:

- ``ratelimit_per_s``: ``RedisRateLimiter.hit`` (sync client, its lean path), the tools' check;
- ``ratelimit_async_per_s``: ``AsyncRedisRateLimiter.hit`` (asyncio client), the relay's check;
- ``raw_evalsha_per_s``: ``EVALSHA`` of ``return 1`` through the same client as the check
  (redis-py's ``client.evalsha`` on the same pool), the floor of one script call: the same client
  code, the same server, the same run, and no script work;
- ``raw_evalsha_wire_per_s``: the same ``EVALSHA`` as RESP packed by hiredis, written on a plain
  kept socket and read by hiredis, no client library at all: what a round trip costs by itself;
- ``limits_moving_window_per_s``: ``limits.aio`` ``MovingWindowRateLimiter.hit`` on its async
  ``RedisStorage`` (default coredis implementation), and ``limits_moving_window_redispy_per_s``
  with its redis-py implementation. ``limits`` answers only allowed/refused in that call; ours
  also returns remaining and retry_after.

The targets read ``ratio_to_raw_evalsha`` (``ratelimit_per_s / raw_evalsha_per_s``, at least 0.8)
and ``ratio_to_limits`` (``ratelimit_per_s / limits_moving_window_per_s``, at least 2). What
separates the check from the raw floor is work the floor does not do: the script's two commands
(a GET and a SET of the bucket's one number; a script's first ``redis.call`` costs the server
about 4 us, the next ones 1 to 2), the append-only file write of the SET before the reply
(``return 1`` writes nothing), and the client's encoding of the time and building of the decision.

Beside each rate, ``<name>_client_cpu_us`` is the client process's CPU time per call (user and
system): the part of a round trip the client library controls, where a loaded or virtualised host
makes wall-clock rates mostly a measure of scheduling.

The contenders run in interleaved rounds of ``ROUND_SECONDS`` and each figure is the median of its
rounds, so a neighbour's load burst hits every contender alike; each round starts with the next
contender, so none always runs first or right after another. Every contender uses the same limit
(``BENCH_LIMIT`` per ``BENCH_WINDOW_SECONDS``) on fresh keys, deleted afterwards.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

import redis

from teaagent.store._connection import converting
from teaagent.store._store import connect, connect_sync
from teaagent_bench._resp import RespConnection, pack

__all__ = ["CALLERS", "bench_async_client", "bench_ratelimit"]

# Never refused, so the path measured is the one that counts a call (a refusal writes nothing): a
# refill every 6 us, quicker than any round trip, so the bucket never empties however long the run.
BENCH_LIMIT = 10_000_000
BENCH_WINDOW_SECONDS = 60.0
ROUND_SECONDS = 0.25  # short rounds, interleaved, so load on a shared machine spreads evenly
_BATCH = 25  # calls between two looks at the clock

_Item = TypeVar("_Item")


@dataclass(frozen=True)
class _Limit:
    max_calls: int
    window_seconds: float


def _rotated(items: list[_Item], by: int) -> list[_Item]:
    """``items`` starting from index ``by`` (modulo their number) and wrapping around."""
    by %= len(items)
    return items[by:] + items[:by]


def _round(call: Callable[[], object], seconds: float) -> tuple[float, float]:
    """Calls per second, and this process's CPU microseconds per call (user + system)."""
    done, started, cpu = 0, time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(_BATCH):
            call()
        done += _BATCH
    return done / elapsed, (time.process_time() - cpu) / done * 1e6


async def _around(call: Callable[[], Awaitable[object]], seconds: float) -> tuple[float, float]:
    done, started, cpu = 0, time.perf_counter(), time.process_time()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(_BATCH):
            await call()
        done += _BATCH
    return done / elapsed, (time.process_time() - cpu) / done * 1e6


class _Wire:
    """One kept socket to the server, no client library: RESP packed and read by hiredis."""

    def __init__(self, redis_url: str) -> None:
        import socket
        from urllib.parse import urlsplit

        import hiredis

        parts = urlsplit(redis_url)
        try:
            if parts.scheme == "unix":
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._socket.connect(parts.path)
            else:
                address = (parts.hostname or "127.0.0.1", parts.port or 6379)
                self._socket = socket.create_connection(address)
        except OSError as exc:
            raise redis.exceptions.ConnectionError(f"the floor's connection failed: {exc}") from exc
        self._replies = hiredis.Reader()
        if parts.password:
            user = [parts.username] if parts.username else []
            self.call(pack("AUTH", *user, parts.password))

    def call(self, packed: bytes) -> Any:
        self._socket.sendall(packed)
        while (reply := self._replies.gets()) is False:
            data = self._socket.recv(65536)
            if not data:
                raise redis.exceptions.ConnectionError("the server closed the floor's connection")
            self._replies.feed(data)
        if isinstance(reply, Exception):
            raise RuntimeError(f"Redis refused a floor command: {reply}")
        return reply

    def close(self) -> None:
        self._socket.close()


def bench_ratelimit(redis_url: str, seconds: float = 2.0) -> dict[str, Any]:
    """Measure check rates (sequential round trips per second) against the Redis at ``redis_url``.

    ``seconds`` is the time spent on each contender. Returns a dict with ``ratelimit_per_s``,
    ``ratelimit_async_per_s``, ``raw_evalsha_per_s``, ``raw_evalsha_wire_per_s``,
    ``limits_moving_window_per_s``, ``limits_moving_window_redispy_per_s``, the two ratios the
    targets speak of (``ratio_to_raw_evalsha``, ``ratio_to_limits``), and the parameters. A
    ``limits`` figure is None, with a ``..._error`` beside it, when its client library is missing.

    Raises:
        StoreError: Redis is unreachable or failed.
        ValueError: ``seconds`` is not positive, or ``redis_url`` is not a redis URL.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    from limits import RateLimitItemPerSecond
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import MovingWindowRateLimiter

    prefix = f"bench:{uuid.uuid4().hex[:12]}"
    limit = _Limit(BENCH_LIMIT, BENCH_WINDOW_SECONDS)
    item = RateLimitItemPerSecond(BENCH_LIMIT, int(BENCH_WINDOW_SECONDS))
    figures: dict[str, Any] = {
        "seconds_per_figure": seconds,
        "limit": f"{BENCH_LIMIT}/{BENCH_WINDOW_SECONDS:g}s",
    }
    loop = asyncio.new_event_loop()
    store = connect_sync(redis_url, prefix=prefix)
    astore = connect(redis_url, prefix=prefix)
    storages: list[Any] = []
    assert isinstance(store.client, redis.Redis)  # one server: the bench has no cluster mode
    wire: _Wire | None = None
    with converting(redis_url):  # the figures need Redis; no answer is a StoreError
        try:
            sha = store.client.script_load("return 1")
            client, limiter, alimiter = store.client, store.rate_limiter, astore.rate_limiter
            raw = pack("EVALSHA", sha, 0)
            wire = _Wire(redis_url)
            on_wire = wire
            sync_calls: dict[str, Callable[[], object]] = {
                "ratelimit_per_s": lambda: limiter.hit("bench", limit),
                "raw_evalsha_per_s": lambda: client.evalsha(sha, 0),
                "raw_evalsha_wire_per_s": lambda: on_wire.call(raw),
            }
            async_calls: dict[str, Callable[[], Awaitable[object]]] = {
                "ratelimit_async_per_s": lambda: alimiter.hit("bench-async", limit),
            }
            implementations: tuple[tuple[str, Literal["coredis", "redispy"]], ...] = (
                ("limits_moving_window_per_s", "coredis"),
                ("limits_moving_window_redispy_per_s", "redispy"),
            )
            for name, implementation in implementations:
                try:
                    storage = RedisStorage(
                        f"async+{redis_url}", implementation=implementation, key_prefix=f"{prefix}:limits"
                    )
                except Exception as exc:  # a missing optional client is a figure to report, not a crash
                    figures[name] = None
                    figures[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                    continue
                storages.append(storage)
                moving = MovingWindowRateLimiter(storage)
                async_calls[name] = lambda moving=moving, key=implementation: moving.hit(item, key)  # type: ignore[misc]
            rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in [*sync_calls, *async_calls]}
            for call in sync_calls.values():  # warm up: connections, script caches
                _round(call, ROUND_SECONDS / 5)
            for acall in async_calls.values():
                loop.run_until_complete(_around(acall, ROUND_SECONDS / 5))
            sync_order, async_order = list(sync_calls.items()), list(async_calls.items())
            for number in range(max(1, round(seconds / ROUND_SECONDS))):
                # Each round starts with another contender, so none always follows the asyncio ones.
                for name, call in _rotated(sync_order, number):
                    rounds[name].append(_round(call, ROUND_SECONDS))
                for name, acall in _rotated(async_order, number):
                    rounds[name].append(loop.run_until_complete(_around(acall, ROUND_SECONDS)))
            for name, measured in rounds.items():
                figures[name] = statistics.median(rate for rate, _cpu in measured)
                figures[name.removesuffix("_per_s") + "_client_cpu_us"] = statistics.median(
                    cpu for _rate, cpu in measured
                )
        finally:
            for storage in storages:
                loop.run_until_complete(storage.reset())
            loop.run_until_complete(astore.aclose())
            loop.close()
            if wire is not None:
                wire.close()
            store.rate_limiter.close()
            keys = list(store.client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                store.client.delete(*keys)
            store.close()
    figures["ratio_to_raw_evalsha"] = figures["ratelimit_per_s"] / figures["raw_evalsha_per_s"]
    figures["ratio_to_raw_evalsha_wire"] = figures["ratelimit_per_s"] / figures["raw_evalsha_wire_per_s"]
    moving_rate = figures.get("limits_moving_window_per_s")
    figures["ratio_to_limits"] = figures["ratelimit_per_s"] / moving_rate if moving_rate else None
    return figures


# -- the asyncio client, many callers at once ---------------------------------------------------------

CALLERS = 32  # concurrent callers of one client, as a relay's requests share its store
_READS: Final = 3  # the reads of the measured transaction: a request's document and two hashes


async def _concurrent(calls: Callable[[int], Awaitable[object]], seconds: float) -> float:
    """``CALLERS`` callers of ``calls(caller)`` for ``seconds``: this process's CPU microseconds a call."""
    done = 0
    stop_at = time.perf_counter() + seconds

    async def caller(index: int) -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            for _ in range(_BATCH):
                await calls(index)
            done += _BATCH

    cpu = time.process_time()
    await asyncio.gather(*(caller(index) for index in range(CALLERS)))
    return (time.process_time() - cpu) / max(done, 1) * 1e6


async def _interleaved(
    contenders: dict[str, Callable[[int], Awaitable[object]]], seconds: float
) -> dict[str, float]:
    """Each contender's CPU microseconds a call at ``CALLERS`` callers: the median of interleaved rounds."""
    for call in contenders.values():  # warm up: every connection opened, scripts cached
        await _concurrent(call, ROUND_SECONDS / 5)
    rounds: dict[str, list[float]] = {name: [] for name in contenders}
    order = list(contenders.items())
    for number in range(max(1, round(seconds / ROUND_SECONDS))):
        for name, call in _rotated(order, number):
            rounds[name].append(await _concurrent(call, ROUND_SECONDS))
    return {name: statistics.median(measured) for name, measured in rounds.items()}


async def _bench_async_client(redis_url: str, seconds: float) -> dict[str, float]:
    import redis.asyncio

    from teaagent.store._connection import StoreOptions, make_async_client

    prefix = f"bench:{uuid.uuid4().hex[:12]}"
    doc, outcome, decisions = (f"{prefix}:{{client}}:{name}" for name in ("doc", "outcome", "decisions"))
    ours = make_async_client(redis_url, StoreOptions())
    stock = redis.asyncio.Redis(
        connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
            redis_url, max_connections=64, timeout=10, socket_timeout=5
        )
    )
    floor: list[RespConnection] = []
    try:
        sha = await ours.script_load("return redis.call('SET', KEYS[1], ARGV[1], 'EX', 600)")
        value = "v" * 400
        await ours.hset(outcome, mapping={"state": "pending", "required": "2", "peers": "2"})
        await ours.hset(decisions, mapping={"approval:beta": value})
        for _ in range(CALLERS):
            floor.append(await RespConnection.open(redis_url))
        raw_write = pack("EVALSHA", sha, 1, doc, value)
        raw_reads = b"".join(
            [
                pack("MULTI"),
                pack("GET", doc),
                pack("HGETALL", outcome),
                pack("HGETALL", decisions),
                pack("EXEC"),
            ]
        )

        async def raw(index: int, packed: bytes, replies: int) -> None:
            await floor[index].call(packed, replies)

        def reads(client: Any) -> Callable[[int], Awaitable[object]]:
            async def call(_index: int) -> object:
                async with client.pipeline(transaction=True) as pipe:
                    pipe.get(doc)
                    pipe.hgetall(outcome)
                    pipe.hgetall(decisions)
                    return await pipe.execute()

            return call

        contenders: dict[str, Callable[[int], Awaitable[object]]] = {
            "async_evalsha_client_cpu_us": lambda _index: ours.evalsha(sha, 1, doc, value),
            "async_evalsha_redispy_client_cpu_us": lambda _index: stock.evalsha(sha, 1, doc, value),
            "async_evalsha_raw_client_cpu_us": lambda index: raw(index, raw_write, 1),
            "async_multi3_client_cpu_us": reads(ours),
            "async_multi3_redispy_client_cpu_us": reads(stock),
            "async_multi3_raw_client_cpu_us": lambda index: raw(index, raw_reads, _READS + 2),
        }
        figures = await _interleaved(contenders, seconds)
    finally:
        for kept in floor:
            kept.close()
        await ours.delete(doc, outcome, decisions)
        await ours.aclose()
        await stock.aclose()
    for kind in ("evalsha", "multi3"):
        raw_cpu = figures[f"async_{kind}_raw_client_cpu_us"]
        figures[f"async_{kind}_ratio_to_raw"] = figures[f"async_{kind}_client_cpu_us"] / raw_cpu
        figures[f"async_{kind}_redispy_ratio_to_raw"] = (
            figures[f"async_{kind}_redispy_client_cpu_us"] / raw_cpu
        )
    return figures


def bench_async_client(redis_url: str, seconds: float = 2.0) -> dict[str, float]:
    """The store's asyncio client at ``CALLERS`` concurrent callers, against its floor, on uvloop.

    Client CPU microseconds per call, the median of interleaved rounds (``ROUND_SECONDS`` each,
    ``seconds`` per contender in all), for two calls a relay makes on every quorum: an
    ``EVALSHA`` of a one-line ``SET ... EX`` script and a ``MULTI`` of three reads (a document and
    two hashes). Each is made three ways: through the store's client (``make_async_client``:
    redis-py's, on the pool of ``StoreOptions.max_connections``), through redis-py's asyncio
    client built by hand on a ``BlockingConnectionPool`` of 64 (``*_redispy_*``, for context),
    and, the floor, as RESP packed and read by hiredis over ``CALLERS`` kept connections
    (``*_raw_*``). ``async_<call>_ratio_to_raw`` is the store's figure over the floor's, and
    ``async_<call>_redispy_ratio_to_raw`` redis-py's over the floor's. ``bench_redis_libraries``
    sets other libraries beside redis-py the same way (``lib_*``).

    Raises:
        StoreError: Redis is unreachable or failed.
        ValueError: ``seconds`` is not positive.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    import uvloop

    with converting(redis_url):  # the figures need Redis; no answer is a StoreError
        return uvloop.run(_bench_async_client(redis_url, seconds))
