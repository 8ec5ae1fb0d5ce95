"""The node's inbox as the operator's commands see it: the approver, a request named and shown, a decision.

``teaagent approvals`` (its one-shot commands and ``watch``) talk to the node's approver through
these: what a refusal of the approver means for the exit code, how a request is shown, and
:func:`decide`, which refuses a request settled at its origin before anything is signed.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import typer

from teaagent._display import long_values as _long_values
from teaagent._display import pretty_arguments, visible
from teaagent._words import moment, plural, time_left
from teaagent.approver_client import (
    ApprovalItem,
    ApproverClient,
    DecisionResult,
    node_approver,
    resolve_request,
    signed_by,
)
from teaagent.approver_client import decide as operator_decide
from teaagent.cli._exit import EXIT_DENIED, EXIT_FAILED, EXIT_USAGE, bad_usage, fail
from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError, RelayError, SignatureError
from teaagent.quorum import (
    shown_policy,
)
from teaagent.signing import (
    Signer,
)

TABLE_ARGUMENTS_CHARS: Final = 60  # a listing's one-line arguments; `show` prints them whole

# What each refusal of the approver means for the exit code; every other failure is 1.
_EXIT_BY_CODE: Final = {
    "not_found": EXIT_USAGE,  # the id names no request that reached this node
    "ambiguous": EXIT_USAGE,  # several origins used the id: --origin names one
    "invalid": EXIT_USAGE,  # a statement that does not match, a malformed call
    "forbidden": EXIT_USAGE,  # a key that may not sign for this node
    "unauthorized": EXIT_USAGE,  # the configuration's token is not the node's
    "expired": EXIT_DENIED,
    "withdrawn": EXIT_DENIED,  # its origin withdrew it: nothing is signed, as for an expired one
    "settled": EXIT_FAILED,  # decided at its origin already: nothing is signed, the call did not fail
}


# -- connecting ---------------------------------------------------------------------------------


def connect(config: Path | None) -> tuple[NodeConfig, ApproverClient]:
    node = load_config(config)
    return node, node_approver(node)


def exit_code(exc: RelayError) -> int:
    return _EXIT_BY_CODE.get(exc.code or "", EXIT_FAILED)


def resolve(client: ApproverClient, typed: str, origin: str | None) -> ApprovalItem:
    """The request a one-shot command names: a full id, or a prefix of one request the approver lists.

    Raises:
        typer.Exit: Exit 2 when ``typed`` is no id, names no request or several (one sentence).
        RelayError: The approver refused or failed.
    """
    try:
        return resolve_request(client, typed, origin=origin, among="listed by this node's approver")
    except ValueError as exc:
        bad_usage(str(exc))


@contextlib.contextmanager
def answers() -> Iterator[None]:
    """Turn the approver's refusals into their exit code and sentence."""
    try:
        yield
    except RelayError as exc:
        raise typer.Exit(fail(str(exc), exit_code(exc))) from None


# -- showing ------------------------------------------------------------------------------------


def node_key_of(node: NodeConfig) -> str | None:
    """The node key's fingerprint, to tell its signatures from an operator's own key; None if unreadable."""
    try:
        return node.own_public_key().fingerprint
    except ConfigError:
        return None


def rule_phrase(item: ApprovalItem) -> str:
    rule = item.rule
    if rule is None:
        return "none matches: it waits for an operator"
    patterns = "".join(f" {name}={pattern!r}" for name, pattern in sorted(rule.arguments.items()))
    return f"#{rule.index} tool={rule.tool!r}{patterns} -> {rule.decision}"


def decision_phrase(item: ApprovalItem, node_key: str | None, now: float) -> str:
    decision = item.decision
    if decision is None:
        return "not decided yet"
    verb = "approved" if decision.kind == "approval" else "denied"
    reason = f": {visible(decision.reason)}" if decision.reason else ""
    who = signed_by(decision.by, decision.key_fingerprint, node_key)
    return f"{verb} {who} at {moment(decision.at, now)}{reason}"


def settled_phrase(item: ApprovalItem, now: float) -> str | None:
    """``approved at alpha by beta, gamma 12s ago``: the outcome at its origin, as the approver
    verified its evidence; None while it has none."""
    return None if item.settled is None else item.settled.phrase(item.origin, now)


