"""teaagent.runner AgentRunner: every way a run ends, told by its audit log, its run log and its result."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from teaagent.audit import AuditLogger, verify_log
from teaagent.budget import RunBudget
from teaagent.cost_tracker import CostTracker
from teaagent.llm import (
    PRICE_FILE_FORMAT,
    PRICE_UNIT,
    LLMAdapter,
    LLMRequest,
    LLMResponse,
    LLMToolCall,
    ScriptedAdapter,
)
from teaagent.policy import ApprovalPolicy, PermissionMode
from teaagent.runner import RUN_STATUSES, AgentRunner, FinalAnswer, RunResult, ValidationResult
from teaagent.session import SessionStore, new_session
from teaagent.tools import ToolAnnotations, ToolRegistry, workspace_registry

READ_THEN_ANSWER: list[dict[str, Any]] = [
    {
        "content": "I will read the notes.",
        "tool_calls": [{"tool_name": "fs.read", "arguments": {"path": "notes.txt"}, "call_id": "c1"}],
        "input_tokens": 100,
        "output_tokens": 20,
    },
    {
        "content": "The notes say: remember the milk.",
        "expect": ["remember the milk"],
        "input_tokens": 150,
        "output_tokens": 10,
    },
]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kinds(path: Path) -> list[str]:
    return [record["event_type"] for record in records(path)]


def payloads(path: Path, event_type: str) -> list[dict[str, Any]]:
    return [record["payload"] for record in records(path) if record["event_type"] == event_type]


def make_runner(
    workspace: Path,
    turns: list[dict[str, Any]],
    *,
    mode: PermissionMode = PermissionMode.WORKSPACE_WRITE,
    registry: ToolRegistry | None = None,
    adapter: LLMAdapter | None = None,
    **options: Any,
) -> tuple[AgentRunner, ScriptedAdapter, Path]:
    script = ScriptedAdapter(turns)
    audit_path = workspace.parent / "audit" / "audit.jsonl"
    runner = AgentRunner(
        adapter=adapter if adapter is not None else script,
        registry=registry if registry is not None else workspace_registry(workspace),
        policy=ApprovalPolicy.for_workspace(workspace, mode=mode, use_presets=False),
        audit=AuditLogger(audit_path),
        **options,
    )
    return runner, script, audit_path


def write_prices(path: Path, *, input_per_1k: float, output_per_1k: float) -> Path:
    document = {
        "format": PRICE_FILE_FORMAT,
        "unit": PRICE_UNIT,
        "providers": {"scripted": {"default": {"input": input_per_1k, "output": output_per_1k}}},
    }
    path.write_text(json.dumps(document))
    return path


@pytest.fixture
def notes(workspace: Path) -> Path:
    (workspace / "notes.txt").write_text("remember the milk\n")
    return workspace


# -- completed ----------------------------------------------------------------------------------------


def test_a_run_reads_a_file_and_answers_with_what_the_model_was_shown(notes: Path) -> None:
    runner, script, _ = make_runner(notes, READ_THEN_ANSWER)

    result = runner.run("What do the notes say?")

    assert result.status == "completed"
    assert result.error_message is None
    assert result.final_answer is not None
    assert result.final_answer.content == "The notes say: remember the milk."
    assert result.final_answer.metadata["stop_reason"] == "end_turn"
    assert (result.iterations, result.tool_calls) == (2, 1)
    assert (result.input_tokens, result.output_tokens) == (250, 30)
    assert result.cost_cents == 0.0
    assert result.run_id == runner.run_id
    assert script.remaining == 0


def test_the_audit_log_tells_the_run_in_order_and_verifies(notes: Path) -> None:
    runner, _, audit_path = make_runner(notes, READ_THEN_ANSWER)

    result = runner.run("What do the notes say?")

    assert kinds(audit_path) == [
        "run_start",
        "model_request",
        "model_response",
        "cost_checkpoint",
        "tool_call",  # every call is recorded before it runs, read-only ones too
        "tool_result",
        "model_request",
        "model_response",
        "cost_checkpoint",
        "run_end",
    ]
    assert {record["run_id"] for record in records(audit_path)} == {runner.run_id}
    (start,) = payloads(audit_path, "run_start")
    assert start["task"] == "What do the notes say?"
    assert start["provider"] == "scripted"
    assert start["permission_mode"] == "workspace-write"
    assert "fs.read" in start["tools"]
    assert "ask_user" in start["tools"]
    first_response = payloads(audit_path, "model_response")[0]
    assert first_response["tool_calls"] == [
        {"call_id": "c1", "tool_name": "fs.read", "arguments": {"path": "notes.txt"}}
    ]
    assert [p["total_cents"] for p in payloads(audit_path, "cost_checkpoint")] == [0.0, 0.0]
    (end,) = payloads(audit_path, "run_end")
    assert end == {
        "status": "completed",
        "error_message": None,
        "iterations": 2,
        "tool_calls": 1,
        "input_tokens": 250,
        "output_tokens": 30,
        "cost_cents": 0.0,
        "cancelled": False,
    }
    report = verify_log(audit_path)
    assert report.ok
    assert result.metadata["last_audit_hash"] == report.last_event_hash
    assert result.metadata["audit_log"] == str(audit_path)


def test_the_run_log_records_each_model_call_for_the_cost_reports(notes: Path) -> None:
    runner, _, _ = make_runner(notes, READ_THEN_ANSWER, label="nightly")

    result = runner.run("What do the notes say?")

    log = Path(result.metadata["run_log"])
    assert log == notes / ".teaagent" / "runs" / f"{runner.run_id}.jsonl"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["type"] for line in lines] == ["run_start", "model_call", "model_call", "run_end"]
    assert lines[0]["label"] == "nightly"
    assert (lines[0]["provider"], lines[0]["model"]) == ("scripted", "scripted")
    assert [(line["input_tokens"], line["output_tokens"]) for line in lines[1:3]] == [(100, 20), (150, 10)]
    assert lines[-1]["status"] == "completed"
    assert CostTracker(notes).get_summary_by_label()["nightly"]["runs"] == 1


def test_without_a_run_log_nothing_is_written_to_the_workspace(notes: Path) -> None:
    runner, _, _ = make_runner(notes, READ_THEN_ANSWER, run_log=False)

    result = runner.run("What do the notes say?")

    assert result.status == "completed"
    assert result.metadata["run_log"] is None
    assert not (notes / ".teaagent").exists()


def test_the_model_is_offered_every_tool_with_its_schema_and_the_system_prompt(notes: Path) -> None:
    seen: list[LLMRequest] = []

    class Recorder(ScriptedAdapter):
        async def complete(self, request: LLMRequest) -> LLMResponse:
            seen.append(request)
            return await super().complete(request)

    runner, _, _ = make_runner(
        notes, [], adapter=Recorder([{"content": "hi"}]), system_prompt="Be brief.", max_output_tokens=77
    )
    runner.run("Say hi.")

    (request,) = seen
    assert [(m.role, m.content) for m in request.messages] == [("system", "Be brief."), ("user", "Say hi.")]
    assert request.max_tokens == 77
    assert request.tools is not None
    names = [tool["name"] for tool in request.tools]
    assert names == ["fs.read", "fs.write", "fs.list", "fs.search", "fs.delete", "shell.run", "ask_user"]
    assert request.tools[0]["input_schema"]["required"] == ["path"]


def test_a_reply_cut_at_max_tokens_still_completes_and_says_so(notes: Path) -> None:
    runner, _, _ = make_runner(notes, [{"content": "The answer is", "stop_reason": "max_tokens"}])

    result = runner.run("Answer at length.")

    assert result.status == "completed"
    assert result.final_answer is not None
    assert result.final_answer.metadata == {"stop_reason": "max_tokens", "iteration": 1, "truncated": True}


# -- tool failures go back to the model ---------------------------------------------------------------


def test_tool_failures_go_back_to_the_model_and_the_run_goes_on(notes: Path) -> None:
    turns = [
        {
            "tool_calls": [
                {"tool_name": "fs.nothing", "arguments": {}, "call_id": "a"},
                {"tool_name": "fs.read", "arguments": {"path": 3}, "call_id": "b"},
                {"tool_name": "fs.read", "arguments": {"path": "missing.txt"}, "call_id": "c"},
            ]
        },
        {
            "content": "Three failures seen.",
            "expect": [
                "no tool named 'fs.nothing' is registered",
                '"error_type": "SchemaValidationError"',
                "cannot read 'missing.txt'",
            ],
        },
    ]
    runner, _, audit_path = make_runner(notes, turns)

    result = runner.run("Try things.")

    assert result.status == "completed"
    assert result.tool_calls == 3
    errors = payloads(audit_path, "tool_error")
    assert [(e["call_id"], e["stage"]) for e in errors] == [
        ("a", "arguments"),
        ("b", "arguments"),
        ("c", "call"),
    ]


def test_a_handler_that_raises_is_an_error_result_for_the_model(workspace: Path) -> None:
    registry = ToolRegistry()

    def broken(arguments: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("disk on fire")

    registry.register(
        "broken.tool",
        "Breaks.",
        {"type": "object"},
        {"type": "object"},
        ToolAnnotations(read_only=True),
        broken,
    )
    turns = [
        {"tool_calls": [{"tool_name": "broken.tool", "arguments": {}}]},
        {"content": "It broke.", "expect": ['"error": "disk on fire"', '"error_type": "RuntimeError"']},
    ]
    runner, _, _ = make_runner(workspace, turns, registry=registry)

    assert runner.run("Use the tool.").status == "completed"


def test_a_long_tool_result_is_cut_before_it_reaches_the_model(workspace: Path) -> None:
    (workspace / "big.txt").write_text("x" * 150_000)
    turns = [
        {"tool_calls": [{"tool_name": "fs.read", "arguments": {"path": "big.txt"}}]},
        {"content": "Big.", "expect": ["more characters cut by the runner]"]},
    ]
    runner, _, _ = make_runner(workspace, turns)

    assert runner.run("Read it.").status == "completed"


def test_call_ids_a_model_reuses_are_made_unique_for_the_gate(notes: Path) -> None:
    call = {"tool_name": "fs.read", "arguments": {"path": "notes.txt"}, "call_id": "same"}
    runner, _, audit_path = make_runner(
        notes, [{"tool_calls": [call]}, {"tool_calls": [call]}, {"content": "ok"}]
    )

    runner.run("Read twice.")

    assert [p["call_id"] for p in payloads(audit_path, "tool_result")] == ["same", "same-2"]


# -- approval_denied ----------------------------------------------------------------------------------


def test_a_denied_call_ends_the_run_and_the_tool_never_runs(notes: Path) -> None:
    turns = [
        {
            "content": "Cleaning up.",
            "tool_calls": [{"tool_name": "fs.delete", "arguments": {"path": "notes.txt"}}],
        },
        {"content": "Deleted."},
    ]
    runner, script, audit_path = make_runner(notes, turns)

    result = runner.run("Delete the notes.")

    assert result.status == "approval_denied"
    assert result.error_message == "fs.delete is destructive and the permission mode is workspace-write."
    assert result.final_answer is None
    assert (result.iterations, result.tool_calls) == (1, 1)
    assert (notes / "notes.txt").exists()
    assert script.position == 1  # the model is not asked again
    assert kinds(audit_path)[-2:] == ["approval_denied", "run_end"]
    assert payloads(audit_path, "run_end")[0]["status"] == "approval_denied"
    log = Path(result.metadata["run_log"]).read_text().splitlines()
    assert json.loads(log[-1])["status"] == "approval_denied"


def test_in_read_only_mode_a_write_is_denied(workspace: Path) -> None:
    turns = [{"tool_calls": [{"tool_name": "fs.write", "arguments": {"path": "a.txt", "content": "x"}}]}]
    runner, _, _ = make_runner(workspace, turns, mode=PermissionMode.READ_ONLY)

    result = runner.run("Write a file.")

    assert result.status == "approval_denied"
    assert result.error_message == "fs.write is not read-only and the permission mode is read-only."
    assert not (workspace / "a.txt").exists()


# -- limit_exceeded -----------------------------------------------------------------------------------

LIST = {"tool_calls": [{"tool_name": "fs.list", "arguments": {}}]}


def test_a_model_that_never_stops_is_stopped_at_the_iteration_limit(workspace: Path) -> None:
    runner, script, audit_path = make_runner(workspace, [LIST] * 5, budget=RunBudget(max_iterations=3))

    result = runner.run("List forever.")

    assert result.status == "limit_exceeded"
    assert result.error_message == "The run stopped at its limit of 3 iterations."
    assert (result.iterations, result.tool_calls) == (3, 3)
    assert script.position == 3
    assert kinds(audit_path)[-2:] == ["iteration_limit", "run_end"]
    assert payloads(audit_path, "iteration_limit") == [{"iteration": 4, "max_iterations": 3}]


def test_a_run_that_answers_at_its_last_allowed_iteration_completes(workspace: Path) -> None:
    runner, _, audit_path = make_runner(
        workspace, [LIST, LIST, {"content": "done"}], budget=RunBudget(max_iterations=3)
    )

    result = runner.run("List twice.")

    assert result.status == "completed"
    assert result.iterations == 3
    assert "iteration_limit" not in kinds(audit_path)


def test_the_tool_call_past_the_limit_is_refused_before_it_runs(workspace: Path) -> None:
    turns = [
        {
            "tool_calls": [
                {"tool_name": "fs.write", "arguments": {"path": "one.txt", "content": "1"}, "call_id": "w1"},
                {"tool_name": "fs.write", "arguments": {"path": "two.txt", "content": "2"}, "call_id": "w2"},
            ]
        },
        {"content": "done"},
    ]
    runner, _, audit_path = make_runner(workspace, turns, budget=RunBudget(max_tool_calls=1))

    result = runner.run("Write two files.")

    assert result.status == "limit_exceeded"
    assert result.error_message == "The run stopped at its limit of 1 tool call."
    assert result.tool_calls == 1
    assert (workspace / "one.txt").exists()
    assert not (workspace / "two.txt").exists()
    assert payloads(audit_path, "tool_call_limit") == [
        {"tool_name": "fs.write", "call_id": "w2", "max_tool_calls": 1}
    ]
    assert kinds(audit_path)[-2:] == ["tool_call_limit", "run_end"]


def test_a_run_may_make_exactly_its_tool_call_limit(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [LIST, {"content": "done"}], budget=RunBudget(max_tool_calls=1))

    assert runner.run("List once.").status == "completed"


def test_with_a_tool_call_limit_of_zero_no_tool_runs(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [LIST], budget=RunBudget(max_tool_calls=0))

    result = runner.run("List.")

    assert result.status == "limit_exceeded"
    assert result.error_message == "The run may not call tools: its tool-call limit is 0."
    assert result.tool_calls == 0


# -- cost_exceeded ------------------------------------------------------------------------------------


def test_zero_cost_cap_blocks_positive_cost_run(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "TEAAGENT_PRICES_FILE",
        str(write_prices(tmp_path / "prices.json", input_per_1k=0.001, output_per_1k=0.002)),
    )
    runner, script, audit_path = make_runner(
        workspace, [{"content": "never said"}], budget=RunBudget(max_estimated_cost_cents=0)
    )

    result = runner.run("Say something.")

    assert result.status == "cost_exceeded"
    assert result.error_message is not None
    assert result.error_message.startswith("This model call could cost up to ")
    assert result.error_message.endswith("cents, but the run's cost cap is 0 cents.")
    assert script.position == 0  # the model call was never made
    assert (result.iterations, result.cost_cents, result.input_tokens) == (0, 0.0, 0)
    assert "model_request" not in kinds(audit_path)
    assert payloads(audit_path, "cost_checkpoint")[0]["refused"] == "preflight"


def test_zero_cost_cap_blocks_a_priced_provider_of_any_adapter(workspace: Path) -> None:
    class PricedModel(LLMAdapter):
        provider = "openai"
        model = "gpt-4.1"
        calls = 0

        async def complete(self, request: LLMRequest) -> LLMResponse:
            PricedModel.calls += 1
            return LLMResponse("x", "end_turn", [], 1, 1, 0.01)

        async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
            yield "x"

    runner, _, _ = make_runner(
        workspace, [], adapter=PricedModel(), budget=RunBudget(max_estimated_cost_cents=0)
    )

    assert runner.run("Say something.").status == "cost_exceeded"
    assert PricedModel.calls == 0


def test_zero_cost_cap_lets_a_free_model_run(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [{"content": "free"}], budget=RunBudget(max_estimated_cost_cents=0))

    assert runner.run("Say something.").status == "completed"


def test_a_call_that_could_take_the_run_past_its_cap_is_not_made(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # $10 per 1k output tokens: 100 output tokens allowed per call is at most 100 cents a call.
    monkeypatch.setenv(
        "TEAAGENT_PRICES_FILE",
        str(write_prices(tmp_path / "prices.json", input_per_1k=0.0, output_per_1k=10.0)),
    )
    turn = {**LIST, "output_tokens": 60}  # each call really costs 60 cents
    runner, script, _ = make_runner(
        workspace, [turn, turn, turn], budget=RunBudget(max_estimated_cost_cents=150), max_output_tokens=100
    )

    result = runner.run("List.")

    # Call 1: 0 + 100 <= 150 runs (60 spent); call 2: 60 + 100 > 150 is refused before it is made.
    assert result.status == "cost_exceeded"
    assert script.position == 1
    assert result.cost_cents == pytest.approx(60.0)
    assert result.error_message == (
        "This model call could cost up to 100 cents, which would bring the run to 160 cents, "
        "above its cost cap of 150 cents."
    )


def test_a_call_that_cost_more_than_its_estimate_stops_the_run(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "TEAAGENT_PRICES_FILE",
        str(write_prices(tmp_path / "prices.json", input_per_1k=0.0, output_per_1k=10.0)),
    )
    # The model reports more output than it was allowed (a provider that overshoots max_tokens).
    runner, _, _ = make_runner(
        workspace,
        [{"content": "an answer", "output_tokens": 20}],
        budget=RunBudget(max_estimated_cost_cents=15),
        max_output_tokens=10,
    )

    result = runner.run("Answer.")

    assert result.status == "cost_exceeded"
    assert result.final_answer is None
    assert result.error_message == "The run spent 20 cents, above its cost cap of 15 cents."


# -- failed -------------------------------------------------------------------------------------------


def test_a_model_error_fails_the_run_with_its_sentence(workspace: Path) -> None:
    runner, _, audit_path = make_runner(workspace, [LIST])

    result = runner.run("List.")

    assert result.status == "failed"
    assert result.error_message == "The script <script> has no turn 2: all 1 turn was played."
    assert (result.iterations, result.tool_calls) == (2, 1)
    assert payloads(audit_path, "model_response")[-1] == {"iteration": 2, "error": result.error_message}
    assert kinds(audit_path)[-1] == "run_end"


def test_a_tool_result_that_never_reaches_the_model_is_caught_by_the_script(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("something else\n")
    runner, _, _ = make_runner(workspace, READ_THEN_ANSWER)

    result = runner.run("What do the notes say?")

    assert result.status == "failed"
    assert result.error_message == (
        "Turn 2 of the script <script> expects the conversation to contain 'remember the milk', "
        "but it does not."
    )


def test_a_broken_audit_log_stops_tool_calls(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "not-a-folder").write_text("")
    audit = AuditLogger(tmp_path / "not-a-folder" / "audit.jsonl")
    runner = AgentRunner(
        adapter=ScriptedAdapter(
            [{"tool_calls": [{"tool_name": "fs.write", "arguments": {"path": "a", "content": "x"}}]}]
        ),
        registry=workspace_registry(workspace),
        policy=ApprovalPolicy.for_workspace(workspace, use_presets=False),
        audit=audit,
    )

    result = runner.run("Write.")

    assert result.status == "failed"
    assert result.error_message is not None
    assert result.error_message.startswith("The audit log cannot be written, so no tool is called: ")
    assert not (workspace / "a").exists()
    assert "audit_disk_error" in result.metadata


# -- sessions -----------------------------------------------------------------------------------------


def test_a_session_carries_the_conversation_and_keeps_the_new_turns(notes: Path) -> None:
    store = SessionStore(notes)
    session = new_session(label="milk", session_id="s1")
    session.add_message("user", "My name is Ada.")
    session.add_message("assistant", "Hello Ada.")
    store.save(session)
    turns = [{"content": "You are Ada.", "expect": ["My name is Ada.", "Hello Ada."]}]
    runner, _, _ = make_runner(notes, turns, session_store=store, session=store.load("s1"))

    result = runner.run("Who am I?")

    assert result.status == "completed"
    assert result.metadata["session_id"] == "s1"
    saved = store.load("s1")
    assert saved is not None
    assert [(m.role, m.content) for m in saved.messages] == [
        ("user", "My name is Ada."),
        ("assistant", "Hello Ada."),
        ("user", "Who am I?"),
        ("assistant", "You are Ada."),
    ]


def test_a_failed_run_keeps_the_task_in_its_session(workspace: Path) -> None:
    store = SessionStore(workspace)
    runner, _, _ = make_runner(workspace, [], session_store=store, session=new_session(session_id="s2"))

    assert runner.run("Anything?").status == "failed"
    saved = store.load("s2")
    assert saved is not None
    assert [(m.role, m.content) for m in saved.messages] == [("user", "Anything?")]


# -- the runner's own rules ---------------------------------------------------------------------------


def test_every_status_is_a_run_status() -> None:
    assert set(RUN_STATUSES) == {"completed", "failed", "approval_denied", "limit_exceeded", "cost_exceeded"}


def test_a_runner_makes_one_run(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [{"content": "one"}, {"content": "two"}])
    runner.run("First.")

    with pytest.raises(
        RuntimeError, match=r"^An AgentRunner makes one run; make a new one for the next task\.$"
    ):
        runner.run("Second.")


@pytest.mark.anyio
async def test_run_inside_an_event_loop_points_to_arun(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [{"content": "one"}])

    async def inside() -> RunResult:
        with pytest.raises(
            RuntimeError, match=r"cannot be called inside an event loop; await arun\(\) instead\.$"
        ):
            runner.run("Task.")
        return await runner.arun("Task.")

    assert (await inside()).status == "completed"


def test_a_run_needs_a_task(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [{"content": "one"}])

    with pytest.raises(ValueError, match=r"^A run needs a task: a non-empty string\.$"):
        runner.run("  ")


def test_a_cost_cap_needs_a_known_provider(workspace: Path) -> None:
    class Anonymous(LLMAdapter):
        async def complete(self, request: LLMRequest) -> LLMResponse:
            return LLMResponse("x", "end_turn", [], 1, 1, 0.0)

        async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
            yield "x"

    with pytest.raises(
        ValueError, match=r"^The run has a cost cap but its provider is unknown; pass provider="
    ):
        make_runner(workspace, [], adapter=Anonymous())
    runner, _, _ = make_runner(
        workspace, [], adapter=Anonymous(), budget=RunBudget(max_estimated_cost_cents=None)
    )
    assert runner.run("Go.").status == "completed"
    named, _, _ = make_runner(workspace, [], adapter=Anonymous(), provider="scripted")
    assert named.provider == "scripted"


def test_the_runner_refuses_a_tool_that_shadows_ask_user(workspace: Path) -> None:
    registry = ToolRegistry()
    registry.register(
        "ask_user", "Mine.", {"type": "object"}, {"type": "object"}, ToolAnnotations(), lambda a: {}
    )

    with pytest.raises(
        ValueError, match=r"^The registry holds a tool named 'ask_user', which the runner provides\.$"
    ):
        make_runner(workspace, [], registry=registry)


def test_a_run_id_must_be_able_to_name_the_run_log(workspace: Path) -> None:
    with pytest.raises(ValueError, match=r"run id 'a/b' must be 1 to 64 letters"):
        make_runner(workspace, [], run_id="a/b")


def test_the_run_id_defaults_to_the_audit_loggers(workspace: Path) -> None:
    runner, _, _ = make_runner(workspace, [])

    assert runner.run_id == runner.audit.run_id


def test_arguments_that_are_not_an_object_are_refused_by_the_schema_not_replaced(workspace: Path) -> None:
    class Sloppy(LLMAdapter):
        provider = "scripted"
        model = "scripted"
        turn = 0

        async def complete(self, request: LLMRequest) -> LLMResponse:
            self.turn += 1
            if self.turn == 1:
                call = LLMToolCall(call_id="c1", tool_name="fs.list", arguments=".")  # type: ignore[arg-type]
                return LLMResponse("", "tool_use", [call], 1, 1, 0.0)
            assert '"error_type": "SchemaValidationError"' in request.messages[-1].content
            return LLMResponse("ok", "end_turn", [], 1, 1, 0.0)

        async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
            yield "x"

    runner, _, audit_path = make_runner(workspace, [], adapter=Sloppy())

    assert runner.run("List.").status == "completed"
    assert payloads(audit_path, "tool_error")[0]["stage"] == "arguments"


# -- post-run validation ------------------------------------------------------------------------------


def test_a_validator_that_passes_is_audited_and_the_run_completes(notes: Path) -> None:
    seen: list[str] = []

    def validator(answer: FinalAnswer) -> ValidationResult:
        seen.append(answer.content)
        return ValidationResult(ok=True, detail="3 tests passed")

    runner, _, audit_path = make_runner(notes, READ_THEN_ANSWER, validator=validator)

    result = runner.run("What do the notes say?")

    assert result.status == "completed"
    assert seen == ["The notes say: remember the milk."]
    assert payloads(audit_path, "validation_result") == [{"ok": True, "detail": "3 tests passed"}]
    assert kinds(audit_path)[-2:] == ["validation_result", "run_end"]


@pytest.mark.parametrize(
    ("verdict", "message"),
    [
        (False, "Post-run validation failed: the validator said no."),
        (ValidationResult(ok=False, detail="2 tests failed"), "Post-run validation failed: 2 tests failed."),
    ],
)
def test_a_validator_that_fails_fails_the_run(notes: Path, verdict: object, message: str) -> None:
    runner, _, audit_path = make_runner(notes, READ_THEN_ANSWER, validator=lambda answer: verdict)

    result = runner.run("What do the notes say?")

    assert result.status == "failed"
    assert result.error_message == message
    assert result.final_answer is not None  # the answer stays on record beside the verdict
    assert payloads(audit_path, "validation_result")[0]["ok"] is False


def test_a_validator_that_raises_has_not_validated_anything(notes: Path) -> None:
    def broken(answer: FinalAnswer) -> bool:
        raise RuntimeError("no test runner")

    runner, _, audit_path = make_runner(notes, READ_THEN_ANSWER, validator=broken)

    result = runner.run("What do the notes say?")

    assert result.status == "failed"
    assert payloads(audit_path, "validation_result") == [
        {"ok": False, "detail": "the validator raised RuntimeError: no test runner"}
    ]


def test_a_run_that_did_not_complete_is_not_validated(workspace: Path) -> None:
    called: list[FinalAnswer] = []
    runner, _, audit_path = make_runner(workspace, [], validator=lambda answer: called.append(answer) is None)

    result = runner.run("anything")

    assert result.status == "failed"
    assert called == []
    assert "validation_result" not in kinds(audit_path)
