"""What an operator sees of one received request: the verified request and this node's own decision.

Every field shown, and every rule matched, comes from the request after its origin signature
verified (:class:`Received`, built only by ``Engine.receive``): never from the relay's description
of the item (PROTOCOL.md "What an approving node decides on").

The state is this node's view (pending, approved or denied by this node, expired), never the
request's outcome: only its origin counts that, from every peer's decision. The one exception is
``settled``: the outcome at its origin, shown only once this approver verified its evidence (the
certificate, or the denials) itself (:func:`teaagent.quorum.verify_settlement`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from teaagent.config import ApproverRule
from teaagent.errors import SignatureError
from teaagent.quorum import Settlement, VerifiedRequest, stated_kind
from teaagent.relay_client import InboxItem
from teaagent.signing import parse_sshsig
from teaagent_approver._ledger import Record

__all__ = [
    "RELAY_DECIDED_BY",
    "SHOWN_FIELDS",
    "Received",
    "item_view",
    "matching_rule",
    "rule_view",
    "settled_sentence",
    "shown_fields",
]

RELAY_DECIDED_BY = "relay"  # a decision this approver did not record: handed to the relay directly
#: What an operator is shown of a request first, wherever it is shown (an ``Item``, a notification).
SHOWN_FIELDS: Final = ("request_id", "origin", "tool_name", "arguments", "reason", "payload_digest")


def shown_fields(request: object) -> dict[str, Any]:
    """The :data:`SHOWN_FIELDS` of a request (a verified one, or a notification's copy), in order."""
    return {name: getattr(request, name) for name in SHOWN_FIELDS}


@dataclass(frozen=True, slots=True)
class Received:
    """An inbox item whose request verified: the request, and what the relay holds of it.

    Attributes:
        request: The verified request: everything shown, matched and signed comes from it.
        state: The relay's state of the item (``pending``, ``withdrawn``...). A hint: a relay that
            lies about it can only delay (a withdrawn or expired item is never signed anyway).
        decision: This node's signed decision as the relay holds it, or None.
        settled: Its outcome at its origin, proven by evidence this node verified, or None.
    """

    request: VerifiedRequest
    state: str
    decision: dict[str, Any] | None
    settled: Settlement | None = None

    @classmethod
    def of(cls, request: VerifiedRequest, item: InboxItem, settled: Settlement | None = None) -> Received:
        """The verified request with the relay's state and decision of ``item``, and its verified outcome."""
        return cls(request=request, state=item.state, decision=item.decision, settled=settled)

    @property
    def ref(self) -> tuple[str, str]:
        """``(origin, request_id)``, this node's name for the item in its records."""
        return self.request.origin, self.request.request_id


def settled_phrase(request: VerifiedRequest, settled: Settlement) -> str:
    """``approved at alpha by beta, gamma``: the outcome at the origin, as its evidence proves it."""
    return f"{settled.outcome} at {request.origin} by {', '.join(settled.decided_by)}"


def settled_sentence(request: VerifiedRequest, settled: Settlement) -> str:
    """Why this node signs nothing for a settled request, in one sentence."""
    return (
        f"Request {request.request_id} was already {settled_phrase(request, settled)}; "
        "this node signs nothing for it."
    )


def matching_rule(rules: Sequence[ApproverRule], request: VerifiedRequest) -> tuple[int, ApproverRule] | None:
    """The first rule that matches the verified call, with its position from 1; None when none does."""
    arguments = request.arguments
    for index, rule in enumerate(rules, start=1):
        if rule.matches(request.tool_name, arguments):
            return index, rule
    return None


def rule_view(found: tuple[int, ApproverRule] | None) -> dict[str, Any] | None:
    """The ``rule`` field of an item."""
    if found is None:
        return None
    index, rule = found
    return {"index": index, "tool": rule.tool, "arguments": dict(rule.arguments), "decision": rule.decision}


def _decision_view(kind: str, reason: str, by: str, key_fingerprint: str, at: int) -> dict[str, Any]:
    """This node's decision on an item, as an ``Item`` shows it (``decision``)."""
    return {"kind": kind, "reason": reason, "by": by, "key_fingerprint": key_fingerprint, "at": at}


def _record_view(record: Record) -> dict[str, Any]:
    return _decision_view(record.kind, record.reason, record.by, record.key_fingerprint, record.signed_at)


def _relay_decision_view(decision: dict[str, Any]) -> dict[str, Any] | None:
    """This node's decision as the relay holds it, when this approver has no record of it."""
    statement = decision.get("statement")
    signature = decision.get("signature")
    if not isinstance(statement, dict) or not isinstance(signature, str):
        return None
    kind = stated_kind(statement)
    try:
        key = parse_sshsig(signature).signer_fingerprint
    except (SignatureError, ValueError):
        key = ""  # a development signature carries no key
    signed_at = statement.get("signed_at")
    at = signed_at if isinstance(signed_at, int) else 0
    return _decision_view(kind, str(statement.get("reason", "")), RELAY_DECIDED_BY, key, at)


def item_view(
    item: Received, record: Record | None, rules: Sequence[ApproverRule], now: float
) -> dict[str, Any]:
    """The ``Item`` of the HTTP API (and of the notifier) for one inbox item.

    Args:
        item: The verified item.
        record: This approver's record of the node's decision, if any.
        rules: The node's ``[[approver.rules]]``.
        now: The current time, Unix seconds.
    """
    request = item.request
    decision: dict[str, Any] | None
    if record is not None:
        decision = _record_view(record)
        state = "approved" if record.kind == "approval" else "denied"
    else:
        # The relay's copy of this node's decision verified in Engine.receive; without one, its
        # word that this node decided is not shown.
        decision = _relay_decision_view(item.decision) if item.decision else None
        state = item.state
        if state in ("approved", "denied") and decision is None:
            state = "pending"
        if state == "settled" and item.settled is None:
            state = "pending"  # the relay's word alone: it can only delay
        if state == "pending" and item.settled is not None:
            state = "settled"
        if state == "pending" and now > request.expires_at:
            state = "expired"
    return {
        **shown_fields(request),
        "run_id": request.run_id,
        "call_id": request.call_id,
        "required_approvals": request.required_approvals,
        "peers": list(request.peers),
        "created_at": request.created_at,
        "expires_at": request.expires_at,
        "seconds_left": max(0, math.ceil(request.expires_at - now)),
        "state": state,
        "decision": decision,
        "settled": item.settled.to_dict() if item.settled is not None else None,
        "rule": rule_view(matching_rule(rules, request)),
        "request": request.document(),
        "signature": request.signature,
    }
