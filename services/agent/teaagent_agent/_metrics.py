"""Prometheus metrics of one agent application, in a registry of its own, and the middleware that
counts its calls.

A registry per application (not the process-wide default) lets tests run several agent services in
one process without their collectors clashing (as the relay's and the approver's).
"""

from __future__ import annotations

import time
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["LATENCY_BUCKETS", "AgentMetrics", "MetricsMiddleware"]

# Seconds: most calls take a millisecond; a run's event stream lasts as long as the run.
LATENCY_BUCKETS: Final = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 300, 1800)
# Label values must stay few: any other method a client sends is counted as OTHER.
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class AgentMetrics:
    """The agent service's call counter and latency histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "teaagent_agent_http_requests",
            "HTTP calls answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "teaagent_agent_http_request_duration_seconds",
            "Time to answer one HTTP call, by route template (a run's event stream until it ends).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def render(self) -> bytes:
        """Return the metrics in the Prometheus text format."""
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Count every HTTP call by route template, method and status, and time it (pure ASGI: the
    event streams pass through unbuffered)."""

    def __init__(self, app: ASGIApp, *, metrics: AgentMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def watched_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            template = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.http_requests.labels(
                template, method if method in _METHODS else "OTHER", str(status)
            ).inc()
            self.metrics.latency.labels(template).observe(time.perf_counter() - started)
