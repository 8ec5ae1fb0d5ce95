"""A run whose shell.run needs 2 of 3 peers, watched in the agent service's stream: real relays, a real
``teaagent agent serve``, real signatures.

The first tests sign the peers' decisions in the test and hand them to each peer's relay as its
approver would (``relay_support.approve_next``), each only once the stream has shown the one
before, so the frames prove that each arrives as it is counted, not at the outcome. The last two
leave beta's and gamma's decisions to their real approver processes (``teaagent approver serve``,
deciding by their ``[[approver.rules]]``), with delta's relay served and no approver behind it:
an approval by rule ends in a certificate that verifies and one audit record per approver naming
its rule; a denial by rule ends the run ``approval_denied`` with the peers' reasons in the stream.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import AgentNode, AgentProcess
from httpx_sse import connect_sse
from relay_support import (
    APPROVE_ECHO,
    ApproverProcess,
    Node,
    approve_next,
    served,
    signer,
    wait_until,
    write_cluster,
)

from teaagent.audit import verify_log_or_raise
from teaagent.cli._main import run as cli
from teaagent.signing import fingerprint
from teaagent_approver import AUDIT_FILE_NAME, DECISION_EVENT

pytestmark = pytest.mark.slow

WAIT = 30.0
APPROVER_WAIT = 90.0  # seconds without a byte from the stream: approvers' polls on a loaded host


def cluster(
    tmp_path: Path,
    redis_url: str,
    redis_prefix: str,
    turns: list[dict[str, object]],
    rules: dict[str, str] | None = None,
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
        rules=rules,
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
    quorum = [
        (kind, data)
        for kind, data in seen
        if (kind.startswith("quorum") or kind.startswith("approval")) and kind != "quorum_progress"
    ]
    # The wait as every surface words it: sent (with the command a peer runs), each change, decided.
    progress = [data for kind, data in seen if kind == "quorum_progress"]
    assert progress[0]["why"] == "sent"
    assert progress[-1]["why"] == "decided"
    assert progress[-1]["state"] == "approved"
    short = progress[0]["request_id"][:8]
    assert progress[0]["approve_command"] == f"teaagent approvals approve {short} --config <their node.toml>"
    assert progress[0]["text"].startswith(f"request {short} for shell.run: 0 approvals of the 2 needed; ")
    assert progress[0]["text"].endswith(progress[0]["approve_command"])
    assert 0 < progress[0]["seconds_left"] <= 120
    assert [p["signers"] for p in progress if p["signers"]] == [
        ["beta"],
        ["beta", "gamma"],
    ]
    assert any("denied by delta: not on Fridays" in p["text"] for p in progress)
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


def test_cancel_ends_a_quorum_wait_at_once_cancelled_and_withdraws_the_request(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    nodes, agent = cluster(tmp_path, redis_url, redis_prefix, [SHELL, {"content": "never"}])
    alpha, beta = nodes["alpha"], nodes["beta"]
    seen: list[tuple[str, dict[str, Any]]] = []
    with (
        served(alpha, beta, nodes["gamma"], nodes["delta"]),
        AgentProcess(agent, tmp_path),
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=WAIT) as client,
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=WAIT) as other,
    ):
        with connect_sse(
            client, "POST", "/runs", json={"text": "clean", "approvals": {"mode": "auto"}}
        ) as source:
            for event in source.iter_sse():
                seen.append((event.event, json.loads(event.data)))
                if event.event == "quorum_requested":
                    # beta holds the request: the withdrawal must take it back from there too.
                    assert wait_until(lambda: relay_get(beta, "/v1/inbox").json(), WAIT)
                    assert other.post("/runs/cancel").json() == {"cancelled": True}
        request_id = next(data for kind, data in seen if kind == "quorum_requested")["request_id"]
        at_origin = relay_get(alpha, f"/v1/requests/{request_id}").json()
        dropped = wait_until(lambda: not relay_get(beta, "/v1/inbox").json(), WAIT)
        audit_path = tmp_path / "data-alpha" / "audit" / "alpha.jsonl"

    result = seen[-1][1]
    assert seen[-1][0] == "result"
    assert (result["stop"], result["stop_message"]) == ("cancelled", "The run was cancelled.")
    assert "shell.run was not run: the wait for its quorum was stopped." in result["tools"][0]["output"]
    assert f"Withdrawn: request {request_id} of shell.run" in result["tools"][0]["output"]
    finished = next(data for kind, data in seen if kind == "run_finished")
    assert (finished["status"], finished["cancelled"]) == ("failed", True)
    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    run_end = next(r["payload"] for r in records if r["event_type"] == "run_end")
    assert (run_end["status"], run_end["cancelled"]) == ("failed", True)
    assert at_origin["state"] == "withdrawn"
    assert dropped


def relay_get(node: Node, path: str) -> httpx.Response:
    response = httpx.get(f"{node.url}{path}", headers=node.headers, timeout=WAIT)
    response.raise_for_status()
    return response


# -- the peers' real approvers decide by rule --------------------------------------------------

DENY_REASONS = {"beta": "beta cleans on Mondays only", "gamma": "gamma wants a ticket first"}


def deny_echo(name: str) -> str:
    return f"""
