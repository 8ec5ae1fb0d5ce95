"""A run whose shell.run needs 2 of 3 peers, watched in the agent service's stream: real relays, a real
``teaagent agent serve``, real signatures.

The peers' decisions are signed and handed to each peer's relay as its approver would
(``relay_support.approve_next``): the approver service was not in the tree when this was written.
Each decision is taken only once the stream has shown the one before, so the frames prove that
each arrives as it is counted, not at the outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from agent_support import AgentNode, AgentProcess
from httpx_sse import connect_sse
from relay_support import Node, approve_next, served, write_cluster

from teaagent.audit import verify_log_or_raise

pytestmark = pytest.mark.slow

WAIT = 30.0


def cluster(
    tmp_path: Path, redis_url: str, redis_prefix: str, turns: list[dict[str, object]]
) -> tuple[dict[str, Node], AgentNode]:
    nodes = write_cluster(
        tmp_path,
        ["alpha", "beta", "gamma", "delta"],
        redis_url=redis_url,
        prefix=redis_prefix,
        required=2,
        peers_of={
            "alpha": ["beta", "gamma", "delta"],
            "beta": ["alpha"],
            "gamma": ["alpha"],
            "delta": ["alpha"],
        },
    )
    alpha = nodes["alpha"]
    from relay_support import free_port

    port = free_port()
    with alpha.config_path.open("a") as handle:
        handle.write(f'\n[agent]\npermission_mode = "allow"\nport = {port}\n')
    (tmp_path / "workspace-alpha").mkdir()
    agent = AgentNode(
        folder=tmp_path,
        config_path=alpha.config_path,
        script_path=tmp_path / "script.json",
        port=port,
        token=alpha.token,
    )
    agent.script(turns)
    return nodes, agent


SHELL = {
    "content": "Cleaning.",
    "tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "echo cleaned"}}],
}


def test_a_2_of_3_quorum_is_watched_decision_by_decision(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    nodes, agent = cluster(
        tmp_path, redis_url, redis_prefix, [SHELL, {"content": "Clean.", "expect": ["cleaned"]}]
    )
    beta, gamma, delta = nodes["beta"], nodes["gamma"], nodes["delta"]
    seen: list[tuple[str, dict[str, object]]] = []
    states = []
    with (
        served(nodes["alpha"], beta, gamma, delta),
        AgentProcess(agent, tmp_path),
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=WAIT) as client,
    ):
        # "auto" approves locally; the quorum is needed all the same (PROTOCOL.md).
        with connect_sse(
            client, "POST", "/runs", json={"text": "clean", "approvals": {"mode": "auto"}}
        ) as source:
            for event in source.iter_sse():
                data = json.loads(event.data)
                seen.append((event.event, data))
                if event.event == "quorum_requested":
                    approve_next(delta, deny_reason="not on Fridays")
                elif event.event == "quorum_decision" and data["peer"] == "delta":
                    states.append(client.get("/runs/state").json())
                    approve_next(beta)
                elif event.event == "quorum_decision" and data["peer"] == "beta":
                    approve_next(gamma)
        audit_path = tmp_path / "data-alpha" / "audit" / "alpha.jsonl"

    kinds = [kind for kind, _ in seen]
    quorum = [(kind, data) for kind, data in seen if kind.startswith("quorum") or kind.startswith("approval")]
    assert [kind for kind, _ in quorum] == [
        "approval_waiting",  # the local check: auto
        "approval_answered",
        "approval_granted",
        "approval_waiting",  # the quorum
        "quorum_requested",
        "quorum_decision",
        "quorum_decision",
        "quorum_decision",
        "quorum_outcome",
        "approval_granted",
    ]
    waiting = quorum[3][1]
    assert (waiting["via"], waiting["required_approvals"], waiting["peers"]) == (
        "quorum",
        2,
        ["beta", "delta", "gamma"],
    )
    requested = quorum[4][1]
    assert (requested["required"], requested["peers"], requested["tool_name"]) == (
        2,
        ["beta", "delta", "gamma"],
        "shell.run",
    )
    decisions = [
        (d["peer"], d["decision"], d["reason"], d["signers"], d["denied_by"]) for _, d in quorum[5:8]
    ]
    assert decisions == [
        ("delta", "denied", "not on Fridays", [], ["delta"]),
        ("beta", "approved", "", ["beta"], ["delta"]),
        ("gamma", "approved", "", ["beta", "gamma"], ["delta"]),
    ]
    assert quorum[8][1]["state"] == "approved"
    assert quorum[9][1]["via"] == "quorum"
    # A client that reconnected then would have seen the run wait on the peers.
    [state] = states
    assert state["running"] is True
    assert state["pending"] == {
        **state["pending"],
        "kind": "quorum",
        "tool_name": "shell.run",
        "required": 2,
        "signers": [],
        "denied_by": ["delta"],
    }
    result = seen[-1][1]
    assert kinds[-1] == "result"
    assert result["stop"] == "completed"
    assert result["tools"][0]["ok"] is True
    # The certificate the policy verified is on record, and the audit chain holds.
    verify_log_or_raise(audit_path)
    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    granted = [
        r
        for r in records
        if r.get("event_type") == "approval_granted" and "certificate" in r.get("payload", {})
    ]
    assert len(granted) == 1


def test_a_quorum_that_two_peers_deny_ends_the_run_denied(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    nodes, agent = cluster(tmp_path, redis_url, redis_prefix, [SHELL, {"content": "never"}])
    beta, gamma, delta = nodes["beta"], nodes["gamma"], nodes["delta"]
    seen: list[tuple[str, dict[str, object]]] = []
    with (
        served(nodes["alpha"], beta, gamma, delta),
        AgentProcess(agent, tmp_path),
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=WAIT) as client,
        connect_sse(client, "POST", "/runs", json={"text": "clean", "approvals": {"mode": "auto"}}) as source,
    ):
        for event in source.iter_sse():
            data = json.loads(event.data)
            seen.append((event.event, data))
            if event.event == "quorum_requested":
                approve_next(delta, deny_reason="no")
                approve_next(gamma, deny_reason="also no")
    outcome = next(data for kind, data in seen if kind == "quorum_outcome")
    assert outcome["state"] == "denied"
    assert sorted(outcome["denied_by"]) == ["delta", "gamma"]  # type: ignore[arg-type]
    denied = next(data for kind, data in seen if kind == "approval_denied")
    assert "denied by" in str(denied["reason"])
    result = seen[-1][1]
    assert result["stop"] == "approval_denied"
    assert result["tools"][0]["ok"] is False


def test_cancel_ends_a_quorum_wait_at_once(tmp_path: Path, redis_url: str, redis_prefix: str) -> None:
    nodes, agent = cluster(tmp_path, redis_url, redis_prefix, [SHELL, {"content": "never"}])
    seen: list[str] = []
    with (
        served(nodes["alpha"], deliver=False),
        AgentProcess(agent, tmp_path),
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=WAIT) as client,
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=WAIT) as other,
        connect_sse(client, "POST", "/runs", json={"text": "clean", "approvals": {"mode": "auto"}}) as source,
    ):
        for event in source.iter_sse():
            seen.append(event.event)
            if event.event == "quorum_requested":
                assert other.post("/runs/cancel").json() == {"cancelled": True}
            if event.event == "result":
                result = json.loads(event.data)
    assert result["stop"] == "cancelled"
    assert "shell.run was not run: the wait for its quorum was stopped." in result["tools"][0]["output"]
