"""``for_node`` and ``node_gate``: one node configuration makes one run's tools, policy, quorum and log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from teaagent.config import NodeConfig, load_config
from teaagent.errors import ApprovalDeniedError, ConfigError
from teaagent.llm import ScriptedAdapter
from teaagent.policy import JITApprovalState, PermissionMode
from teaagent.runner._node import for_node, node_audit_path, node_gate


class RefusingGate:
    """A quorum gate that records each request it is asked to get approved, and obtains none."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        raise ApprovalDeniedError("the peers said no")


@pytest.fixture
def node(tmp_path: Path, ssh_key_factory: Callable[..., Any]) -> NodeConfig:
    key = ssh_key_factory("alpha")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("remember the milk\n")
    text = f"""agent_id = "alpha"
private_key = "{key.private_path}"
redis_url = "embedded"
relay_url = "http://127.0.0.1:9"
workspace = "workspace"

[agent]
permission_mode = "danger-full-access"
provider = "scripted"

[quorum]
enabled = true
required_approvals = 1
high_risk_patterns = ["shell.*"]
"""
    text += f'\n[peers.beta]\npublic_key = "{ssh_key_factory("beta").public_line}"\n'
    text += 'relay_url = "http://127.0.0.1:9100"\n'
    config = tmp_path / "alpha.toml"
    config.write_text(text)
    return load_config(config)


def _script(*calls: tuple[str, dict[str, Any]]) -> ScriptedAdapter:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"tool_name": name, "arguments": arguments}]} for name, arguments in calls
    ]
    return ScriptedAdapter([*turns, {"content": "done"}])


def test_a_high_risk_call_of_the_runner_goes_to_the_quorum_gate_and_its_refusal_ends_the_run(
    node: NodeConfig,
) -> None:
    gate = RefusingGate()
    runner = for_node(
        node, run_id="r" * 32, quorum_gate=gate, adapter=_script(("shell.run", {"command": "touch made"}))
    )
    try:
        result = runner.run("Touch a file.")
    finally:
        runner.audit.close()

    assert result.status == "approval_denied"
    assert [request["tool_name"] for request in gate.requests] == ["shell.run"]
    assert not (node.workspace / "made").exists()
    assert runner.audit.path == node_audit_path(node)
    denied = [json.loads(line) for line in runner.audit.path.read_text().splitlines()]
    assert "approval_denied" in [record["event_type"] for record in denied]


def test_a_low_risk_call_runs_in_the_node_workspace_without_the_quorum(node: NodeConfig) -> None:
    gate = RefusingGate()
    runner = for_node(
        node, run_id="r" * 32, quorum_gate=gate, adapter=_script(("fs.read", {"path": "notes.txt"}))
    )
    try:
        result = runner.run("Read the notes.")
    finally:
        runner.audit.close()

    assert result.status == "completed"
    assert gate.requests == []
    assert runner.policy.agent_id == "alpha"
    assert runner.policy.permission_mode is PermissionMode.DANGER_FULL_ACCESS


def test_without_a_quorum_gate_a_high_risk_call_is_denied(node: NodeConfig) -> None:
    gate = node_gate(node, run_id="cli-1")
    try:
        with pytest.raises(ApprovalDeniedError):
            gate.call("shell.run", {"command": "touch made"}, call_id="cli-1-1")
    finally:
        gate.audit.close()
    assert not (node.workspace / "made").exists()


def test_the_mode_and_the_policy_changes_are_the_callers(node: NodeConfig) -> None:
    jit = JITApprovalState()
    gate = node_gate(
        node,
        run_id="cli-1",
        mode="read-only",
        policy_changes={"jit_state": jit, "allow_all_destructive": True},
    )
    gate.audit.close()
    assert gate.policy.permission_mode is PermissionMode.READ_ONLY
    assert gate.policy.jit_state is jit
    assert gate.policy.allow_all_destructive is True


def test_an_audit_log_that_cannot_be_written_fails_closed_unless_told(node: NodeConfig) -> None:
    audit_dir = node_audit_path(node).parent
    audit_dir.parent.mkdir(parents=True, exist_ok=True)
    audit_dir.write_text("a file where the folder should be")

    with pytest.raises(ConfigError, match="cannot be written"):
        for_node(node, run_id="r" * 32, adapter=_script())
    runner = for_node(node, run_id="r" * 32, adapter=_script(), audit_must_write=False)
    runner.audit.close()
    assert runner.audit.disk_error is not None
