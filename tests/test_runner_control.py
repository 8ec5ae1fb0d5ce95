"""AgentRunner while it runs: events, approvals waited for, questions, steering and cancellation."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from teaagent.audit import AuditLogger
from teaagent.errors import ApprovalDeniedError
from teaagent.llm import ScriptedAdapter
from teaagent.policy import (
    ApprovalPolicy,
    MultiSigQuorumConfig,
    PermissionMode,
    PromptAnswer,
    PromptRequest,
    QuorumGate,
)
from teaagent.quorum import build_certificate, sign_approval, sign_request
from teaagent.runner import CANCELLED_MESSAGE, EVENT_KINDS, AgentRunner, Question, RunEvent
from teaagent.signing import load_private_key
from teaagent.tools import workspace_registry

LIST = {"content": "Listing.", "tool_calls": [{"tool_name": "fs.list", "arguments": {}, "call_id": "l1"}]}


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kinds(path: Path) -> list[str]:
    return [record["event_type"] for record in records(path)]


def make_runner(
    workspace: Path,
    turns: list[dict[str, Any]],
    *,
    mode: PermissionMode = PermissionMode.WORKSPACE_WRITE,
    prompter: Callable[[PromptRequest], PromptAnswer] | None = None,
    quorum: MultiSigQuorumConfig | None = None,
    quorum_gate: QuorumGate | None = None,
    agent_id: str = "local",
    **options: Any,
) -> tuple[AgentRunner, ScriptedAdapter, Path, list[RunEvent]]:
    script = ScriptedAdapter(turns)
    audit_path = workspace.parent / "audit" / "audit.jsonl"
    events: list[RunEvent] = []
    sinks = [events.append, *options.pop("sinks", [])]
    runner = AgentRunner(
        adapter=script,
        registry=workspace_registry(workspace),
        policy=ApprovalPolicy.for_workspace(
            workspace,
            mode=mode,
            use_presets=False,
            prompter=prompter,
            multi_sig_config=quorum,
            quorum_gate=quorum_gate,
            agent_id=agent_id,
        ),
        audit=AuditLogger(audit_path),
        event_sink=sinks,
        **options,
    )
    return runner, script, audit_path, events


# -- the event stream ---------------------------------------------------------------------------------


def test_events_come_in_the_order_of_the_run(workspace: Path) -> None:
    runner, _, _, events = make_runner(workspace, [LIST, {"content": "Done."}])

    runner.run("List the workspace.")

    assert [event.kind for event in events] == [
        "run_started",
        "model_request",
        "model_response",
        "cost",
        "tool_call",
        "tool_result",
        "model_request",
        "model_response",
        "cost",
        "run_finished",
    ]
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert all(earlier.at <= later.at for earlier, later in itertools.pairwise(events))
    assert {event.kind for event in events} <= set(EVENT_KINDS)
    call, result = events[4], events[5]
    assert call.data == {"call_id": "l1", "tool_name": "fs.list", "arguments": {}, "reason": "Listing."}
    assert result.data["ok"] is True
    assert result.data["result"]["truncated"] is False
    finished = events[-1].data
    assert (finished["status"], finished["final_answer"], finished["run_id"]) == (
        "completed",
        "Done.",
        runner.run_id,
    )
    assert runner.history == events


def test_a_failed_tool_is_a_tool_result_that_is_not_ok(workspace: Path) -> None:
    turns = [{"tool_calls": [{"tool_name": "fs.read", "arguments": {"path": "nope"}}]}, {"content": "ok"}]
    runner, _, _, events = make_runner(workspace, turns)

    runner.run("Read.")

    (result,) = [event for event in events if event.kind == "tool_result"]
    assert result.data["ok"] is False
    assert result.data["error"] == "fs.read: cannot read 'nope': no such file or directory"
    assert result.data["error_type"] == "ToolError"


def test_a_streaming_run_sends_the_text_as_it_comes(workspace: Path) -> None:
    runner, _, _, events = make_runner(workspace, [{"content": "Hello there, world."}], stream=True)

    result = runner.run("Greet.")

    deltas = [event.data["text"] for event in events if event.kind == "model_delta"]
    assert deltas == ["Hello ", "there, ", "world."]
    assert result.final_answer is not None
    assert result.final_answer.content == "".join(deltas)
    kinds_seen = [event.kind for event in events]
    assert (
        kinds_seen.index("model_request")
        < kinds_seen.index("model_delta")
        < kinds_seen.index("model_response")
    )


@pytest.mark.anyio
async def test_an_async_iterator_started_before_the_run_sees_every_event(workspace: Path) -> None:
    runner, _, _, events = make_runner(workspace, [LIST, {"content": "Done."}])

    async def main() -> list[RunEvent]:
        seen: list[RunEvent] = []

        async def watch() -> None:
            async for event in runner.events():
                seen.append(event)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        await runner.arun("List.")
        await asyncio.wait_for(watcher, 5)
        return seen

    assert await main() == events


def test_an_async_iterator_started_after_the_run_replays_it(workspace: Path) -> None:
    runner, _, _, events = make_runner(workspace, [{"content": "Done."}])
    runner.run("Answer.")

    async def replay() -> list[RunEvent]:
        return [event async for event in runner.events()]

    assert asyncio.run(replay()) == events  # run() makes a loop of its own: not inside one


def test_an_async_iterator_in_another_thread_follows_a_run(workspace: Path) -> None:
    gate = threading.Event()

    def hold(event: RunEvent) -> None:
        if event.kind == "run_started":
            gate.wait(5)

    runner, _, _, events = make_runner(workspace, [LIST, {"content": "Done."}], sinks=[hold])
    seen: list[RunEvent] = []

    async def watch() -> None:
        async for event in runner.events():
            seen.append(event)
            gate.set()

    watcher = threading.Thread(target=lambda: asyncio.run(watch()))
    watcher.start()
    time.sleep(0.05)  # the watcher subscribes; if it is late, it replays what it missed
    gate.set()
    runner.run("List.")
    watcher.join(5)

    assert seen == events


def test_a_sink_that_raises_does_not_break_the_run(workspace: Path) -> None:
    def broken(event: RunEvent) -> None:
        raise RuntimeError("display gone")

    runner, _, _, events = make_runner(workspace, [{"content": "Done."}], sinks=[broken])

    assert runner.run("Answer.").status == "completed"
    assert events[-1].kind == "run_finished"


# -- approvals waited for -----------------------------------------------------------------------------

WRITE = {
    "content": "Writing it.",
    "tool_calls": [
        {"tool_name": "fs.write", "arguments": {"path": "a.txt", "content": "hi"}, "call_id": "w1"}
    ],
}


def test_a_prompt_approval_is_waited_for_recorded_and_the_call_runs(workspace: Path) -> None:
    asked: list[PromptRequest] = []

    def approve(request: PromptRequest) -> PromptAnswer:
        asked.append(request)
        return PromptAnswer.ONCE

    runner, _, audit_path, events = make_runner(
        workspace, [WRITE, {"content": "Written."}], mode=PermissionMode.PROMPT, prompter=approve
    )

    result = runner.run("Write a.txt.")

    assert result.status == "completed"
    assert (workspace / "a.txt").read_text() == "hi"
    assert [request.call_id for request in asked] == ["w1"]
    assert asked[0].reason == "Writing it."
    order = [event.kind for event in events]
    assert order[order.index("tool_call") :][:4] == [
        "tool_call",
        "approval_waiting",
        "approval_granted",
        "tool_result",
    ]
    waiting = next(event for event in events if event.kind == "approval_waiting")
    assert waiting.data["via"] == "prompt"
    assert waiting.data["tool_name"] == "fs.write"
    assert waiting.data["arguments"] == {"path": "a.txt", "content": "hi"}
    log = kinds(audit_path)
    assert log[log.index("approval_request") :][:4] == [
        "approval_request",
        "approval_granted",
        "tool_call",
        "tool_result",
    ]
    request_record = next(r for r in records(audit_path) if r["event_type"] == "approval_request")
    assert request_record["payload"]["call_id"] == "w1"
    assert request_record["payload"]["via"] == "prompt"


def test_a_denial_at_the_prompt_ends_the_run(workspace: Path) -> None:
    runner, _, audit_path, events = make_runner(
        workspace,
        [WRITE, {"content": "Written."}],
        mode=PermissionMode.PROMPT,
        prompter=lambda r: PromptAnswer.DENY,
    )

    result = runner.run("Write a.txt.")

    assert result.status == "approval_denied"
    assert result.error_message == "fs.write was denied at the approval prompt."
    assert not (workspace / "a.txt").exists()
    assert [event.kind for event in events][-3:] == ["approval_waiting", "approval_denied", "run_finished"]
    assert kinds(audit_path)[-3:] == ["approval_request", "approval_denied", "run_end"]


def test_a_session_approval_at_the_prompt_is_asked_once(workspace: Path) -> None:
    asked: list[str] = []

    def approve(request: PromptRequest) -> PromptAnswer:
        asked.append(request.call_id)
        return PromptAnswer.SESSION

    second = {
        "tool_calls": [
            {"tool_name": "fs.write", "arguments": {"path": "b.txt", "content": "x"}, "call_id": "w2"}
        ]
    }
    runner, _, _, _ = make_runner(
        workspace, [WRITE, second, {"content": "ok"}], mode=PermissionMode.PROMPT, prompter=approve
    )

    assert runner.run("Write two files.").status == "completed"
    assert asked == ["w1"]
    assert (workspace / "b.txt").exists()


def peers_config(keys: dict[str, Any]) -> MultiSigQuorumConfig:
    peers = ["beta", "delta", "gamma"]
    return MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=peers,
        peer_public_keys={peer: keys[peer].public_line for peer in peers},
        peer_relay_urls={peer: f"http://127.0.0.1:{9000 + n}" for n, peer in enumerate(peers)},
        local_relay_base_url="http://127.0.0.1:8999",
        allow_dev_signatures=False,
        high_risk_patterns=["shell.*"],
        timeout_seconds=30,
    )


class InProcessPeers:
    """Two of three peers sign, in this process (between nodes their relays carry the same documents)."""

    def __init__(self, keys: dict[str, Any], config: MultiSigQuorumConfig) -> None:
        self.keys = keys
        self.config = config

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        signature = sign_request(request, load_private_key(self.keys["alpha"].private_path))
        approvals = [
            sign_approval(request, peer, load_private_key(self.keys[peer].private_path))
            for peer in ("beta", "gamma")
        ]
        return build_certificate(request, signature, approvals)


def test_a_high_risk_call_waits_for_the_quorum_then_runs(workspace: Path, ssh_key_factory: Any) -> None:
    keys = {name: ssh_key_factory(name) for name in ("alpha", "beta", "delta", "gamma")}
    config = peers_config(keys)
    turns = [
        {
            "content": "Running it.",
            "tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "echo hi"}}],
        },
        {"content": "It printed hi.", "expect": ['"stdout": "hi\\n"']},
    ]
    runner, _, audit_path, events = make_runner(
        workspace,
        turns,
        mode=PermissionMode.DANGER_FULL_ACCESS,
        quorum=config,
        quorum_gate=InProcessPeers(keys, config),
        agent_id="alpha",
    )

    result = runner.run("Say hi in the shell.")

    assert result.status == "completed", result.error_message
    order = [event.kind for event in events]
    assert order[order.index("tool_call") :][:4] == [
        "tool_call",
        "approval_waiting",
        "approval_granted",
        "tool_result",
    ]
    waiting = next(event for event in events if event.kind == "approval_waiting")
    assert waiting.data["via"] == "quorum"
    assert (waiting.data["required_approvals"], waiting.data["peers"]) == (2, ["beta", "delta", "gamma"])
    granted = next(r for r in records(audit_path) if r["event_type"] == "approval_granted")
    assert sorted(a["statement"]["signer"] for a in granted["payload"]["certificate"]["approvals"]) == [
        "beta",
        "gamma",
    ]


def test_a_quorum_that_denies_ends_the_run_and_nothing_runs(workspace: Path, ssh_key_factory: Any) -> None:
    keys = {name: ssh_key_factory(name) for name in ("alpha", "beta", "delta", "gamma")}
    config = peers_config(keys)

    class Denying:
        def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
            raise ApprovalDeniedError("shell.run was denied by beta and gamma: not today.")

    turns = [{"tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "touch made"}}]}]
    runner, _, audit_path, events = make_runner(
        workspace,
        turns,
        mode=PermissionMode.DANGER_FULL_ACCESS,
        quorum=config,
        quorum_gate=Denying(),
        agent_id="alpha",
    )

    result = runner.run("Touch a file.")

    assert result.status == "approval_denied"
    assert result.error_message == "shell.run was denied by beta and gamma: not today."
    assert not (workspace / "made").exists()
    assert [event.kind for event in events][-3:] == ["approval_waiting", "approval_denied", "run_finished"]
    assert kinds(audit_path)[-3:] == ["approval_request", "approval_denied", "run_end"]


def test_without_a_quorum_gate_a_high_risk_call_is_denied_without_waiting(
    workspace: Path, ssh_key_factory: Any
) -> None:
    keys = {name: ssh_key_factory(name) for name in ("alpha", "beta", "delta", "gamma")}
    turns = [{"tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "touch made"}}]}]
    runner, _, _, events = make_runner(
        workspace, turns, mode=PermissionMode.DANGER_FULL_ACCESS, quorum=peers_config(keys), agent_id="alpha"
    )

    result = runner.run("Touch a file.")

    assert result.status == "approval_denied"
    assert result.error_message == (
        "shell.run needs 2 approvals from 3 peers but no quorum could be obtained: "
        "no quorum gate is configured."
    )
    assert "approval_waiting" not in [event.kind for event in events]


# -- questions ----------------------------------------------------------------------------------------

ASK = {
    "content": "Which one?",
    "tool_calls": [
        {
            "tool_name": "ask_user",
            "arguments": {"question": "Which colour?", "options": ["red", "blue"]},
            "call_id": "q1",
        }
    ],
}


def test_a_question_is_answered_by_the_ask_callback(workspace: Path) -> None:
    asked: list[Question] = []

    def ask(question: Question) -> str | None:
        asked.append(question)
        return "blue"

    turns = [ASK, {"content": "Blue it is.", "expect": ['{"answer": "blue"}']}]
    runner, _, audit_path, events = make_runner(workspace, turns, ask=ask)

    result = runner.run("Paint it.")

    assert result.status == "completed"
    assert asked == [
        Question(call_id="q1", question="Which colour?", options=("red", "blue"), run_id=runner.run_id)
    ]
    assert result.tool_calls == 1  # a question counts against the tool-call limit
    order = [event.kind for event in events]
    assert order[order.index("question") : order.index("question") + 2] == ["question", "answer"]
    answer = next(event for event in events if event.kind == "answer")
    assert answer.data == {"call_id": "q1", "answered": True, "answer": "blue"}
    (record,) = [r for r in records(audit_path) if r["event_type"] == "tool_result"]
    assert record["payload"]["tool_name"] == "ask_user"
    assert record["payload"]["result"] == {"answer": "blue"}


def test_a_question_without_anyone_to_answer_is_declined(workspace: Path) -> None:
    turns = [ASK, {"content": "I will pick.", "expect": ['{"declined": true}']}]
    runner, _, _, events = make_runner(workspace, turns)

    assert runner.run("Paint it.").status == "completed"
    answer = next(event for event in events if event.kind == "answer")
    assert answer.data == {"call_id": "q1", "answered": False, "answer": None}


@pytest.mark.parametrize("reply", [None, RuntimeError("the terminal closed")])
def test_a_question_the_user_declines_or_that_fails_is_declined(workspace: Path, reply: object) -> None:
    def ask(question: Question) -> str | None:
        if isinstance(reply, Exception):
            raise reply
        return None

    turns = [ASK, {"content": "I will pick.", "expect": ['{"declined": true}']}]
    runner, _, _, _ = make_runner(workspace, turns, ask=ask)

    assert runner.run("Paint it.").status == "completed"


def test_a_malformed_question_is_an_error_for_the_model(workspace: Path) -> None:
    bad = {"tool_calls": [{"tool_name": "ask_user", "arguments": {"question": ""}}]}
    turns = [bad, {"content": "ok", "expect": ["ask_user takes a question of 1 to 2000 characters"]}]
    asked: list[Question] = []
    runner, _, _, _ = make_runner(workspace, turns, ask=lambda q: asked.append(q) or "x")

    assert runner.run("Ask.").status == "completed"
    assert asked == []


# -- steering -----------------------------------------------------------------------------------------


def test_a_steering_message_reaches_the_next_model_call(workspace: Path) -> None:
    holder: list[AgentRunner] = []

    def steer_once(event: RunEvent) -> None:
        if event.kind == "model_response" and event.data["iteration"] == 1:
            assert holder[0].steer("Also count the files.")

    turns = [LIST, {"content": "There are none.", "expect": ["Also count the files."]}]
    runner, _, audit_path, events = make_runner(workspace, turns, sinks=[steer_once])
    holder.append(runner)

    result = runner.run("List the workspace.")

    assert result.status == "completed"
    order = [event.kind for event in events]
    steered = order.index("steered")
    assert order[steered + 1] == "model_request"
    assert events[steered].data == {"iteration": 2, "text": "Also count the files."}
    requests = [r["payload"] for r in records(audit_path) if r["event_type"] == "model_request"]
    assert [request["steered"] for request in requests] == [[], ["Also count the files."]]


def test_a_steering_message_before_the_run_joins_its_first_call(workspace: Path) -> None:
    runner, _, _, _ = make_runner(workspace, [{"content": "ok", "expect": ["Be quick."]}])

    assert runner.steer("Be quick.")
    assert runner.run("Do it.").status == "completed"


def test_steering_after_the_run_is_refused(workspace: Path) -> None:
    runner, _, _, _ = make_runner(workspace, [{"content": "ok"}])
    runner.run("Do it.")

    assert runner.steer("Too late.") is False
    with pytest.raises(ValueError, match=r"^A steering message must be a non-empty string\.$"):
        runner.steer(" ")


# -- cancellation -------------------------------------------------------------------------------------


def test_cancel_from_another_thread_abandons_a_model_call_in_flight(workspace: Path) -> None:
    holder: list[AgentRunner] = []

    def cancel_while_thinking(event: RunEvent) -> None:
        if event.kind == "model_request":
            threading.Timer(0.05, holder[0].cancel).start()

    slow = {"content": "Too late.", "delay_seconds": 30}
    runner, _, audit_path, events = make_runner(workspace, [slow], sinks=[cancel_while_thinking])
    holder.append(runner)

    started = time.monotonic()
    result = runner.run("Think hard.")

    assert time.monotonic() - started < 20  # the 30-second call was abandoned
    assert result.status == "failed"
    assert result.error_message == CANCELLED_MESSAGE
    assert result.metadata["cancelled"] is True
    assert result.final_answer is None
    assert [event.kind for event in events][-1] == "run_finished"
    assert "model_response" not in kinds(audit_path)
    (end,) = [r["payload"] for r in records(audit_path) if r["event_type"] == "run_end"]
    assert (end["status"], end["cancelled"]) == ("failed", True)
    assert runner.cancel() is False  # nothing left to cancel


def test_cancel_between_tool_calls_stops_before_the_next_step(workspace: Path) -> None:
    holder: list[AgentRunner] = []

    def cancel_after_first(event: RunEvent) -> None:
        if event.kind == "tool_result":
            threading.Thread(target=holder[0].cancel).start()
            time.sleep(0.05)

    two = {
        "tool_calls": [
            {"tool_name": "fs.write", "arguments": {"path": "one.txt", "content": "1"}},
            {"tool_name": "fs.write", "arguments": {"path": "two.txt", "content": "2"}},
        ]
    }
    runner, script, _, _ = make_runner(workspace, [two, {"content": "done"}], sinks=[cancel_after_first])
    holder.append(runner)

    result = runner.run("Write two files.")

    assert result.status == "failed"
    assert result.metadata["cancelled"] is True
    assert (workspace / "one.txt").exists()
    assert not (workspace / "two.txt").exists()
    assert script.position == 1
    assert result.tool_calls == 1


@pytest.mark.anyio
async def test_a_cancelled_asyncio_task_records_the_run_then_propagates(workspace: Path) -> None:
    runner, _, audit_path, events = make_runner(workspace, [{"content": "slow", "delay_seconds": 30}])

    async def main() -> None:
        task = asyncio.create_task(runner.arun("Think."))
        while not any(event.kind == "model_request" for event in runner.history):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    await main()

    assert runner.result is not None
    assert runner.result.status == "failed"
    assert runner.result.metadata["cancelled"] is True
    assert kinds(audit_path)[-1] == "run_end"
    assert events[-1].kind == "run_finished"
