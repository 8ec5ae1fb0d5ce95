"""Prometheus metrics of one agent application (``teaagent.service.ServiceMetrics``): its calls,
their latency and its refusals, in a registry of its own."""

from __future__ import annotations

from typing import Final

from teaagent.service import ServiceMetrics

__all__ = ["LATENCY_BUCKETS", "AgentMetrics"]

# Seconds: most calls take a millisecond; a run's event stream lasts as long as the run.
LATENCY_BUCKETS: Final = (0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 300, 1800)


class AgentMetrics(ServiceMetrics):
    """The agent service's call counter, latency histogram and refusal counter."""

    def __init__(self) -> None:
        super().__init__(
            "agent",
            latency_help="Time to answer one HTTP call, by route template "
            "(a run's event stream until it ends).",
            buckets=LATENCY_BUCKETS,
        )
