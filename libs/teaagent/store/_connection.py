"""Redis clients with timeouts and retries, and the one place Redis errors become ``StoreError``.

A node's store is one Redis server or a Redis Cluster (``redis_cluster = true`` in node.toml): the
cluster clients of redis-py route each command by its key's slot and follow MOVED and ASK, so the
store's code is the same on both. ``AsyncClient`` and ``SyncClient`` name either kind.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import math
import os
import re
import socket
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeAlias
from urllib.parse import urlsplit, urlunsplit

import hiredis
import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.exceptions
import redis.retry

from teaagent.errors import StoreError

__all__ = [
    "EMBEDDED_URL",
    "REDIS_ERRORS",
    "AsyncClient",
    "LeanRedis",
    "StoreOptions",
    "SyncClient",
    "converting",
    "describe_redis_error",
    "make_async_client",
    "make_sync_client",
    "redact_url",
]

EMBEDDED_URL = "embedded"  # the node configuration's word for "start a private server in data_dir"

SOCKET_TIMEOUT = 5.0  # a command on a healthy Redis takes microseconds; five seconds means it is gone
CONNECT_TIMEOUT = 2.0  # a loopback or LAN connect is instant; fail fast so retries can help
HEALTH_CHECK_INTERVAL = 30  # PING a pooled connection idle this long first: NATs and proxies drop idle TCP
RETRIES = 3  # a restart or failover of Redis takes a moment; three backed-off retries ride it out
BACKOFF_BASE = 0.05  # seconds before the first retry
BACKOFF_CAP = 1.0  # seconds, the longest wait between two retries
MAX_CONNECTIONS = 64  # per async client, for commands that answer at once
# Per async store, for blocking reads (long-polls, queue claims) on a pool of their own: each holds
# a connection while it blocks, and sharing one pool let 64 waiting long-polls starve every command.
BLOCKING_CONNECTIONS = 1024
# Which asyncio client a single server gets (benches only, while both are measured): "redispy" is
# redis-py's own client on its blocking pool, anything else this module's lean client.
STORE_CLIENT_ENV: Final = "TEAAGENT_STORE_CLIENT"
POOL_WAIT_TIMEOUT = 10.0  # seconds a caller waits for a free pooled connection before failing

AsyncClient: TypeAlias = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster
SyncClient: TypeAlias = redis.Redis | redis.cluster.RedisCluster
# What a client may raise: redis-py's cluster clients raise RedisClusterException, which is not a
# RedisError, for what they refuse before sending (keys of two slots in one command, no reachable node).
REDIS_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,
)


@dataclass(frozen=True, kw_only=True)
class StoreOptions:
    """How a store talks to Redis; the defaults suit a local or LAN Redis."""

    socket_timeout: float = SOCKET_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT
    health_check_interval: int = HEALTH_CHECK_INTERVAL
    retries: int = RETRIES
    max_connections: int = MAX_CONNECTIONS
    blocking_connections: int = BLOCKING_CONNECTIONS

    def __post_init__(self) -> None:
        if self.socket_timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("socket_timeout and connect_timeout must be positive")
        if self.retries < 0 or self.max_connections < 1 or self.health_check_interval < 0:
            raise ValueError("retries and health_check_interval must be >= 0 and max_connections >= 1")
        if self.blocking_connections < 1:
            raise ValueError("blocking_connections must be >= 1")

    def for_blocking(self) -> StoreOptions:
        """These options with the blocking reads' pool size as the pool's (``make_async_client``)."""
        return dataclasses.replace(self, max_connections=self.blocking_connections)

    @property
    def max_block_seconds(self) -> float:
        """Longest single blocking read, kept well under the socket timeout so it never trips it."""
        return self.socket_timeout / 2


def _check_url(redis_url: str, cluster: bool) -> None:
    if redis_url == EMBEDDED_URL:
        raise ValueError(
            "redis_url 'embedded' names no server: start EmbeddedRedis(data_dir) and connect to its url"
        )
    parts = urlsplit(redis_url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"redis_url must start with redis://, rediss:// or unix://, not {redact_url(redis_url)!r}"
        )
    if cluster and parts.scheme == "unix":
        raise ValueError(
            f"a Redis Cluster is reached over TCP: redis_url must start with redis:// or rediss://, "
            f"not {redact_url(redis_url)!r}"
        )
    if cluster and parts.path not in ("", "/", "/0"):
        raise ValueError(
            f"a Redis Cluster has database 0 only: redis_url {redact_url(redis_url)!r} names another"
        )


def make_async_client(
    redis_url: str, options: StoreOptions, *, cluster: bool = False, shared: bool = True
) -> AsyncClient:
    """Build an asyncio client whose pool waits for a free connection instead of failing at once.

    On a single server, with ``shared`` (the default), the commands that answer at once and
    plain pipelines of them go over one connection that all the client's callers share
    (``LeanRedis``); blocking commands and those that change a connection's state keep the pool.
    A client only for blocking reads is built with ``shared=False``.

    With ``cluster``, a Redis Cluster client that learns the cluster's nodes from ``redis_url`` (any
    one node) at its first command; it keeps up to ``options.max_connections`` connections per
    node and, unlike the single server's pool, fails a command at once when a node's are all busy.

    Raises:
        ValueError: ``redis_url`` is not a redis://, rediss:// or unix:// URL (not unix:// and no
            database but 0 for a cluster).
    """
    _check_url(redis_url, cluster)
    retry = redis.asyncio.retry.Retry(
        redis.backoff.ExponentialWithJitterBackoff(base=BACKOFF_BASE, cap=BACKOFF_CAP), options.retries
    )
    if cluster:
        return redis.asyncio.cluster.RedisCluster.from_url(
            redis_url,
            max_connections=options.max_connections,
            socket_timeout=options.socket_timeout,
            socket_connect_timeout=options.connect_timeout,
            health_check_interval=options.health_check_interval,
            retry=retry,
        )
    if os.environ.get(STORE_CLIENT_ENV) == "redispy":  # the benches' variant: redis-py as shipped
        return redis.asyncio.Redis(
            connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
                redis_url,
                max_connections=options.max_connections,
                timeout=POOL_WAIT_TIMEOUT,
                socket_timeout=options.socket_timeout,
                socket_connect_timeout=options.connect_timeout,
                health_check_interval=options.health_check_interval,
                retry=retry,
            )
        )
    pool = QuickBlockingPool.from_url(
        redis_url,
        max_connections=options.max_connections,
        timeout=POOL_WAIT_TIMEOUT,
        socket_timeout=options.socket_timeout,
        socket_connect_timeout=options.connect_timeout,
        health_check_interval=options.health_check_interval,
        retry=retry,
    )
    pool.connection_class = _HIREDIS_PACKED.get(pool.connection_class, pool.connection_class)
    client = LeanRedis(connection_pool=pool)
    if shared:
        client._shared = _Shared(pool)
    return client


class LeanRedis(redis.asyncio.Redis):
    """redis-py's asyncio client, whose commands skip the layer around the round trip.

    ``Redis.execute_command`` wraps each command in closures, timing and awaited metric calls for
    OpenTelemetry (recorded only when configured; teaagent never configures them), the
    single-connection client's lock, and a check for ``HIMPORT SET``. Here a command that answers
    at once goes over the client's shared connection (``_Shared``, when ``make_async_client``
    gave it one): packed, queued behind the other callers' commands and answered in their order.
    Any other command (a blocking read, one that changes a connection's state: ``_shareable``)
    takes a pooled connection, sends, and reads its reply with the client's own
    ``parse_response``. Either way the reply goes through the client's callbacks and options, and
    a failed attempt is retried by the client's ``Retry`` exactly as redis-py retries it (a pooled
    connection is dropped before each new attempt, a shared one has dropped itself). A client
    built for one connection (``single_connection_client``) goes redis-py's own way.
    ``teaagent bench relay`` measures the client against redis-py's and against the same
    commands written by hand (its ``async_*`` figures).
    """

    _shared: _Shared | None = None

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        if self.single_connection_client or self.connection is not None:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        shared = self._shared
        if shared is not None and _shareable(args, options):
            return await self._shared_command(shared, args, options)
        pool = self.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:

            async def trip() -> Any:
                await connection.send_packed_command(connection.pack_command(*args))
                return await self.parse_response(connection, args[0], **options)

            return await connection.retry.call_with_retry(trip, lambda _error: connection.disconnect())
        finally:
            await _give_back(pool, connection)

    async def _shared_command(self, shared: _Shared, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
        packed = _pack(args)

        async def trip() -> Any:
            return await (await shared.lane()).call(packed)

        reply = await shared.retry.call_with_retry(trip, shared.after_failure)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        options.pop("keys", None)  # as parse_response does: only a client-side cache reads it
        callback = self.response_callbacks.get(args[0])
        if callback is None:
            return reply
        result = callback(reply, **options)
        return await result if inspect.isawaitable(result) else result

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> LeanPipeline:
        pipe = LeanPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe._shared = self._shared
        return pipe

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the shared connection (its callers get a ``ConnectionError``), then as redis-py does."""
        if self._shared is not None:
            await self._shared.aclose()
        await super().aclose(close_connection_pool)


