"""The agent HTTP API as the seed describes it and as the relay and the approver serve: a real
``teaagent agent serve`` over HTTP, with the offline scripted model.

Its OpenAPI document and pages without the token (as on the relay and the approver), a session's
history with its runs' tool calls, a session's usage with its runs' seconds, ``remember`` that lets
the same program run unasked and nothing else, and a ``tool_call`` audit record for every call.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import AgentNode, AgentProcess, frames, write_node
from httpx_sse import connect_sse

pytestmark = pytest.mark.slow

WAIT = 30.0


@pytest.fixture
def node(tmp_path: Path) -> AgentNode:
    return write_node(tmp_path / "alpha", permission_mode="prompt")


@pytest.fixture
def client(node: AgentNode, tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        AgentProcess(node, tmp_path),
        httpx.Client(base_url=node.url, headers=node.headers, timeout=WAIT) as c,
    ):
        yield c


def run(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/runs", json=body)
    assert response.status_code == 200, response.text
    found = frames(response.text)
    assert found[-1][0] == "result", found[-3:]
    return {"frames": found, "kinds": [kind for kind, _ in found], **found[-1][1]}


def test_the_openapi_document_and_its_pages_need_no_token_like_the_relays(
    node: AgentNode, client: httpx.Client
) -> None:
    bare = httpx.Client(base_url=node.url, timeout=WAIT)
    with bare:
        document = bare.get("/openapi.json")
        docs = bare.get("/docs")
        redoc = bare.get("/redoc")
        refused = bare.get("/sessions")
    assert document.status_code == 200
    assert "/runs" in document.json()["paths"]
    assert "/openapi.json" in document.json()["info"]["description"]
    assert docs.status_code == 200
    assert "swagger-ui" in docs.text
    assert "/openapi.json" in docs.text
    assert redoc.status_code == 200
    assert refused.status_code == 401
    assert refused.json()["error"] == "unauthorized"


def shell(command: str) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"tool_name": "shell.run", "arguments": {"command": command}}]}


def test_remember_lets_the_same_program_run_unasked_and_nothing_else(
    node: AgentNode, client: httpx.Client
) -> None:
    (node.workspace / "sub").mkdir()
    commands = ["echo hi", "echo bye", "touch x", "echo c; touch y", "echo c; touch y", "rm -rf sub"]
    node.script([*(shell(command) for command in commands), {"content": "never"}])
    # What the client answers to each command it is asked about: approve, remember.
    answers = {
        "echo hi": [(True, True)],
        "touch x": [(True, False)],
        "echo c; touch y": [(True, True), (True, False)],  # remember asked for, not given
        "rm -rf sub": [(False, False)],
    }
    seen: list[tuple[str, dict[str, Any]]] = []
    with (
        httpx.Client(base_url=node.url, headers=node.headers, timeout=WAIT) as other,
        connect_sse(client, "POST", "/runs", json={"text": "go", "approvals": {"mode": "ask"}}) as source,
    ):
        for event in source.iter_sse():
            data = json.loads(event.data)
            seen.append((event.event, data))
            if event.event == "approval_requested":
                approve, remember = answers[data["command"]].pop(0)
                answered = other.post(
                    "/runs/approvals",
                    json={"call_id": data["call_id"], "approve": approve, "remember": remember},
                )
                assert answered.json() == {"resolved": True}

    asked = [(d["command"], d["remember_supported"]) for kind, d in seen if kind == "approval_requested"]
    assert asked == [
        ("echo hi", True),
        ("touch x", True),  # another program: asked, though echo was remembered
        ("echo c; touch y", False),  # compound: never remembered
        ("echo c; touch y", False),
        ("rm -rf sub", True),
    ]
    remembered = [d["remember"] for kind, d in seen if kind == "approval_answered"]
    assert remembered == [True, False, False, False, False]
    ran = [d["arguments"]["command"] for kind, d in seen if kind == "tool_call"]
    assert ran == commands
    result = seen[-1][1]
    assert result["stop"] == "approval_denied"
    assert [tool["ok"] for tool in result["tools"]] == [True, True, True, True, True, False]
    assert (node.workspace / "x").exists()
    assert (node.workspace / "sub").is_dir()  # rm -rf was asked about, and refused


def audit_records(node: AgentNode) -> list[dict[str, Any]]:
    path = node.folder / "data-alpha" / "audit" / "alpha.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_audit_log_has_a_tool_call_record_for_every_invoked_tool_read_only_ones_included(
    node: AgentNode, client: httpx.Client
) -> None:
    (node.workspace / "notes.md").write_text("hello\n")
    node.script(
        [
            {
                "content": "Looking.",
                "tool_calls": [
                    {"tool_name": "fs.list", "arguments": {"path": "."}},
                    {"tool_name": "fs.read", "arguments": {"path": "notes.md"}},
                    {"tool_name": "ask_user", "arguments": {"question": "Which one?"}},
                    {"tool_name": "shell.run", "arguments": {"command": "echo hi"}},
                ],
            },
            {"content": "Done."},
        ]
    )
    done = run(client, {"text": "look", "approvals": {"mode": "auto"}})
    assert done["stop"] == "completed", done["stop_message"]

    records = [r for r in audit_records(node) if r["run_id"] == done["run_id"]]
    calls = [r["payload"] for r in records if r["event_type"] == "tool_call"]
    assert [(c["tool_name"], c["arguments"]) for c in calls] == [
        ("fs.list", {"path": "."}),
        ("fs.read", {"path": "notes.md"}),
        ("ask_user", {"question": "Which one?"}),
        ("shell.run", {"command": "echo hi"}),
    ]
    assert {c["reason"] for c in calls} == {"Looking."}
    # Each call's record comes before its end's.
    order = [(r["event_type"], r["payload"].get("call_id")) for r in records]
    for call in calls:
        assert order.index(("tool_call", call["call_id"])) < order.index(("tool_result", call["call_id"]))


def test_a_sessions_usage_counts_its_runs_seconds(node: AgentNode, client: httpx.Client) -> None:
    node.script([{"content": "Thought about it.", "delay_seconds": 0.4}])
    first = run(client, {"text": "think"})
    second = run(client, {"text": "think again"})
    other = client.post("/sessions", json={"title": "another"}).json()
    third = run(client, {"text": "elsewhere"})

    assert first["session_id"] == second["session_id"] != third["session_id"] == other["id"]
    runs = first["usage"]["seconds"] + second["usage"]["seconds"]
    assert first["usage"]["seconds"] >= 0.4
    assert second["usage"]["seconds"] >= 0.4
    assert 0.4 <= client.get("/sessions/current").json()["usage"]["seconds"] <= third["usage"]["seconds"]
    usage = client.post(f"/sessions/{first['session_id']}/switch").json()["usage"]
    # Each run's time as its run log has it, from its start to its end: inside the run's own.
    assert runs - 0.5 <= usage["seconds"] <= runs
    assert usage["requests"] == 2


def test_a_sessions_history_carries_its_runs_tool_calls(node: AgentNode, client: httpx.Client) -> None:
    (node.workspace / "notes.md").write_text("hello\n")
    node.script(
        [
            {
                "content": "Reading.",
                "tool_calls": [
                    {"tool_name": "fs.read", "arguments": {"path": "notes.md"}, "call_id": "r1"},
                    {"tool_name": "fs.read", "arguments": {"path": "missing.md"}, "call_id": "r2"},
                ],
            },
            {"content": "They say hello.", "expect": ["hello"]},
        ]
    )
    done = run(client, {"text": "what do the notes say?"})
    assert done["stop"] == "completed", done["stop_message"]
    # A second run continues the conversation: its text, not the first run's calls, goes to the model.
    node.script([{"content": "Still hello."}])
    again = run(client, {"text": "and now?"})
    assert again["stop"] == "completed", again["stop_message"]

    messages = client.get("/sessions/current/history").json()["messages"]
    assert [(m["role"], m["text"]) for m in messages] == [
        ("user", "what do the notes say?"),
        ("assistant", "Reading."),
        ("tool", messages[2]["text"]),
        ("tool", messages[3]["text"]),
        ("assistant", "They say hello."),
        ("user", "and now?"),
        ("assistant", "Still hello."),
    ]
    calls = messages[1]["tool_calls"]
    assert [(c["call_id"], c["name"], c["arguments"], c["ok"], c["skipped"]) for c in calls] == [
        ("r1", "fs.read", {"path": "notes.md"}, True, False),
        ("r2", "fs.read", {"path": "missing.md"}, False, False),
    ]
    assert "hello" in calls[0]["output"]
    read, missing = messages[2], messages[3]
    assert (read["tool_call_id"], read["tool_name"], read["ok"]) == ("r1", "fs.read", True)
    assert json.loads(read["text"])["content"] == "hello\n"
    assert (missing["tool_call_id"], missing["tool_name"], missing["ok"]) == ("r2", "fs.read", False)
    assert json.loads(missing["text"])["error_type"] == "ToolError"
    assert all(m["tool_calls"] == [] and m["tool_call_id"] is None for m in messages[4:])


def test_a_prompt_whose_run_was_denied_is_resumed_without_its_calls(
    node: AgentNode, client: httpx.Client
) -> None:
    node.script([shell("rm -rf sub"), {"content": "never"}])
    denied = run(client, {"text": "clean up", "approvals": {"mode": "deny"}})
    assert denied["stop"] == "approval_denied"
    history = client.get("/sessions/current/history").json()["messages"]
    assert [(m["role"], m["ok"]) for m in history] == [("user", True), ("assistant", True), ("tool", False)]
    assert history[1]["tool_calls"][0]["output"] == history[2]["text"]
    assert "denied" in history[2]["text"]
    resumable = client.get("/runs/resumable").json()
    assert (resumable["resumable"], resumable["kind"]) == (True, "prompt")
    assert resumable["description"].endswith("clean up")

    node.script([{"content": "Nothing to clean.", "expect": ["clean up"]}])
    resumed = client.post("/runs/resume", json={})
    assert frames(resumed.text)[-1][1]["stop"] == "completed"
    history = client.get("/sessions/current/history").json()["messages"]
    assert [(m["role"], m["text"]) for m in history] == [
        ("user", "clean up"),
        ("assistant", "Nothing to clean."),
    ]


def test_a_workspace_held_by_mcp_serve_is_locked_and_the_error_names_its_command_line(
    node: AgentNode, client: httpx.Client, tmp_path: Path
) -> None:
    from relay_support import free_port, wait_until

    from teaagent.mcp_server import WorkspaceRegistry

    command = [
        sys.executable, "-m", "teaagent", "mcp", "serve", "--config", str(node.config_path), "--http",
        str(free_port()),
    ]  # fmt: skip
    with (tmp_path / "mcp.log").open("wb") as log:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        registry = WorkspaceRegistry()
        assert wait_until(lambda: registry.holder(node.workspace), WAIT), (tmp_path / "mcp.log").read_text()
        refused = client.post("/runs", json={"text": "x"})
        current = client.get("/sessions/current").json()
    finally:
        server.terminate()
        server.wait(WAIT)
    assert refused.status_code == 423
    body = refused.json()
    assert body["error"] == "locked"
    assert body["message"] == (
        f"The workspace {node.workspace.resolve()} is locked by another process (pid {server.pid}: "
        f"{shlex.join(command)}); one process at a time works in a workspace: stop that one, or wait "
        "for it to finish."
    )
    assert current["locked"] is True
    # Gone, it holds nothing: the next run takes the workspace.
    assert run(client, {"text": "x"})["stop"] == "completed"


def test_the_documented_permission_table_is_the_one_the_service_uses() -> None:
    from teaagent.policy import PermissionMode
    from teaagent_agent._catalog import MODES_BY_PERMISSION, permission_of
    from teaagent_agent._schemas import PERMISSION_NAMES

    page = (Path(__file__).resolve().parent.parent / "docs" / "agent-api.md").read_text()
    rows = re.findall(r"^\| `([a-z]+)`(?: \(shown\))? \| `([a-z-]+)` \|", page, re.MULTILINE)
    # One row per mode, naming what GET /settings shows for it; each name sets the mode of its row.
    assert sorted(mode for _name, mode in rows) == sorted(mode.value for mode in PermissionMode)
    assert all(permission_of(PermissionMode(mode)) == name for name, mode in rows)
    assert {(name, MODES_BY_PERMISSION[name].value) for name in PERMISSION_NAMES} <= set(rows)