def left_phrase(item: ApprovalItem, now: float) -> str:
    left = item.expires_at - now
    if left <= 0:
        return f"expired at {moment(item.expires_at, now)}"
    return f"{time_left(left)} (expires at {moment(item.expires_at, now).split(',')[0]})"


def show_lines(
    item: ApprovalItem, node_id: str, now: float | None = None, *, node_key: str | None = None
) -> list[str]:
    """What ``show`` prints: everything a careful approver needs, nothing cut without saying so.

    ``node_key`` is the node key's fingerprint: a decision it signed says "the node key".
    """
    now = time.time() if now is None else now
    lines = [
        f"request      {item.request_id}",
        f"origin       {item.origin} (run {visible(item.run_id)}, call {visible(item.call_id)})",
        f"tool         {visible(item.tool_name)}",
        "arguments",
        *("  " + line for line in pretty_arguments(item.arguments).splitlines()),
    ]
    for path, length in _long_values(item.arguments):
        lines.append(f"  note: {visible(path)} is {length} characters long, printed whole above.")
    reason = visible(item.reason, newlines=True).splitlines() or [""]
    lines.append(f"reason       {reason[0]}")
    lines.extend(f"             {line}" for line in reason[1:])
    lines += [
        f"digest       {item.payload_digest}",
        *quorum_lines(item, node_id),
        f"{node_id:<12} {decision_phrase(item, node_key, now)} (this node's own decision, "
        "not the request's outcome)",
        f"time left    {left_phrase(item, now)}",
        f"rule         {rule_phrase(item)}",
    ]
    settled = settled_phrase(item, now)
    if settled is not None:
        lines.insert(-2, f"settled      {settled} (the outcome at its origin, its evidence verified here)")
    return lines


def quorum_lines(item: ApprovalItem, node_id: str) -> list[str]:
    """What the request needs: N of its peers, or (version 2) its rule, its terms, and this node's term."""
    shown = shown_policy(item.request, node_id)
    if shown is None:
        needed = plural(item.required_approvals, "approval")
        return [f"quorum       {needed} needed from {', '.join(item.peers)}, counted by {item.origin}"]
    return [
        f"quorum       {shown.heading}",
        *(f"  {name:<10} {term}" for name, term in shown.numbered),
        f"counts for   {shown.counts}",
    ]


def one_line(arguments: Any, width: int) -> str:
    text = visible(json.dumps(arguments, ensure_ascii=False, sort_keys=True, separators=(", ", ": ")))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def echo_decision(result: DecisionResult, node: NodeConfig, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    reason = f" ({visible(result.reason)})" if result.reason else ""
    typer.echo(
        f"{node.agent_id} {result.this_node} request {result.request_id} of {result.origin}{reason}: "
        f"signed {signed_by(result.by, result.key_fingerprint, node_key_of(node))}."
    )
    typer.echo(
        f"Forwarded to {result.origin} through this node's relay."
        if result.forwarded
        else f"Not forwarded to {result.origin} yet: the approver sends it again until the relay takes it."
    )
    typer.echo(
        result.note
        or f"This node's decision; the request's outcome is counted by its origin, {result.origin}."
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
    """This node's decision on the request shown: signed by the approver (node key) or by ``signer``.

    The tool and payload digest shown go with it: the approver signs nothing for a request that
    differs (409 ``changed``).

    Raises:
        RelayError: The approver refused (its code says why), is unreachable, or gave a statement
            this node may not sign (:func:`~teaagent.approver_client.check_before_signing`).
        ConfigError: The local key could not sign (an ssh-agent that refuses, a token not touched).
    """
    settled = settled_phrase(item, time.time())
    if settled is not None:
        # Refused before anything is signed, a local key's signature included.
        raise RelayError(
            f"Request {item.request_id} was already {settled}; this node signs nothing for it.",
            status_code=409,
            code="settled",
        )
    try:
        return operator_decide(client, item, agent_id=node.agent_id, deny=deny, reason=reason, signer=signer)
    except SignatureError as exc:
        raise ConfigError(str(exc)) from None
