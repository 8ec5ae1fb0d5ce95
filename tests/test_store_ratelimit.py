"""Rate-limit windows in Redis: the Nth call passes, the next is refused, the window slides."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from teaagent.store import RateDecision, RedisRateLimiter, connect_sync, open_store
from teaagent.tools import InMemoryRateLimiter, RateLimiter, ToolRateLimit

T0 = 1_000_000.0  # the caller's clock: tests pass time instead of sleeping


@dataclass(frozen=True)
class Spec:
    """Any object with max_calls and window_seconds is a limit (ToolRateLimit refuses these itself)."""

    max_calls: int
    window_seconds: float


@pytest.fixture
def limiter(redis_url: str, redis_prefix: str) -> Iterator[RedisRateLimiter]:
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        yield store.rate_limiter


def test_it_is_a_tools_rate_limiter(limiter: RedisRateLimiter) -> None:
    typed: RateLimiter = limiter  # mypy checks the protocol; isinstance checks it at run time
    assert isinstance(typed, RateLimiter)
    assert isinstance(limiter.hit("tool:fs.read", ToolRateLimit(1, 1.0), now=T0), RateDecision)


def test_the_nth_call_passes_the_next_is_refused_and_the_window_slides(limiter: RedisRateLimiter) -> None:
    limit = ToolRateLimit(max_calls=3, window_seconds=10.0)
    assert limiter.hit("tool:shell.run", limit, now=T0) == RateDecision(True, 2, 0.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 1) == RateDecision(True, 1, 0.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 2) == RateDecision(True, 0, 0.0)
    # One over: refused until the first call leaves the window at T0 + 10.
    assert limiter.hit("tool:shell.run", limit, now=T0 + 3) == RateDecision(False, 0, 7.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 9.999) == RateDecision(False, 0, 0.001)
    # A call made at t counts until t + window, excluded.
    assert limiter.hit("tool:shell.run", limit, now=T0 + 10) == RateDecision(True, 0, 0.0)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 10.5) == RateDecision(False, 0, 0.5)
    assert limiter.hit("tool:shell.run", limit, now=T0 + 11) == RateDecision(True, 0, 0.0)


def test_refused_calls_are_not_counted(limiter: RedisRateLimiter) -> None:
    limit = ToolRateLimit(max_calls=1, window_seconds=5.0)
    assert limiter.hit("k", limit, now=T0).allowed
    for offset in (1, 2, 3, 4):
        assert not limiter.hit("k", limit, now=T0 + offset).allowed
    assert limiter.hit("k", limit, now=T0 + 5).allowed  # the refusals did not push the window out


def test_it_agrees_with_the_in_memory_limiter_call_for_call(limiter: RedisRateLimiter) -> None:
    clock = [T0]
    memory = InMemoryRateLimiter(clock=lambda: clock[0])
    limit = ToolRateLimit(max_calls=4, window_seconds=3.0)
    for step in range(60):
        clock[0] = T0 + step * 0.25 + (0.125 if step % 7 == 0 else 0.0)
        ours = limiter.hit("tool:fs.write", limit, now=clock[0])
        theirs = memory.hit("tool:fs.write", limit)
        assert (ours.allowed, ours.remaining) == (theirs.allowed, theirs.remaining), step
        assert ours.retry_after == pytest.approx(theirs.retry_after, abs=0.001), step


def test_a_lowered_limit_waits_for_enough_calls_to_leave(limiter: RedisRateLimiter) -> None:
    for offset in range(4):
        assert limiter.hit("k", ToolRateLimit(4, 10.0), now=T0 + offset).allowed
    # Now only 2 per window: two of the four logged calls must leave first (the one at T0 + 2).
    assert limiter.hit("k", ToolRateLimit(2, 10.0), now=T0 + 5) == RateDecision(False, 0, 7.0)


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


def test_the_window_key_lives_exactly_one_window(redis_url: str, redis_prefix: str) -> None:
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        store.rate_limiter.hit("tool:fs.read", ToolRateLimit(5, 7.5))
        ttl = store.client.pttl(store.keys.ratelimit("tool:fs.read"))
    assert 7000 < ttl <= 7500


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        (Spec(0, 1.0), "max_calls must be between 1 and 100000, not 0"),
        (Spec(100_001, 1.0), "max_calls must be between 1 and 100000, not 100001"),
        (Spec(1, 0.0004), "window_seconds must be at least 0.001"),
    ],
)
def test_limits_out_of_range_are_refused(
    limiter: RedisRateLimiter, limit: ToolRateLimit, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        limiter.hit("k", limit)


def test_the_async_limiter_shares_the_sync_limiters_windows(redis_url: str, redis_prefix: str) -> None:
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

    decisions = asyncio.run(scenario())
    assert sum(decision.allowed for decision in decisions) == 1
    assert {decision.retry_after for decision in decisions if not decision.allowed} == {29.0}


def test_a_server_that_lost_its_scripts_gets_them_again(redis_url: str, redis_prefix: str) -> None:
    limit = ToolRateLimit(max_calls=2, window_seconds=60.0)
    with connect_sync(redis_url, prefix=redis_prefix) as store:
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 1
        store.client.script_flush()  # what a restart without persistence of the script cache looks like
        assert store.rate_limiter.hit("k", limit, now=T0).remaining == 0

    async def scenario() -> RateDecision:
        async with open_store(redis_url, prefix=redis_prefix) as store:
            await store.client.script_flush()
            return await store.rate_limiter.hit("k", limit, now=T0)

    assert asyncio.run(scenario()) == RateDecision(False, 0, 60.0)
