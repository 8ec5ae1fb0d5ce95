"""Rate-limit buckets in Redis (GCRA): a burst of max_calls passes, then one call per refill.

The synchronous limiter sends one EVALSHA through redis-py's client per check; the stories
at the end put that path through what a real server does to it: losing its scripts, dropping the
connection, stalling past the socket timeout, dying, being shared by threads and by a forked child.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relay_support import wait_until

from teaagent.store import (
    EmbeddedRedis,
    RateDecision,
    RedisRateLimiter,
    StoreError,
    StoreOptions,
    connect_sync,
    open_store,
)
from teaagent.tools import InMemoryRateLimiter, RateLimiter, ToolRateLimit
from teaagent.tools._ratelimit import decision_from_reply, gcra_parameters, gcra_step

T0 = 1_000_000.0  # the caller's clock: tests pass time instead of sleeping


@dataclass(frozen=True)
class Spec:
    """Any object with max_calls and window_seconds is a limit (ToolRateLimit refuses these itself)."""

    max_calls: int
    window_seconds: float


FAIL_FAST = StoreOptions(socket_timeout=0.3, connect_timeout=0.5, retries=0)  # errors within a second


@pytest.fixture
def limiter(redis_url: str, redis_prefix: str) -> Iterator[RedisRateLimiter]:
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        yield store.rate_limiter


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A server of this test alone: the stories below kill its clients, stall it, or kill it."""
    with EmbeddedRedis(tmp_path) as server:
        yield server


def test_it_is_a_tools_rate_limiter(limiter: RedisRateLimiter) -> None:
    typed: RateLimiter = limiter  # mypy checks the protocol; isinstance checks it at run time
    assert isinstance(typed, RateLimiter)
    assert isinstance(limiter.hit("tool:fs.read", ToolRateLimit(1, 1.0), now=T0), RateDecision)


def test_a_burst_of_max_calls_passes_then_one_call_per_refill(limiter: RedisRateLimiter) -> None:
    limit = ToolRateLimit(max_calls=3, window_seconds=30.0)  # one refill every 10 s
    assert limiter.hit("tool:shell.run", limit, now=T0) == RateDecision(True, 2, 0.0)
    assert limiter.hit("tool:shell.run", limit, now=T0) == RateDecision(True, 1, 0.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 1) == RateDecision(True, 0, 0.0)
    # The bucket is empty: the next call waits for the first refill, at T0 + 10.
    assert limiter.hit("tool:shell.run", limit, now=T0 + 3) == RateDecision(False, 0, 7.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 9.999999) == RateDecision(False, 0, 0.000001)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 10) == RateDecision(True, 0, 0.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 15) == RateDecision(False, 0, 5.0)
    # Idle for a whole window: the bucket is full again.
    assert limiter.hit("tool:shell.run", limit, now=T0 + 50) == RateDecision(True, 2, 0.0)


def test_refused_calls_are_not_counted(limiter: RedisRateLimiter) -> None:
    limit = ToolRateLimit(max_calls=1, window_seconds=5.0)
    assert limiter.hit("k", limit, now=T0).allowed
    for offset in (1, 2, 3, 4):
        assert not limiter.hit("k", limit, now=T0 + offset).allowed
    assert limiter.hit("k", limit, now=T0 + 5).allowed  # the refusals did not push the refill out