class LeanPipeline(redis.asyncio.client.Pipeline):
    """redis-py's pipeline, whose plain batches skip the layer around the round trip.

    A batch without ``WATCH``, without scripts to load and with nothing but ordinary commands
    (no ``HIMPORT``, no reply-shaping options) is packed in one write: on the client's shared
    connection when every command may go there (``_shareable``), else on a pooled one, each
    reply read with the connection's ``read_response``. For a transaction the ``EXEC`` reply is
    checked as redis-py checks it (a command refused while queued is raised, ``EXECABORT``
    otherwise); the first error is raised with its position (``raise_first_error``) and each
    result goes through the client's reply callbacks. A transaction on the shared connection is
    one write from ``MULTI`` to ``EXEC``, so no other caller's command falls inside it. redis-py's
    own ``execute`` adds, per batch, observability calls, the bookkeeping of ``HIMPORT`` field
    sets before and after the write, and a parse layer and a timer per reply. Any other batch
    goes redis-py's own way.
    """

    _shared: _Shared | None = None

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack
        if (
            not stack
            or self.watching
            or self.scripts
            or self.connection is not None
            or any(_special(args, options) for args, options in stack)
        ):
            return await super().execute(raise_on_error)
        transaction = self.is_transaction or self.explicit_transaction
        commands = [args for args, _options in stack]
        if transaction:
            commands = [("MULTI",), *commands, ("EXEC",)]
        shared = self._shared
        if shared is not None and all(_shareable(args, options) for args, options in stack):
            packed = b"".join(_pack(args) for args in commands)

            async def trip() -> list[Any]:
                return await (await shared.lane()).call(packed, len(commands))  # type: ignore[no-any-return]

            try:
                replies = await shared.retry.call_with_retry(trip, shared.after_failure)
                return await self._outcome(stack, replies, transaction, raise_on_error)
            finally:
                await self.reset()  # type: ignore[no-untyped-call]  # holds no connection: empties its stack
        pool = self.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            return await connection.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: self._trip(connection, stack, commands, transaction, raise_on_error),
                lambda _error: connection.disconnect(),
            )
        finally:
            try:
                await self.reset()  # type: ignore[no-untyped-call]  # holds no connection: empties its stack
            finally:
                await _give_back(pool, connection)

    async def _trip(
        self,
        connection: redis.asyncio.connection.AbstractConnection,
        stack: list[Any],
        commands: list[tuple[Any, ...]],
        transaction: bool,
        raise_on_error: bool,
    ) -> list[Any]:
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        # One deadline for the batch's replies, not one timer per reply: each read waits without
        # its own (``math.inf``), and the socket timeout bounds them all, as redis-py's would.
        try:
            async with asyncio.timeout(connection.socket_timeout):
                for _ in commands:
                    try:
                        replies.append(await connection.read_response(timeout=math.inf))
                    except redis.exceptions.ResponseError as error:
                        replies.append(error)
        except TimeoutError as exc:  # the connection was dropped by the cancelled read
            raise redis.exceptions.TimeoutError("Timeout reading a pipeline's replies") from exc
        return await self._outcome(stack, replies, transaction, raise_on_error, connection)

    async def _outcome(
        self,
        stack: list[Any],
        replies: list[Any],
        transaction: bool,
        raise_on_error: bool,
        connection: redis.asyncio.connection.AbstractConnection | None = None,
    ) -> list[Any]:
        """The batch's results from its replies (errors as values), checked as redis-py checks them."""
        if transaction:
            executed = replies[-1]
            if isinstance(executed, redis.exceptions.ResponseError):
                for number, reply in enumerate(replies[:-1]):
                    if isinstance(reply, redis.exceptions.ResponseError):
                        if number:  # a command refused while queued, named as redis-py names it
                            self.annotate_exception(reply, number, stack[number - 1][0])
                        raise reply from executed
                raise executed
            self.watching = False
            if executed is None:
                raise redis.exceptions.WatchError("Watched variable changed.")
            if len(executed) != len(stack):
                if connection is not None:  # as redis-py does; a shared connection stays in step
                    await connection.disconnect()
                raise redis.exceptions.ResponseError("Wrong number of response items from pipeline execution")
            replies = list(executed)
        if raise_on_error:
            self.raise_first_error(stack, replies)
        results = []
        callbacks = self.response_callbacks
        for reply, (args, options) in zip(replies, stack, strict=True):
            if not isinstance(reply, Exception) and args[0] in callbacks:
                options.pop("keys", None)
                reply = callbacks[args[0]](reply, **options)
                if inspect.isawaitable(reply):
                    reply = await reply
            results.append(reply)
        return results


