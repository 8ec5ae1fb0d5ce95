"""``/tools``, ``/quorum``, ``/inbox``, ``/approve``, ``/deny``: the tools, and the node's peers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from teaagent.approver_client import ApprovalItem, ApproverClient, DecisionResult, decide, resolve_request
from teaagent.config import NodeConfig
from teaagent.errors import ConfigError, TeaAgentError
from teaagent.tui._base import TUIBase
from teaagent.tui._common import short
from teaagent.tui._inbox import approver_client, decision_lines, inbox_policy_lines, inbox_rows
from teaagent.tui._screen import visible

_T = TypeVar("_T")


def cmd_tools(tui: TUIBase, _argument: str) -> None:
    try:
        registry = tui._tools()
    except (OSError, ValueError, ConfigError) as exc:
        tui._screen.say(f"The tools cannot be loaded: {exc}", "red")
        return
    quorum = tui.node.quorum if tui.node is not None else None
    rows = []
    for tool in registry.list_tools():
        notes = tool.annotations
        kind = "destructive" if notes.destructive else ("read-only" if notes.read_only else "writes")
        risk = "quorum" if quorum is not None and quorum.enabled and quorum.is_high_risk(tool.name) else ""
        limit = f"{tool.rate_limit.max_calls}/{tool.rate_limit.window_seconds:g}s" if tool.rate_limit else ""
        rows.append([tool.name, kind, risk, limit, short(tool.description.split(". ")[0], 60)])
    rows.append(["ask_user", "read-only", "", "", "Ask you a question (built in)"])
    tui._screen.table(["TOOL", "KIND", "NEEDS", "LIMIT", "WHAT IT DOES"], rows)


def cmd_quorum(tui: TUIBase, _argument: str) -> None:
    if not tui._board.calls:
        enabled = tui.node is not None and tui.node.quorum.enabled
        tui._screen.say(
            "No high-risk call in this session yet."
            if enabled
            else "The quorum is not enabled here: no call needs peers."
        )
        return
    tui._screen.table(
        ["REQUEST", "TOOL", "STATE", "SIGNED BY", "DENIED BY", "QUORUM", "WHEN"], tui._board.rows()
    )
    for call in tui._board.calls:
        if call.outcome and not call.waiting:
            tui._screen.say(f"  {call.request_id[:12]}: {visible(call.outcome)}", "dim")


def _ask_approver(tui: TUIBase, ask: Callable[[ApproverClient, NodeConfig], _T]) -> _T | None:
    """``ask`` the node's approver; None, said on the screen, when there is none or it refuses or fails.

    ``ask`` says its own refusals (and returns None for them); the approver's are said here in red.
    """
    if tui.node is None:
        tui._screen.say("The inbox is a node's: start with teaagent tui --config node.toml.", "yellow")
        return None
    try:
        client = approver_client(tui.node)
    except ConfigError as exc:
        tui._screen.say(str(exc), "red")
        return None
    with client:
        try:
            return ask(client, tui.node)
        except TeaAgentError as exc:  # RelayError included
            tui._screen.say(str(exc), "red")
            return None


def _inbox_items(client: ApproverClient, _node: NodeConfig) -> list[ApprovalItem]:
    items = client.list_requests("pending")
    # Settled at their origin while they could still be decided: shown as such, once.
    now = time.time()
    return items + [item for item in client.list_requests("settled") if item.expires_at >= now]


def cmd_inbox(tui: TUIBase, _argument: str) -> None:
    items = _ask_approver(tui, _inbox_items)
    if items is None:
        return
    assert tui.node is not None
    tui._inbox = items
    for item in items:
        tui._inbox_shown.setdefault((item.origin, item.request_id), item)
    if not items:
        tui._screen.say(f"No pending requests for {tui.node.agent_id}.")
        return
    tui._screen.table(["REQUEST", "ORIGIN", "TOOL", "LEFT", "RULE", "ARGUMENTS"], inbox_rows(items))
    for line in inbox_policy_lines(items, tui.node.agent_id):
        tui._screen.say(line)
    tui._screen.say(
        "Decide with /approve ID or /deny ID [REASON]; `teaagent approvals show ID` prints one whole.",
        "dim",
    )


def cmd_approve(tui: TUIBase, argument: str) -> None:
    _decide(tui, argument, deny=False)


def cmd_deny(tui: TUIBase, argument: str) -> None:
    _decide(tui, argument, deny=True)


def _decide(tui: TUIBase, argument: str, *, deny: bool) -> None:
    verb = "/deny" if deny else "/approve"
    typed, _, reason = argument.partition(" ")
    if not typed:
        tui._screen.say(f"Usage: {verb} ID [REASON] (/inbox lists the requests).", "yellow")
        return

    def decided(client: ApproverClient, node: NodeConfig) -> tuple[ApprovalItem, DecisionResult] | None:
        try:
            item = resolve_request(client, typed, seen=tui._inbox_shown.values(), among="shown by /inbox")
        except ValueError as exc:
            tui._screen.say(str(exc), "yellow")
            return None
        signer = tui.operator_signer
        return item, decide(
            client, item, agent_id=node.agent_id, deny=deny, reason=reason.strip(), signer=signer
        )

    done = _ask_approver(tui, decided)
    if done is None:
        return
    assert tui.node is not None
    item, result = done
    try:
        node_key: str | None = tui.node.own_public_key().fingerprint
    except ConfigError:
        node_key = None  # the decision is then shown with its key alone
    for line in decision_lines(result, tui.node.agent_id, node_key):
        tui._screen.say(line, "green" if not deny else "yellow")
    tui._inbox = [listed for listed in tui._inbox if listed is not item]