def test_the_key_holds_the_theoretical_arrival_time(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(max_calls=4, window_seconds=2.0)  # a refill every 0.5 s
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        for _ in range(3):
            store.rate_limiter.hit("k", limit, now=T0)
        # Three calls at T0 took three refills: the bucket is full again at T0 + 1.5 s.
        assert store.client.get(store.keys.ratelimit("k")) == b"%d" % ((T0 + 1.5) * 1_000_000)


def test_it_agrees_with_the_in_memory_limiter_call_for_call(limiter: RedisRateLimiter) -> None:
    clock = [T0]
    memory = InMemoryRateLimiter(clock=lambda: clock[0])
    limit = ToolRateLimit(max_calls=4, window_seconds=3.0)
    for step in range(60):
        clock[0] = T0 + step * 0.25 + (0.125 if step % 7 == 0 else 0.0)
        assert limiter.hit("tool:fs.write", limit, now=clock[0]) == memory.hit("tool:fs.write", limit), step


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    max_calls=st.integers(1, 6),
    window_ms=st.integers(1, 5_000),
    gaps_us=st.lists(st.integers(0, 3_000_000), min_size=1, max_size=40),
    start=st.sampled_from([T0, time.time()]),  # today's times too: about 1.8e15 microseconds
)
def test_redis_and_memory_and_the_reference_agree_on_any_sequence(
    limiter: RedisRateLimiter, max_calls: int, window_ms: int, gaps_us: list[int], start: float
) -> None:
    """The Lua script, the in-memory limiter and ``gcra_step`` give the same answer to every call."""
    limit = ToolRateLimit(max_calls, window_ms / 1000)
    interval, capacity = gcra_parameters(max_calls, limit.window_seconds)
    key = f"prop:{uuid.uuid4().hex}"
    clock = [start]
    memory = InMemoryRateLimiter(clock=lambda: clock[0])
    tat: int | None = None
    now = round(start * 1_000_000)
    # Redis expires a key in real time (when its bucket would be full again), so the callers'
    # clock must never fall behind real time, as a real clock never does: each step moves it by
    # its gap plus the real time the last step took (on a loaded machine, milliseconds).
    began = time.monotonic()
    lag = 0
    # That time is read before a call, and the call may reach Redis later than the last one did
    # (a loaded machine): the key of a bucket a few milliseconds long may then have expired. Only
    # when the real time since the call that set it has reached its TTL may Redis answer as for a
    # full bucket; the three then go on from that bucket.
    set_at = ttl = 0.0
    for gap in gaps_us:
        real = round((time.monotonic() - began) * 1_000_000)
        now += gap + (real - lag)
        lag = real
        clock[0] = now / 1_000_000
        now = round(clock[0] * 1_000_000)  # the microsecond both limiters read from that clock
        new_tat, reply = gcra_step(tat, now, interval, capacity)
        asked = time.monotonic()
        answer = limiter.hit(key, limit, now=now / 1_000_000)
        if answer != decision_from_reply(reply) and set_at and time.monotonic() - set_at >= ttl:
            new_tat, reply = gcra_step(None, now, interval, capacity)
            memory = InMemoryRateLimiter(clock=lambda: clock[0])
        expected = decision_from_reply(reply)
        assert answer == expected
        assert memory.hit(key, limit) == expected
        if new_tat is not None:
            tat = new_tat
            set_at, ttl = asked, math.ceil((new_tat - now) / 1000) / 1000  # the script's PX, in seconds


def test_a_lowered_limit_waits_for_the_bucket_to_drain(limiter: RedisRateLimiter) -> None:
    for _ in range(4):
        assert limiter.hit("k", ToolRateLimit(4, 10.0), now=T0).allowed  # the TAT is now T0 + 10
    # Now 2 per 10 s (a refill every 5 s, a bucket of 10 s): one more refill must fit in the bucket.
    assert limiter.hit("k", ToolRateLimit(2, 10.0), now=T0 + 1) == RateDecision(False, 0, 4.0)
    assert limiter.hit("k", ToolRateLimit(2, 10.0), now=T0 + 5) == RateDecision(True, 0, 0.0)


def test_a_bucket_set_by_a_clock_far_ahead_never_asks_for_more_than_a_full_refill(
    limiter: RedisRateLimiter,
) -> None:
    limit = ToolRateLimit(2, 10.0)
    for _ in range(2):
        assert limiter.hit("k", limit, now=T0 + 3600).allowed  # a host whose clock is an hour ahead
    assert limiter.hit("k", limit, now=T0) == RateDecision(False, 0, 10.0)


