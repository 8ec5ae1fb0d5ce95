"""Prometheus metrics of one relay application, in a registry of its own.

A registry per application (not the process-wide default) lets tests and benchmarks run several
relays in one process without their collectors clashing.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["LATENCY_BUCKETS", "RelayMetrics"]

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


class RelayMetrics:
    """The relay's counters, histogram and queue gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "teaagent_relay_http_requests",
            "HTTP calls answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "teaagent_relay_http_request_duration_seconds",
            "Time to answer one HTTP call, by route template (long-polls included).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.quorum_requests = Counter(
            "teaagent_relay_quorum_requests",
            "Signed requests stored: own (from this node's agent) or inbox (from a peer), new or repeated.",
            ["source", "result"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "teaagent_relay_refusals",
            "Calls refused, by stable error code.",
            ["code"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "teaagent_relay_deliveries",
            "Deliveries to peer relays that ended: ok (2xx), dead (refused for good, or expired), "
            "withdrawn (a request withdrawn before it reached a peer out of reach), or settled (the "
            "settlement of a request that never reached that peer).",
            ["result"],
            registry=self.registry,
        )
        self.retries = Counter(
            "teaagent_relay_delivery_retries",
            "Delivery attempts that failed and were scheduled again.",
            registry=self.registry,
        )
        self.decisions = Counter(
            "teaagent_relay_decisions",
            "Signed decisions received, from peers or this node's approver: counted, duplicate (verified, "
            "already counted or decided), late (the request had expired), rejected; source settlement: "
            "an origin's evidence of an outcome that did not verify here (rejected).",
            ["source", "result"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "teaagent_relay_outcomes",
            "Own requests decided, by outcome (counted once, by the call that decided it).",
            ["state"],
            registry=self.registry,
        )
        self.queue = Gauge(
            "teaagent_relay_queue_entries",
            "Entries of the relay's queues at scrape time: waiting or in flight, in flight, scheduled, dead.",
            ["queue", "kind"],
            registry=self.registry,
        )
        self.long_polls = Gauge(
            "teaagent_relay_long_polls_waiting",
            "Long-polls being answered now: inbox (GET /v1/inbox with wait) or outcome (GET with wait).",
            ["kind"],
            registry=self.registry,
        )

        self.trust_reloads = Counter(
            "teaagent_relay_trust_reloads",
            "Reloads of the trust (SIGHUP, POST /v1/reload): reloaded (it changed), unchanged, or failed "
            "(the file did not load; the old trust is kept).",
            ["result"],
            registry=self.registry,
        )
        self.trust_generation = Gauge(
            "teaagent_relay_trust_generation",
            "The trust in use: 1 at start, one more per reload that changed it.",
            registry=self.registry,
        )
        self.trust_generation.set(1)

    def render(self) -> bytes:
        """Return the metrics in the Prometheus text format."""
        return generate_latest(self.registry)