[[approver.rules]]
tool = "shell.run"
arguments = {{ command = "echo *" }}
decision = "deny"
reason = "{DENY_REASONS[name]}"
"""


@contextlib.contextmanager
def approvers(folder: Path, *nodes: Node) -> Iterator[None]:
    """``teaagent approver serve`` for each node, started together, each answering before the run."""
    with contextlib.ExitStack() as stack:
        processes = [ApproverProcess(node, folder).start(wait=False) for node in nodes]
        for process in processes:
            stack.callback(process.stop)
        for process in processes:
            process.wait_ready()
        yield


def watch(tmp_path: Path, nodes: dict[str, Node], agent: AgentNode) -> list[tuple[str, dict[str, Any]]]:
    """Every node's relay served, beta's and gamma's approvers running, delta's not: one run's frames."""
    seen: list[tuple[str, dict[str, Any]]] = []
    with (
        served(nodes["alpha"], nodes["beta"], nodes["gamma"], nodes["delta"]),
        approvers(tmp_path, nodes["beta"], nodes["gamma"]),
        AgentProcess(agent, tmp_path),
        httpx.Client(base_url=agent.url, headers=agent.headers, timeout=APPROVER_WAIT) as client,
        connect_sse(client, "POST", "/runs", json={"text": "clean", "approvals": {"mode": "auto"}}) as source,
    ):
        for event in source.iter_sse():
            seen.append((event.event, json.loads(event.data)))
    return seen


def decisions_of(node: Node) -> list[dict[str, Any]]:
    """The decision records of the node's approver audit log, whose chain is checked first."""
    path = node.data_dir / AUDIT_FILE_NAME
    verify_log_or_raise(path)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [event["payload"] for event in events if event["event_type"] == DECISION_EVENT]


