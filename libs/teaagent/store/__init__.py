"""Redis for a node: connection, key names, Lua scripts, queues, rate-limit windows, embedded server.

Every process of a node opens its store with ``open_node_store(config)`` (asyncio: relay,
approver) or ``connect_node_sync(config)`` (the tools' rate limiter), so that none forgets
``redis_cluster`` or the embedded server's socket; ``connect``, ``connect_sync`` and
``open_store`` take a URL. The store is one server or a Redis Cluster (``redis_cluster =
true``; ``cluster=True`` here). Every Redis failure surfaces as ``StoreError`` with one sentence
naming the server (its password redacted); code that calls ``Store.client`` itself catches
``REDIS_ERRORS`` (redis-py's cluster client raises one error class that is no ``RedisError``).
"""

from __future__ import annotations

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.store._connection import EMBEDDED_URL, REDIS_ERRORS, StoreOptions, redact_url
from teaagent.store._embedded import EmbeddedRedis, find_server_binary, socket_url
from teaagent.store._inbox_book import InboxBook
from teaagent.store._keys import (
    MAX_DOCUMENT_BYTES,
    REQUEST_RETENTION_SECONDS,
    Keys,
    QueueKeys,
    RequestKeys,
    node_prefix,
)
from teaagent.store._queue import (
    CONSUMER_RETENTION_SECONDS,
    DeadLetter,
    Delivery,
    DeliveryQueue,
    QueueStats,
    RetryResult,
    backoff_delay,
)
from teaagent.store._ratelimit import AsyncRedisRateLimiter, RateLimitSpec, RedisRateLimiter
from teaagent.store._request_book import RequestBook
from teaagent.store._results import (
    MAX_PENDING_PER_ORIGIN,
    AcceptResult,
    DecisionKind,
    DecisionResult,
    DecisionToCount,
    DeliveryState,
    DeliveryStateName,
    Intake,
    QueuedDecision,
    ReceiveResult,
    RequestState,
    SettleResult,
    StoredRequest,
    WithdrawResult,
)
from teaagent.store._shapes import Outgoing
from teaagent.store._store import (
    Store,
    SyncStore,
    connect,
    connect_node_sync,
    connect_sync,
    node_redis_url,
    open_node_store,
    open_store,
)
from teaagent.tools import RateDecision  # the tools' answer type, re-exported: one class

__all__ = [
    "CONSUMER_RETENTION_SECONDS",
    "EMBEDDED_URL",
    "MAX_DOCUMENT_BYTES",
    "MAX_PENDING_PER_ORIGIN",
    "REDIS_ERRORS",
    "REQUEST_RETENTION_SECONDS",
    "AcceptResult",
    "AsyncRedisRateLimiter",
    "DeadLetter",
    "DecisionKind",
    "DecisionResult",
    "DecisionToCount",
    "Delivery",
    "DeliveryQueue",
    "DeliveryState",
    "DeliveryStateName",
    "EmbeddedRedis",
    "InboxBook",
    "Intake",
    "Keys",
    "Outgoing",
    "QueueKeys",
    "QueueStats",
    "QueuedDecision",
    "RateDecision",
    "RateLimitSpec",
    "ReceiveResult",
    "RedisRateLimiter",
    "RequestBook",
    "RequestConflictError",
    "RequestKeys",
    "RequestNotFoundError",
    "RequestState",
    "RetryResult",
    "SettleResult",
    "Store",
    "StoreError",
    "StoreOptions",
    "StoredRequest",
    "SyncStore",
    "WithdrawResult",
    "backoff_delay",
    "connect",
    "connect_node_sync",
    "connect_sync",
    "find_server_binary",
    "node_prefix",
    "node_redis_url",
    "open_node_store",
    "open_store",
    "redact_url",
    "socket_url",
]
