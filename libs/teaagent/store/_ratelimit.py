"""Rate-limit windows shared through Redis: one Lua script call per check.

``RedisRateLimiter`` implements ``teaagent.tools.RateLimiter`` with the meaning of
``teaagent.tools.InMemoryRateLimiter``: GCRA, a bucket of ``max_calls`` calls refilled at
``max_calls`` per ``window_seconds``, kept as one number per key (``ratelimit.lua`` runs
``teaagent.tools.gcra_step``). A refused call is not counted; a key expires once its bucket is full.

The synchronous check is one ``EVALSHA`` through redis-py's client (its pool, its retries, hiredis
parsing): a server that lost the script is given it again and the check sent once more. Failures
still fail closed: no reply is a ``StoreError``, never an allowed call.

On a Redis Cluster the cluster client sends each window's EVALSHA to the node that owns its slot
(a window is one key, so one slot); a node without the script is given it there.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import redis
import redis.cluster
import redis.exceptions

from teaagent.errors import StoreError
from teaagent.store._connection import REDIS_ERRORS, AsyncClient, SyncClient, describe_redis_error
from teaagent.store._keys import Keys
from teaagent.store._scripts import LOAD_ATTEMPTS, AsyncScripts, script_source
from teaagent.tools import RateDecision
from teaagent.tools._ratelimit import decision_from_reply, gcra_parameters

__all__ = ["AsyncRedisRateLimiter", "RateLimitSpec", "RedisRateLimiter"]


class RateLimitSpec(Protocol):
    """What a limit must say: ``max_calls`` per ``window_seconds`` (``ToolRateLimit`` fits)."""

    @property
    def max_calls(self) -> int: ...

    @property
    def window_seconds(self) -> float: ...


def _window(max_calls: int, window_seconds: float) -> tuple[bytes, bytes]:
    """A limit's two script arguments, encoded: the refill interval and the capacity, microseconds.

    Raises:
        ValueError: the limit is out of range (see ``teaagent.tools.gcra_parameters``).
    """
    interval, capacity = gcra_parameters(max_calls, window_seconds)
    return b"%d" % interval, b"%d" % capacity


def _now_us(now: float | None) -> bytes:
    return b"%d" % (time.time_ns() // 1000 if now is None else round(now * 1_000_000))


def _decision(reply: object) -> RateDecision:
    """Read the script's one integer: remaining calls when allowed, minus the wait in µs when refused."""
    if type(reply) is not int:
        raise redis.exceptions.InvalidResponse(f"the rate-limit script answered {reply!r}, not an integer")
    return decision_from_reply(reply)


class RedisRateLimiter:
    """A GCRA limiter whose buckets live in Redis, so every process on one prefix shares them.

    ``hit(key, limit)`` counts one call against the bucket ``key`` (a tool name, ``origin:<id>``):
    a burst of ``limit.max_calls`` calls, refilled at ``limit.max_calls`` per
    ``limit.window_seconds`` (``teaagent.tools`` says what that allows); a refused call is not
    counted. One EVALSHA per check through the client (the script is loaded again where the
    server lost it); thread-safe, as redis-py's client is. On a cluster client, the EVALSHA goes
    to the window's node.
    """

    def __init__(self, client: SyncClient, *, keys: Keys, url: str) -> None:
        self._client = client
        self._keys = keys
        self._url = url
        self._source = script_source("ratelimit")
        self._sha = hashlib.sha1(self._source.encode(), usedforsecurity=False).hexdigest()

    def hit(self, key: str, limit: RateLimitSpec, *, now: float | None = None) -> RateDecision:
        """Count one call against window ``key`` and say whether it may proceed.

        Args:
            key: the window's name, shared by every caller that should share the limit.
            limit: ``max_calls`` per ``window_seconds``.
            now: Unix seconds, the caller's clock (tests pass time explicitly).

        Raises:
            StoreError: Redis is unreachable, timed out or failed (callers fail closed: no answer is no pass).
            ValueError: an empty key, or a limit out of range.
        """
        # redis-py leaves the synchronous clients' methods unannotated.
        execute: Callable[..., Any] = self._client.execute_command
        name = self._keys.ratelimit(key)
        interval, capacity = _window(limit.max_calls, limit.window_seconds)
        command = ("EVALSHA", self._sha, 1, name, interval, capacity, _now_us(now))
        try:
            for _attempt in range(LOAD_ATTEMPTS - 1):
                try:
                    return _decision(execute(*command))
                except redis.exceptions.NoScriptError:
                    self._load(name)
            return _decision(execute(*command))
        except REDIS_ERRORS as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc

    def _load(self, name: str) -> None:
        """Load the script where window ``name`` lives (a restarted, flushed or promoted server lost it)."""
        client = self._client
        if not isinstance(client, redis.cluster.RedisCluster):
            client.script_load(self._source)
            return
        owner_of: Callable[[str], Any] = client.get_node_from_key
        owner = owner_of(name)  # None: a slot no node serves (the cluster is reshaping)
        execute: Callable[..., Any] = client.execute_command
        execute(
            "SCRIPT LOAD",
            self._source,
            target_nodes=owner if owner is not None else redis.cluster.RedisCluster.PRIMARIES,
        )

    def close(self) -> None:
        """Nothing to give back: the limiter holds no connection of its own (the client's pool does)."""


class AsyncRedisRateLimiter:
    """The asyncio twin of ``RedisRateLimiter`` (the relay's per-origin limit); same windows, same keys."""

    def __init__(self, client: AsyncClient, scripts: AsyncScripts, *, keys: Keys, url: str) -> None:
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
        name, args = self.charge(key, limit, now=now)
        try:
            return _decision(await self._scripts.run("ratelimit", [name], args))
        except REDIS_ERRORS as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc

    async def hit_once(
        self, key: str, limit: RateLimitSpec, ref: str, *, ttl_ms: int, now: float | None = None
    ) -> RateDecision:
        """:meth:`hit`, once per request ``ref``: a repeat is answered as the first allowed call was.

        For a receive in steps (a Redis Cluster), whose later step may fail after the charge: the
        origin's repeat of the request is not charged again. The mark lives ``ttl_ms`` (until the
        request expires); a refused call leaves none.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: an empty key or ref, or a limit out of range.
        """
        name, args = self.charge(key, limit, now=now)
        keys = [name, self._keys.ratelimit_charged(key, ref)]
        try:
            return _decision(await self._scripts.run("charge_once", keys, [*args, ttl_ms]))
        except REDIS_ERRORS as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc

    def charge(self, key: str, limit: RateLimitSpec, *, now: float | None = None) -> tuple[str, list[bytes]]:
        """The ``ratelimit`` script's key and arguments for one :meth:`hit`, for a composite script.

        Raises:
            ValueError: an empty key, or a limit out of range.
        """
        interval, capacity = _window(limit.max_calls, limit.window_seconds)
        return self._keys.ratelimit(key), [interval, capacity, _now_us(now)]

    @staticmethod
    def decision(reply: object) -> RateDecision:
        """Read the ``ratelimit`` script's reply (an integer), as :meth:`hit` returns it.

        Raises:
            redis.exceptions.InvalidResponse: the reply is not an integer.
        """
        return _decision(reply)