def test_beta_and_gammas_approvers_approve_by_rule_and_the_certificate_verifies(
    tmp_path: Path, redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, agent = cluster(
        tmp_path,
        redis_url,
        redis_prefix,
        [SHELL, {"content": "Clean.", "expect": ["cleaned"]}],
        rules={"beta": APPROVE_ECHO, "gamma": APPROVE_ECHO},
    )

    seen = watch(tmp_path, nodes, agent)

    kinds = [kind for kind, _ in seen]
    quorum = [
        (kind, data)
        for kind, data in seen
        if kind.startswith(("quorum", "approval")) and kind != "quorum_progress"
    ]
    assert [kind for kind, _ in quorum] == [
        "approval_waiting",  # the local check: auto
        "approval_answered",
        "approval_granted",
        "approval_waiting",  # the quorum
        "quorum_requested",
        "quorum_decision",
        "quorum_decision",
        "quorum_outcome",
        "approval_granted",
    ], kinds
    requested = quorum[4][1]
    request_id = requested["request_id"]
    assert (requested["required"], requested["peers"], requested["tool_name"]) == (
        2,
        ["beta", "delta", "gamma"],
        "shell.run",
    )
    # Each approval is its own frame, as the relay counted it; delta, without an approver, never answers.
    decisions = [data for _, data in quorum[5:7]]
    assert sorted(d["peer"] for d in decisions) == ["beta", "gamma"]
    for decision in decisions:
        assert (decision["request_id"], decision["decision"], decision["reason"], decision["denied_by"]) == (
            request_id,
            "approved",
            "",
            [],
        )
        assert decision["peer"] in decision["signers"]
    assert decisions[-1]["signers"] == ["beta", "gamma"]
    outcome = quorum[7][1]
    assert (outcome["request_id"], outcome["state"], outcome["signers"], outcome["denied_by"]) == (
        request_id,
        "approved",
        ["beta", "gamma"],
        [],
    )
    assert quorum[8][1]["via"] == "quorum"
    # The tool ran after the quorum, and the run completed.
    granted_at = kinds.index("approval_granted", kinds.index("quorum_outcome"))
    assert "tool_result" in kinds[granted_at:]
    result = seen[-1][1]
    assert kinds[-1] == "result"
    assert result["stop"] == "completed"
    [tool] = result["tools"]
    assert (tool["name"], tool["ok"]) == ("shell.run", True)
    assert "cleaned" in tool["output"]

    # alpha's audit log holds the certificate, and it verifies offline with alpha's configuration.
    audit_path = nodes["alpha"].data_dir / "audit" / "alpha.jsonl"
    verify_log_or_raise(audit_path)
    records = [json.loads(line) for line in audit_path.read_text().splitlines()]
    [certificate] = [
        r["payload"]["certificate"]
        for r in records
        if r.get("event_type") == "approval_granted" and "certificate" in r.get("payload", {})
    ]
    assert certificate["request"]["request_id"] == request_id
    assert sorted(a["statement"]["signer"] for a in certificate["approvals"]) == ["beta", "gamma"]
    path = tmp_path / "certificate.json"
    path.write_text(json.dumps(certificate))
    capsys.readouterr()
    assert cli(["quorum", "verify", str(path), "--config", str(nodes["alpha"].config_path)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[:2] == [
        f"certificate for request {request_id}: shell.run from alpha",
        "approved by beta, gamma (2 approvals of the 2 needed)",
    ]
    assert shown[2].startswith("request signature: verified with alpha's key ")

    # Each approver recorded its own decision, and the rule that made it, in its own audit log.
    for name in ("beta", "gamma"):
        [record] = decisions_of(nodes[name])
        assert (record["request_id"], record["origin"], record["tool_name"]) == (
            request_id,
            "alpha",
            "shell.run",
        )
        assert (record["decision"], record["by"], record["recovered"]) == ("approval", "rule 1", False)
        assert record["key_fingerprint"] == fingerprint(signer(name))


def test_beta_and_gammas_approvers_deny_by_rule_and_the_run_ends_denied_with_their_reasons(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    nodes, agent = cluster(
        tmp_path,
        redis_url,
        redis_prefix,
        [SHELL, {"content": "never"}],
        rules={"beta": deny_echo("beta"), "gamma": deny_echo("gamma")},
    )

    seen = watch(tmp_path, nodes, agent)

    kinds = [kind for kind, _ in seen]
    requested = next(data for kind, data in seen if kind == "quorum_requested")
    request_id = requested["request_id"]
    decisions = [data for kind, data in seen if kind == "quorum_decision"]
    assert {d["peer"]: (d["decision"], d["reason"]) for d in decisions} == {
        "beta": ("denied", DENY_REASONS["beta"]),
        "gamma": ("denied", DENY_REASONS["gamma"]),
    }
    assert len(decisions) == 2
    assert all(d["request_id"] == request_id and d["signers"] == [] for d in decisions)
    assert all(d["peer"] in d["denied_by"] for d in decisions)
    outcome = next(data for kind, data in seen if kind == "quorum_outcome")
    assert (outcome["state"], sorted(outcome["denied_by"]), outcome["signers"]) == (
        "denied",
        ["beta", "gamma"],
        [],
    )
    assert "approval_granted" not in kinds[kinds.index("quorum_requested") :]
    denied = next(data for kind, data in seen if kind == "approval_denied")
    assert f"beta: {DENY_REASONS['beta']}" in str(denied["reason"])
    assert f"gamma: {DENY_REASONS['gamma']}" in str(denied["reason"])
    result = seen[-1][1]
    assert kinds[-1] == "result"
    assert result["stop"] == "approval_denied"
    [tool] = result["tools"]
    assert (tool["name"], tool["ok"]) == ("shell.run", False)
    assert "cleaned" not in tool["output"]

    for name in ("beta", "gamma"):
        [record] = decisions_of(nodes[name])
        assert (record["request_id"], record["origin"]) == (request_id, "alpha")
        assert (record["decision"], record["reason"], record["by"]) == (
            "denial",
            DENY_REASONS[name],
            "rule 1",
        )
        assert record["key_fingerprint"] == fingerprint(signer(name))