def _special(args: tuple[Any, ...], options: Mapping[str, Any]) -> bool:
    """A queued command that redis-py's own pipeline must run: reply-shaping options, or ``HIMPORT``."""
    if redis.client.EMPTY_RESPONSE in options or redis.client.NEVER_DECODE in options:
        return True
    name = args[0]
    return (name.decode(errors="replace") if isinstance(name, bytes) else str(name))[:7].upper() == "HIMPORT"


# Commands that must not go over the shared connection: those that may wait (every caller's
# replies would wait behind them) and those that change the connection's own state.
_UNSHARED: frozenset[str] = frozenset(
    {
        "ASKING", "AUTH", "BLMOVE", "BLMPOP", "BLPOP", "BRPOP", "BRPOPLPUSH", "BZMPOP", "BZPOPMAX",
        "BZPOPMIN", "CLIENT", "DEBUG", "DISCARD", "EXEC", "HELLO", "MONITOR", "MULTI", "PSUBSCRIBE",
        "PSYNC", "PUNSUBSCRIBE", "QUIT", "READONLY", "READWRITE", "REPLCONF", "RESET", "SELECT",
        "SHUTDOWN", "SSUBSCRIBE", "SUBSCRIBE", "SUNSUBSCRIBE", "SYNC", "UNSUBSCRIBE", "UNWATCH",
        "WAIT", "WAITAOF", "WATCH",
    }
)  # fmt: skip


