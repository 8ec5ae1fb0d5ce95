"""``/inbox``, ``/approve``, ``/deny``: what peers ask this node to approve, as in ``teaagent approvals``.

Everything goes through the node's approver service (:class:`~teaagent.approver_client.ApproverClient`),
never the relay: the approver records each decision atomically before any signature leaves, audits
it with the key that signed it, and refuses a second, different one. A decision is signed by the
approver with the node key, or here with an operator's key (``operator_signer``), in which case the
TUI checks the statement it is handed before it signs anything
(:func:`~teaagent.approver_client.decide`, as ``teaagent approvals`` does).

``/approve ID`` and ``/deny ID`` name a request by its full id, or by its first characters when no
other request ``/inbox`` has shown in this session (pending or settled since) starts with them, as
``teaagent approvals watch`` does (:func:`~teaagent.approver_client.resolve_request`); what ``/inbox``
showed of it goes with the decision, and the approver signs nothing for a request that differs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Final

from teaagent._words import time_left
from teaagent.approver_client import ApprovalItem, DecisionResult, node_approver, signed_by
from teaagent.quorum import shown_policy
from teaagent.tui._screen import visible

__all__ = [
    "INBOX_ARGUMENTS_CHARS",
    "approver_client",
    "decision_lines",
    "inbox_policy_lines",
    "inbox_rows",
]

INBOX_ARGUMENTS_CHARS: Final = (
    60  # a listing's one-line arguments; `teaagent approvals show` prints them whole
)


approver_client = node_approver
"""The node's approver (:func:`teaagent.approver_client.node_approver`)."""


def _one_line(arguments: Any, width: int) -> str:
    text = visible(json.dumps(arguments, ensure_ascii=False, sort_keys=True, separators=(", ", ": ")))
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def inbox_rows(items: Sequence[ApprovalItem], now: float | None = None) -> list[list[str]]:
    """The ``/inbox`` table's rows: id, origin, tool, time left, the matching rule, the arguments.

    A request settled at its origin says so instead of its time left (``approved at beta by
    gamma 12s ago``): nobody is to decide it any more.
    """
    now = time.time() if now is None else now
    rows = []
    for item in items:
        rule = "ask (no rule)" if item.rule is None else f"#{item.rule.index} {item.rule.decision}"
        rows.append(
            [
                item.request_id,
                item.origin,
                visible(item.tool_name),
                item.settled.phrase(item.origin, now)
                if item.settled is not None
                else time_left(item.expires_at - now),
                rule,
                _one_line(item.arguments, INBOX_ARGUMENTS_CHARS),
            ]
        )
    return rows


def inbox_policy_lines(items: Sequence[ApprovalItem], node_id: str) -> list[str]:
    """Under the ``/inbox`` table, one line per version 2 request: its rule, its terms, this node's term.

    From the signed request the approver verified (:func:`teaagent.quorum.shown_policy`), as
    ``teaagent approvals show`` words it.
    """
    lines = []
    for item in items:
        shown = shown_policy(item.request, node_id)
        if shown is not None:
            lines.append(f"{item.request_id[:8]} {shown.line()}")
    return lines


def decision_lines(result: DecisionResult, node_id: str, node_key: str | None = None) -> list[str]:
    """What a decision did, in the words of ``teaagent approvals``.

    ``node_key`` is the node key's fingerprint: a decision it signed says "the node key".
    """
    reason = f" ({visible(result.reason)})" if result.reason else ""
    lines = [
        f"{node_id} {result.this_node} request {result.request_id} of {result.origin}{reason}: "
        f"signed {signed_by(result.by, result.key_fingerprint, node_key)}.",
        f"Forwarded to {result.origin} through this node's relay."
        if result.forwarded
        else f"Not forwarded to {result.origin} yet: the approver sends it again until the relay takes it.",
    ]
    return lines
