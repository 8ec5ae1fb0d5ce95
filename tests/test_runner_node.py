"""``for_node`` and ``node_gate``: one node configuration makes one run's tools, policy, quorum and log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_cli_tools import write_node

from teaagent.config import NodeConfig, load_config
from teaagent.errors import ApprovalDeniedError, ConfigError
from teaagent.llm import ScriptedAdapter
from teaagent.policy import JITApprovalState, PermissionMode, PromptAnswer, PromptRequest
from teaagent.runner import RunResult
from teaagent.runner._node import GateOptions, for_node, node_audit_path, node_gate, node_registry


class RefusingGate:
    """A quorum gate that records each request it is asked to get approved, and obtains none."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(request)
        raise ApprovalDeniedError("the peers said no")


@pytest.fixture
def node(tmp_path: Path, ssh_key_factory: Callable[..., Any]) -> NodeConfig:
    # The local mode lets everything through: what stands between the model and the shell is the quorum.
    return load_config(write_node(tmp_path, ssh_key_factory, mode="danger-full-access", quorum=True))


def _script(*calls: tuple[str, dict[str, Any]]) -> ScriptedAdapter:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"tool_name": name, "arguments": arguments}]} for name, arguments in calls
    ]
    return ScriptedAdapter([*turns, {"content": "done"}])


def _run(node: NodeConfig, task: str, *calls: tuple[str, dict[str, Any]]) -> tuple[RunResult, RefusingGate]:
    """One run of the node's runner (``for_node``) with a scripted model, its quorum gate refusing all."""
    gate = RefusingGate()
    runner = for_node(node, run_id="r" * 32, quorum_gate=gate, adapter=_script(*calls))
    try:
        result = runner.run(task)
    finally:
        runner.audit.close()
    assert runner.audit.path == node_audit_path(node)
    assert runner.policy.agent_id == "alpha"
    assert runner.policy.permission_mode is PermissionMode.DANGER_FULL_ACCESS
    return result, gate


def test_a_high_risk_call_of_the_runner_goes_to_the_quorum_gate_and_its_refusal_ends_the_run(
    node: NodeConfig,
) -> None:
    result, gate = _run(node, "Touch a file.", ("shell.run", {"command": "touch made"}))

    assert result.status == "approval_denied"
    assert [request["tool_name"] for request in gate.requests] == ["shell.run"]
    assert not (node.workspace / "made").exists()
    records = [json.loads(line) for line in node_audit_path(node).read_text().splitlines()]
    assert "approval_denied" in [record["event_type"] for record in records]


def test_a_low_risk_call_runs_in_the_node_workspace_without_the_quorum(node: NodeConfig) -> None:
    result, gate = _run(node, "Read the notes.", ("fs.read", {"path": "notes.txt"}))

    assert result.status == "completed"
    assert gate.requests == []


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


def test_for_node_gives_each_gate_keyword_to_the_gate_and_the_others_to_the_runner(node: NodeConfig) -> None:
    # GateOptions is where node_gate's keywords are written, once; for_node takes them beside the
    # runner's and hands each to its own side (a gate keyword given to AgentRunner is a TypeError).
    audit_dir = node_audit_path(node).parent
    audit_dir.parent.mkdir(parents=True, exist_ok=True)
    audit_dir.write_text("a file where the folder should be")  # only audit_must_write=False opens it
    jit, registry, quorum_gate = JITApprovalState(), node_registry(node), RefusingGate()

    def prompter(request: PromptRequest, /) -> PromptAnswer:
        return PromptAnswer.DENY

    gate: GateOptions = {
        "run_id": "g" * 32,
        "prompter": prompter,
        "quorum_gate": quorum_gate,
        "mode": "read-only",
        "registry": registry,
        "policy_changes": {"jit_state": jit},
        "audit_must_write": False,
    }
    assert set(gate) == set(GateOptions.__annotations__)  # every one of them, whatever is added
    runner = for_node(node, **gate, adapter=_script(), label="the label", stream=True)
    runner.audit.close()

    assert (runner.run_id, runner.audit.run_id, runner.registry) == ("g" * 32, "g" * 32, registry)
    assert runner.policy.permission_mode is PermissionMode.READ_ONLY
    assert runner.policy.jit_state is jit
    assert runner.policy.prompter is not None  # the runner watches them: not the very objects
    assert runner.policy.quorum_gate is not None
    assert runner.audit.disk_error is not None
    assert (runner.label, runner.stream, runner.root) == ("the label", True, node.workspace)
