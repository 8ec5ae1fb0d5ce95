"""Prometheus metrics of one approver application: the toolkit's (calls, latency, refusals; see
``teaagent.service.ServiceMetrics``) and the approver's own counters, in a registry of its own."""

from __future__ import annotations

from teaagent.service import ServiceMetrics

__all__ = ["ApproverMetrics"]


class ApproverMetrics(ServiceMetrics):
    """The approver's counters and latency histogram."""

    def __init__(self) -> None:
        super().__init__("approver")
        self.decisions = self.counter(
            "decisions",
            "Decisions of this node recorded by this process, by who decided (rule, operator) and kind.",
            "by",
            "kind",
        )
        self.signatures = self.counter("signatures", "Statements this process signed with the node key.")
        self.forwards = self.counter(
            "forwards",
            "Signed decisions handed to the node's relay: ok, retry (the relay did not answer), refused.",
            "result",
        )
        self.skipped = self.counter(
            "skipped",
            "Inbox items the engine did not sign: ask (left to an operator), expired, withdrawn, settled "
            "(decided at its origin, on evidence verified here), bad_origin "
            "(the origin's signature does not verify), deferred (another process is deciding it).",
            "reason",
        )
        self.refused_items = self.counter(
            "refused_items",
            "Inbox items refused before anything was shown, matched or signed: bad_request (the request "
            "is malformed, not from a configured peer or not addressed to this node), bad_signature (the "
            "origin's signature does not verify with its configured keys), relay_disagrees (the relay's "
            "description of the item differs from the signed request it carries).",
            "reason",
        )
        self.takeovers = self.counter(
            "takeovers",
            "Decisions another approver process recorded and did not finish, finished by this one.",
        )
        self.notifications = self.counter(
            "notifications", "Requests handed to the notifier (once per request)."
        )
        self.looks = self.histogram(
            "look_seconds",
            "Looks of the rules at the inbox that found something to look at: from reading what is new "
            "(or due again) to the last item handled, its Redis and relay calls included.",
        )
        self.engine_errors = self.counter(
            "engine_errors",
            "Rounds of the engine that failed: relay or redis unreachable, or other (see the log).",
            "kind",
        )
        self.trust_metrics()
