"""``/inbox``, ``/approve``, ``/deny``: what peers ask this node to approve, as in ``teaagent approvals``.

Everything goes through the node's approver service (:class:`~teaagent.approver_client.ApproverClient`),
never the relay: the approver records each decision atomically before any signature leaves, audits
it with the key that signed it, and refuses a second, different one. A decision is signed by the
approver with the node key, or here with an operator's key (``operator_signer``), in which case the
TUI checks the statement it is handed is this node's, for this request, in canonical form, before it
signs anything.

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
from teaagent.approver_client import (
    ApprovalItem,
    ApproverClient,
    DecisionResult,
    Expected,
    StatementToSign,
    signed_by,
)
from teaagent.config import NodeConfig
from teaagent.errors import RelayError
from teaagent.quorum import APPROVAL_NAMESPACE, DENIAL_NAMESPACE, statement_bytes
from teaagent.signing import Signer, signature_to_wire, sshsig_sign
from teaagent.tui._screen import visible

__all__ = ["INBOX_ARGUMENTS_CHARS", "approver_client", "decide", "decision_lines", "inbox_rows"]

INBOX_ARGUMENTS_CHARS: Final = (
    60  # a listing's one-line arguments; `teaagent approvals show` prints them whole
)


def approver_client(node: NodeConfig) -> ApproverClient:
    """The node's approver, at ``http://127.0.0.1:<approver.port>`` with the node's token.

    Raises:
        ConfigError: The node's token cannot be read.
    """
    return ApproverClient(
        f"http://127.0.0.1:{node.approver.port}",
        token=node.load_token(),
        start_command=f"teaagent approver serve --config {node.path}",
    )


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


def _check_statement(node: NodeConfig, to_sign: StatementToSign, item: ApprovalItem, base_url: str) -> None:
    """Refuse a statement that is not this node's, for the request shown, in canonical form.

    Raises:
        RelayError: The approver's statement is not one this node may sign for the request.
    """
    request_id = item.request_id
    statement = to_sign.statement
    problem = None
    try:
        if statement_bytes(statement) != to_sign.data:
            problem = "its bytes are not the statement's canonical JSON"
    except ValueError as exc:
        problem = str(exc)
    if problem is None and statement.get("signer") != node.agent_id:
        problem = f"its signer is {statement.get('signer')!r}, not {node.agent_id}"
    if problem is None and statement.get("request_id") != request_id:
        problem = f"it is the statement of request {statement.get('request_id')!r}"
    if problem is None and (statement.get("tool_name"), statement.get("payload_digest")) != (
        item.tool_name,
        item.payload_digest,
    ):
        problem = "its tool or payload digest is not the one shown"
    if problem is not None:
        raise RelayError(
            f"The approver at {base_url} gave a statement to sign that is wrong ({problem}); "
            "nothing was signed."
        )


def decide(
    client: ApproverClient,
    node: NodeConfig,
    item: ApprovalItem,
    *,
    deny: bool,
    reason: str,
    signer: Signer | None,
) -> DecisionResult:
    """This node's decision on the request shown: signed by the approver (node key) or here by ``signer``.

    The tool and payload digest shown go with it: the approver signs nothing for a request that
    differs (409 ``changed``).

    Raises:
        RelayError: The approver refused (its code says why), is unreachable, or handed a
            statement this node may not sign.
        SignatureError: The operator's key could not sign.
    """
    request_id, origin, expected = item.request_id, item.origin, Expected.of(item)
    if signer is None:
        if deny:
            return client.deny(request_id, reason=reason, origin=origin, expected=expected)
        return client.approve(request_id, reason=reason, origin=origin, expected=expected)
    to_sign = client.statement(
        request_id, kind="denial" if deny else "approval", reason=reason, origin=origin, expected=expected
    )
    _check_statement(node, to_sign, item, client.base_url)
    signature = sshsig_sign(to_sign.data, signer, DENIAL_NAMESPACE if deny else APPROVAL_NAMESPACE)
    return client.submit_decision(
        request_id, to_sign.statement, signature_to_wire(signature), expected=expected
    )


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