# The names whose verdict is in their arguments (BLOCK, DEBUG), and the verdicts kept by name.
_BY_ARGUMENTS: frozenset[str] = frozenset({"XREAD", "XREADGROUP", "SCRIPT"})
_VERDICTS: dict[str | bytes, bool] = {}
_MAX_VERDICTS = 1024


def _words(value: object) -> list[str]:
    text = value.decode(errors="replace") if isinstance(value, bytes | bytearray) else str(value)
    return text.upper().split()


def _shareable(args: tuple[Any, ...], options: Mapping[str, Any]) -> bool:
    """Whether a command may go over the shared connection: it answers at once and leaves it as it was.

    Erring is safe one way only, so this errs that way: an ``XREAD`` with any argument spelled
    ``BLOCK`` (a key so named too) takes a pooled connection, as does a reply-shaping option.
    The verdict on a name that alone decides it is kept (``_VERDICTS``).
    """
    if options and (redis.client.EMPTY_RESPONSE in options or redis.client.NEVER_DECODE in options):
        return False
    name = args[0]
    verdict = _VERDICTS.get(name)
    if verdict is not None:
        return verdict
    words = _words(name) or [""]
    if len(words) == 1 and words[0] in _BY_ARGUMENTS:
        if words[0] == "SCRIPT":
            return not (len(args) > 1 and _words(args[1])[:1] == ["DEBUG"])
        return not any(isinstance(arg, str | bytes) and "BLOCK" in _words(arg) for arg in args[1:])
    # A name of several words: "SCRIPT LOAD" is shared, "SCRIPT DEBUG" and "XREAD ..." are not.
    verdict = words[0] not in _UNSHARED and words[:2] != ["SCRIPT", "DEBUG"] and words[0] != "XREAD"
    verdict = verdict and words[0] != "XREADGROUP"
    if len(_VERDICTS) < _MAX_VERDICTS and isinstance(name, str | bytes):
        _VERDICTS[name] = verdict
    return verdict


_MORE: Final = object()  # hiredis's "no whole reply yet" (False is a RESP3 reply)
_READ_SIZE = 65536
_CLOSED = "Connection closed by server."  # redis-py's words for it


def _copy(error: Exception) -> Exception:
    """A fresh exception like ``error``, one per caller: each raises its own with its own traceback."""
    try:
        return type(error)(*error.args)
    except Exception:  # an exception class with another signature
        return error


