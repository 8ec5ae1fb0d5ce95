"""What an operator sees of one received request: the relay's item and this node's own decision.

The state is this node's view (pending, approved or denied by this node, expired), never the
request's outcome: only its origin counts that, from every peer's decision.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from teaagent.config import ApproverRule
from teaagent.errors import SignatureError
from teaagent.relay_client import InboxItem
from teaagent.signing import parse_sshsig
from teaagent_approver._ledger import Record

__all__ = ["RELAY_DECIDED_BY", "item_view", "matching_rule", "rule_view"]

RELAY_DECIDED_BY = "relay"  # a decision this approver did not record: handed to the relay directly


def matching_rule(rules: Sequence[ApproverRule], item: InboxItem) -> tuple[int, ApproverRule] | None:
    """The first rule that matches the item's call, with its position from 1; None when none does."""
    for index, rule in enumerate(rules, start=1):
        if rule.matches(item.tool_name, item.arguments):
            return index, rule
    return None


def rule_view(found: tuple[int, ApproverRule] | None) -> dict[str, Any] | None:
    """The ``rule`` field of an item."""
    if found is None:
        return None
    index, rule = found
    return {"index": index, "tool": rule.tool, "arguments": dict(rule.arguments), "decision": rule.decision}


def _record_view(record: Record) -> dict[str, Any]:
    return {
        "kind": record.kind,
        "reason": record.reason,
        "by": record.by,
        "key_fingerprint": record.key_fingerprint,
        "at": record.signed_at,
    }


def _relay_decision_view(decision: dict[str, Any]) -> dict[str, Any] | None:
    """This node's decision as the relay holds it, when this approver has no record of it."""
    statement = decision.get("statement")
    signature = decision.get("signature")
    if not isinstance(statement, dict) or not isinstance(signature, str):
        return None
    kind = "denial" if statement.get("type") == "teaagent.denial" else "approval"
    try:
        key = parse_sshsig(signature).signer_fingerprint
    except (SignatureError, ValueError):
        key = ""  # a development signature carries no key
    signed_at = statement.get("signed_at")
    return {
        "kind": kind,
        "reason": str(statement.get("reason", "")),
        "by": RELAY_DECIDED_BY,
        "key_fingerprint": key,
        "at": signed_at if isinstance(signed_at, int) else 0,
    }


def item_view(
    item: InboxItem, record: Record | None, rules: Sequence[ApproverRule], now: float
) -> dict[str, Any]:
    """The ``Item`` of the HTTP API (and of the notifier) for one inbox item.

    Args:
        item: The relay's inbox item.
        record: This approver's record of the node's decision, if any.
        rules: The node's ``[[approver.rules]]``.
        now: The current time, Unix seconds.
    """
    decision: dict[str, Any] | None
    if record is not None:
        decision = _record_view(record)
        state = "approved" if record.kind == "approval" else "denied"
    else:
        decision = _relay_decision_view(item.decision) if item.decision else None
        state = item.state
        if state == "pending" and now > item.expires_at:
            state = "expired"
    return {
        "request_id": item.request_id,
        "origin": item.origin,
        "tool_name": item.tool_name,
        "arguments": item.arguments,
        "reason": item.reason,
        "payload_digest": item.payload_digest,
        "run_id": item.run_id,
        "call_id": item.call_id,
        "required_approvals": item.required_approvals,
        "peers": list(item.peers),
        "created_at": item.created_at,
        "expires_at": item.expires_at,
        "seconds_left": max(0, math.ceil(item.expires_at - now)),
        "state": state,
        "decision": decision,
        "rule": rule_view(matching_rule(rules, item)),
        "request": item.request,
        "signature": item.signature,
    }
