"""The operator's check before signing: a decision is signed only on the request the operator was shown.

Two places ask it. An operator who signs with their own key (``teaagent approvals approve --key``,
``approvals statement``, the TUI's ``/approve`` with an operator key) checks the statement the
approver hands over before signing it (:func:`check_before_signing`): this node's, for the request
shown, its tool and payload digest the ones shown, in canonical form. And the approver itself
refuses to sign, or to offer for signing, a request whose signed tool or payload digest is not the
one the operator confirmed (:func:`unconfirmed`, its 409 ``changed``).

:func:`decide` is the decision of ``teaagent approvals`` and the TUI's ``/approve`` and ``/deny``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from teaagent.approver_client._client import ApproverClient
from teaagent.approver_client._models import ApprovalItem, DecisionResult, Expected, StatementToSign
from teaagent.config import NodeConfig
from teaagent.errors import RelayError
from teaagent.quorum import APPROVAL_NAMESPACE, DENIAL_NAMESPACE, statement_bytes
from teaagent.signing import Signer, signature_to_wire, sshsig_sign

__all__ = ["check_before_signing", "decide", "node_approver", "unconfirmed"]


def node_approver(node: NodeConfig) -> ApproverClient:
    """The node's approver, at ``http://127.0.0.1:<approver.port>`` with the node's token.

    Raises:
        ConfigError: The node's token cannot be read.
    """
    return ApproverClient(
        f"http://127.0.0.1:{node.approver.port}",
        token=node.load_token(),
        start_command=f"teaagent approver serve --config {node.path}",
    )


def unconfirmed(signed: Mapping[str, Any], *, tool_name: str | None, payload_digest: str | None) -> list[str]:
    """The fields of ``signed`` (a request or a statement) that are not what the operator confirmed.

    Args:
        signed: What is to be signed: has ``tool_name`` and ``payload_digest``.
        tool_name: The tool the operator was shown; None when not given (nothing to compare).
        payload_digest: The payload digest the operator was shown; None when not given.

    Returns:
        ``"tool"`` and/or ``"payload digest"``, in that order; empty when both are as confirmed.
    """
    return [
        name
        for name, confirmed, key in (
            ("tool", tool_name, "tool_name"),
            ("payload digest", payload_digest, "payload_digest"),
        )
        if confirmed is not None and signed.get(key) != confirmed
    ]


def check_before_signing(to_sign: StatementToSign, item: ApprovalItem, *, signer: str, base_url: str) -> None:
    """Refuse to sign a statement that is not ``signer``'s, for the request shown, in canonical form.

    Args:
        to_sign: The statement the approver handed over, and its bytes.
        item: The request the operator was shown.
        signer: This node's agent id.
        base_url: The approver's address, for the sentence.

    Raises:
        RelayError: The approver's statement is not one this node may sign for the request.
    """
    statement = to_sign.statement
    problem = None
    try:
        if statement_bytes(statement) != to_sign.data:
            problem = "its bytes are not the statement's canonical JSON"
    except ValueError as exc:
        problem = str(exc)
    if problem is None and statement.get("signer") != signer:
        problem = f"its signer is {statement.get('signer')!r}, not {signer}"
    if problem is None and statement.get("request_id") != item.request_id:
        problem = f"it is the statement of request {statement.get('request_id')!r}"
    if problem is None and unconfirmed(
        statement, tool_name=item.tool_name, payload_digest=item.payload_digest
    ):
        problem = "its tool or payload digest is not the one shown"
    if problem is not None:
        raise RelayError(
            f"The approver at {base_url} gave a statement to sign that is wrong ({problem}); "
            "nothing was signed."
        )


def decide(
    client: ApproverClient,
    item: ApprovalItem,
    *,
    agent_id: str,
    deny: bool,
    reason: str,
    signer: Signer | None,
) -> DecisionResult:
    """This node's decision on the request shown: signed by the approver (node key) or here by ``signer``.

    The tool and payload digest shown go with it: the approver signs nothing for a request that
    differs (409 ``changed``); a statement to sign here is checked first (:func:`check_before_signing`).

    Args:
        client: The node's approver.
        item: The request the operator was shown.
        agent_id: This node's agent id.
        deny: A denial, not an approval.
        reason: Why (a denial's reason goes to the origin's operators).
        signer: An operator's key to sign with here; None lets the approver sign with the node key.

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
    check_before_signing(to_sign, item, signer=agent_id, base_url=client.base_url)
    signature = sshsig_sign(to_sign.data, signer, DENIAL_NAMESPACE if deny else APPROVAL_NAMESPACE)
    return client.submit_decision(
        request_id, to_sign.statement, signature_to_wire(signature), expected=expected
    )