class _Lane:
    """One connection that many callers share: their commands in one stream, answered in order.

    ``call`` queues a packed command (or a pipeline's commands, one write) and returns a future
    for its replies. All that the loop's callbacks queue in one turn leaves in one write on the
    next turn, and one read of the socket answers as many as have come. Redis answers a
    connection's commands in the order sent, so the replies go to the queued calls first come,
    first served. A call whose caller stopped waiting (cancelled) still takes its reply off the
    stream, so no reply is ever read by another call.

    A lane that fails fails every call queued on it with the same kind of error, and is done:
    the connection is closed and ``_Shared`` opens a new one for the next call (each caller's
    retries are its own). It fails when the server closes the connection or a read or write
    breaks (``ConnectionError``), when a call's reply has not come within the socket timeout
    (``TimeoutError``, measured from the call, one timer for the lane: the oldest call's
    deadline), or when the stream is out of step (a reply that no call asked for).
    """

    def __init__(self, connection: redis.asyncio.connection.AbstractConnection, timeout: float) -> None:
        connection_: Any = connection
        self.connection = connection
        self.loop = asyncio.get_running_loop()
        self.failure: Exception | None = None
        self.used_at = self.loop.time()
        self._timeout = timeout
        self._transport: asyncio.WriteTransport = connection_._writer.transport
        self._pending: collections.deque[list[Any]] = collections.deque()  # future, count, replies, deadline
        self._outgoing: list[bytes] = []
        self._watchdog: asyncio.TimerHandle | None = None
        encoder = connection_.encoder
        decoding = {"encoding": encoder.encoding, "errors": encoder.encoding_errors}
        self._replies = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse,
            replyError=connection_._parser.parse_error,
            notEnoughData=_MORE,
            **(decoding if encoder.decode_responses else {}),
        )
        self._reading = self.loop.create_task(self._read(connection_._reader))

    def usable(self, idle: float) -> bool:
        """Open, on the running loop, and (with ``idle``) used within ``idle`` seconds or busy."""
        if self.failure is not None or self.loop is not asyncio.get_running_loop():
            return False
        return not idle or bool(self._pending) or self.loop.time() - self.used_at < idle

    def call(self, packed: bytes, replies: int | None = None) -> asyncio.Future[Any]:
        """Queue ``packed``: one command (its reply is the result), or ``replies`` commands (their list)."""
        if self.failure is not None:
            raise _copy(self.failure)
        loop = self.loop
        future = loop.create_future()
        self._pending.append([future, replies, None if replies is None else [], loop.time() + self._timeout])
        if not self._outgoing:
            loop.call_soon(self._write)
        self._outgoing.append(packed)
        if self._watchdog is None:
            self._watch()
        return future

    def _write(self) -> None:
        data = b"".join(self._outgoing)
        self._outgoing.clear()
        if self.failure is None:
            try:
                self._transport.write(data)
            except Exception as exc:  # a transport closed under it
                self.fail(redis.exceptions.ConnectionError(f"Error while writing to socket. {exc}."))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        replies, pending = self._replies, self._pending
        try:
            while True:
                data = await stream.read(_READ_SIZE)
                if not data:
                    raise redis.exceptions.ConnectionError(_CLOSED)
                replies.feed(data)
                self.used_at = self.loop.time()
                while (reply := replies.gets()) is not _MORE:
                    if isinstance(reply, hiredis.PushNotification):
                        continue  # nothing on this connection subscribes or tracks
                    if isinstance(reply, redis.exceptions.ConnectionError):
                        raise reply  # "max number of clients reached" and the like
                    if not pending:
                        raise redis.exceptions.ConnectionError("Redis sent a reply that no command asked for")
                    entry = pending[0]
                    if entry[2] is None:
                        pending.popleft()
                        if not entry[0].done():
                            entry[0].set_result(reply)
                    else:
                        entry[2].append(reply)
                        if len(entry[2]) == entry[1]:
                            pending.popleft()
                            if not entry[0].done():
                                entry[0].set_result(entry[2])
        except asyncio.CancelledError:
            self.fail(redis.exceptions.ConnectionError("the connection was closed"))
            raise
        except redis.exceptions.RedisError as exc:
            self.fail(exc if isinstance(exc, redis.exceptions.ConnectionError) else _broken(exc))
        except OSError as exc:
            self.fail(redis.exceptions.ConnectionError(f"Error while reading from socket: {exc}."))

    def _watch(self) -> None:
        """Arm the one timer at the oldest queued call's deadline (none if nothing is queued)."""
        self._watchdog = self.loop.call_at(self._pending[0][3], self._check) if self._pending else None

    def _check(self) -> None:
        self._watchdog = None
        if self.failure is not None:
            return
        if self._pending and self._pending[0][3] <= self.loop.time():
            unsent = self._transport.get_write_buffer_size() or self._outgoing
            self.fail(
                redis.exceptions.TimeoutError(f"Timeout {'writing to' if unsent else 'reading from'} socket")
            )
            return
        self._watch()

    def fail(self, error: Exception) -> None:
        """Fail every queued call with ``error`` and close the connection; later calls raise it too."""
        if self.failure is not None:
            return
        self.failure = error
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._outgoing.clear()
        pending, self._pending = self._pending, collections.deque()
        for future, *_rest in pending:
            if not future.done():
                future.set_exception(_copy(error))
        with contextlib.suppress(Exception):  # its loop may be gone
            self._transport.abort()
        connection: Any = self.connection
        with contextlib.suppress(Exception):
            connection._close()
        if self._reading is not asyncio.current_task(self.loop) and not self._reading.done():
            with contextlib.suppress(RuntimeError):  # a task of a loop that is closed
                self._reading.cancel()

    async def aclose(self) -> None:
        self.fail(redis.exceptions.ConnectionError("the client was closed"))
        if self.loop is asyncio.get_running_loop():
            await asyncio.gather(self._reading, return_exceptions=True)


