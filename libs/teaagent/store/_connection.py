"""Redis clients with timeouts and retries, and the one place Redis errors become ``StoreError``.

A node's store is one Redis server or a Redis Cluster (``redis_cluster = true`` in node.toml): the
cluster clients of redis-py route each command by its key's slot and follow MOVED and ASK, so the
store's code is the same on both. ``AsyncClient`` and ``SyncClient`` name either kind.

The calls that callers of one process make at the same moment (the store's scripts, its small
reads) go out together: :class:`CommandBatches` gathers them into one redis-py pipeline
(``transaction=False``) per batch, on a client of its own that never sends a batch twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, TypeAlias
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.backoff
import redis.cluster
import redis.exceptions
import redis.retry

from teaagent._batch import Coalescer
from teaagent._urls import shown_url, split_url
from teaagent.errors import StoreError

__all__ = [
    "BATCHES_ENV",
    "EMBEDDED_URL",
    "REDIS_ERRORS",
    "AsyncClient",
    "CommandBatches",
    "StoreOptions",
    "SyncClient",
    "converting",
    "describe_redis_error",
    "make_async_client",
    "make_batches",
    "make_sync_client",
    "redact_url",
    "send_pipeline",
]

EMBEDDED_URL = "embedded"  # the node configuration's word for "start a private server in data_dir"

SOCKET_TIMEOUT = 5.0  # a command on a healthy Redis takes microseconds; five seconds means it is gone
CONNECT_TIMEOUT = 2.0  # a loopback or LAN connect is instant; fail fast so retries can help
HEALTH_CHECK_INTERVAL = 30  # PING a pooled connection idle this long first: NATs and proxies drop idle TCP
RETRIES = 3  # a restart or failover of Redis takes a moment; three backed-off retries ride it out
BACKOFF_BASE = 0.05  # seconds before the first retry
BACKOFF_CAP = 1.0  # seconds, the longest wait between two retries
MAX_CONNECTIONS = 64  # per async client: the calls one process has in flight at once (its pool's size)
# Per async store, for blocking reads (long-polls, queue claims) on a pool of their own: each holds
# a connection while it blocks, and sharing one pool let 64 waiting long-polls starve every command.
BLOCKING_CONNECTIONS = 1024
POOL_WAIT_TIMEOUT = 10.0  # seconds a caller waits for a free pooled connection before failing
# "0" in the environment: every call is sent on its own, as before batching (the bench's variant).
BATCHES_ENV: Final = "TEAAGENT_REDIS_BATCHES"
MAX_BATCH: Final = 256  # commands per pipeline at most: bounds one reply's size and one batch's wait

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


def _connections(options: StoreOptions) -> dict[str, Any]:
    """What every client's connections are given: how many, their timeouts, their idle check."""
    return {
        "max_connections": options.max_connections,
        "socket_timeout": options.socket_timeout,
        "socket_connect_timeout": options.connect_timeout,
        "health_check_interval": options.health_check_interval,
    }


def make_async_client(redis_url: str, options: StoreOptions, *, cluster: bool = False) -> AsyncClient:
    """Build redis-py's asyncio client on a pool sized to the calls in flight, waiting for a free connection.

    On a single server, a ``BlockingConnectionPool`` of ``options.max_connections`` connections
    (the calls one process has in flight at once: a caller beyond them waits up to
    ``POOL_WAIT_TIMEOUT`` for one, instead of failing); redis-py parses with hiredis (a
    dependency), and each caller's command or pipeline has a connection of its own, so a timeout
    fails its own caller only. With ``cluster``, a Redis Cluster client that learns the cluster's
    nodes from ``redis_url`` (any one node) at its first command; it keeps up to
    ``options.max_connections`` connections per node and, unlike the single server's pool, fails
    a command at once when a node's are all busy.

    Raises:
        ValueError: ``redis_url`` is not a redis://, rediss:// or unix:// URL (not unix:// and no
            database but 0 for a cluster).
    """
    _check_url(redis_url, cluster)
    retry = redis.asyncio.retry.Retry(
        redis.backoff.ExponentialWithJitterBackoff(base=BACKOFF_BASE, cap=BACKOFF_CAP), options.retries
    )
    if cluster:
        return redis.asyncio.cluster.RedisCluster.from_url(redis_url, **_connections(options), retry=retry)
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        redis_url, **_connections(options), timeout=POOL_WAIT_TIMEOUT, retry=retry
    )
    return redis.asyncio.Redis.from_pool(pool)  # closed with the client (aclose disconnects it)


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
                **_connections(options),
                timeout=POOL_WAIT_TIMEOUT,
                retry=retry,
            )
    pool = redis.BlockingConnectionPool.from_url(
        redis_url, **_connections(options), timeout=POOL_WAIT_TIMEOUT, retry=retry
    )
    return redis.Redis.from_pool(pool)  # closed with the client


