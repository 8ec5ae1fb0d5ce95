"""The store of one node: its clients, key names, request books, queues and rate limiters."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
import redis.asyncio

from teaagent.store._connection import (
    EMBEDDED_URL,
    StoreOptions,
    converting,
    make_async_client,
    make_sync_client,
    redact_url,
)
from teaagent.store._embedded import EmbeddedRedis
from teaagent.store._keys import Keys
from teaagent.store._queue import DeliveryQueue
from teaagent.store._ratelimit import AsyncRedisRateLimiter, RedisRateLimiter
from teaagent.store._requests import InboxBook, RequestBook
from teaagent.store._scripts import AsyncScripts

__all__ = ["Store", "SyncStore", "connect", "connect_sync", "open_store"]


class Store:
    """The asyncio store of one node, what the relay uses; build it with ``connect`` or ``open_store``.

    Attributes:
        keys: every key name under this store's prefix.
        requests: this node's own requests (accept, count decisions, wait for the outcome).
        inbox: requests received from peers, with this node's decision.
        deliveries: the queue of outgoing deliveries to peer relays.
        inbox_queue: the queue of received requests waiting for this node's approver.
        rate_limiter: GCRA buckets (per peer origin, per tool) shared through Redis.
    """

    def __init__(self, client: redis.asyncio.Redis, *, url: str, prefix: str, options: StoreOptions) -> None:
        self.client = client
        self.url = redact_url(url)
        self.keys = Keys(prefix)
        self.options = options
        self._raw_url = url
        self._scripts = AsyncScripts(client)
        self.requests = RequestBook(client, self._scripts, keys=self.keys, url=url, options=options)
        self.inbox = InboxBook(client, self._scripts, keys=self.keys, url=url, options=options)
        self.deliveries = self.queue("deliveries")
        self.inbox_queue = self.queue("inbox")
        self.rate_limiter = AsyncRedisRateLimiter(client, self._scripts, keys=self.keys, url=url)

    def __repr__(self) -> str:
        return f"Store({self.url!r}, prefix={self.keys.prefix!r})"

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
            **settings,
        )

    async def ping(self) -> float:
        """Return the round-trip time of one PING in seconds (for /health).

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        started = time.perf_counter()
        with converting(self._raw_url):
            await self.client.ping()
        return time.perf_counter() - started

    async def aclose(self) -> None:
        """Close the client and its connection pool."""
        await self.client.aclose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class SyncStore:
    """The synchronous store (the tools' rate limiter, command-line tools); thread-safe."""

    def __init__(self, client: redis.Redis, *, url: str, prefix: str) -> None:
        self.client = client
        self.url = redact_url(url)
        self.keys = Keys(prefix)
        self._raw_url = url
        self.rate_limiter = RedisRateLimiter(client, keys=self.keys, url=url)

    def __repr__(self) -> str:
        return f"SyncStore({self.url!r}, prefix={self.keys.prefix!r})"

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
        self.client.close()
        # redis-py leaves a pool it was handed open: disconnect it, or its sockets outlive the store.
        self.client.connection_pool.disconnect()

    def __enter__(self) -> SyncStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def connect(redis_url: str, *, prefix: str, options: StoreOptions | None = None) -> Store:
    """Return an asyncio store on ``redis_url`` under ``prefix``; nothing connects until first use.

    Connections have socket and connect timeouts, a health check when idle, and retries with
    exponential backoff and jitter on connection errors and timeouts (``StoreOptions``).

    Raises:
        ValueError: ``redis_url`` is "embedded" or not a redis URL, or ``prefix`` is malformed.
    """
    options = options or StoreOptions()
    Keys(prefix)  # refuse a bad prefix before building a pool
    return Store(make_async_client(redis_url, options), url=redis_url, prefix=prefix, options=options)


def connect_sync(redis_url: str, *, prefix: str, options: StoreOptions | None = None) -> SyncStore:
    """Return a synchronous store on ``redis_url`` under ``prefix``.

    Raises:
        ValueError: ``redis_url`` is "embedded" or not a redis URL, or ``prefix`` is malformed.
    """
    options = options or StoreOptions()
    Keys(prefix)
    return SyncStore(make_sync_client(redis_url, options), url=redis_url, prefix=prefix)


@asynccontextmanager
async def open_store(
    redis_url: str, *, prefix: str, data_dir: Path | str | None = None, options: StoreOptions | None = None
) -> AsyncIterator[Store]:
    """Open a node's store for the life of the block, starting the embedded server when asked.

    With ``redis_url = "embedded"`` the private server in ``<data_dir>/redis/`` is started first
    (or shared, if another live process of the node runs it) and stopped when the block ends.
    The store answers PING before the block starts.

    Raises:
        StoreError: Redis is unreachable, or the embedded server did not start.
        ValueError: "embedded" without ``data_dir``, a URL that is not a redis URL, or a bad prefix.
    """
    server: EmbeddedRedis | None = None
    if redis_url == EMBEDDED_URL:
        if data_dir is None:
            raise ValueError("redis_url 'embedded' needs the node's data_dir to keep the server's data in")
        server = EmbeddedRedis(data_dir)
        await asyncio.to_thread(server.start)
        redis_url = server.url
    try:
        store = connect(redis_url, prefix=prefix, options=options)
        try:
            await store.ping()
            yield store
        finally:
            await store.aclose()
    finally:
        if server is not None:
            await asyncio.to_thread(server.stop)
