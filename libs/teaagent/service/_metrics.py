"""Prometheus metrics of one service application, in a registry of its own, and the middleware that
counts its calls.

A registry per application (not the process-wide default) lets tests and benchmarks run several
services in one process without their collectors clashing. Every service counts its HTTP calls
(by route template, method and status), times them, and counts its refusals by ``ErrorOut``
code; its own counters it adds with :meth:`ServiceMetrics.counter`, :meth:`ServiceMetrics.gauge` and
:meth:`ServiceMetrics.histogram`, named ``teaagent_<service>_<name>``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Final

from fastapi import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["INNER_CALL", "LATENCY_BUCKETS", "METRICS_RESPONSES", "MetricsMiddleware", "ServiceMetrics"]

#: The scope key of a call that a service serves inside another of its calls (the relay's
#: ``POST /v1/deliveries``): not an HTTP call of its own, so not counted or timed as one here; the
#: call that carries it is, and counts what it carries its own way.
INNER_CALL = "teaagent.inner"

# Seconds: most calls take a millisecond; long-polls take up to a minute.
LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)
# Label values must stay few: any other method a client sends is counted as OTHER.
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The OpenAPI ``responses`` of a ``/metrics`` route.
METRICS_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}
}


class ServiceMetrics:
    """A service's registry, its call counter, latency histogram and refusal counter.

    Args:
        service: The name in every metric's (``relay``: ``teaagent_relay_http_requests``).
        latency_help: What the latency histogram times (a long-poll, an event stream).
        buckets: The histogram's buckets, in seconds.
    """

    trust_reloads: Counter  # with trust_generation, once trust_metrics() added them
    trust_generation: Gauge

    def __init__(
        self,
        service: str,
        *,
        latency_help: str = "Time to answer one HTTP call, by route template (long-polls included).",
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        self.prefix = f"teaagent_{service}_"
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = self.counter(
            "http_requests",
            "HTTP calls answered, by route template, method and status.",
            "route",
            "method",
            "status",
        )
        self.latency = Histogram(
            f"{self.prefix}http_request_duration_seconds",
            latency_help,
            ["route"],
            buckets=buckets,
            registry=self.registry,
        )
        self.refusals = self.counter("refusals", "HTTP calls refused, by stable error code.", "code")

    def counter(self, name: str, documentation: str, *labels: str) -> Counter:
        """Add a counter ``teaagent_<service>_<name>`` to this registry."""
        return Counter(f"{self.prefix}{name}", documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        """Add a gauge ``teaagent_<service>_<name>`` to this registry."""
        return Gauge(f"{self.prefix}{name}", documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, *labels: str, buckets: Sequence[float] = LATENCY_BUCKETS
    ) -> Histogram:
        """Add a histogram ``teaagent_<service>_<name>`` to this registry (seconds, by default buckets)."""
        return Histogram(
            f"{self.prefix}{name}", documentation, labels, buckets=buckets, registry=self.registry
        )

    def trust_metrics(self) -> tuple[Counter, Gauge]:
        """Add the counter of trust reloads and the gauge of the trust in use (``teaagent._reload``),
        as ``trust_reloads`` and ``trust_generation``."""
        reloads = self.counter(
            "trust_reloads",
            "Reloads of the trust (SIGHUP, POST /v1/reload): reloaded (it changed), unchanged, or failed "
            "(the file did not load; the old trust is kept).",
            "result",
        )
        generation = self.gauge(
            "trust_generation", "The trust in use: 1 at start, one more per reload that changed it."
        )
        generation.set(1)
        self.trust_reloads, self.trust_generation = reloads, generation
        return reloads, generation

    def render(self) -> bytes:
        """Return the metrics in the Prometheus text format."""
        return generate_latest(self.registry)

    def response(self) -> Response:
        """Return the answer of ``GET /metrics``."""
        return Response(self.render(), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Count every HTTP call by route template, method and status, and time it; count each refusal
    (a 4xx or 5xx answer) by its ``ErrorOut`` code. Pure ASGI: event streams pass through unbuffered."""

    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or INNER_CALL in scope:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        refused = False

        async def watched_send(message: Message) -> None:
            nonlocal status, refused
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and not refused:
                refused = True  # an ErrorOut is one small JSON body: its first chunk holds the code
                self.metrics.refusals.labels(_error_code(message.get("body", b""))).inc()
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            key = (template, method if method in _METHODS else "OTHER", status)
            children = self._children.get(key)
            if children is None:
                # labels() checks and locks on every call; the few label sets in use are kept here.
                children = self._children[key] = (
                    self.metrics.http_requests.labels(template, key[1], str(status)),
                    self.metrics.latency.labels(template),
                )
            children[0].inc()
            children[1].observe(time.perf_counter() - started)


def _error_code(body: bytes) -> str:
    """The ``error`` of an ``ErrorOut`` body, or ``other`` for a body that is not one."""
    try:
        code = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return "other"
    return code if isinstance(code, str) and code.isidentifier() else "other"
