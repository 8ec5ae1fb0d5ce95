"""Rate limiting behind one small protocol, so that agents sharing a Redis can share windows.

A limiter answers one question in one call, ``hit(key, limit)``: may one more call happen now, and if
so it is counted. The Redis implementation (in :mod:`teaagent.store`) does that in a single Lua round
trip; :class:`InMemoryRateLimiter` does it under a lock in this process. Both run the same arithmetic,
:func:`gcra_step`, so a limit means the same with or without Redis.

The algorithm is GCRA (the generic cell rate algorithm, as in ``redis-cell`` and nginx's
``limit_req``), which is a token bucket kept as one number per key: the *theoretical arrival time*
(TAT) at which the bucket would be full again. ``ToolRateLimit(max_calls, window_seconds)`` is a
bucket of ``max_calls`` calls that refills one call every ``window_seconds / max_calls``:

- a burst of ``max_calls`` calls passes at once; the next call waits one refill interval;
- over a long run at most ``max_calls`` calls pass per ``window_seconds``;
- any ``window_seconds`` holds at most ``2 * max_calls - 1`` calls (a full burst, then a window of
  refills), which is the price of keeping one number instead of a log of every call;
- a refused call is not counted, and ``retry_after`` is the exact wait until the next call passes.

Times are whole microseconds, and the refill interval is rounded up to one: a limit is never looser
than it says.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from teaagent.tools._definitions import ToolRateLimit

__all__ = [
    "InMemoryRateLimiter",
    "RateDecision",
    "RateLimiter",
    "gcra_parameters",
    "gcra_step",
]

# A key holds one number whatever the limit; these bounds keep microsecond times far inside the
# integers a double (Lua's only number) holds exactly.
MAX_LIMIT_CALLS: Final = 1_000_000_000
MAX_WINDOW_SECONDS: Final = 366 * 86_400.0  # a year


@dataclass(frozen=True, slots=True)
class RateDecision:
    """The answer of a rate limiter to one call.

    Attributes:
        allowed: The call may run; it has been counted.
        remaining: How many more calls would pass right now after this one (0 when refused).
        retry_after: Seconds until a refused call would be allowed (0.0 when allowed).
    """

    allowed: bool
    remaining: int
    retry_after: float


_CACHED_ALLOWED: Final = 256  # allowed decisions are built once: a frozen dataclass costs ~0.8 us to make
_ALLOWED: Final = tuple(RateDecision(True, remaining, 0.0) for remaining in range(_CACHED_ALLOWED))


def allowed(remaining: int) -> RateDecision:
    """The decision "allowed, ``remaining`` calls left", shared when small (it is immutable)."""
    return _ALLOWED[remaining] if 0 <= remaining < _CACHED_ALLOWED else RateDecision(True, remaining, 0.0)


def decision_from_reply(reply: int) -> RateDecision:
    """Turn :func:`gcra_step`'s reply (remaining when >= 0, minus the wait in microseconds when < 0)."""
    if reply >= 0:
        return _ALLOWED[reply] if reply < _CACHED_ALLOWED else RateDecision(True, reply, 0.0)
    return RateDecision(False, 0, -reply / 1_000_000)


@functools.lru_cache(maxsize=256, typed=True)  # typed: True must not hit the entry of 1
def gcra_parameters(max_calls: int, window_seconds: float) -> tuple[int, int]:
    """Return ``(interval_us, capacity_us)`` for ``max_calls`` per ``window_seconds``.

    ``interval_us`` is one refill, rounded up to a whole microsecond; ``capacity_us`` is
    ``max_calls`` refills, the furthest the TAT may run ahead of now.

    Raises:
        ValueError: ``max_calls`` is not between 1 and a billion, or ``window_seconds`` is not
            above 0 and at most a year (the Redis limiter accepts any object with these two fields).
    """
    if isinstance(max_calls, bool) or not isinstance(max_calls, int) or not 1 <= max_calls <= MAX_LIMIT_CALLS:
        raise ValueError(f"max_calls must be an integer between 1 and {MAX_LIMIT_CALLS:,}, not {max_calls!r}")
    if not (isinstance(window_seconds, int | float) and 0 < window_seconds <= MAX_WINDOW_SECONDS):
        raise ValueError(f"window_seconds must be above 0 and at most a year, not {window_seconds!r}")
    window_us = max(1, round(window_seconds * 1_000_000))
    interval = -(-window_us // max_calls)  # integer ceiling: 1.1 s is 1,100,000 us, not one more
    return interval, interval * max_calls


def gcra_step(tat: int | None, now: int, interval: int, capacity: int) -> tuple[int | None, int]:
    """One check: the key's new TAT (None when refused: keep the old one) and the reply.

    Args:
        tat: The key's theoretical arrival time in microseconds, or None when it has none (a
            missing key is a full bucket).
        now: The caller's clock in microseconds.
        interval: One refill, ``capacity``: ``max_calls`` refills (see :func:`gcra_parameters`).

    Returns:
        ``(new_tat, remaining)`` with ``remaining >= 0`` when the call passes, or
        ``(None, -retry_after_us)`` with ``retry_after_us >= 1`` when it is refused. The wait is
        never more than ``capacity``: a TAT further ahead was set by a clock ahead of ``now``.
        ``ratelimit.lua`` is this function in Lua; keep them together.
    """
    if tat is None or tat < now:
        tat = now
    ahead = tat + interval - now  # how far past now the bucket would be full again
    if ahead > capacity:
        return None, -min(ahead - capacity, capacity)
    return tat + interval, (capacity - ahead) // interval


@runtime_checkable
class RateLimiter(Protocol):
    """Counts calls per key against a limit; one call per check (see the module for what a limit means)."""

    def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
        """Count one call under ``key`` if ``limit`` allows it, atomically.

        Args:
            key: What is limited, such as ``tool:fs.read``; limiters sharing a store share its keys.
            limit: ``max_calls`` per ``window_seconds``.

        Returns:
            Whether the call is allowed; a refused call is not counted.
        """
        ...


_SWEEP_EVERY: Final = 4096  # keys added between two sweeps of the ones whose bucket is full again


class InMemoryRateLimiter:
    """A thread-safe GCRA limiter for one process: one TAT per key, under a lock.

    A key whose bucket is full again holds no information and is dropped on the next sweep, so
    memory follows the keys in use, not the calls made.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Create an empty limiter.

        Args:
            clock: Seconds from any fixed origin, never going back; tests inject their own.
        """
        self._clock = clock
        self._lock = threading.Lock()
        self._tats: dict[str, int] = {}
        self._until_sweep = _SWEEP_EVERY

    def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
        """Count one call under ``key`` if ``limit`` allows it (see :class:`RateLimiter`)."""
        interval, capacity = gcra_parameters(limit.max_calls, limit.window_seconds)
        with self._lock:
            now = round(self._clock() * 1_000_000)
            tat, reply = gcra_step(self._tats.get(key), now, interval, capacity)
            if tat is not None:
                if key not in self._tats:
                    self._until_sweep -= 1
                    if self._until_sweep <= 0:
                        self._sweep(now)
                self._tats[key] = tat
        return decision_from_reply(reply)

    def _sweep(self, now: int) -> None:
        self._tats = {key: tat for key, tat in self._tats.items() if tat > now}
        self._until_sweep = _SWEEP_EVERY

    def reset(self, key: str | None = None) -> None:
        """Forget the calls counted under ``key``, or under every key when None."""
        with self._lock:
            if key is None:
                self._tats.clear()
            else:
                self._tats.pop(key, None)
