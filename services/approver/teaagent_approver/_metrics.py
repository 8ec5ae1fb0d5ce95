"""Prometheus metrics of one approver application, in a registry of its own.

A registry per application (not the process-wide default) lets tests run several approvers in one
process without their collectors clashing.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["LATENCY_BUCKETS", "ApproverMetrics"]

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


class ApproverMetrics:
    """The approver's counters and latency histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.http_requests = Counter(
            "teaagent_approver_http_requests",
            "HTTP calls answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "teaagent_approver_http_request_duration_seconds",
            "Time to answer one HTTP call, by route template (long-polls included).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.refusals = Counter(
            "teaagent_approver_refusals",
            "HTTP calls refused, by stable error code.",
            ["code"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "teaagent_approver_decisions",
            "Decisions of this node recorded by this process, by who decided (rule, operator) and kind.",
            ["by", "kind"],
            registry=self.registry,
        )
        self.signatures = Counter(
            "teaagent_approver_signatures",
            "Statements this process signed with the node key.",
            registry=self.registry,
        )
        self.forwards = Counter(
            "teaagent_approver_forwards",
            "Signed decisions handed to the node's relay: ok, retry (the relay did not answer), refused.",
            ["result"],
            registry=self.registry,
        )
        self.skipped = Counter(
            "teaagent_approver_skipped",
            "Inbox items the engine did not sign: ask (left to an operator), expired, withdrawn, settled "
            "(decided at its origin, on evidence verified here), bad_origin "
            "(the origin's signature does not verify), deferred (another process is deciding it).",
            ["reason"],
            registry=self.registry,
        )
        self.refused_items = Counter(
            "teaagent_approver_refused_items",
            "Inbox items refused before anything was shown, matched or signed: bad_request (the request "
            "is malformed, not from a configured peer or not addressed to this node), bad_signature (the "
            "origin's signature does not verify with its configured keys), relay_disagrees (the relay's "
            "description of the item differs from the signed request it carries).",
            ["reason"],
            registry=self.registry,
        )
        self.takeovers = Counter(
            "teaagent_approver_takeovers",
            "Decisions another approver process recorded and did not finish, finished by this one.",
            registry=self.registry,
        )
        self.notifications = Counter(
            "teaagent_approver_notifications",
            "Requests handed to the notifier (once per request).",
            registry=self.registry,
        )
        self.engine_errors = Counter(
            "teaagent_approver_engine_errors",
            "Rounds of the engine that failed: relay or redis unreachable, or other (see the log).",
            ["kind"],
            registry=self.registry,
        )

        self.trust_reloads = Counter(
            "teaagent_approver_trust_reloads",
            "Reloads of the trust (SIGHUP, POST /v1/reload): reloaded (it changed), unchanged, or failed "
            "(the file did not load; the old trust is kept).",
            ["result"],
            registry=self.registry,
        )
        self.trust_generation = Gauge(
            "teaagent_approver_trust_generation",
            "The trust in use: 1 at start, one more per reload that changed it.",
            registry=self.registry,
        )
        self.trust_generation.set(1)

    def render(self) -> bytes:
        """Return the metrics in the Prometheus text format."""
        return generate_latest(self.registry)
