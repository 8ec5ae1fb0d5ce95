"""teaagent.runner ToolGate: every tool call goes through schema, policy, quorum, rate limit and audit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from teaagent.audit import AuditLogger, verify_log
from teaagent.errors import (
    ApprovalDeniedError,
    SchemaValidationError,
    ToolError,
    ToolNotFoundError,
    ToolRateLimitError,
)
from teaagent.policy import ApprovalPolicy, MultiSigQuorumConfig, PermissionMode, PromptAnswer
from teaagent.runner._gate import ToolGate
from teaagent.tools import ToolRateLimit, workspace_registry


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kinds(path: Path) -> list[str]:
    return [record["event_type"] for record in records(path)]


def make_gate(workspace: Path, tmp_path: Path, **policy: Any) -> tuple[ToolGate, Path]:
    audit_path = tmp_path / "audit" / "audit.jsonl"
    gate = ToolGate(
        registry=workspace_registry(workspace),
        policy=ApprovalPolicy.for_workspace(workspace, use_presets=False, **policy),
        audit=AuditLogger(audit_path),
        run_id="run-1",
    )
    return gate, audit_path


def limit_fs_list(gate: ToolGate) -> None:
    """Give ``fs.list`` a window of 2 calls a minute."""
    definition = gate.registry.lookup("fs.list")
    assert definition is not None
    gate.registry.register(
        "fs.list",
        definition.description,
        definition.input_schema,
        definition.output_schema,
        definition.annotations,
        definition.handler,
        rate_limit=ToolRateLimit(max_calls=2, window_seconds=60),
        allow_override=True,
    )


def quorum(required: int = 2) -> MultiSigQuorumConfig:
    peers = ["beta", "delta", "gamma"]
    keys = {
        peer: Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        .decode()
        for peer in peers
    }
    return MultiSigQuorumConfig(
        enabled=True,
        required_approvals=required,
        peer_agent_ids=peers,
        peer_public_keys=keys,
        peer_relay_urls={peer: f"http://127.0.0.1:{9000 + n}" for n, peer in enumerate(peers)},
        local_relay_base_url="http://127.0.0.1:8999",
        allow_dev_signatures=False,
        high_risk_patterns=["shell.*", "fs.delete"],
        timeout_seconds=120,
    )


def test_a_read_only_call_is_recorded_before_it_runs_and_when_it_returns(
    workspace: Path, tmp_path: Path
) -> None:
    (workspace / "notes.txt").write_text("hello")
    gate, audit_path = make_gate(workspace, tmp_path)

    result = gate.call("fs.read", {"path": "notes.txt"}, call_id="c1", reason="look")

    assert result["content"] == "hello"
    assert kinds(audit_path) == ["tool_call", "tool_result"]  # the seed's tool_call, read-only too
    call, done = records(audit_path)
    assert {call["run_id"], done["run_id"]} == {"run-1"}  # the gate's run, not the logger's default
    assert call["payload"] == {
        "tool_name": "fs.read",
        "call_id": "c1",
        "arguments": {"path": "notes.txt"},
        "reason": "look",
    }
    assert done["payload"]["result"]["content"] == "hello"
    assert verify_log(audit_path).ok


def test_a_call_that_can_change_something_is_recorded_before_it_runs(workspace: Path, tmp_path: Path) -> None:
    gate, audit_path = make_gate(workspace, tmp_path)

    gate.call("fs.write", {"path": "a.txt", "content": "x"}, call_id="c1", reason="save")

    assert kinds(audit_path) == ["tool_call", "tool_result"]
    call, done = records(audit_path)
    assert call["payload"] == {
        "tool_name": "fs.write",
        "call_id": "c1",
        "arguments": {"path": "a.txt", "content": "x"},
        "reason": "save",
    }
    assert done["payload"]["result"] == {"path": "a.txt", "bytes_written": 1}


def test_a_refused_call_never_runs_and_is_recorded_as_denied(workspace: Path, tmp_path: Path) -> None:
    gate, audit_path = make_gate(workspace, tmp_path, mode=PermissionMode.READ_ONLY)

    with pytest.raises(ApprovalDeniedError, match=r"fs\.write"):
        gate.call("fs.write", {"path": "a.txt", "content": "x"}, call_id="c1")

    assert not (workspace / "a.txt").exists()
    assert kinds(audit_path) == ["approval_denied"]


def test_malformed_arguments_are_refused_before_anyone_is_asked(workspace: Path, tmp_path: Path) -> None:
    asked: list[Any] = []

    def prompter(request: Any) -> PromptAnswer:
        asked.append(request)
        return PromptAnswer.ONCE

    gate, audit_path = make_gate(workspace, tmp_path, mode=PermissionMode.PROMPT, prompter=prompter)

    with pytest.raises(SchemaValidationError, match=r"^fs\.write: arguments are invalid"):
        gate.call("fs.write", {"path": "a.txt"}, call_id="c1")

    assert asked == []
    assert kinds(audit_path) == ["tool_error"]


def test_an_approval_from_a_prompt_is_recorded_before_the_call(workspace: Path, tmp_path: Path) -> None:
    gate, audit_path = make_gate(
        workspace, tmp_path, mode=PermissionMode.PROMPT, prompter=lambda request: PromptAnswer.ONCE
    )

    gate.call("fs.write", {"path": "a.txt", "content": "x"}, call_id="c1")

    assert (workspace / "a.txt").read_text() == "x"
    assert kinds(audit_path) == ["approval_granted", "tool_call", "tool_result"]
    assert records(audit_path)[0]["payload"]["source"] == "prompt-once"


def test_unknown_tools_and_handler_failures_are_recorded_as_tool_errors(
    workspace: Path, tmp_path: Path
) -> None:
    gate, audit_path = make_gate(workspace, tmp_path)

    with pytest.raises(ToolNotFoundError):
        gate.call("fs.nothing", {}, call_id="c1")
    with pytest.raises(ToolError, match="no such file or directory"):
        gate.call("fs.read", {"path": "missing.txt"}, call_id="c2")

    assert kinds(audit_path) == ["tool_error", "tool_call", "tool_error"]
    unknown, called, failed = (record["payload"] for record in records(audit_path))
    assert (unknown["stage"], unknown["arguments"]) == ("arguments", {})
    assert called["arguments"] == {"path": "missing.txt"}
    assert (failed["error_type"], failed["stage"]) == ("ToolError", "call")


def test_a_full_rate_limit_window_refuses_the_call(workspace: Path, tmp_path: Path) -> None:
    gate, audit_path = make_gate(workspace, tmp_path)
    limit_fs_list(gate)

    gate.call("fs.list", {}, call_id="c1")
    gate.call("fs.list", {}, call_id="c2")
    with pytest.raises(ToolRateLimitError, match="rate limit of 2 calls"):
        gate.call("fs.list", {}, call_id="c3")

    assert kinds(audit_path) == ["tool_call", "tool_result"] * 2 + ["tool_call", "tool_error"]


@pytest.mark.parametrize("mode", list(PermissionMode))
def test_a_high_risk_call_without_a_reachable_quorum_fails_closed_in_every_mode(
    workspace: Path, tmp_path: Path, mode: PermissionMode
) -> None:
    # No quorum gate (no relay reachable): not even danger-full-access or a prompt lets it run.
    gate, audit_path = make_gate(
        workspace,
        tmp_path,
        mode=mode,
        multi_sig_config=quorum(),
        prompter=lambda request: PromptAnswer.SESSION,
    )

    with pytest.raises(ApprovalDeniedError):
        gate.call("shell.run", {"command": "touch ran"}, call_id="c1")

    assert not (workspace / "ran").exists()
    assert kinds(audit_path) == ["approval_denied"]


def test_a_quorum_gate_that_fails_is_a_denial(workspace: Path, tmp_path: Path) -> None:
    class UnreachableRelay:
        def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
            raise ConnectionError("relay http://127.0.0.1:8999 is unreachable")

    gate, _ = make_gate(
        workspace,
        tmp_path,
        mode=PermissionMode.DANGER_FULL_ACCESS,
        multi_sig_config=quorum(),
        quorum_gate=UnreachableRelay(),
    )

    with pytest.raises(ApprovalDeniedError, match="unreachable"):
        gate.call("shell.run", {"command": "touch ran"}, call_id="c1")

    assert not (workspace / "ran").exists()


def test_calls_that_are_not_high_risk_do_not_need_the_quorum(workspace: Path, tmp_path: Path) -> None:
    (workspace / "a.txt").write_text("x")
    gate, _ = make_gate(workspace, tmp_path, multi_sig_config=quorum())

    assert gate.call("fs.read", {"path": "a.txt"}, call_id="c1")["content"] == "x"


# -- admit / finished / failed: the gate's steps for a caller that runs the tool itself --------------


def test_an_admitted_call_is_recorded_as_gate_call_records_it(workspace: Path, tmp_path: Path) -> None:
    (workspace / "notes.txt").write_text("hello")
    gate, audit_path = make_gate(workspace, tmp_path)

    read = gate.admit("fs.read", {"path": "notes.txt"}, call_id="c1", reason="look", at_once=True)
    assert read is not None
    gate.finished(read, {"content": "hello"})
    write = gate.admit(
        "fs.write", {"path": "a.txt", "content": "x"}, call_id="c2", reason="save", at_once=True
    )
    assert write is not None
    gate.failed(write, OSError("disk full"))

    assert kinds(audit_path) == ["tool_call", "tool_result", "tool_call", "tool_error"]
    read_call, done, call, failed = (record["payload"] for record in records(audit_path))
    assert read_call["arguments"] == {"path": "notes.txt"}
    assert done == {"tool_name": "fs.read", "call_id": "c1", "result": {"content": "hello"}}
    assert call["arguments"] == {"path": "a.txt", "content": "x"}
    assert failed == {
        "tool_name": "fs.write",
        "call_id": "c2",
        "error": "disk full",
        "error_type": "OSError",
        "stage": "call",
    }
    assert verify_log(audit_path).ok


def test_at_once_leaves_what_must_wait_unrecorded_and_refuses_what_the_mode_refuses(
    workspace: Path, tmp_path: Path
) -> None:
    asked: list[Any] = []

    def prompter(request: Any) -> PromptAnswer:
        asked.append(request)
        return PromptAnswer.ONCE

    gate, audit_path = make_gate(
        workspace, tmp_path, mode=PermissionMode.PROMPT, prompter=prompter, multi_sig_config=quorum()
    )
    limit_fs_list(gate)

    # A prompt, the quorum, a rate-limit window: each is left to gate.call, with nothing recorded.
    assert gate.admit("fs.write", {"path": "a.txt", "content": "x"}, call_id="c1", at_once=True) is None
    assert gate.admit("shell.run", {"command": "ls"}, call_id="c2", at_once=True) is None
    assert gate.admit("fs.list", {}, call_id="c3", at_once=True) is None
    assert asked == []
    assert not audit_path.exists() or kinds(audit_path) == []
    # What needs nobody is decided at once, refusals included, and recorded as gate.call would.
    with pytest.raises(SchemaValidationError):
        gate.admit("fs.write", {"path": "a.txt"}, call_id="c4", at_once=True)
    read_only_gate, read_only_audit = make_gate(workspace, tmp_path / "ro", mode=PermissionMode.READ_ONLY)
    with pytest.raises(ApprovalDeniedError, match=r"^fs\.write is not read-only"):
        read_only_gate.admit("fs.write", {"path": "a.txt", "content": "x"}, call_id="c5", at_once=True)
    assert kinds(audit_path) == ["tool_error"]
    assert kinds(read_only_audit) == ["approval_denied"]
