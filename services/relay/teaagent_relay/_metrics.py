"""Prometheus metrics of one relay application: the toolkit's (calls, latency, refusals; see
``teaagent.service.ServiceMetrics``) and the relay's own counters, in a registry of its own."""

from __future__ import annotations

from typing import Any

from teaagent.service import ServiceMetrics

__all__ = ["RelayMetrics"]


class RelayMetrics(ServiceMetrics):
    """The relay's counters, histogram and queue gauges."""

    def __init__(self) -> None:
        super().__init__("relay")
        self.quorum_requests = self.counter(
            "quorum_requests",
            "Signed requests stored: own (from this node's agent) or inbox (from a peer), new or repeated.",
            "source",
            "result",
        )
        self.deliveries = self.counter(
            "deliveries",
            "Deliveries to peer relays that ended: ok (2xx), dead (refused for good, or expired), "
            "withdrawn (a request withdrawn before it reached a peer out of reach), or settled (the "
            "settlement of a request that never reached that peer).",
            "result",
        )
        self.batched = self.counter(
            "batched_deliveries",
            "Peers' deliveries received inside POST /v1/deliveries, by the route that served each (as "
            "its own call) and its status; each batch is one call of http_requests_total, its deliveries "
            "are not.",
            "route",
            "status",
        )
        self._batched: dict[tuple[str, int], Any] = {}  # labels() locks on every call: children kept
        self.retries = self.counter(
            "delivery_retries", "Delivery attempts that failed and were scheduled again."
        )
        self.decisions = self.counter(
            "decisions",
            "Signed decisions received, from peers or this node's approver: counted, duplicate (verified, "
            "already counted or decided), late (the request had expired), rejected; source settlement: "
            "an origin's evidence of an outcome that did not verify here (rejected).",
            "source",
            "result",
        )
        self.settlements = self.counter(
            "settlements",
            "Peers of an own request decided here whose decision is not in the evidence of its outcome, "
            "once the settlement's grace is over: queued (sent the evidence: they had not decided) or "
            "spared (their decision came in the grace, so they are not sent it).",
            "result",
        )
        self.outcomes = self.counter(
            "outcomes",
            "Own requests decided, by outcome (counted once, by the call that decided it).",
            "state",
        )
        self.queue = self.gauge(
            "queue_entries",
            "Entries of the relay's queues at scrape time: waiting or in flight, in flight, scheduled, dead.",
            "queue",
            "kind",
        )
        self.long_polls = self.gauge(
            "long_polls_waiting",
            "Long-polls being answered now: inbox (GET /v1/inbox with wait) or outcome (GET with wait).",
            "kind",
        )
        self.trust_metrics()

    def count_batched(self, route: str, status: int) -> None:
        """Count one delivery of a ``POST /v1/deliveries`` (``batched_deliveries``)."""
        child = self._batched.get((route, status))
        if child is None:
            child = self._batched[(route, status)] = self.batched.labels(route, str(status))
        child.inc()