def _broken(error: Exception) -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError(f"Redis's replies could not be read: {error}")


class _Shared:
    """The shared connection of one client (``make_async_client``): its ``_Lane``, opened on demand.

    The connection is made from the pool's settings (its address, credentials, database, TLS,
    timeouts and handshake) but is not one of the pool's ``max_connections``: those stay for the
    commands that must have a connection of their own. A lane idle longer than the pool's
    health-check interval is replaced before use, as the pool would check a connection idle that
    long, and so is one left on another event loop. Callers that arrive while it opens wait for
    the same opening.
    """

    def __init__(self, pool: redis.asyncio.ConnectionPool) -> None:
        settings = pool.connection_kwargs
        self.pool = pool
        self.retry: redis.asyncio.retry.Retry = settings.get("retry") or redis.asyncio.retry.Retry(
            redis.backoff.NoBackoff(), 0
        )
        self._timeout = float(settings.get("socket_timeout") or SOCKET_TIMEOUT)
        self._idle = float(settings.get("health_check_interval") or 0)
        self._lane: _Lane | None = None
        self._opening: asyncio.Task[_Lane] | None = None

    async def lane(self) -> _Lane:
        """The open lane, or a new one."""
        lane = self._lane
        if lane is not None and lane.usable(self._idle):
            return lane
        loop = asyncio.get_running_loop()
        opening = self._opening
        if opening is None or opening.get_loop() is not loop:
            opening = self._opening = loop.create_task(self._open())
            opening.add_done_callback(self._opened)
        return await asyncio.shield(opening)

    async def _open(self) -> _Lane:
        if self._lane is not None:
            self._lane.fail(redis.exceptions.ConnectionError("the connection was replaced"))
            self._lane = None
        connection = self.pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.connect()
        except BaseException:
            await connection.disconnect(nowait=True)
            raise
        lane = self._lane = _Lane(connection, self._timeout)
        return lane

    def _opened(self, task: asyncio.Task[_Lane]) -> None:
        if self._opening is task:
            self._opening = None
        if not task.cancelled():
            task.exception()  # retrieved: every waiter has it, or none is left to

    async def after_failure(self, _error: Exception) -> None:
        """A failed attempt's clean-up, for ``Retry``: the lane has already dropped its connection."""

    async def aclose(self) -> None:
        opening, lane = self._opening, self._lane
        if opening is not None and opening.get_loop() is asyncio.get_running_loop():
            await asyncio.gather(opening, return_exceptions=True)
            lane = self._lane
        self._lane = None
        if lane is not None:
            await lane.aclose()


def _pack(args: tuple[Any, ...]) -> bytes:
    """Pack a command in C with hiredis, as redis-py's sync connections do (its asyncio ones use Python).

    The same bytes as ``AbstractConnection.pack_command`` (a multi-word command name split, str
    as UTF-8, int and float as their ``repr``), as redis-py's own ``HiredisRespSerializer`` packs
    them for its synchronous connections.

    Raises:
        redis.exceptions.DataError: an argument is of a type redis-py does not send.
    """
    name = args[0]
    if isinstance(name, str):
        if not name.isalnum():  # "SCRIPT LOAD" and the like: the words are sent apart
            args = (*name.encode().split(), *args[1:])
    elif isinstance(name, bytes) and b" " in name:
        args = (*name.split(), *args[1:])
    try:
        return bytes(hiredis.pack_command(args))
    except TypeError:
        pass
    # hiredis takes bytes, str, int and float; redis-py sends a bytearray or memoryview as bytes
    args = tuple(bytes(arg) if isinstance(arg, bytearray | memoryview) else arg for arg in args)
    try:
        return bytes(hiredis.pack_command(args))
    except TypeError as exc:
        raise redis.exceptions.DataError(str(exc)) from exc


class _HiredisPacking:
    """A connection that packs with ``_pack`` and writes without a task per write."""

    def pack_command(self, *args: object) -> list[bytes]:
        return [_pack(args)]

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """Write ``command`` after one turn of the event loop; wait only while the socket takes no more.

        redis-py runs every write in ``asyncio.wait_for``, which on Python 3.11 makes a task and a
        timer for it. The task's one effect that matters is that the write leaves on the loop's next
        turn: the commands that many callers issue in one turn go out together and the server
        answers them together, in fewer wake-ups on both sides. So this yields once, as that task
        did, then hands the bytes to the transport, and only if some are left unsent does it wait
        for them, under the socket timeout. The failures are redis-py's: the connection is
        dropped, and a timeout or a broken socket is its ``TimeoutError`` or ``ConnectionError``.
        """
        connection: Any = self
        if not connection.is_connected:
            await connection.connect_check_health(check_health=False)
        if check_health:
            await connection.check_health()
        try:
            if isinstance(command, str):
                command = command.encode()
            await asyncio.sleep(0)  # the loop's next turn, with the other callers' commands
            writer = connection._writer
            if writer is None:  # closed meanwhile (the client's own close): the retry reconnects
                raise redis.exceptions.ConnectionError("the connection was closed before the write")
            writer.write(command if isinstance(command, bytes) else b"".join(command))
            if writer.transport.get_write_buffer_size():
                async with asyncio.timeout(connection.socket_timeout or None):
                    await writer.drain()
        except TimeoutError:
            await connection.disconnect(nowait=True)
            raise redis.exceptions.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await connection.disconnect(nowait=True)
            number, message = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
            raise redis.exceptions.ConnectionError(
                f"Error {number} while writing to socket. {message}."
            ) from exc
        except BaseException:
            await connection.disconnect(nowait=True)
            raise


