"""Rate-limit windows shared through Redis: one Lua script call per check.

``RedisRateLimiter`` implements ``teaagent.tools.RateLimiter`` with the same sliding-window meaning as
``teaagent.tools.InMemoryRateLimiter``: a call at ``t`` counts until ``t + window_seconds`` (excluded),
refused calls are not counted.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import time
from typing import Protocol

import redis
import redis.asyncio
import redis.exceptions

from teaagent.errors import StoreError
from teaagent.store._connection import describe_redis_error
from teaagent.store._keys import Keys
from teaagent.store._scripts import AsyncScripts, script_source
from teaagent.tools import RateDecision

__all__ = ["MAX_WINDOW_CALLS", "AsyncRedisRateLimiter", "RateLimitSpec", "RedisRateLimiter"]

MAX_WINDOW_CALLS = 100_000  # the window logs one member per counted call; beyond this it is a throughput knob


class RateLimitSpec(Protocol):
    """What a limit must say: at most ``max_calls`` in any ``window_seconds`` (``ToolRateLimit`` fits)."""

    @property
    def max_calls(self) -> int: ...

    @property
    def window_seconds(self) -> float: ...


def _token() -> bytes:
    return os.urandom(6).hex().encode()


_MEMBER_TOKEN = _token()
_MEMBER_SEQUENCE = itertools.count()
_KEY_CACHE_SIZE = 1024  # window names in use at once: tools and peers, not users; past it the cache restarts


def _reseed_after_fork() -> None:
    global _MEMBER_TOKEN
    _MEMBER_TOKEN = _token()  # a forked child must not repeat its parent's member names


os.register_at_fork(after_in_child=_reseed_after_fork)


@functools.lru_cache(maxsize=256)
def _window(max_calls: int, window_seconds: float) -> tuple[bytes, bytes]:
    """Validate a limit once and keep its two arguments encoded (the check runs per tool call)."""
    window_ms = round(window_seconds * 1000)
    if not 1 <= max_calls <= MAX_WINDOW_CALLS:
        raise ValueError(f"max_calls must be between 1 and {MAX_WINDOW_CALLS}, not {max_calls}")
    if window_ms < 1:
        raise ValueError(f"window_seconds must be at least 0.001, not {window_seconds}")
    return b"%d" % window_ms, b"%d" % max_calls


def _args(limit: RateLimitSpec, now: float | None) -> tuple[bytes, bytes, bytes, bytes]:
    window_ms, max_calls = _window(limit.max_calls, limit.window_seconds)
    now_ms = int((time.time() if now is None else now) * 1000)
    return b"%d" % now_ms, window_ms, max_calls, b"%d-%s-%d" % (now_ms, _MEMBER_TOKEN, next(_MEMBER_SEQUENCE))


def _decision(reply: list[int]) -> RateDecision:
    allowed, remaining, retry_after_ms = reply
    return RateDecision(allowed=allowed == 1, remaining=int(remaining), retry_after=retry_after_ms / 1000)


class RedisRateLimiter:
    """A sliding-window limiter whose windows live in Redis, so every process on one prefix shares them.

    ``hit(key, limit)`` counts one call against the window ``key`` (a tool name, ``origin:<id>``):
    at most ``limit.max_calls`` calls pass in any ``limit.window_seconds``; a refused call is not
    counted. One EVALSHA per check (the script is loaded again if the server lost it);
    thread-safe (the client's pool is shared).
    """

    def __init__(self, client: redis.Redis, *, keys: Keys, url: str) -> None:
        self._client = client
        self._keys = keys
        self._url = url
        self._source = script_source("ratelimit")
        self._sha = hashlib.sha1(self._source.encode(), usedforsecurity=False).hexdigest()
        self._names: dict[str, bytes] = {}

    def _name(self, key: str) -> bytes:
        name = self._names.get(key)
        if name is None:
            if len(self._names) >= _KEY_CACHE_SIZE:
                self._names.clear()
            name = self._names[key] = self._keys.ratelimit(key).encode()
        return name

    def hit(self, key: str, limit: RateLimitSpec, *, now: float | None = None) -> RateDecision:
        """Count one call against window ``key`` and say whether it may proceed.

        Args:
            key: the window's name, shared by every caller that should share the limit.
            limit: ``max_calls`` per ``window_seconds``.
            now: Unix seconds, the caller's clock (tests pass time explicitly).

        Raises:
            StoreError: Redis is unreachable or failed (callers fail closed: no answer is no pass).
            ValueError: an empty key, or a limit out of range.
        """
        name, args = self._name(key), _args(limit, now)
        try:
            try:
                reply = self._client.evalsha(self._sha, 1, name, *args)
            except redis.exceptions.NoScriptError:
                self._sha = self._client.script_load(self._source)  # a restarted or flushed server
                reply = self._client.evalsha(self._sha, 1, name, *args)
            return _decision(reply)
        except redis.exceptions.RedisError as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc


class AsyncRedisRateLimiter:
    """The asyncio twin of ``RedisRateLimiter`` (the relay's per-origin limit); same windows, same keys."""

    def __init__(self, client: redis.asyncio.Redis, scripts: AsyncScripts, *, keys: Keys, url: str) -> None:
        self._client = client
        self._scripts = scripts
        self._keys = keys
        self._url = url

    async def hit(self, key: str, limit: RateLimitSpec, *, now: float | None = None) -> RateDecision:
        """Count one call against window ``key`` and say whether it may proceed.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: an empty key, or a limit out of range.
        """
        name, args = self._keys.ratelimit(key), _args(limit, now)
        try:
            return _decision(await self._scripts.run("ratelimit", [name], list(args)))
        except redis.exceptions.RedisError as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc
