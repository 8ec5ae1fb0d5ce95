"""Rate-limit windows shared through Redis: one Lua script call per check.

``RedisRateLimiter`` implements ``teaagent.tools.RateLimiter`` with the meaning of
``teaagent.tools.InMemoryRateLimiter``: GCRA, a bucket of ``max_calls`` calls refilled at
``max_calls`` per ``window_seconds``, kept as one number per key (``ratelimit.lua`` runs
``teaagent.tools.gcra_step``). A refused call is not counted; a key expires once its bucket is full.

The synchronous check runs once per tool call, so it skips redis-py's command layer (argument
packing, pool checkout, retry wrapper, reply callbacks: about half of the client's CPU per call):
it holds one connection of the client's pool (``LeanChannel``), keeps each window's EVALSHA
command encoded up to its one per-call argument, and reads the reply with the connection's own
parser. Failures still fail closed: no reply is a ``StoreError``, never an allowed call.

On a Redis Cluster the check goes through the cluster client instead, which sends each window's
EVALSHA to the node that owns its slot (a window is one key, so one slot); a node without the
script is given it there.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import weakref
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

__all__ = [
    "AsyncRedisRateLimiter",
    "LeanChannel",
    "RateLimitSpec",
    "RedisRateLimiter",
    "pack_command",
]


class RateLimitSpec(Protocol):
    """What a limit must say: ``max_calls`` per ``window_seconds`` (``ToolRateLimit`` fits)."""

    @property
    def max_calls(self) -> int: ...

    @property
    def window_seconds(self) -> float: ...


_KEY_CACHE_SIZE = 1024  # windows in use at once (tools, peers, a few limits each); past it the cache restarts
_CHANNELS: weakref.WeakSet[LeanChannel] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for channel in list(_CHANNELS):
        channel._forget()  # a forked child must not use its parent's socket or lock state


os.register_at_fork(after_in_child=_reset_after_fork)


def pack_command(*parts: bytes, count: int | None = None) -> bytes:
    """Encode a command as a RESP array of bulk strings (what ``Connection.pack_command`` sends).

    ``count`` is the array's length when more parts follow (appended by the caller), else ``len(parts)``.
    """
    header = b"*%d\r\n" % (len(parts) if count is None else count)
    return header + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in parts)


class LeanChannel:
    """A connection of a synchronous client's pool, held by one owner: send a packed command, read the reply.

    A lock keeps each send paired with its read, so threads share the channel safely (one round
    trip at a time, as on any single connection). A connection that failed is dropped; after
    losing an established connection the command is sent once more on a fresh one (the server may
    then have counted it twice, an error on the refusing side). A timeout is not retried: the
    server is alive but slow, and a second wait would double the caller's.
    The connection goes back to the pool on ``close()``; a forked child takes a new one.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._lock = threading.Lock()
        # A redis.connection.Connection; typed Any because redis-py leaves its methods unannotated.
        self._connection: Any = None
        _CHANNELS.add(self)

    def _forget(self) -> None:
        """In a forked child: the parent's lock state and socket are not ours (the pool resets itself)."""
        self._lock = threading.Lock()
        self._connection = None

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.disconnect()
            self._pool.release(connection)

    def execute(self, packed: list[bytes]) -> Any:
        """Send one packed command and return its decoded reply.

        Raises:
            redis.exceptions.RedisError: the server refused the command (``ResponseError``, the
                connection stays usable), or the connection failed twice, or it timed out.
        """
        with self._lock:
            connection = self._connection
            if connection is not None:
                try:
                    connection.send_packed_command(packed, check_health=True)
                    return connection.read_response()
                except redis.exceptions.ResponseError:
                    raise  # the reply was read whole: the connection is in step
                except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError):
                    self._drop()
                    raise
                except redis.exceptions.ConnectionError:
                    self._drop()  # a restarted server or a dropped socket: one fresh connection, one more try
                except BaseException:
                    # A timeout, or an interrupt between send and read, may leave a reply unread.
                    self._drop()
                    raise
            fresh: Any = self._pool.get_connection()
            self._connection = connection = fresh
            try:
                # The health check only looks at the clock unless the connection sat idle for its interval.
                connection.send_packed_command(packed, check_health=True)
                return connection.read_response()
            except redis.exceptions.ResponseError:
                raise
            except BaseException:
                self._drop()
                raise

    def close(self) -> None:
        """Give the connection back to the pool (the next ``execute`` takes one again)."""
        with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                self._pool.release(connection)


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
    counted. One EVALSHA per check on a connection of its own (the script is loaded again if the
    server lost it); thread-safe (threads take turns on that connection). On a cluster client,
    one EVALSHA per check through that client, to the window's node.
    """

    def __init__(self, client: SyncClient, *, keys: Keys, url: str) -> None:
        self._client = client
        self._keys = keys
        self._url = url
        self._source = script_source("ratelimit")
        self._sha = hashlib.sha1(self._source.encode(), usedforsecurity=False).hexdigest().encode()
        # One connection serves one server only: a cluster's windows live on several nodes.
        self._cluster: redis.cluster.RedisCluster | None = None
        self._channel: LeanChannel | None = None
        if isinstance(client, redis.cluster.RedisCluster):
            self._cluster = client
        else:
            self._channel = LeanChannel(client)
        # (key, max_calls, window_seconds) -> the command encoded up to now: "*7 EVALSHA sha 1 key i c".
        self._commands: dict[tuple[str, int, float], bytes] = {}

    def _command(self, key: str, limit: RateLimitSpec) -> bytes:
        interval, capacity = _window(limit.max_calls, limit.window_seconds)
        name = self._keys.ratelimit(key).encode()
        command = pack_command(b"EVALSHA", self._sha, b"1", name, interval, capacity, count=7)
        if len(self._commands) >= _KEY_CACHE_SIZE:
            self._commands.clear()
        self._commands[(key, limit.max_calls, limit.window_seconds)] = command
        return command

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
        channel = self._channel
        if channel is None:
            return self._hit_cluster(key, limit, now)
        command = self._commands.get((key, limit.max_calls, limit.window_seconds))
        if command is None:
            command = self._command(key, limit)
        now_us = b"%d" % (time.time_ns() // 1000 if now is None else round(now * 1_000_000))
        packed = [b"%s$%d\r\n%s\r\n" % (command, len(now_us), now_us)]
        try:
            reply = channel.execute(packed)
        except redis.exceptions.NoScriptError:
            reply = self._load_and_execute(packed)
        except redis.exceptions.RedisError as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc
        if type(reply) is int:
            return decision_from_reply(reply)
        try:
            return _decision(reply)
        except redis.exceptions.RedisError as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc

    def _load_and_execute(self, packed: list[bytes]) -> Any:
        """Load the script (a restarted or flushed server lost it; same text, same SHA) and send again.

        Raises:
            StoreError: Redis is unreachable, timed out or failed.
        """
        channel = self._channel
        assert channel is not None  # the lean path's only
        try:
            channel.execute([pack_command(b"SCRIPT", b"LOAD", self._source.encode())])
            return channel.execute(packed)
        except redis.exceptions.RedisError as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc

    def _hit_cluster(self, key: str, limit: RateLimitSpec, now: float | None) -> RateDecision:
        """``hit`` on a cluster: the client routes the EVALSHA by its key and follows MOVED.

        A NOSCRIPT (a node that a failover promoted, or one restarted) loads the script on the
        node that owns the window and sends the check again.

        Raises:
            StoreError: Redis is unreachable, timed out or failed.
            ValueError: an empty key, or a limit out of range.
        """
        cluster = self._cluster
        assert cluster is not None  # no channel: a cluster
        # redis-py leaves the synchronous cluster client's methods unannotated.
        execute: Callable[..., Any] = cluster.execute_command
        owner_of: Callable[[str], Any] = cluster.get_node_from_key
        name = self._keys.ratelimit(key)
        interval, capacity = _window(limit.max_calls, limit.window_seconds)
        command = ("EVALSHA", self._sha, 1, name, interval, capacity, _now_us(now))
        try:
            for _attempt in range(LOAD_ATTEMPTS - 1):
                try:
                    return _decision(execute(*command))
                except redis.exceptions.NoScriptError:
                    owner = owner_of(name)  # None: a slot no node serves (the cluster is reshaping)
                    execute(
                        "SCRIPT LOAD",
                        self._source,
                        target_nodes=owner if owner is not None else redis.cluster.RedisCluster.PRIMARIES,
                    )
            return _decision(execute(*command))
        except REDIS_ERRORS as exc:
            raise StoreError(describe_redis_error(self._url, exc)) from exc

    def close(self) -> None:
        """Give the limiter's connection back to the client's pool; a later ``hit`` takes one again."""
        if self._channel is not None:
            self._channel.close()


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