class _PackedConnection(_HiredisPacking, redis.asyncio.Connection):
    pass


class _PackedSSLConnection(_HiredisPacking, redis.asyncio.SSLConnection):
    pass


class _PackedUnixConnection(_HiredisPacking, redis.asyncio.UnixDomainSocketConnection):
    pass


_HIREDIS_PACKED: dict[
    type[redis.asyncio.connection.AbstractConnection], type[redis.asyncio.connection.AbstractConnection]
] = {
    redis.asyncio.Connection: _PackedConnection,
    redis.asyncio.SSLConnection: _PackedSSLConnection,
    redis.asyncio.UnixDomainSocketConnection: _PackedUnixConnection,
}


class QuickBlockingPool(redis.asyncio.BlockingConnectionPool):
    """redis-py's blocking pool, that hands out an idle connection without its waiting machinery.

    ``BlockingConnectionPool.get_connection`` takes a condition, arms a timeout and records wait
    metrics for every command, even when a connection is idle: about a quarter of the client's
    CPU per round trip (61 against 47 microseconds of client CPU a ``GET`` with 50 callers on
    this project's 2-core machine). When a connection is idle, nobody waits for one and the pool is not in
    maintenance, this takes it at once and checks it exactly as the pool does
    (``ensure_connection``); any other case (all busy, waiters queued, a redis-py without these
    attributes) goes the pool's own way, so its bound and its fairness hold.
    """

    async def get_connection(
        self, command_name: object = None, *keys: object, **options: object
    ) -> redis.asyncio.connection.AbstractConnection:
        waiters = getattr(self._condition, "_waiters", None)
        if (
            self._available_connections
            and not waiters
            and waiters is not None
            and not getattr(self, "_in_maintenance", False)
        ):
            connection: redis.asyncio.connection.AbstractConnection = (
                self.get_available_connection()  # type: ignore[no-untyped-call]
            )
            try:
                try:
                    clean = connection.is_connected and not await connection.can_read()
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    clean = False
                if not clean:  # closed, or data left unread: the pool's own check reconnects it
                    await self.ensure_connection(connection)
            except BaseException:
                await self.release(connection)
                raise
            return connection
        return await super().get_connection()  # type: ignore[no-untyped-call,no-any-return]

    def release_at_once(self, connection: redis.asyncio.connection.AbstractConnection) -> bool:
        """Give ``connection`` back without awaiting, when nobody waits and it needs nothing done.

        The pool's own release takes its lock and condition, then tells its listeners (a
        re-authentication a streaming credential provider asked for) and its metrics collector
        (OpenTelemetry, when configured), for every round trip.
        These pools have neither (``make_async_client`` gives no credential provider and no
        listener, and teaagent configures no redis-py metrics), so when no caller waits for a
        connection, neither lock is held, and the connection needs no reconnect nor a pending
        re-authentication, it goes back to the idle list here and this returns True. Otherwise
        it returns False and the caller awaits ``release``, the pool's own way, which wakes a
        waiting caller as before. With no await inside, a cancellation cannot split the pool's
        bookkeeping half way.
        """
        waiters = getattr(self._condition, "_waiters", None)
        if (
            waiters
            or waiters is None
            or self._condition.locked()
            or self._lock.locked()
            or connection.should_reconnect()  # type: ignore[no-untyped-call]
            or getattr(connection, "_re_auth_token", True) is not None
            or connection not in self._in_use_connections
        ):
            return False
        self._in_use_connections.remove(connection)
        self._available_connections.append(connection)
        return True

    async def release(self, connection: redis.asyncio.connection.AbstractConnection) -> None:
        """Give ``connection`` back: at once if ``release_at_once`` may, else the pool's own way."""
        if not self.release_at_once(connection):
            await super().release(connection)


