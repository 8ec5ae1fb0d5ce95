"""The store of one node: its clients, key names, request books, queues and rate limiters."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import redis.asyncio.cluster
import redis.cluster

from teaagent.errors import StoreError
from teaagent.store._connection import (
    EMBEDDED_URL,
    AsyncClient,
    CommandBatches,
    StoreOptions,
    SyncClient,
    converting,
    make_async_client,
    make_batches,
    make_sync_client,
    redact_url,
)
from teaagent.store._embedded import EmbeddedRedis, socket_url
from teaagent.store._inbox_book import InboxBook
from teaagent.store._keys import Keys, node_prefix
from teaagent.store._queue import DeliveryQueue
from teaagent.store._ratelimit import AsyncRedisRateLimiter, RedisRateLimiter
from teaagent.store._request_book import RequestBook
from teaagent.store._scripts import AsyncScripts

if TYPE_CHECKING:
    from teaagent.config import NodeConfig

__all__ = [
    "Store",
    "SyncStore",
    "connect",
    "connect_node_sync",
    "connect_sync",
    "node_redis_url",
    "open_node_store",
    "open_store",
]

logger = logging.getLogger(__name__)

STARTUP_RETRY_SECONDS: Final = 0.5  # between PINGs of a store that does not answer yet


MIN_REDIS_VERSION: Final = (7, 0)  # PEXPIRE ... NX and SET ... NX GET (Store.check_server)


def _version(text: str) -> tuple[int, ...]:
    """``"7.2.4"`` as ``(7, 2, 4)``; the numeric parts only (``"8.0.0-rc1"`` is ``(8, 0, 0)``)."""
    parts: list[int] = []
    for part in text.split("."):
        digits = "".join(itertools.takewhile(str.isdigit, part))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


class Store:
    """The asyncio store of one node, what the relay uses; build it with ``connect`` or ``open_store``.

    Attributes:
        client: the redis-py client: a ``Redis``, or a ``RedisCluster`` when ``cluster``. A command
            sent on it directly must name keys of one slot (one hash tag), and a transaction too.
        blocking: the client for blocking reads (XREAD/XREADGROUP with BLOCK), on a pool of its
            own (``StoreOptions.blocking_connections``): however many long-polls wait, the
            commands on ``client`` find a connection. ``client`` itself when built without one.
        batches: the scripts' calls of one moment, sent as one pipeline (``CommandBatches``, on a
            client of its own); None when built without (each call is sent on its own).
        cluster: True when the store is a Redis Cluster (``redis_cluster = true``).
        keys: every key name under this store's prefix.
        requests: this node's own requests (accept, count decisions, wait for the outcome).
        inbox: requests received from peers, with this node's decision.
        deliveries: the queue of outgoing deliveries to peer relays.
        inbox_queue: the queue of received requests waiting for this node's approver.
        rate_limiter: GCRA buckets (per peer origin, per tool) shared through Redis.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        url: str,
        prefix: str,
        options: StoreOptions,
        blocking: AsyncClient | None = None,
        batches: CommandBatches | None = None,
    ) -> None:
        self.client = client
        self.blocking = blocking or client
        self.batches = batches
        self.cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self.url = redact_url(url)
        self.keys = Keys(prefix)
        self.options = options
        self._raw_url = url
        self._scripts = AsyncScripts(client, batches)
        self.requests = RequestBook(
            client, self._scripts, keys=self.keys, url=url, options=options, blocking=self.blocking
        )
        self.inbox = InboxBook(client, self._scripts, keys=self.keys, url=url, options=options)
        self.deliveries = self.queue("deliveries")
        self.inbox_queue = self.queue("inbox")
        self.rate_limiter = AsyncRedisRateLimiter(client, self._scripts, keys=self.keys, url=url)

    def __repr__(self) -> str:
        cluster = ", cluster=True" if self.cluster else ""
        return f"Store({self.url!r}, prefix={self.keys.prefix!r}{cluster})"

    def queue(self, name: str, **settings: Any) -> DeliveryQueue:
        """Return the work queue ``name``; ``settings`` are ``DeliveryQueue``'s keyword options.

        Raises:
            ValueError: ``name`` is not a short lowercase word, or a setting is out of range.
        """
        return DeliveryQueue(
            self.client,
            self._scripts,
            keys=self.keys.queue(name),
            url=self._raw_url,
            options=self.options,
            blocking=self.blocking,
            **settings,
        )

    async def ping(self) -> float:
        """Return the round-trip time of one PING in seconds (for /health); on a cluster, of every primary.

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        started = time.perf_counter()
        with converting(self._raw_url):
            if isinstance(self.client, redis.asyncio.cluster.RedisCluster):
                # Each primary serves some requests' slots; a replica's absence costs the store nothing.
                await self.client.ping(target_nodes=redis.asyncio.cluster.RedisCluster.PRIMARIES)
            else:
                await self.client.ping()
        return time.perf_counter() - started

    async def check_server(self) -> None:
        """Refuse a server older than ``MIN_REDIS_VERSION`` (every primary of a cluster), in one sentence.

        The store's scripts use ``PEXPIRE ... NX`` and the approver's ledger ``SET ... NX GET``,
        both of Redis 7.0 (Valkey reports the Redis version it is compatible with, 7.2 and on): on
        an older server every call would fail with a bare ``syntax error``.

        Raises:
            StoreError: Redis is unreachable or failed, or is older than ``MIN_REDIS_VERSION``.
        """
        with converting(self._raw_url):
            if isinstance(self.client, redis.asyncio.cluster.RedisCluster):
                found = await self.client.info(
                    "server", target_nodes=redis.asyncio.cluster.RedisCluster.PRIMARIES
                )
            else:
                found = await self.client.info("server")
        sections = [found] if "redis_version" in found else list(found.values())
        for section in sections:
            version = str(section.get("redis_version", "0"))
            if _version(version) < MIN_REDIS_VERSION:
                needed = ".".join(map(str, MIN_REDIS_VERSION))
                raise StoreError(
                    f"Redis at {self.url} is version {version}; teaagent needs Redis "
                    f"{needed} or later (or Valkey 7.2 or later)."
                )

    async def aclose(self) -> None:
        """Close the clients and their connection pools."""
        await self.client.aclose()
        if self.blocking is not self.client:
            await self.blocking.aclose()
        if self.batches is not None:
            await self.batches.aclose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class SyncStore:
    """The synchronous store (the tools' rate limiter, command-line tools); thread-safe.

    ``client`` is a ``Redis``, or a ``RedisCluster`` when ``cluster``.
    """

    def __init__(self, client: SyncClient, *, url: str, prefix: str) -> None:
        self.client = client
        self.cluster = isinstance(client, redis.cluster.RedisCluster)
        self.url = redact_url(url)
        self.keys = Keys(prefix)
        self._raw_url = url
        self.rate_limiter = RedisRateLimiter(client, keys=self.keys, url=url)

    def __repr__(self) -> str:
        cluster = ", cluster=True" if self.cluster else ""
        return f"SyncStore({self.url!r}, prefix={self.keys.prefix!r}{cluster})"

    def ping(self) -> float:
        """Return the round-trip time of one PING in seconds.

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        started = time.perf_counter()
        with converting(self._raw_url):
            self.client.ping()
        return time.perf_counter() - started

    def close(self) -> None:
        """Close the rate limiter's connection, the client and its connection pool."""
        self.rate_limiter.close()
        self.client.close()  # one server's pool is the client's own (``from_pool``): closed with it
        # A cluster client leaves each node's pool open: disconnect them, or their sockets outlive
        # the store.
        if isinstance(self.client, redis.cluster.RedisCluster):
            _disconnect_nodes(self.client)

    def __enter__(self) -> SyncStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _disconnect_nodes(client: Any) -> None:
    """Disconnect the pool of every node a synchronous cluster client knows (its methods are untyped)."""
    for node in client.get_nodes():
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()


def connect(
    redis_url: str, *, prefix: str, options: StoreOptions | None = None, cluster: bool = False
) -> Store:
    """Return an asyncio store on ``redis_url`` under ``prefix``; nothing connects until first use.

    Connections have socket and connect timeouts, a health check when idle, and retries with
    exponential backoff and jitter on connection errors and timeouts (``StoreOptions``). With
    ``cluster``, ``redis_url`` names one node of a Redis Cluster, and the store finds the others.

    Raises:
        ValueError: ``redis_url`` is "embedded" or not a redis URL (for a cluster: not redis:// or
            rediss://, or a database but 0), or ``prefix`` is malformed.
    """
    options = options or StoreOptions()
    Keys(prefix)  # refuse a bad prefix before building a pool
    client = make_async_client(redis_url, options, cluster=cluster)
    blocking = make_async_client(redis_url, options.for_blocking(), cluster=cluster)
    batches = make_batches(redis_url, options, cluster=cluster)
    return Store(client, url=redis_url, prefix=prefix, options=options, blocking=blocking, batches=batches)


def connect_sync(
    redis_url: str, *, prefix: str, options: StoreOptions | None = None, cluster: bool = False
) -> SyncStore:
    """Return a synchronous store on ``redis_url`` under ``prefix`` (one node of a cluster, with ``cluster``).

    A single server is connected at first use; a cluster is asked for its layout here.

    Raises:
        StoreError: with ``cluster``, no node of the cluster answered.
        ValueError: ``redis_url`` is "embedded" or not a redis URL (for a cluster: not redis:// or
            rediss://, or a database but 0), or ``prefix`` is malformed.
    """
    options = options or StoreOptions()
    Keys(prefix)
    return SyncStore(make_sync_client(redis_url, options, cluster=cluster), url=redis_url, prefix=prefix)


@asynccontextmanager
async def open_store(
    redis_url: str,
    *,
    prefix: str,
    data_dir: Path | str | None = None,
    options: StoreOptions | None = None,
    cluster: bool = False,
) -> AsyncIterator[Store]:
    """Open a node's store for the life of the block, starting the embedded server when asked.

    With ``redis_url = "embedded"`` the private server in ``<data_dir>/redis/`` is started first
    (or shared, if another live process of the node runs it) and stopped when the block ends.
    With ``cluster``, ``redis_url`` is one node of a Redis Cluster. The store answers PING (every
    node of a cluster does) before the block starts.

    Raises:
        StoreError: Redis is unreachable, or the embedded server did not start.
        ValueError: "embedded" without ``data_dir`` or with ``cluster``, a URL that is not a redis
            URL, or a bad prefix.
    """
    embedded = redis_url == EMBEDDED_URL
    if embedded and cluster:
        raise ValueError("redis_url 'embedded' is one private server, not a Redis Cluster")
    if embedded and data_dir is None:
        raise ValueError("redis_url 'embedded' needs the node's data_dir to keep the server's data in")
    async with _started(data_dir if embedded else None) as server:
        url = server.url if server is not None else redis_url
        store = connect(url, prefix=prefix, options=options, cluster=cluster)
        async with contextlib.aclosing(store):
            await store.ping()
            await store.check_server()
            yield store


@asynccontextmanager
async def _started(data_dir: Path | str | None) -> AsyncIterator[EmbeddedRedis | None]:
    """The embedded server in ``data_dir``, started for the block and stopped after it (None: no server).

    Raises:
        StoreError: the server did not start.
    """
    if data_dir is None:
        yield None
        return
    server = EmbeddedRedis(data_dir)
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


def node_redis_url(config: NodeConfig) -> str:
    """The URL every process of the node ``config`` describes connects to.

    Its ``redis_url``; for ``embedded``, the Unix socket of the server its relay runs, whose
    address and password are the same at every start of it (:func:`socket_url`).

    Raises:
        StoreError: the embedded server's socket path is too long.
    """
    if config.redis_url == EMBEDDED_URL:
        return socket_url(config.data_dir)
    return config.redis_url


def _absent(config: NodeConfig, exc: StoreError) -> str:
    """Why the node's store does not answer, in the sentence its operator needs."""
    if config.redis_url == EMBEDDED_URL:
        return (
            f"{config.agent_id}'s embedded Redis runs with its relay: start it "
            f"(teaagent relay serve --config {config.path})"
        )
    return str(exc)


@asynccontextmanager
async def open_node_store(
    config: NodeConfig,
    *,
    prefix: str | None = None,
    options: StoreOptions | None = None,
    start_embedded: bool = True,
    wait: bool = True,
    service: str | None = None,
) -> AsyncIterator[Store]:
    """Open the store of the node ``config`` describes, for the life of an ``async with`` block.

    Every process of a node opens its store with this (or :func:`connect_node_sync`), so they
    all read the same keys on the same server: its ``redis_url``, a Redis Cluster when
    ``redis_cluster = true``, under ``prefix`` (``ta:<agent_id>`` when None). With ``redis_url =
    "embedded"``, the server in its ``data_dir`` is started as :func:`open_store` does, or, with
    ``start_embedded=False`` (a service that must not own it, as the approver), the socket of the
    one the node's relay runs is used. The store answers PING before the block starts: with
    ``wait``, a Redis that does not answer yet (a service started before its relay or its Redis)
    is waited for however long it takes, with one log line when the wait starts and one when it
    ends. Later failures heal by themselves: the clients reconnect to the same URL.

    Raises:
        StoreError: the embedded server did not start, or (without ``wait``) Redis is unreachable.
        ValueError: ``prefix`` is malformed.
    """
    who = service or config.agent_id
    owned = config.redis_url == EMBEDDED_URL and start_embedded
    async with _started(config.data_dir if owned else None) as server:
        url = server.url if server is not None else node_redis_url(config)
        key_prefix = prefix if prefix is not None else node_prefix(config.agent_id)
        store = connect(url, prefix=key_prefix, options=options, cluster=config.redis_cluster)
        async with contextlib.aclosing(store):
            await _answering(store, config, who, wait=wait)
            await store.check_server()
            yield store


async def _answering(store: Store, config: NodeConfig, who: str, *, wait: bool) -> None:
    """Return once ``store`` answers PING; log once when it has to be waited for, once when it answers."""
    waited_since: float | None = None
    while True:
        try:
            await store.ping()
        except StoreError as exc:
            if not wait:
                raise StoreError(_absent(config, exc)) from exc
            if waited_since is None:
                waited_since = time.monotonic()
                logger.warning("%s waits for its Redis: %s", who, _absent(config, exc))
            await asyncio.sleep(STARTUP_RETRY_SECONDS)
        else:
            break
    if waited_since is not None:
        logger.warning(
            "%s's Redis answers after %.1f s of waiting; carrying on", who, time.monotonic() - waited_since
        )


def connect_node_sync(config: NodeConfig, *, prefix: str | None = None) -> SyncStore:
    """Return a synchronous store of the node ``config`` describes (:func:`open_node_store`'s twin).

    Its ``redis_url`` (for ``embedded``, the socket of the server its relay runs), a Redis Cluster
    when ``redis_cluster = true``, under ``prefix`` (``ta:<agent_id>`` when None). Nothing is
    started; a client reconnects to the same URL after a failure.

    Raises:
        StoreError: with ``redis_cluster``, no node of the cluster answered.
        ValueError: ``prefix`` is malformed.
    """
    return connect_sync(
        node_redis_url(config),
        prefix=prefix if prefix is not None else node_prefix(config.agent_id),
        cluster=config.redis_cluster,
    )
