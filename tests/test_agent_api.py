"""The agent service's routes through httpx against the app: shapes, codes, and what each one does.

Runs play the offline scripted model (from the script's first turn, every run); the workspace,
sessions, run logs and node.toml are real files.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import AgentNode, frames, in_app, write_node

from teaagent.config import load_config
from teaagent_agent._runs import command_matches


@pytest.fixture
def node(tmp_path: Path) -> AgentNode:
    return write_node(tmp_path / "alpha")


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error", "message"}, body
    return response.status_code, body["error"], body["message"]


def result_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    found = frames(response.text)
    assert found[-1][0] == "result", found[-3:]
    return {"frames": found, "kinds": [kind for kind, _ in found], **found[-1][1]}


async def wait_for_pending(client: httpx.AsyncClient, kind: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        state = (await client.get("/runs/state")).json()
        if state["pending"] is not None and state["pending"]["kind"] == kind:
            return dict(state["pending"])
        await asyncio.sleep(0.02)
    raise AssertionError(f"no {kind} became pending")


# -- health, auth, errors ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_health_needs_no_token_and_says_what_the_service_has(node: AgentNode) -> None:
    async with in_app(node) as client:
        response = await client.get("/health", headers={"Authorization": ""})
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "version": response.json()["version"],
        "workspace": str(node.workspace),
        "ready": True,
        "session": None,
        "models": 1,
        "busy": False,
    }


@pytest.mark.anyio
async def test_every_other_route_needs_the_token(node: AgentNode) -> None:
    async with in_app(node) as client:
        schema = (await client.get("/openapi.json")).json()
        checked = 0
        for path, methods in schema["paths"].items():
            if path in ("/health", "/ready", "/metrics"):  # liveness, readiness, metrics: no token
                continue
            concrete = path.replace("{session_id}", "current").replace("{name}", "scripted")
            for method in methods:
                for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong-token-0123456789"}):
                    response = await client.request(method.upper(), concrete, headers=headers, json={})
                    assert error_of(response)[:2] == (401, "unauthorized"), (method, path)
                    assert response.headers["www-authenticate"] == "Bearer"
                checked += 1
    assert checked >= 30


@pytest.mark.anyio
async def test_every_failure_is_an_error_out(node: AgentNode) -> None:
    async with in_app(node) as client:
        assert error_of(await client.get("/nowhere")) == (
            404,
            "not_found",
            "There is no such resource on this agent service.",
        )
        assert error_of(await client.delete("/runs/state"))[:2] == (405, "invalid")
        bad_json = await client.post("/runs", content=b"{", headers={"Content-Type": "application/json"})
        assert error_of(bad_json)[:2] == (400, "invalid")
        assert error_of(await client.post("/runs", json={"text": ""})) == (
            422,
            "invalid",
            "Text: String should have at least 1 character.",
        )
        assert error_of(await client.post("/runs", json={"text": "x", "answer_timeout": 0}))[:2] == (
            422,
            "invalid",
        )
        assert error_of(await client.get("/mentions", params={"limit": 0}))[:2] == (422, "invalid")
        too_big = await client.post("/runs", content=b"x" * (5 * 1024 * 1024))
        assert error_of(too_big)[:2] == (413, "invalid")


# -- runs ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_run_streams_its_frames_and_ends_with_its_result(tmp_path: Path) -> None:
    node = write_node(
        tmp_path,
        turns=[
            {
                "content": "Writing it.",
                "tool_calls": [{"tool_name": "fs.write", "arguments": {"path": "a.txt", "content": "hi"}}],
            },
            {"content": "It is written.", "expect": ['"bytes_written": 2']},
        ],
    )
    async with in_app(node) as client:
        run = result_of(
            await client.post("/runs", json={"text": "write a.txt", "approvals": {"mode": "auto"}})
        )
        history = (await client.get("/sessions/current/history")).json()
        state = (await client.get("/runs/state")).json()
        health = (await client.get("/health")).json()
    assert run["kinds"][:2] == ["run_accepted", "run_started"]
    assert run["kinds"][-2:] == ["run_finished", "result"]
    assert "model_delta" in run["kinds"]
    assert [kind for kind in run["kinds"] if kind.startswith("approval")] == [
        "approval_waiting",
        "approval_answered",
        "approval_granted",
    ]
    answered = next(data for kind, data in run["frames"] if kind == "approval_answered")
    assert answered == {
        "call_id": answered["call_id"],
        "tool_name": "fs.write",
        "approved": True,
        "remember": False,
        "by": "auto",
    }
    assert run["text"] == "It is written."
    assert run["stop"] == "completed"
    assert run["stop_message"] is None
    assert run["events"] is None
    assert run["usage"]["requests"] == 2
    assert run["usage"]["input_tokens"] > 0
    assert [(tool["name"], tool["ok"], tool["skipped"]) for tool in run["tools"]] == [
        ("fs.write", True, False)
    ]
    assert (node.workspace / "a.txt").read_text() == "hi"
    assert [(m["role"], m["text"]) for m in history["messages"]] == [
        ("user", "write a.txt"),
        ("assistant", "Writing it."),
        ("tool", '{"bytes_written": 2, "path": "a.txt"}'),
        ("assistant", "It is written."),
    ]
    assert state["running"] is False
    assert state["session_id"] == run["session_id"] == health["session"]
    assert state["last_event_id"] == len(run["frames"])


@pytest.mark.anyio
async def test_keep_events_puts_every_frame_in_the_result(node: AgentNode) -> None:
    async with in_app(node) as client:
        run = result_of(await client.post("/runs", json={"text": "hi", "keep_events": True}))
    assert [frame["event"] for frame in run["events"]] == run["kinds"][:-1]
    assert [frame["id"] for frame in run["events"]] == list(range(1, len(run["kinds"])))


WRITE = {
    "content": "",
    "tool_calls": [{"tool_name": "fs.write", "arguments": {"path": "b.txt", "content": "x"}}],
}
SHELL = {"content": "", "tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "echo hi"}}]}


@pytest.mark.anyio
async def test_deny_refuses_what_the_permission_leaves_open_and_the_run_ends_denied(tmp_path: Path) -> None:
    node = write_node(tmp_path, turns=[WRITE, {"content": "never"}])
    async with in_app(node) as client:
        run = result_of(await client.post("/runs", json={"text": "write"}))
    assert run["stop"] == "approval_denied"
    assert run["stop_message"] == "fs.write was denied at the approval prompt."
    assert not (node.workspace / "b.txt").exists()
    assert [(t["name"], t["ok"], t["skipped"]) for t in run["tools"]] == [("fs.write", False, True)]
    answered = next(data for kind, data in run["frames"] if kind == "approval_answered")
    assert (answered["approved"], answered["by"]) == (False, "deny")


def test_commands_match_whole_words_and_never_a_shell_character() -> None:
    approved = ["git status", "echo"]
    assert command_matches("git status", approved)
    assert command_matches("git  status -s", approved)
    assert command_matches("echo hi there", approved)
    assert not command_matches("git statusx", approved)
    assert not command_matches("git", approved)
    assert not command_matches("", approved)
    for bad in (
        "echo hi; rm -rf /",
        "echo hi | sh",
        "echo a && rm x",
        "echo $(id)",
        "echo `id`",
        "echo > f",
        "echo\nrm",
    ):
        assert not command_matches(bad, approved), bad


@pytest.mark.anyio
async def test_commands_approves_only_the_commands_named(tmp_path: Path) -> None:
    node = write_node(tmp_path, permission_mode="allow", turns=[SHELL, {"content": "ran it"}])
    async with in_app(node) as client:
        ran = result_of(
            await client.post(
                "/runs", json={"text": "x", "approvals": {"mode": "commands", "commands": ["echo"]}}
            )
        )
        refused = result_of(
            await client.post(
                "/runs", json={"text": "x", "approvals": {"mode": "commands", "commands": ["git status"]}}
            )
        )
    assert ran["stop"] == "completed"
    assert '"stdout": "hi\\n"' in ran["tools"][0]["output"]
    assert refused["stop"] == "approval_denied"
    assert refused["stop_message"] == "shell.run was denied at the approval prompt."


@pytest.mark.anyio
async def test_ask_waits_for_the_client_and_state_shows_what_it_waits_on(tmp_path: Path) -> None:
    node = write_node(tmp_path, permission_mode="allow", turns=[SHELL, SHELL, {"content": "both ran"}])
    async with in_app(node) as client:
        task = asyncio.create_task(client.post("/runs", json={"text": "x", "approvals": {"mode": "ask"}}))
        pending = await wait_for_pending(client, "approval")
        assert pending["command"] == "echo hi"
        assert pending["remember_supported"] is True
        assert pending["timeout_seconds"] == 300
        wrong = await client.post("/runs/approvals", json={"call_id": "nope", "approve": True})
        assert wrong.json() == {"resolved": False}
        assert error_of(await client.post("/runs/approvals", json={"call_id": "x", "approve": "yes"}))[
            :2
        ] == (422, "invalid")
        answered = await client.post(
            "/runs/approvals", json={"call_id": pending["call_id"], "approve": True, "remember": True}
        )
        assert answered.json() == {"resolved": True}
        run = result_of(await task)
    # remember: the second call of the same tool ran unasked.
    assert run["kinds"].count("approval_requested") == 1
    assert run["stop"] == "completed"
    assert [t["ok"] for t in run["tools"]] == [True, True]


@pytest.mark.anyio
async def test_an_unanswered_ask_is_denied_when_answer_timeout_runs_out(tmp_path: Path) -> None:
    node = write_node(tmp_path, permission_mode="allow", turns=[SHELL, {"content": "never"}])
    async with in_app(node) as client:
        run = result_of(
            await client.post(
                "/runs", json={"text": "x", "approvals": {"mode": "ask"}, "answer_timeout": 0.3}
            )
        )
    answered = next(data for kind, data in run["frames"] if kind == "approval_answered")
    assert (answered["approved"], answered["by"]) == (False, "timeout")
    assert run["stop"] == "approval_denied"


ASK_USER = {
    "content": "",
    "tool_calls": [{"tool_name": "ask_user", "arguments": {"question": "Which?", "options": ["a", "b"]}}],
}


@pytest.mark.anyio
async def test_questions_are_asked_in_the_stream_and_answered_by_post(tmp_path: Path) -> None:
    node = write_node(tmp_path, turns=[ASK_USER, {"content": "you said b", "expect": ['"answer": "b"']}])
    async with in_app(node) as client:
        task = asyncio.create_task(client.post("/runs", json={"text": "x", "questions": "ask"}))
        pending = await wait_for_pending(client, "question")
        assert (pending["question"], pending["options"]) == ("Which?", ["a", "b"])
        assert (
            await client.post("/runs/questions", json={"call_id": pending["call_id"], "answer": "b"})
        ).json() == {"resolved": True}
        run = result_of(await task)
        declined = result_of(await client.post("/runs", json={"text": "x"}))
    assert run["stop"] == "completed"
    assert run["questions"] == ["Which?"]
    assert "question_asked" in run["kinds"]
    # questions = decline (the default): the model hears the reader is not there, and the script's
    # expectation of an answer fails the second turn.
    assert "question_asked" not in declined["kinds"]
    assert next(data for kind, data in declined["frames"] if kind == "answer")["answered"] is False


SLOW = {"content": "thinking", "delay_seconds": 30}


@pytest.mark.anyio
async def test_one_run_per_session_busy_then_cancel_then_resume(tmp_path: Path) -> None:
    node = write_node(tmp_path, turns=[SLOW])
    async with in_app(node) as client:
        task = asyncio.create_task(client.post("/runs", json={"text": "the long task"}))
        await _until(lambda: client.get("/runs/state"), lambda s: s["running"])
        assert error_of(await client.post("/runs", json={"text": "another"}))[:2] == (409, "busy")
        assert (await client.get("/health")).json()["busy"] is True
        assert (await client.get("/runs/resumable")).json()["resumable"] is False
        assert (await client.post("/runs/cancel")).json() == {"cancelled": True}
        run = result_of(await task)
        assert (await client.post("/runs/cancel")).json() == {"cancelled": False}
        resumable = (await client.get("/runs/resumable")).json()
        node.script([{"content": "Resumed and done.", "expect": ["the long task"]}])
        resumed = result_of(await client.post("/runs/resume", json={}))
        history = (await client.get("/sessions/current/history")).json()
        nothing = await client.post("/runs/resume", json={})
    assert run["stop"] == "cancelled"
    assert run["stop_message"] == "The run was cancelled."
    assert resumable["resumable"] is True
    assert resumable["kind"] == "prompt"
    assert resumable["description"].endswith("the long task")
    assert resumed["stop"] == "completed"
    # The interrupted prompt was run again, not added twice.
    assert [(m["role"], m["text"]) for m in history["messages"]] == [
        ("user", "the long task"),
        ("assistant", "Resumed and done."),
    ]
    assert error_of(nothing)[:2] == (409, "invalid")


@pytest.mark.anyio
async def test_timeout_stops_the_run_and_says_so(tmp_path: Path) -> None:
    node = write_node(tmp_path, turns=[SLOW])
    async with in_app(node) as client:
        run = result_of(await client.post("/runs", json={"text": "x", "timeout": 0.3}))
    assert run["kinds"][-2:] == ["error", "result"]
    assert run["frames"][-2][1] == {"error": "timeout", "message": "The run was stopped after 0.3 seconds."}
    assert run["stop"] == "timeout"
    assert run["stop_message"] == "The run was stopped after 0.3 seconds, its time limit."


@pytest.mark.anyio
async def test_steering_reaches_the_next_model_call(tmp_path: Path) -> None:
    node = write_node(
        tmp_path,
        turns=[
            {
                "content": "listing",
                "delay_seconds": 1.0,
                "tool_calls": [{"tool_name": "fs.list", "arguments": {"path": "."}}],
            },
            {"content": "steered", "expect": ["also check the tests"]},
        ],
    )
    async with in_app(node) as client:
        assert (await client.post("/runs/steer", json={"text": "nobody runs"})).json() == {"steered": False}
        task = asyncio.create_task(client.post("/runs", json={"text": "x"}))
        await _until(lambda: client.get("/runs/state"), lambda s: s["running"])
        assert (await client.post("/runs/steer", json={"text": "also check the tests"})).json() == {
            "steered": True
        }
        run = result_of(await task)
    assert run["stop"] == "completed", run["stop_message"]
    assert "steered" in run["kinds"]


@pytest.mark.anyio
async def test_a_workspace_held_by_another_process_is_locked(node: AgentNode) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from teaagent.mcp_server import WorkspaceRegistry
                WorkspaceRegistry().acquire_lock({str(node.workspace)!r})
                print("held", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        async with in_app(node) as client:
            created = (await client.post("/sessions", json={"title": "t"})).json()
            refused = await client.post("/runs", json={"text": "x"})
            current = (await client.get("/sessions/current")).json()
            assert error_of(refused)[:2] == (423, "locked")
            named = f"is locked by another process (pid {holder.pid}: {sys.executable} -c "
            assert named in error_of(refused)[2]
            assert current == {**current, "id": created["id"], "locked": True}
            holder.stdin.close()  # type: ignore[union-attr]
            holder.wait(10)
            run = result_of(await client.post("/runs", json={"text": "x"}))
            assert run["stop"] == "completed"
            assert (await client.get("/sessions/current")).json()["locked"] is False
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.anyio
async def test_images_are_refused_with_a_sentence(tmp_path: Path) -> None:
    node = write_node(tmp_path)
    async with in_app(node) as client:
        not_base64 = await client.post(
            "/runs", json={"text": "x", "images": [{"data": "%%%", "media_type": "image/png"}]}
        )
        wrong_type = await client.post(
            "/runs", json={"text": "x", "images": [{"data": "AAAA", "media_type": "text/html"}]}
        )
        text_only = await client.post(
            "/runs", json={"text": "x", "images": [{"data": "AAAA", "media_type": "image/png"}]}
        )
    assert error_of(not_base64) == (422, "invalid", "images[0].data is not base64.")
    assert error_of(wrong_type)[2].startswith("images[0].media_type must be one of image/gif, image/jpeg")
    assert error_of(text_only) == (
        422,
        "invalid",
        "The model scripted does not take images; send the prompt without them.",
    )


@pytest.mark.anyio
async def test_mentions_list_the_workspace_and_attach_files_to_the_prompt(tmp_path: Path) -> None:
    node = write_node(
        tmp_path, turns=[{"content": "read it", "expect": ['<file path="src/main.py">', "print('hello')"]}]
    )
    (node.workspace / "src").mkdir()
    (node.workspace / "src" / "main.py").write_text("print('hello')\n")
    (node.workspace / "src" / "mod.py").write_text("")
    (node.workspace / ".teaagent").mkdir(exist_ok=True)
    (node.workspace / ".teaagent" / "secret").write_text("no")
    async with in_app(node) as client:
        listed = (await client.get("/mentions", params={"prefix": "src/m"})).json()
        root = (await client.get("/mentions", params={"prefix": ""})).json()
        bounded = (await client.get("/mentions", params={"prefix": "src/", "limit": 1})).json()
        hidden = (await client.get("/mentions", params={"prefix": ".teaagent/"})).json()
        run = result_of(await client.post("/runs", json={"text": "look at @src/main.py please"}))
    assert listed["mentions"] == [
        {"token": "@src/main.py", "kind": "file", "name": "main.py", "description": "file, 15 bytes"},
        {"token": "@src/mod.py", "kind": "file", "name": "mod.py", "description": "file, 0 bytes"},
    ]
    assert {m["token"] for m in root["mentions"]} >= {"@src/", "@src/main.py"}
    assert len(bounded["mentions"]) == 1
    assert hidden["mentions"] == []
    assert run["stop"] == "completed", run["stop_message"]


# -- sessions ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_sessions_create_list_switch_rename_history_delete(node: AgentNode) -> None:
    async with in_app(node) as client:
        assert error_of(await client.get("/sessions/current"))[:2] == (404, "not_found")
        first = await client.post("/sessions", json={"title": "first"})
        assert first.status_code == 201
        second = (await client.post("/sessions")).json()
        listed = (await client.get("/sessions")).json()["sessions"]
        assert [s["id"] for s in listed] == [second["id"], first.json()["id"]]
        assert [s["current"] for s in listed] == [True, False]
        switched = (await client.post(f"/sessions/{first.json()['id']}/switch")).json()
        assert switched["id"] == first.json()["id"]
        assert switched["title"] == "first"
        assert switched["usage"]["input_tokens"] == 0
        renamed = (await client.patch("/sessions/current", json={"title": "renamed"})).json()
        assert renamed["title"] == "renamed"
        run = result_of(await client.post("/runs", json={"text": "hello"}))
        assert run["session_id"] == first.json()["id"]
        current = (await client.get("/sessions/current")).json()
        assert current["usage"]["requests"] == 1
        assert current["usage"]["input_tokens"] > 0
        history = (await client.get(f"/sessions/{first.json()['id']}/history")).json()
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
        assert (await client.delete(f"/sessions/{first.json()['id']}")).status_code == 204
        assert error_of(await client.get(f"/sessions/{first.json()['id']}/history"))[:2] == (404, "not_found")
        assert error_of(await client.delete(f"/sessions/{first.json()['id']}"))[:2] == (404, "not_found")
        assert error_of(await client.get("/sessions/current"))[:2] == (404, "not_found")
        assert error_of(await client.post("/sessions/no such/switch"))[:2] == (404, "not_found")
        assert error_of(await client.patch(f"/sessions/{second['id']}", json={"title": ""}))[:2] == (
            422,
            "invalid",
        )


@pytest.mark.anyio
async def test_compaction_folds_the_older_messages_into_the_models_summary(tmp_path: Path) -> None:
    node = write_node(tmp_path, turns=[{"content": "answer"}])
    async with in_app(node) as client:
        for text in ("one", "two"):
            result_of(await client.post("/runs", json={"text": text}))
        node.script([{"content": "They said one and two.", "expect": ["user: one", "assistant: answer"]}])
        nothing = (await client.post("/sessions/current/compact", json={"keep": 10})).json()
        compacted = (await client.post("/sessions/current/compact", json={"keep": 1})).json()
        history = (await client.get("/sessions/current/history")).json()["messages"]
        context = (await client.get("/sessions/current/context")).json()
    assert nothing == {"applied": False, "summary": "", "compressed": 0, "kept": 4}
    assert compacted == {"applied": True, "summary": "They said one and two.", "compressed": 3, "kept": 1}
    assert [(m["role"], m["text"]) for m in history] == [
        ("system", "Summary of the earlier conversation:\nThey said one and two."),
        ("assistant", "answer"),
    ]
    assert [share["name"] for share in context["shares"]] == [
        "system prompt",
        "tools",
        "summaries",
        "assistant messages",
    ]
    assert context["used"] == sum(share["tokens"] for share in context["shares"])
    assert context["window"] == 128_000
    assert context["measured_by"] == "estimate: 4 characters per token"


@pytest.mark.anyio
async def test_self_compaction_is_a_choice_per_session_and_compacts_before_an_overfull_run(
    tmp_path: Path,
) -> None:
    node = write_node(tmp_path, turns=[{"content": "x" * 4000}])
    async with in_app(node) as client:
        result_of(await client.post("/runs", json={"text": "fill it"}))
        assert (await client.get("/sessions/current/self-compaction")).json() == {
            "choice": None,
            "effective": False,
        }
        assert (await client.put("/sessions/current/self-compaction", json={"choice": True})).json() == {
            "choice": True,
            "effective": True,
        }
        assert error_of(await client.put("/sessions/current/self-compaction", json={"choice": "yes"}))[
            :2
        ] == (422, "invalid")
        await client.patch("/settings", json={"compact_percent": 0.5})  # 640 tokens of 128,000
        node.script([{"content": "the summary"}])
        run = result_of(await client.post("/runs", json={"text": "go on"}))
        cleared = (await client.put("/sessions/current/self-compaction", json={"choice": None})).json()
    compacted = next(data for kind, data in run["frames"] if kind == "compacted")
    assert compacted["applied"] is True
    assert run["kinds"].index("compacted") < run["kinds"].index("run_started")
    assert cleared == {"choice": None, "effective": False}


# -- models, settings, doctor ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_models_are_written_to_node_toml_atomically_and_checked(node: AgentNode) -> None:
    before = node.config_path.read_text()
    async with in_app(node) as client:
        assert (await client.get("/models")).json() == {
            "models": [
                {
                    "name": "scripted",
                    "model": "scripted",
                    "context_window": 128000,
                    "multimodal": False,
                    "efforts": [],
                    "active": True,
                    "compact_percent": 80.0,
                }
            ],
            "current": "scripted",
        }
        added = await client.post(
            "/models",
            json={
                "model": "gpt-4.1",
                "token": "sk-test",
                "reasoning_efforts": ["low", "high"],
                "context_window": 1000,
            },
        )
        assert added.status_code == 201
        assert added.json() == {
            "name": "gpt-4.1",
            "model": "gpt-4.1",
            "context_window": 1000,
            "multimodal": False,
            "efforts": ["low", "high"],
            "active": False,
            "compact_percent": 80.0,
        }
        assert error_of(await client.post("/models", json={"model": "gpt-4.1"}))[:2] == (409, "invalid")
        bad = await client.post(
            "/models", json={"model": "m", "display_model": "local", "base_url": "ftp://x"}
        )
        assert error_of(bad)[:2] == (422, "invalid")
        assert "base_url must be an http:// or https:// URL" in error_of(bad)[2]
        # What urlsplit cannot read (an unclosed IPv6 bracket) and what no file can hold (a lone
        # surrogate, which JSON can escape): refused in one sentence, never a 500.
        unclosed = await client.post("/models", json={"model": "m", "base_url": "http://[::1"})
        assert error_of(unclosed)[:2] == (422, "invalid")
        assert "base_url must be an http:// or https:// URL, not 'http://[::1'" in error_of(unclosed)[2]
        lone = await client.post(
            "/models",
            content=b'{"model": "m", "reasoning_efforts": ["\\ud800"]}',
            headers={"content-type": "application/json"},
        )
        assert error_of(lone)[:2] == (422, "invalid")
        assert error_of(lone)[2].endswith("holds a lone surrogate, which a configuration file cannot hold.")
        assert error_of(await client.post("/models", json={"model": "m", "colour": "red"}))[:2] == (
            422,
            "invalid",
        )
        assert error_of(await client.post("/models", json={"model": "a/b"}))[:2] == (422, "invalid")
        updated = (
            await client.patch("/models/gpt-4.1", json={"multimodal": True, "compact_percent": 60})
        ).json()
        assert (updated["multimodal"], updated["compact_percent"]) == (True, 60.0)
        assert error_of(await client.patch("/models/scripted", json={"multimodal": True}))[:2] == (
            409,
            "invalid",
        )
        assert error_of(await client.patch("/models/nope", json={}))[:2] == (404, "not_found")
        on_disk = load_config(node.config_path).models["gpt-4.1"]
        assert (on_disk.token, on_disk.multimodal, on_disk.compact_percent) == ("sk-test", True, 60.0)
        assert node.config_path.read_text().startswith(before.rstrip("\n"))
        assert (await client.delete("/models/gpt-4.1")).status_code == 204
        assert error_of(await client.delete("/models/gpt-4.1"))[:2] == (404, "not_found")
        assert error_of(await client.delete("/models/scripted"))[:2] == (409, "invalid")
    assert load_config(node.config_path).models == {}
    assert node.config_path.read_text().rstrip("\n") == before.rstrip("\n")
    assert not list(node.config_path.parent.glob(".alpha.toml.*.tmp"))


@pytest.mark.anyio
async def test_settings_choose_the_model_effort_and_permission(
    node: AgentNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with in_app(node) as client:
        await client.post("/models", json={"model": "gpt-4.1", "reasoning_efforts": ["low", "high"]})
        initial = (await client.get("/settings")).json()
        changed = (
            await client.patch("/settings", json={"model": "gpt-4.1", "effort": "high", "permission": "safe"})
        ).json()
        bad_effort = await client.patch("/settings", json={"effort": "max"})
        bad_model = await client.patch("/settings", json={"model": "nope"})
        health = (await client.get("/health")).json()
        not_ready = await client.post("/runs", json={"text": "x"})
    assert initial == {
        "model": {**initial["model"], "name": "scripted", "active": True},
        "effort": "default",
        "efforts": [],
        "permission": "ask",
        "permissions": ["deny", "ask", "safe", "auto"],
        "unsaved": None,
    }
    assert (changed["model"]["name"], changed["effort"], changed["permission"]) == ("gpt-4.1", "high", "safe")
    assert error_of(bad_effort) == (422, "invalid", "The model gpt-4.1 offers no effort 'max' (low, high).")
    assert error_of(bad_model)[:2] == (404, "not_found")
    assert health["ready"] is False
    assert error_of(not_ready) == (
        409,
        "invalid",
        "The model gpt-4.1 has no API key: set OPENAI_API_KEY or PATCH /models/gpt-4.1 with a token.",
    )
    # The choices are kept for the next start of the service.
    async with in_app(node) as client:
        assert (await client.get("/settings")).json()["model"]["name"] == "gpt-4.1"


@pytest.mark.anyio
async def test_doctor_asks_each_model_and_the_scripted_one_always_passes(
    node: AgentNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with in_app(node) as client:
        await client.post("/models", json={"model": "gpt-4.1"})
        await client.post(
            "/models", json={"model": "m", "display_model": "nobody", "base_url": "http://127.0.0.1:9/v1"}
        )
        checks = (await client.post("/doctor", json={"timeout": 5})).json()["checks"]
        assert error_of(await client.post("/doctor", json={"timeout": 0}))[:2] == (422, "invalid")
    by_name = {check["model"]: check for check in checks}
    assert by_name["scripted"]["ok"] is True
    assert by_name["gpt-4.1"] == {
        **by_name["gpt-4.1"],
        "ok": False,
        "detail": "Set OPENAI_API_KEY to use the openai provider.",
    }
    assert by_name["nobody"]["ok"] is False
    assert by_name["nobody"]["model_id"] == "m"


# -- usage, plugins, side questions ---------------------------------------------------------------


@pytest.mark.anyio
async def test_usage_adds_up_the_run_logs_by_session_model_and_day(node: AgentNode) -> None:
    async with in_app(node) as client:
        first = result_of(await client.post("/runs", json={"text": "a"}))
        result_of(await client.post("/runs", json={"text": "b"}))
        other = (await client.post("/sessions", json={"title": "other"})).json()
        usage = (await client.get("/usage")).json()
        stats = (
            await client.get("/usage/sessions", params={"ids": [first["session_id"], other["id"]]})
        ).json()
        plugins = (await client.get("/plugins")).json()
    [session] = usage["sessions"]
    assert session["id"] == first["session_id"]
    assert session["tokens"]["requests"] == 2
    assert session["models"] == ["scripted"]
    assert session["entries"] == 4
    assert usage["total"]["requests"] == 2
    assert usage["total"]["total_tokens"] == usage["total"]["input_tokens"] + usage["total"]["output_tokens"]
    assert [m["model"] for m in usage["models"]] == ["scripted"]
    assert len(usage["days"]) == 1
    assert [(s["id"], s["requests"], s["entries"]) for s in stats["stats"]] == [
        (first["session_id"], 2, 4),
        (other["id"], 0, 0),
    ]
    assert plugins == {"loaded": [], "failures": []}


@pytest.mark.anyio
async def test_a_side_question_never_touches_the_history(tmp_path: Path) -> None:
    node = write_node(tmp_path, turns=[{"content": "first answer"}])
    async with in_app(node) as client:
        result_of(await client.post("/runs", json={"text": "the task"}))
        node.script([{"content": "On the side: 42.", "expect": ["the task", "what is six times seven"]}])
        answer = (await client.post("/side-question", json={"question": "what is six times seven"})).json()
        history = (await client.get("/sessions/current/history")).json()["messages"]
        node.script([{"content": "slow", "delay_seconds": 5}])
        slow = await client.post("/side-question", json={"question": "q", "timeout": 0.2})
        node.script([{"content": "never", "expect": ["a text nobody wrote"]}])
        broken = await client.post("/side-question", json={"question": "q"})
    assert answer == {"answer": "On the side: 42."}
    assert [m["text"] for m in history] == ["the task", "first answer"]
    assert error_of(slow) == (504, "timeout", "The model scripted did not answer within 0.2 seconds.")
    assert error_of(broken)[:2] == (502, "run")


async def _until(call: Any, predicate: Any, timeout: float = 20.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = (await call()).json()
        if predicate(value) or asyncio.get_running_loop().time() > deadline:
            return dict(value)
        await asyncio.sleep(0.02)
