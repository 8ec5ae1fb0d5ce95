"""The toolkit of the node's three web services (the relay, the approver, the agent service).

What every service needs and none should write again: failures as ``ErrorOut`` with stable codes
(:class:`ApiError`, an :class:`ErrorTable` per service, :func:`install_error_handlers`), the body
limit (:class:`BodyLimitMiddleware`), the node's bearer token (:data:`Authorized`,
:func:`check_token`), Prometheus metrics (:class:`ServiceMetrics`, :class:`MetricsMiddleware`),
settings from the environment (:class:`ServiceSettings`), readiness (:func:`readiness`), and
depth-bounded JSON bodies (:class:`BoundedJSONRoute`); :func:`install_toolkit` puts the errors,
the token, the metrics and the body limit on an application in one call, and
:func:`service_app` builds a service's application with them. :class:`SettledOut` is the one
quorum shape both the relay and the approver answer with. A service keeps only
its routes, its table of error codes and its own counters. The toolkit imports no service; the
services import it. Both middlewares are pure ASGI: they neither buffer a body nor hold an event
stream back.
"""

from __future__ import annotations

from teaagent.service._auth import UNAUTHORIZED, Authorized, bearer_token, check_token, require_token
from teaagent.service._bounded_route import BoundedJSONRoute, refuse_deep
from teaagent.service._errors import (
    CLIENT_CLOSED,
    CODES_BY_STATUS,
    ApiError,
    ErrorOut,
    ErrorTable,
    error_response,
    error_responses,
    install_error_handlers,
    sentence,
    started,
    validation_message,
)
from teaagent.service._install import install_toolkit, service_app
from teaagent.service._limits import BodyLimitMiddleware
from teaagent.service._metrics import (
    INNER_CALL,
    LATENCY_BUCKETS,
    METRICS_RESPONSES,
    MetricsMiddleware,
    ServiceMetrics,
)
from teaagent.service._operations import reloaded_trust, store_health
from teaagent.service._quorum_models import SettledOut
from teaagent.service._ready import (
    CHECK_SECONDS,
    Dependency,
    DependencyOut,
    NotReadyOut,
    ReadyOut,
    check,
    readiness,
    ready_responses,
)
from teaagent.service._settings import ServiceSettings, StoreSettings

__all__ = [
    "CHECK_SECONDS",
    "CLIENT_CLOSED",
    "CODES_BY_STATUS",
    "INNER_CALL",
    "LATENCY_BUCKETS",
    "METRICS_RESPONSES",
    "UNAUTHORIZED",
    "ApiError",
    "Authorized",
    "BodyLimitMiddleware",
    "BoundedJSONRoute",
    "Dependency",
    "DependencyOut",
    "ErrorOut",
    "ErrorTable",
    "MetricsMiddleware",
    "NotReadyOut",
    "ReadyOut",
    "ServiceMetrics",
    "ServiceSettings",
    "SettledOut",
    "StoreSettings",
    "bearer_token",
    "check",
    "check_token",
    "error_response",
    "error_responses",
    "install_error_handlers",
    "install_toolkit",
    "readiness",
    "ready_responses",
    "refuse_deep",
    "reloaded_trust",
    "require_token",
    "sentence",
    "service_app",
    "started",
    "store_health",
    "validation_message",
]