class CommandBatches:
    """Commands of concurrent callers on one event loop, sent together as one redis-py pipeline.

    A lone command goes out on the next turn of the event loop; the commands that arrive while a
    batch is out wait for it and go out together as the next one (``teaagent._batch.Coalescer``):
    the callers of one moment share one round trip instead of one each. The pipeline is
    redis-py's (``transaction=False``, ``raise_on_error=False``): each caller gets its own reply
    or its own error (a script that failed, a NOSCRIPT), never another's. On a cluster, redis-py's
    cluster pipeline sends each command to the node of its key's slot.

    ``client`` is this object's own, built with no retries on one server: a batch whose connection
    failed (closed, timed out) fails each of its callers once and is never sent again, since a
    script in it may have run. On a cluster it keeps the store's retries (see :func:`make_batches`).
    A caller cancelled (or timed out by its own deadline) before its batch goes out is left out of
    it; one cancelled after leaves the batch and the other callers alone.
    """

    def __init__(self, client: AsyncClient, *, max_batch: int = MAX_BATCH) -> None:
        self.client = client
        self._batches: Coalescer[tuple[Any, ...], Any] = Coalescer(
            self._send, "teaagent-redis-batch", max_batch=max_batch
        )

    async def execute(self, *command: Any) -> Any:
        """Send ``command`` (``"EVALSHA", sha, ...`` or a read such as ``"HGETALL", key``) in the next batch.

        Its reply is parsed as ``client.execute_command`` would parse it.

        Raises:
            redis.exceptions.RedisError: the server refused this command, or the batch's connection
                failed (then every caller of that batch hears it).
            redis.exceptions.RedisClusterException: no node of the cluster answered.
        """
        return await self._batches.call(command)

    async def _send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        return await send_pipeline(self.client, commands)

    async def aclose(self) -> None:
        """Close the batches' client and its connections."""
        await self.client.aclose()


async def send_pipeline(client: AsyncClient, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` in one redis-py pipeline (no transaction); return each one's reply or error.

    Each reply is parsed as ``client.execute_command`` would parse it, and an error is the one
    Redis answered for that command alone (``raise_on_error=False``: a NOSCRIPT or a script's
    refusal fails its own command, not the others). On a cluster, a command whose node failed
    (``RedisCluster.ERRORS_ALLOW_RETRY``: a connection closed under it, a timeout) is sent again
    on its own with ``client.execute_command``, which retries with the client's backoff and
    refreshes the cluster's layout. redis-py's cluster pipeline retries such a failure only when
    it raises it (``raise_on_error=True``); left as a reply, the first pipeline to a restarted
    master would fail on the dead connection its node's pool still held. On one server the pool
    checks a connection before handing it out, and nothing is sent twice.

    Raises:
        redis.exceptions.RedisError: the whole pipeline failed (no reply was read).
        redis.exceptions.RedisClusterException: no node of the cluster answered.
    """
    async with client.pipeline(transaction=False) as pipe:
        for command in commands:
            pipe.execute_command(*command)
        replies = list(await pipe.execute(raise_on_error=False))
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        failed = [
            index
            for index, reply in enumerate(replies)
            if isinstance(reply, redis.asyncio.cluster.RedisCluster.ERRORS_ALLOW_RETRY)
        ]
        again = await asyncio.gather(
            *(client.execute_command(*commands[index]) for index in failed), return_exceptions=True
        )
        for index, reply in zip(failed, again, strict=True):
            replies[index] = reply
    return replies


def make_batches(redis_url: str, options: StoreOptions, *, cluster: bool = False) -> CommandBatches | None:
    """Build the :class:`CommandBatches` of an asyncio store: a client of its own with no retries.

    None when ``TEAAGENT_REDIS_BATCHES`` is ``0``: each call then goes out on its own, on the
    store's client (what ``teaagent bench`` compares against).

    Raises:
        ValueError: as :func:`make_async_client`.
    """
    if os.environ.get(BATCHES_ENV, "1") == "0":
        _check_url(redis_url, cluster)
        return None
    # On one server a pooled connection is checked before each use (redis-py reconnects one the
    # server closed), so a batch needs no retry. A cluster client's node connections are not: the
    # first batch to a restarted master would fail on its dead connection. There the batches keep
    # the store's retries (``send_pipeline`` sends a command whose node failed again), as the
    # store's own calls on a cluster always had: its steps are written
    # to be run again (a request stored twice is one request, a delivery charged once, a signer
    # counted once).
    retries = options.retries if cluster else 0
    return CommandBatches(
        make_async_client(redis_url, dataclasses.replace(options, retries=retries), cluster=cluster)
    )


def redact_url(redis_url: str) -> str:
    """Return ``redis_url`` with any password replaced by ``***``, fit for messages and logs.

    A password is in the user information (``redis://:PASSWORD@host``) or in the query
    (``?password=PASSWORD``, which redis-py takes as the connection's password). A URL that
    ``urlsplit`` cannot read is shown as :func:`teaagent._urls.shown_url` shows it.
    """
    parts = split_url(redis_url)
    if parts is None:  # an unclosed IPv6 bracket, a port out of range
        return shown_url(redis_url)
    port = parts.port
    netloc = parts.netloc
    if parts.password is not None:
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}" + (f":{port}" if port is not None else "")
    query = "&".join(
        f"{name}=***" if name.lower() == "password" else pair
        for pair in parts.query.split("&")
        for name in (pair.partition("=")[0],)
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return redis_url
    # Assembled here: urlunsplit writes unix:///path, whose netloc is empty, as unix:/path.
    return (
        f"{parts.scheme}://{netloc}{parts.path}"
        + (f"?{query}" if query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


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