def test_windows_are_per_key_and_shared_by_every_limiter_on_the_prefix(
    redis_url: str, redis_prefix: str
) -> None:
    limit = ToolRateLimit(max_calls=2, window_seconds=60.0)
    with (
        connect_sync(redis_url, prefix=redis_prefix) as first,
        connect_sync(redis_url, prefix=redis_prefix) as second,
        connect_sync(redis_url, prefix=redis_prefix + ":other") as other_node,
    ):
        one, two = first.rate_limiter, second.rate_limiter
        assert one.hit("tool:fs.delete", limit, now=T0).allowed
        assert two.hit("tool:fs.delete", limit, now=T0).allowed
        assert not one.hit("tool:fs.delete", limit, now=T0).allowed
        assert two.hit("tool:fs.read", limit, now=T0).allowed
        assert other_node.rate_limiter.hit("tool:fs.delete", limit, now=T0).allowed


def test_fifty_threads_racing_for_ten_slots_get_exactly_ten(limiter: RedisRateLimiter) -> None:
    limit = ToolRateLimit(max_calls=10, window_seconds=60.0)
    with ThreadPoolExecutor(max_workers=16) as pool:
        decisions = list(pool.map(lambda _: limiter.hit("tool:shell.run", limit, now=T0), range(50)))
    assert sum(decision.allowed for decision in decisions) == 10
    assert sorted(decision.remaining for decision in decisions if decision.allowed) == list(range(10))


