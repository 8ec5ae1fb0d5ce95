"""Rate limiting behind one small protocol, so that agents sharing a Redis can share windows.

A limiter answers one question in one call, ``hit(key, limit)``: may one more call happen now, and if
so it is counted. The Redis implementation (in :mod:`teaagent.store`) does that in a single Lua round
trip; :class:`InMemoryRateLimiter` does it under a lock in this process.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from teaagent.tools._definitions import ToolRateLimit

__all__ = ["InMemoryRateLimiter", "RateDecision", "RateLimiter"]


@dataclass(frozen=True, slots=True)
class RateDecision:
    """The answer of a rate limiter to one call.

    Attributes:
        allowed: The call may run; it has been counted in the window.
        remaining: How many more calls the window holds after this one (0 when refused).
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


@runtime_checkable
class RateLimiter(Protocol):
    """Counts calls per key in sliding windows; one call per check."""

    def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
        """Count one call under ``key`` if ``limit`` allows it, atomically.

        Args:
            key: What is limited, such as ``tool:fs.read``; limiters sharing a store share its windows.
            limit: The number of calls allowed per window.

        Returns:
            Whether the call is allowed; a refused call is not counted.
        """
        ...


class InMemoryRateLimiter:
    """A thread-safe sliding-window limiter that keeps the exact time of every counted call.

    A call made at time ``t`` counts in the window until ``t + window_seconds`` (excluded), so the
    ``max_calls``-th call of a window passes, the next is refused, and it passes again exactly when
    the oldest counted call leaves the window. The log of a key never holds more than ``max_calls``
    entries, because refused calls are not recorded.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        """Create an empty limiter.

        Args:
            clock: Seconds from any fixed origin, never going back; tests inject their own.
        """
        self._clock = clock
        self._lock = threading.Lock()
        self._logs: dict[str, deque[float]] = {}

    def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
        """Count one call under ``key`` if ``limit`` allows it (see :class:`RateLimiter`)."""
        window = limit.window_seconds
        with self._lock:
            now = self._clock()
            log = self._logs.get(key)
            if log is None:
                log = self._logs[key] = deque()
            expired = now - window
            while log and log[0] <= expired:
                log.popleft()
            count = len(log)
            if count < limit.max_calls:
                log.append(now)
                return allowed(limit.max_calls - count - 1)
            # The call is allowed again once enough of the oldest entries have left the window; a
            # log may hold more than max_calls entries after the limit was lowered.
            oldest_to_expire = log[count - limit.max_calls]
            return RateDecision(False, 0, max(0.0, oldest_to_expire + window - now))

    def reset(self, key: str | None = None) -> None:
        """Forget the calls counted under ``key``, or under every key when None."""
        with self._lock:
            if key is None:
                self._logs.clear()
            else:
                self._logs.pop(key, None)
