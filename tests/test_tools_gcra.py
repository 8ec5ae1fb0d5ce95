"""What a ``ToolRateLimit`` promises, checked on the arithmetic every limiter runs (``gcra_step``).

The Redis script and ``InMemoryRateLimiter`` are checked against ``gcra_step`` call for call in
``test_store_ratelimit.py``; here the reference itself is checked against the promises the tools
module states: a burst of ``max_calls``, one call per refill after it, at most ``2 * max_calls - 1``
calls in any window, a long-run rate of ``max_calls`` per window, and a ``retry_after`` that is the
exact wait.
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teaagent.tools import InMemoryRateLimiter, RateDecision, ToolRateLimit
from teaagent.tools._ratelimit import _SWEEP_EVERY, gcra_parameters, gcra_step

NOW = 1_800_000_000_000_000  # microseconds, about the current Unix time


def run(limit: ToolRateLimit, times: list[int]) -> list[tuple[int, int]]:
    """Feed the calls at ``times`` (microseconds, in order) to one key; return (time, reply) of each."""
    interval, capacity = gcra_parameters(limit.max_calls, limit.window_seconds)
    tat: int | None = None
    replies = []
    for now in times:
        new_tat, reply = gcra_step(tat, now, interval, capacity)
        if new_tat is not None:
            tat = new_tat
        replies.append((now, reply))
    return replies


limits = st.builds(ToolRateLimit, st.integers(1, 8), st.integers(1, 10_000).map(lambda ms: ms / 1000))
schedules = st.lists(st.integers(0, 2_000_000), min_size=1, max_size=80).map(
    lambda gaps: [NOW + sum(gaps[: index + 1]) for index in range(len(gaps))]
)


@settings(max_examples=300)
@given(limit=limits, times=schedules)
def test_any_window_holds_at_most_twice_max_calls_less_one(limit: ToolRateLimit, times: list[int]) -> None:
    window = round(limit.window_seconds * 1_000_000)
    passed = [now for now, reply in run(limit, times) if reply >= 0]
    for index, start in enumerate(passed):
        inside = bisect.bisect_left(passed, start + window) - index  # calls in [start, start + window)
        assert inside <= 2 * limit.max_calls - 1


@settings(max_examples=300)
@given(limit=limits, times=schedules)
def test_over_any_stretch_no_more_than_a_burst_and_the_refills_pass(
    limit: ToolRateLimit, times: list[int]
) -> None:
    interval, _ = gcra_parameters(limit.max_calls, limit.window_seconds)
    passed = [now for now, reply in run(limit, times) if reply >= 0]
    for index, start in enumerate(passed):
        for later in range(index, len(passed)):
            assert later - index + 1 <= limit.max_calls + (passed[later] - start) // interval


@settings(max_examples=300)
@given(limit=limits, times=schedules)
def test_a_refused_call_waits_exactly_its_retry_after(limit: ToolRateLimit, times: list[int]) -> None:
    interval, capacity = gcra_parameters(limit.max_calls, limit.window_seconds)
    tat: int | None = None
    for now in times:
        new_tat, reply = gcra_step(tat, now, interval, capacity)
        if new_tat is None:
            wait = -reply
            assert 1 <= wait <= capacity
            assert gcra_step(tat, now + wait - 1, interval, capacity)[0] is None  # a microsecond early
            assert gcra_step(tat, now + wait, interval, capacity)[0] is not None
        else:
            # Remaining is how many more calls would pass at this very instant.
            probe, passes = new_tat, 0
            while (probe := gcra_step(probe, now, interval, capacity)[0]) is not None:
                passes += 1
            assert passes == reply
            tat = new_tat


@given(max_calls=st.integers(1, 1000), window_ms=st.integers(1, 3_600_000))
def test_a_full_bucket_passes_exactly_max_calls_at_once(max_calls: int, window_ms: int) -> None:
    replies = [reply for _, reply in run(ToolRateLimit(max_calls, window_ms / 1000), [NOW] * (max_calls + 1))]
    assert replies[:-1] == list(range(max_calls - 1, -1, -1))
    assert replies[-1] < 0


def test_the_refill_interval_rounds_up_so_a_limit_is_never_looser() -> None:
    assert gcra_parameters(3, 1.0) == (333_334, 1_000_002)
    assert gcra_parameters(1, 1.1) == (1_100_000, 1_100_000)  # integer arithmetic: no float ceiling excess
    assert gcra_parameters(1_000, 0.000_001) == (1, 1_000)  # at most one call per microsecond


@pytest.mark.parametrize(
    ("max_calls", "window", "message"),
    [
        (0, 1.0, "^max_calls must be an integer between 1 and 1,000,000,000, not 0$"),
        (True, 1.0, "^max_calls must be an integer between 1 and 1,000,000,000, not True$"),
        (2.0, 1.0, "^max_calls must be an integer between 1 and 1,000,000,000, not 2.0$"),
        (1, -1.0, "^window_seconds must be above 0 and at most a year, not -1.0$"),
        (1, 400 * 86_400.0, "^window_seconds must be above 0 and at most a year, not 34560000.0$"),
    ],
)
def test_parameters_out_of_range_are_refused(max_calls: int, window: float, message: str) -> None:
    gcra_parameters(1, 1.0)  # cached: True (== 1) or 2.0 (== 2) must still not pass as them
    gcra_parameters(2, 1.0)
    with pytest.raises(ValueError, match=message):
        gcra_parameters(max_calls, window)


def test_a_tat_set_by_a_clock_far_ahead_asks_for_one_full_bucket_at_most() -> None:
    interval, capacity = gcra_parameters(2, 10.0)
    assert gcra_step(NOW + 3_600_000_000, NOW, interval, capacity) == (None, -capacity)


def test_the_in_memory_limiter_forgets_keys_whose_bucket_is_full_again() -> None:
    now = [1000.0]
    limiter = InMemoryRateLimiter(clock=lambda: now[0])
    limit = ToolRateLimit(1, 1.0)
    for key in range(_SWEEP_EVERY):
        assert limiter.hit(f"old:{key}", limit).allowed
    assert not limiter.hit("old:0", limit).allowed
    now[0] += 1.0  # every old bucket is full again
    assert limiter.hit("new:0", limit).allowed
    for key in range(1, _SWEEP_EVERY):
        limiter.hit(f"new:{key}", limit)  # the key that starts the next sweep
    assert len(limiter._tats) == _SWEEP_EVERY  # the old keys are gone, the new ones kept
    assert limiter.hit("new:0", limit) == RateDecision(False, 0, 1.0)