async def _give_back(
    pool: redis.asyncio.ConnectionPool, connection: redis.asyncio.connection.AbstractConnection
) -> None:
    """Release ``connection`` to ``pool``; an awaited release is shielded, as redis-py's pipeline does it."""
    if isinstance(pool, QuickBlockingPool) and pool.release_at_once(connection):
        return
    await asyncio.shield(pool.release(connection))


def make_sync_client(redis_url: str, options: StoreOptions, *, cluster: bool = False) -> SyncClient:
    """Build a thread-safe synchronous client (one pool shared by every thread; one per node on a cluster).

    A cluster client asks ``redis_url``'s node for the cluster's layout here, so it connects at once.

    Raises:
        StoreError: with ``cluster``, no node of the cluster answered.
        ValueError: ``redis_url`` is not a redis://, rediss:// or unix:// URL (not unix:// and no
            database but 0 for a cluster).
    """
    _check_url(redis_url, cluster)
    retry = redis.retry.Retry(
        redis.backoff.ExponentialWithJitterBackoff(base=BACKOFF_BASE, cap=BACKOFF_CAP), options.retries
    )
    if cluster:
        with converting(redis_url):
            return redis.cluster.RedisCluster.from_url(
                redis_url,
                connection_pool_class=redis.BlockingConnectionPool,
                max_connections=options.max_connections,
                timeout=POOL_WAIT_TIMEOUT,
                socket_timeout=options.socket_timeout,
                socket_connect_timeout=options.connect_timeout,
                health_check_interval=options.health_check_interval,
                retry=retry,
            )
    pool = redis.BlockingConnectionPool.from_url(
        redis_url,
        max_connections=options.max_connections,
        timeout=POOL_WAIT_TIMEOUT,
        socket_timeout=options.socket_timeout,
        socket_connect_timeout=options.connect_timeout,
        health_check_interval=options.health_check_interval,
        retry=retry,
    )
    return redis.Redis(connection_pool=pool)


def redact_url(redis_url: str) -> str:
    """Return ``redis_url`` with any password replaced by ``***``, fit for messages and logs."""
    parts = urlsplit(redis_url)
    if parts.password is None:
        return redis_url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


_REDIS_PY_PREFIX = re.compile(r"^Error -?\d+ (?:connecting to|while writing to|reading from) [^ ]+?\. ")


def _os_reason(exc: BaseException) -> str | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, socket.gaierror) and current.strerror:
            return current.strerror
        if isinstance(current, OSError) and current.errno and current.errno > 0:
            return os.strerror(current.errno)
        current = current.__cause__ or current.__context__
    return None


def _redis_cause(exc: BaseException) -> redis.exceptions.RedisError | None:
    """The first ``RedisError`` among the causes of ``exc`` (a cluster client's wrapped failure)."""
    seen: set[int] = set()
    current = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, redis.exceptions.RedisError):
            return current
        current = current.__cause__ or current.__context__
    return None


def describe_redis_error(redis_url: str, exc: Exception) -> str:
    """Return the one sentence a user reads for a Redis failure (the password never appears).

    ``exc`` is one of ``REDIS_ERRORS``.
    """
    where = f"Redis at {redact_url(redis_url)}"
    detail = str(exc).strip().splitlines()[0].rstrip(".") if str(exc).strip() else type(exc).__name__
    if isinstance(exc, redis.exceptions.RedisClusterException):
        # "Redis Cluster cannot be connected..." wraps what the last node said: say that instead.
        cause = _redis_cause(exc)
        if cause is not None:
            return describe_redis_error(redis_url, cause)
        reason = _os_reason(exc)
        if reason is not None:
            return f"{where} is unreachable: {reason}"
        return f"{where} (a cluster) failed: {detail}"
    if isinstance(
        exc, redis.exceptions.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError
    ):
        return f"{where} refused the credentials: {detail}"
    if isinstance(exc, redis.exceptions.BusyLoadingError):
        return f"{where} is still loading its data; try again in a moment"
    if isinstance(exc, redis.exceptions.TimeoutError):
        return f"{where} did not answer in time: {detail}"
    if isinstance(exc, redis.exceptions.ConnectionError):
        reason = _os_reason(exc) or _REDIS_PY_PREFIX.sub("", detail)
        return f"{where} is unreachable: {reason}"
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return f"{where} is read-only (a replica?): {detail}"
    if isinstance(exc, redis.exceptions.ResponseError):
        return f"{where} refused a command: {detail}"
    return f"{where} failed: {detail}"


@contextmanager
def converting(redis_url: str) -> Iterator[None]:
    """Turn any Redis error raised inside the block into a ``StoreError`` (usable around ``await``).

    Raises:
        StoreError: Redis was unreachable, timed out, or refused a command inside the block.
    """
    try:
        yield
    except REDIS_ERRORS as exc:
        raise StoreError(describe_redis_error(redis_url, exc)) from exc
