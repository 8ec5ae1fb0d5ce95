"""Redis for a node: connection, key names, Lua scripts, queues, rate-limit windows, embedded server.

The relay builds on the asyncio ``Store`` (``open_node_store(config)``, or ``connect`` and
``open_store``); the tools' rate limiter uses the synchronous ``RedisRateLimiter``
(``connect_sync(...).rate_limiter``). The store is one server or a Redis Cluster (``redis_cluster =
true``; ``cluster=True`` here). Every Redis failure surfaces as ``StoreError`` with one sentence
naming the server (its password redacted); code that calls ``Store.client`` itself catches
``REDIS_ERRORS`` (redis-py's cluster client raises one error class that is no ``RedisError``).
"""

from __future__ import annotations

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.store._connection import EMBEDDED_URL, REDIS_ERRORS, StoreOptions, redact_url
from teaagent.store._embedded import EmbeddedRedis, find_server_binary
from teaagent.store._keys import REQUEST_RETENTION_SECONDS, Keys, QueueKeys, RequestKeys, node_prefix
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
from teaagent.store._requests import (
    MAX_DOCUMENT_BYTES,
    MAX_PENDING_PER_ORIGIN,
    AcceptResult,
    DecisionKind,
    DecisionResult,
    DecisionToCount,
    DeliveryState,
    DeliveryStateName,
    InboxBook,
    Intake,
    ReceiveResult,
    RequestBook,
    RequestState,
    SettleResult,
    StoredRequest,
    WithdrawResult,
)
from teaagent.store._store import Store, SyncStore, connect, connect_sync, open_node_store, open_store
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
    "QueueKeys",
    "QueueStats",
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
    "connect_sync",
    "find_server_binary",
    "node_prefix",
    "open_node_store",
    "open_store",
    "redact_url",
]