def test_the_key_expires_when_its_bucket_is_full_again(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(5, 7.5)  # a refill every 1.5 s
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        name = store.keys.ratelimit("tool:fs.read")
        store.rate_limiter.hit("tool:fs.read", limit)
        assert 1000 < store.client.pttl(name) <= 1500  # one call: full again after one refill
        for _ in range(4):
            store.rate_limiter.hit("tool:fs.read", limit)
        assert 7000 < store.client.pttl(name) <= 7500  # the whole bucket: one window


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        (Spec(0, 1.0), "^max_calls must be an integer between 1 and 1,000,000,000, not 0$"),
        (Spec(10**9 + 1, 1.0), "^max_calls must be an integer between 1 and 1,000,000,000, not 1000000001$"),
        (Spec(1, 0.0), r"^window_seconds must be above 0 and at most a year, not 0\.0$"),
        (Spec(1, 366 * 86_400 + 1), "^window_seconds must be above 0 and at most a year, not 31622401$"),
    ],
)
def test_limits_out_of_range_are_refused(
    limiter: RedisRateLimiter, limit: ToolRateLimit, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        limiter.hit("k", limit)


@pytest.mark.anyio
async def test_the_async_limiter_shares_the_sync_limiters_windows(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(max_calls=2, window_seconds=30.0)
    with connect_sync(redis_url, prefix=redis_prefix) as sync:
        assert sync.rate_limiter.hit("origin:alpha", limit, now=T0).allowed

    async def scenario() -> list[RateDecision]:
        async with open_store(redis_url, prefix=redis_prefix) as store:
            return list(
                await asyncio.gather(
                    *(store.rate_limiter.hit("origin:alpha", limit, now=T0 + 1) for _ in range(20))
                )
            )

    decisions = await scenario()
    assert sum(decision.allowed for decision in decisions) == 1
    # A refill every 15 s: the call at T0 + 1 takes the second slot, the rest wait for a refill.
    assert {decision.retry_after for decision in decisions if not decision.allowed} == {14.0}


@pytest.mark.anyio
async def test_a_server_that_lost_its_scripts_gets_them_again(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(max_calls=2, window_seconds=60.0)
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 1
        store.client.script_flush()  # what a restart without persistence of the script cache looks like
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 0

    async def scenario() -> RateDecision:
        async with open_store(redis_url, prefix=redis_prefix) as store:
            await store.client.script_flush()
            return await store.rate_limiter.hit("k", limit, now=T0)

    assert await scenario() == RateDecision(False, 0, 30.0)


def test_an_empty_scope_is_refused(limiter: RedisRateLimiter) -> None:
    with pytest.raises(ValueError, match="rate-limit scope '' must be 1 to"):
        limiter.hit("", ToolRateLimit(1, 1.0))


def test_the_allowed_decisions_count_down_across_the_cached_range(limiter: RedisRateLimiter) -> None:
    # Decisions with fewer than 256 calls left are shared objects; the ones above are built per call.
    limit = ToolRateLimit(max_calls=300, window_seconds=60.0)
    remaining = [limiter.hit("k", limit, now=T0).remaining for _ in range(300)]
    assert remaining == list(range(299, -1, -1))
    assert limiter.hit("k", limit, now=T0) == RateDecision(False, 0, 0.2)


def test_the_script_reloaded_after_a_flush_counts_the_call_once(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(max_calls=3, window_seconds=60.0)
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 2
        for expected in (1, 0):
            store.client.script_flush()
            assert store.rate_limiter.hit("k", limit, now=T0) == RateDecision(True, expected, 0.0)
        assert store.client.get(store.keys.ratelimit("k")) == b"%d" % ((T0 + 3 * 20) * 1_000_000)
        assert not store.rate_limiter.hit("k", limit, now=T0).allowed


@pytest.mark.slow
def test_a_dropped_connection_is_replaced_and_the_call_counted_once(own_server: EmbeddedRedis) -> None:
    limit = ToolRateLimit(max_calls=5, window_seconds=60.0)
    admin = redis.Redis.from_url(own_server.url)
    with connect_sync(own_server.url, prefix="ta:alpha", options=FAIL_FAST) as store:
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 4
        # The server closes every client but the admin's: the limiter's held connection is gone.
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
        assert store.rate_limiter.hit("k", limit, now=T0) == RateDecision(True, 3, 0.0)
        assert admin.get(store.keys.ratelimit("k")) == b"%d" % ((T0 + 2 * 12) * 1_000_000)
    admin.close()


def _stalled(url: str) -> bool:
    """Whether a PING goes unanswered for 0.5 s: the blocking script has started.

    That is more than the 0.3 s in which the test's own limiter must be answered (``FAIL_FAST``), so
    a loaded host that answers the limiter in time answers this probe too.
    """
    probe = redis.Redis.from_url(url, socket_timeout=0.5)
    try:
        probe.ping()
    except redis.exceptions.TimeoutError:
        return True
    finally:
        probe.close()
    return False


@pytest.mark.slow
def test_a_stalled_server_is_a_store_error_and_the_limiter_recovers(own_server: EmbeddedRedis) -> None:
    limit = ToolRateLimit(max_calls=5, window_seconds=60.0)
    admin = redis.Redis.from_url(own_server.url)
    admin.config_set("busy-reply-threshold", 3000)  # the server answers nobody for three seconds
    blocker = redis.Redis.from_url(own_server.url)
    errors: list[Exception] = []

    def stall() -> None:
        try:
            blocker.eval("while true do end", 0)
        except redis.exceptions.ResponseError as exc:
            errors.append(exc)

    with connect_sync(own_server.url, prefix="ta:alpha", options=FAIL_FAST) as store:
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 4
        thread = threading.Thread(target=stall)
        thread.start()
        assert wait_until(lambda: _stalled(own_server.url), 10), "the blocking script never started"
        with pytest.raises(
            StoreError, match=r"^Redis at unix://:\*\*\*@/\S+/redis\.sock\?db=0 did not answer in time"
        ):
            store.rate_limiter.hit("k", limit, now=T0 + 1)
        deadline = time.monotonic() + 10
        while True:  # SCRIPT KILL is heard once the busy threshold has passed
            try:
                admin.script_kill()
                break
            except redis.exceptions.ResponseError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        thread.join()
        assert len(errors) == 1
        assert "killed" in str(errors[0]).lower()
        # The stalled call may or may not have reached the server before its connection was closed.
        after = store.rate_limiter.hit("k", limit, now=T0 + 2)
        assert after.allowed
        assert after.remaining in (2, 3)
    blocker.close()
    admin.close()


@pytest.mark.slow
def test_a_killed_server_refuses_every_call_instead_of_allowing_it(own_server: EmbeddedRedis) -> None:
    limit = ToolRateLimit(max_calls=100, window_seconds=60.0)
    with connect_sync(own_server.url, prefix="ta:alpha", options=FAIL_FAST) as store:
        assert store.rate_limiter.hit("k", limit).allowed
        assert own_server.pid is not None
        os.kill(own_server.pid, signal.SIGKILL)
        probe = redis.Redis.from_url(own_server.url, socket_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:  # until the kernel has closed the dead server's listening socket
            try:
                probe.ping()
            except redis.exceptions.ConnectionError:
                break
            assert time.monotonic() < deadline
            time.sleep(0.01)
        probe.close()
        for _ in range(3):  # the held connection, then fresh ones: each call fails, none passes
            with pytest.raises(StoreError, match=r"is unreachable: Connection refused$"):
                store.rate_limiter.hit("k", limit)


def test_eight_threads_hammering_one_limiter_get_exactly_max_calls(limiter: RedisRateLimiter) -> None:
    # Day-long windows: the keys expire in real time (at the bucket's refill, on Redis's clock) while
    # the callers' clock stands still at T0, so a short window's key could vanish under a thread
    # that the scheduler held back, and its count start over.
    shared = ToolRateLimit(max_calls=100, window_seconds=86_400.0)
    own = ToolRateLimit(max_calls=1000, window_seconds=86_400.0)
    barrier = threading.Barrier(8)

    def hammer(thread: int) -> tuple[list[RateDecision], list[int]]:
        barrier.wait()
        decisions, counted_down = [], []
        for _ in range(50):
            decisions.append(limiter.hit("tool:shell.run", shared, now=T0))
            # Each thread's own window answers 999, 998, ...: a reply given to the wrong thread shows.
            counted_down.append(limiter.hit(f"thread:{thread}", own, now=T0).remaining)
        return decisions, counted_down

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(hammer, range(8)))
    decisions = [decision for thread_decisions, _ in results for decision in thread_decisions]
    assert len(decisions) == 400
    assert sorted(decision.remaining for decision in decisions if decision.allowed) == list(range(100))
    assert all(decision == RateDecision(False, 0, 864.0) for decision in decisions if not decision.allowed)
    for _, counted_down in results:
        assert counted_down == list(range(999, 949, -1))


def _hit_in_child(url: str, prefix: str, results: multiprocessing.Queue[object]) -> None:
    results.put(_LIMITERS[(url, prefix)].hit("k", ToolRateLimit(max_calls=4, window_seconds=60.0), now=T0))


_LIMITERS: dict[tuple[str, str], RedisRateLimiter] = {}  # what a forked child inherits from its parent


@pytest.mark.slow
def test_a_forked_child_uses_a_connection_of_its_own(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(max_calls=4, window_seconds=60.0)
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        _LIMITERS[(redis_url, redis_prefix)] = store.rate_limiter
        try:
            assert store.rate_limiter.hit("k", limit, now=T0).remaining == 3  # the parent holds a connection
            context = multiprocessing.get_context("fork")
            results: multiprocessing.Queue[object] = context.Queue()
            # The child inherits the parent's pool with a connection in it, and must not use it.
            child = context.Process(
                target=_hit_in_child, args=(redis_url, redis_prefix, results), daemon=True
            )
            try:
                child.start()
                from_child = results.get(timeout=30)
                child.join(timeout=30)
            finally:
                if child.is_alive():  # a child stuck on the inherited lock must not outlive the test
                    child.kill()
                    child.join()
            assert child.exitcode == 0
            assert from_child == RateDecision(True, 2, 0.0)
            assert store.rate_limiter.hit("k", limit, now=T0) == RateDecision(True, 1, 0.0)
            # Three calls counted, each once: the bucket is full again three refills (15 s each) after T0.
            assert store.client.get(store.keys.ratelimit("k")) == b"%d" % ((T0 + 3 * 15) * 1_000_000)
        finally:
            del _LIMITERS[(redis_url, redis_prefix)]


def test_a_closed_limiter_takes_a_connection_again(limiter: RedisRateLimiter) -> None:
    limit = ToolRateLimit(max_calls=2, window_seconds=60.0)
    assert limiter.hit("k", limit, now=T0).remaining == 1
    limiter.close()
    assert limiter.hit("k", limit, now=T0) == RateDecision(True, 0, 0.0)
