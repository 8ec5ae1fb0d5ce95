"""teaagent.tui.TeaAgentTUI driven through input_fn/output_fn: every command, the runs, the state file.

A :class:`Terminal` types the lines a person would and records what is printed, exactly as a
``print``-like function receives it; the model is the offline scripted provider, one script for the
whole REPL session (each model call plays the next turn). The quorum, with real relays and
approvers, is in ``test_tui_quorum.py``; the real ``teaagent tui`` on a terminal in ``test_tui_tmux.py``.
"""

from __future__ import annotations

import _thread
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from agent_support import write_node
from words_support import moment_re

from teaagent.config import load_config
from teaagent.llm import PRICE_FILE_FORMAT, PRICE_UNIT, LLMAdapter, ScriptedAdapter
from teaagent.policy import ApprovalPresetStore, PermissionMode
from teaagent.session import SessionStore
from teaagent.tui import COMMANDS, STATE_FILE, SUBAGENT_TOOL, TeaAgentTUI

WAIT = 20.0  # seconds a test waits for what takes well under one


class Terminal:
    """An ``input``/``print`` pair: it types ``lines`` (an exception in the list is raised instead)."""

    def __init__(self, lines: Iterable[object] = ()) -> None:
        self.lines = list(lines)
        self.chunks: list[str] = []
        self.calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def input(self, prompt: str = "") -> str:
        with self._lock:
            self.prompts.append(prompt)
            self.chunks.append(prompt)
            if not self.lines:
                raise EOFError
            line = self.lines.pop(0)
        if callable(line) and not isinstance(line, type):
            line = line()
        if isinstance(line, BaseException) or (isinstance(line, type) and issubclass(line, BaseException)):
            raise line
        with self._lock:
            self.chunks.append(f"{line}\n")
        return str(line)

    def print(self, *args: object, end: str = "\n", flush: bool = False) -> None:
        with self._lock:
            self.calls.append((args, {"end": end, "flush": flush}))
            self.chunks.append(" ".join(str(arg) for arg in args) + end)

    @property
    def text(self) -> str:
        with self._lock:
            return "".join(self.chunks)

    def wait_for(self, needle: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text:
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} never appeared in:\n{self.text}")
            time.sleep(0.02)


def scripted(turns: list[dict[str, Any]]) -> LLMAdapter:
    return ScriptedAdapter.from_json(json.dumps(turns))


def make(
    workspace: Path,
    terminal: Terminal,
    turns: list[dict[str, Any]] | None = None,
    *,
    adapter: LLMAdapter | None = None,
    **options: Any,
) -> TeaAgentTUI:
    shared = adapter if adapter is not None else scripted(turns or [])
    options.setdefault("adapter_factory", lambda provider, model: shared)
    return TeaAgentTUI(root=workspace, input_fn=terminal.input, output_fn=terminal.print, **options)


def repl(
    workspace: Path, lines: Iterable[object], turns: list[dict[str, Any]] | None = None, **options: Any
) -> tuple[int, str, TeaAgentTUI]:
    terminal = Terminal(lines)
    tui = make(workspace, terminal, turns, **options)
    code = tui.run_repl()
    return code, terminal.text, tui


READ = {
    "content": "Let me read it.",
    "tool_calls": [{"tool_name": "fs.read", "arguments": {"path": "notes.txt"}}],
}
DELETE = {
    "content": "Deleting.",
    "tool_calls": [{"tool_name": "fs.delete", "arguments": {"path": "notes.txt"}}],
}


@pytest.fixture
def notes(workspace: Path) -> Path:
    (workspace / "notes.txt").write_text("remember the milk\n")
    return workspace


def write_prices(path: Path, models: Mapping[str, float], default: float = 0.0) -> Path:
    path.write_text(
        json.dumps(
            {
                "format": PRICE_FILE_FORMAT,
                "unit": PRICE_UNIT,
                "providers": {
                    "scripted": {
                        "default": {"input": default, "output": default},
                        "models": {name: {"input": price, "output": price} for name, price in models.items()},
                    }
                },
            }
        )
    )
    return path


# -- the REPL ------------------------------------------------------------------------------------------


def test_a_task_runs_through_the_tools_and_the_answer_is_shown(notes: Path) -> None:
    turns = [READ, {"content": "The notes say: remember the milk.", "expect": ["remember the milk"]}]

    code, out, tui = repl(notes, ["What do the notes say?"], turns)

    assert code == 0
    assert '→ fs.read {"path": "notes.txt"}' in out
    assert '← fs.read {"content": "remember the milk\\n", "size": 18, "truncated": false}' in out
    assert "The notes say: remember the milk.\n" in out
    assert "completed · 2 turns · 1 tool call · 0.0000 cents · answered by scripted/scripted\n" in out
    assert out.endswith("End of input: goodbye.\n")
    assert [message.role for message in tui.session.messages] == ["user", "assistant", "tool", "assistant"]


def test_the_end_of_input_ends_the_repl_cleanly(workspace: Path) -> None:
    code, out, _ = repl(workspace, [])
    assert code == 0
    assert out.splitlines()[-1] == "End of input: goodbye."


def test_an_unknown_command_is_one_line_and_the_repl_goes_on(workspace: Path) -> None:
    code, out, tui = repl(workspace, ["/frobnicate now", "/quit"])
    assert code == 0
    assert "Unknown command /frobnicate; /help lists the commands.\n" in out
    assert out.endswith("Goodbye.\n")
    assert tui._handle_tui_command("/frobnicate") is False
    assert tui._handle_tui_command("not a command") is False  # a task, which is no command


def test_help_lists_every_command_with_its_text(workspace: Path) -> None:
    code, out, _ = repl(workspace, ["/help", "/help resume", "/help /nothing"])
    assert code == 0
    for command in COMMANDS:
        assert re.search(rf"^  {re.escape(command.usage)} +{re.escape(command.help)}$", out, re.M), command
    names = {command.name for command in COMMANDS}
    assert names == {
        "/help", "/quit", "/new", "/sessions", "/resume", "/model", "/permission", "/approvals",
        "/cost", "/usage", "/context", "/compact", "/tools", "/quorum", "/inbox", "/approve", "/deny",
    }  # fmt: skip
    assert "/resume ID  Go back to a saved session (a unique prefix of its id will do).\n" in out
    assert "There is no command /nothing; /help lists them.\n" in out


def test_every_command_is_handled(workspace: Path) -> None:
    terminal = Terminal()
    tui = make(workspace, terminal, [{"content": "A summary."}])
    for command in COMMANDS:
        if command.name != "/quit":
            assert tui._handle_tui_command(command.name) is True, command.name
    assert tui._handle_tui_command("/quit") is True
    text = terminal.text
    assert "Usage: /resume ID (/sessions lists them).\n" in text
    assert "Usage: /approve ID [REASON] (/inbox lists the requests).\n" in text
    assert "Usage: /deny ID [REASON] (/inbox lists the requests).\n" in text
    assert "The inbox is a node's: start with teaagent tui --config node.toml.\n" in text
    assert text.endswith("Goodbye.\n")


def test_a_provider_error_is_a_message_and_the_repl_goes_on(notes: Path) -> None:
    code, out, _ = repl(notes, ["first", "second", "/usage"], [{"content": "One answer only."}])
    assert code == 0
    assert "One answer only." in out
    assert "The run ended failed: The script <script> has no turn 2: all 1 turn was played.\n" in out
    assert re.search(r"^scripted/scripted +2 +2 +0 ", out, re.M)  # both runs counted, the REPL went on


def test_a_missing_api_key_is_a_message_and_the_repl_goes_on(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    terminal = Terminal(["hello", "/model scripted", "/model"])
    tui = TeaAgentTUI(root=workspace, provider="openai", input_fn=terminal.input, output_fn=terminal.print)
    assert tui.run_repl() == 0
    assert "The run cannot start: Set OPENAI_API_KEY to use the openai provider.\n" in terminal.text
    assert "Model: scripted/scripted.\n" in terminal.text


def test_ctrl_c_at_the_prompt_is_a_message_and_twice_leaves(workspace: Path) -> None:
    code, out, _ = repl(workspace, [KeyboardInterrupt, "/quorum", KeyboardInterrupt, KeyboardInterrupt])
    assert code == 0
    assert out.count("(Ctrl-C again to leave.) Type /quit or press Ctrl-D to leave.\n") == 1
    assert "The quorum is not enabled here: no call needs peers.\n" in out
    assert out.endswith("Goodbye.\n")


def test_ctrl_c_during_a_run_cancels_it(workspace: Path) -> None:
    terminal = Terminal(["think hard"])
    tui = make(workspace, terminal, [{"content": "Never said.", "delay_seconds": 30}], progress=True)

    def interrupt() -> None:
        terminal.wait_for("thinking… (turn 1)")
        _thread.interrupt_main()

    helper = threading.Thread(target=interrupt, daemon=True)
    helper.start()
    started = time.monotonic()
    code = tui.run_repl()
    helper.join(timeout=WAIT)

    assert code == 0
    assert time.monotonic() - started < 15  # not the model's 30 seconds
    assert "Cancelling the run…\n" in terminal.text
    assert "The run ended failed: The run was cancelled.\n" in terminal.text
    assert "Never said." not in terminal.text


def test_run_repl_never_raises_even_when_output_fails(workspace: Path) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the screen is gone")

    tui = TeaAgentTUI(root=workspace, input_fn=lambda prompt: "/help", output_fn=broken)
    assert tui.run_repl() == 1


def test_a_failing_input_function_ends_the_repl_with_1(workspace: Path) -> None:
    terminal = Terminal()

    def broken(prompt: str) -> str:
        raise OSError("the keyboard is gone")

    tui = TeaAgentTUI(root=workspace, input_fn=broken, output_fn=terminal.print)
    assert tui.run_repl() == 1
    assert "The TUI failed: OSError: the keyboard is gone\n" in terminal.text


def test_the_initial_task_runs_first_then_the_repl(workspace: Path) -> None:
    code, out, _ = repl(workspace, ["/quit"], [{"content": "Done first."}], initial_task="do it")
    assert code == 0
    assert out.index("Done first.") < out.index("› /quit")


# -- the seed's parameters --------------------------------------------------------------------------

PROVIDERS = "openai, anthropic, openai-compatible, scripted"
MODES = "read-only, workspace-write, prompt, allow, danger-full-access"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"root": "missing-folder"}, "root must be a readable directory: "),
        ({"provider": "nope"}, f"Unknown LLM provider 'nope'; choose one of: {PROVIDERS}."),
        ({"permission_mode": "yolo"}, f"permission mode 'yolo' is not one of {MODES}."),
        ({"heartbeat": -1}, "heartbeat must be a whole number of seconds >= 0, not -1."),
    ],
)
def test_the_preconditions_are_checked_when_built(
    workspace: Path, options: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace)
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        TeaAgentTUI(**options)


def test_prompt_mode_asks_once_session_or_deny(notes: Path) -> None:
    for name in ("other.txt", "third.txt"):
        (notes / name).write_text("x")

    def delete(path: str) -> dict[str, Any]:
        return {
            "content": "Deleting.",
            "tool_calls": [{"tool_name": "fs.delete", "arguments": {"path": path}}],
        }

    turns = [
        delete("notes.txt"),  # denied: that run ends there
        delete("notes.txt"),
        {"content": "Deleted."},
        delete("other.txt"),
        {"content": "Deleted the other."},
        delete("third.txt"),
        {"content": "Deleted the third."},
    ]
    lines = ["delete it", "d", "delete it", "o", "delete the other", "s", "delete the third", "/approvals"]
    terminal = Terminal(lines)
    tui = make(notes, terminal, turns)
    assert tui.run_repl() == 0
    out = terminal.text
    asked = [prompt for prompt in terminal.prompts if "allow it?" in prompt]
    assert len(asked) == 3  # deny, once, session; the third delete ran on the session approval
    assert "The run ended approval_denied: fs.delete was denied at the approval prompt.\n" in out
    assert "✓ fs.delete approved (once)\n" in out
    assert "✓ fs.delete approved (session)\n" in out
    assert [(notes / name).exists() for name in ("notes.txt", "other.txt", "third.txt")] == [False] * 3
    assert "Approved for this session: fs.delete.\n" in out


def test_approvals_lists_a_workspace_presets_expiry_as_a_date_with_the_time_left(notes: Path) -> None:
    expires_at = int(time.time()) + 7200
    preset = ApprovalPresetStore(notes).add("fs.*", expires_at=expires_at)
    code, out, _ = repl(notes, ["/approvals", "/quit"])
    assert code == 0
    (line,) = [line for line in out.splitlines() if preset.preset_id in line]
    # UTC with a Z and how far off, as every other time a person reads, not the local wall clock.
    until = moment_re(expires_at, r"in 1h 59m|in 2h 00m")
    assert re.fullmatch(rf"  {preset.preset_id}  fs\.\*, until {until}", line), line


def test_ctrl_c_at_an_approval_prompt_denies_and_the_repl_goes_on(notes: Path) -> None:
    code, out, _ = repl(notes, ["delete it", KeyboardInterrupt, "/quit"], [DELETE])
    assert code == 0
    assert "(Ctrl-C: no.)" in out
    assert "The run ended approval_denied: fs.delete was denied at the approval prompt.\n" in out
    assert (notes / "notes.txt").exists()
    assert out.endswith("Goodbye.\n")


def test_allow_destructive_approves_without_asking(notes: Path) -> None:
    terminal = Terminal(["delete it"])
    tui = make(notes, terminal, [DELETE, {"content": "Deleted."}], allow_destructive=True)
    assert tui.run_repl() == 0
    assert not any("allow it?" in prompt for prompt in terminal.prompts)
    assert not (notes / "notes.txt").exists()


def test_the_permission_mode_decides_and_permission_changes_it(notes: Path) -> None:
    turns = [DELETE, {**DELETE, "content": "Again."}, {"content": "Deleted."}]
    code, out, tui = repl(
        notes,
        ["delete it", "/permission danger-full-access", "delete it", "/permission"],
        turns,
        permission_mode=PermissionMode.READ_ONLY,
    )
    assert code == 0
    assert (
        "The run ended approval_denied: fs.delete is destructive and the permission mode is read-only.\n"
        in out
    )
    assert "Permission mode: danger-full-access (does anything without asking" in out
    assert not (notes / "notes.txt").exists()
    assert re.search(r"^ \* danger-full-access ", out, re.M)
    assert tui.permission_mode is PermissionMode.DANGER_FULL_ACCESS
    assert "'yolo' is not a permission mode" in repl(notes, ["/permission yolo"])[1]  # fmt: skip


def test_stream_prints_the_reply_as_it_arrives(workspace: Path) -> None:
    terminal = Terminal(["talk"])
    tui = make(workspace, terminal, [{"content": "one two three four"}], stream=True)
    assert tui.run_repl() == 0
    pieces = [args[0] for args, options in terminal.calls if options["end"] == "" and options["flush"]]
    assert "".join(pieces).strip() == "one two three four"
    assert len(pieces) >= 4  # word by word, not the whole reply at once
    assert terminal.text.count("one two three four") == 1


def test_progress_and_heartbeat_lines_while_the_model_thinks(workspace: Path) -> None:
    code, out, _ = repl(
        workspace, ["slowly"], [{"content": "Finally.", "delay_seconds": 2.6}], progress=True, heartbeat=1
    )
    assert code == 0
    assert "⠿ thinking… (turn 1) 0s · Ctrl-C cancels\n" in out
    beats = re.findall(r"^… still waiting for the model \(turn 1\), (\d+)s$", out, re.M)
    assert len(beats) >= 2, out
    assert out.index("still waiting") < out.index("Finally.")


def test_no_heartbeat_and_no_progress_by_default(workspace: Path) -> None:
    code, out, _ = repl(workspace, ["slowly"], [{"content": "Finally.", "delay_seconds": 1.5}])
    assert code == 0
    assert "still waiting" not in out
    assert "thinking" not in out


def test_a_subagent_runs_a_child_task_shown_nested(notes: Path) -> None:
    turns = [
        {
            "content": "I will delegate.",
            "tool_calls": [{"tool_name": SUBAGENT_TOOL, "arguments": {"task": "Read notes.txt."}}],
        },
        READ,  # the child's turn 1
        {"content": "The note is about milk.", "expect": ["remember the milk"]},  # the child's answer
        {"content": "The helper says: milk.", "expect": ["The note is about milk."]},  # the parent's
    ]
    code, out, _ = repl(notes, ["what is in the notes?", "/usage"], turns, subagent=True)
    assert code == 0
    assert f"→ {SUBAGENT_TOOL} " in out
    assert "  ↳ sub-task (run " in out
    assert '  │ → fs.read {"path": "notes.txt"}' in out
    assert "  │ The note is about milk." in out
    assert "  ↳ sub-task completed · 2 turns · 1 tool call" in out
    assert "The helper says: milk." in out
    assert re.search(r"^scripted/scripted +2 +4 +2 ", out, re.M)  # parent and child, each a run


def test_tools_lists_the_tools_and_the_subagent_tool(workspace: Path) -> None:
    out = repl(workspace, ["/tools"], subagent=True)[1]
    assert re.search(r"^fs\.delete +destructive ", out, re.M)
    assert re.search(r"^fs\.read +read-only ", out, re.M)
    assert re.search(rf"^{re.escape(SUBAGENT_TOOL)} +read-only ", out, re.M)
    assert re.search(r"^ask_user +read-only +Ask you a question \(built in\)$", out, re.M)
    assert SUBAGENT_TOOL not in repl(workspace, ["/tools"])[1]


# -- sessions and the state file ------------------------------------------------------------------------


def test_the_state_is_saved_after_each_change_and_picked_up_at_the_next_start(workspace: Path) -> None:
    state_path = workspace / STATE_FILE
    terminal = Terminal(["/permission allow"])
    tui = make(workspace, terminal, [{"content": "Hi."}], database=".")
    tui.run_repl()
    assert json.loads(state_path.read_text())["permission_mode"] == "allow"
    assert stat.S_IMODE(state_path.stat().st_mode) == 0o600

    code, out, tui = repl(workspace, ["/model scripted/cheap", "hello"], [{"content": "Hi."}], database=".")
    assert code == 0
    saved = json.loads(state_path.read_text())
    assert (saved["permission_mode"], saved["provider"], saved["model"]) == ("allow", "scripted", "cheap")
    assert saved["session_id"] == tui.session.id
    assert [path.name for path in state_path.parent.iterdir() if path.name.endswith(".tmp")] == []

    code, out, again = repl(workspace, [], database=".")
    assert (again.permission_mode, again.provider, again.model) == (PermissionMode.ALLOW, "scripted", "cheap")
    assert again.session.id == tui.session.id
    assert f"session {tui.session.id[:12]} (resumed, 2 messages)" in out
    assert [message.content for message in again.session.messages] == ["hello", "Hi."]
    # An explicit choice wins over the saved one.
    explicit = make(
        workspace, Terminal(), database=".", permission_mode=PermissionMode.READ_ONLY, model="other"
    )
    assert (explicit.permission_mode, explicit.model) == (PermissionMode.READ_ONLY, "other")


def test_a_broken_state_file_is_said_and_ignored(workspace: Path) -> None:
    (workspace / ".teaagent").mkdir()
    (workspace / STATE_FILE).write_text("{not json")
    code, out, tui = repl(workspace, [], database=".")
    assert code == 0
    assert f"The saved state is ignored: {workspace / STATE_FILE} is not usable (" in out
    assert tui.permission_mode is PermissionMode.PROMPT


def test_memory_keeps_nothing_but_the_run_records(workspace: Path) -> None:
    code, out, tui = repl(workspace, ["hello", "/permission allow", "/sessions"], [{"content": "Hi."}])
    assert code == 0
    assert tui.session.id in out  # listed from memory
    teaagent = workspace / ".teaagent"
    assert not (teaagent / "tui_state.json").exists()
    assert not (teaagent / "sessions").exists()
    assert not (teaagent / "tui_history").exists()
    assert list((teaagent / "audit").glob("*.jsonl"))  # what every run leaves: its audit and run logs
    assert list((teaagent / "runs").glob("*.jsonl"))


def test_sessions_new_and_resume(workspace: Path) -> None:
    turns = [{"content": "First answer."}, {"content": "Second answer."}]
    code, out, tui = repl(workspace, ["first task", "/new", "second task", "/sessions"], turns, database=".")
    assert code == 0
    store = SessionStore(workspace)
    listed = store.list_sessions()
    assert len(listed) == 2
    current, older = tui.session.id, next(item["id"] for item in listed if item["id"] != tui.session.id)
    assert re.search(rf"^\* +{current} .* 2 +second task$", out, re.M)
    assert re.search(rf"^ +{older} .* 2 +first task$", out, re.M)

    code, out, again = repl(workspace, [f"/resume {older[:6]}", "/resume zzz"], database=".")
    assert f"Resumed session {older} (2 messages): first task.\n" in out
    assert "No session zzz; /sessions lists them.\n" in out
    assert again.session.id == older
    resumed = make(workspace, Terminal(), database=".", session_id=current)
    assert [message.content for message in resumed.session.messages] == ["second task", "Second answer."]


def test_model_shows_and_switches(workspace: Path) -> None:
    out = repl(workspace, ["/model", "/model openai/gpt-4.1-mini", "/model anthropic", "/model tiny"])[1]
    assert "Model: scripted/scripted\n" in out
    assert "Model: openai/gpt-4.1-mini.\n" in out
    assert "Model: anthropic/claude-sonnet-4-5.\n" in out
    assert "Model: anthropic/tiny.\n" in out


def test_cost_and_usage_of_the_session_and_the_workspace(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_PRICES_FILE", str(write_prices(tmp_path / "prices.json", {}, default=0.01)))
    turns = [{"content": "Hi.", "input_tokens": 1000, "output_tokens": 500}]
    code, out, _ = repl(workspace, ["hello", "/cost", "/usage"], turns)
    assert code == 0
    # 1000 + 500 tokens at a cent per 1000 tokens each way: 1.5 cents.
    assert "completed · 1 turn · 0 tool calls · 1.5000 cents · answered by scripted/scripted\n" in out
    assert "This session: 1.5000 cents over 1 run.\n" in out
    assert "This workspace: 1.5000 cents in all, 1.5000 today (UTC).\n" in out
    assert re.search(r"^scripted/scripted +1 +1 +0 +1000 +500$", out, re.M)


def test_context_and_compact(workspace: Path) -> None:
    turns = [
        {"content": "Answer one."},
        {"content": "Answer two."},
        {"content": "SUMMARY: the user asked twice.", "expect": ["USER: task one", "ASSISTANT: Answer one."]},
    ]
    code, out, tui = repl(
        workspace, ["task one", "task two", "/context", "/compact", "/context"], turns, database="."
    )
    assert code == 0
    assert re.search(
        r"^Session \w+: 4 messages; the next call carries about \d+ tokens of scripted/scripted's 128000 \(",
        out,
        re.M,
    )
    assert re.search(r"^Compacted 2 messages into a summary: about \d+ → \d+ tokens\.$", out, re.M)
    assert re.search(r"^Session \w+: 3 messages;", out, re.M)
    saved = SessionStore(workspace).load(tui.session.id)
    assert saved is not None
    assert [(m.role, m.content) for m in saved.messages] == [
        ("system", "Summary of the earlier conversation: SUMMARY: the user asked twice."),
        ("user", "task two"),
        ("assistant", "Answer two."),
    ]


def test_a_failed_compaction_changes_nothing(workspace: Path) -> None:
    turns = [{"content": "A."}, {"content": "B."}, {"content": "S.", "expect": ["never said"]}]
    _, out, tui = repl(workspace, ["one", "two", "/compact"], turns)
    assert (
        "The session was not compacted: Turn 3 of the script <script> expects the conversation to "
        "contain 'never said', but it does not.\n" in out
    )
    assert len(tui.session.messages) == 4
    assert "Nothing to compact: the session has 0 messages.\n" in repl(workspace, ["/compact"])[1]


def test_the_offline_model_compacts_a_session_whose_script_it_has_played(workspace: Path) -> None:
    _, out, tui = repl(workspace, ["one", "two", "/compact"], [{"content": "A."}, {"content": "B."}])

    assert re.search(r"^Compacted 2 messages into a summary: about \d+ → \d+ tokens\.$", out, re.M)
    [summary, *kept] = [(m.role, m.content) for m in tui.session.messages]
    assert summary[0] == "system"
    assert summary[1].startswith(
        "Summary of the earlier conversation: An offline answer of the scripted model, which plays the "
        "script <script> and understands nothing: what it was asked begins «USER: one"
    )
    assert kept == [("user", "two"), ("assistant", "B.")]


def test_the_bundled_question_script_asks_and_hears_the_answer(workspace: Path) -> None:
    terminal = Terminal(["Clean up.", "yes"])
    tui = TeaAgentTUI(
        root=workspace, input_fn=terminal.input, output_fn=terminal.print, script_path="question"
    )

    assert tui.run_repl() == 0
    out = terminal.text
    assert "Shall I clean the build folder?" in out
    assert "Thank you: your answer is in the ask_user result above" in out
    assert tui.session.messages[-1].content.startswith("Thank you")


# -- with a node: routing and the approver --------------------------------------------------------------


def test_route_model_sends_simple_turns_to_the_cheaper_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = write_node(
        tmp_path / "node", extra='model = "scripted-big"\n\n[models.small]\nmodel = "scripted"\n'
    )
    monkeypatch.setenv(
        "TEAAGENT_PRICES_FILE", str(write_prices(tmp_path / "prices.json", {"scripted-big": 0.01}))
    )
    config = load_config(node.config_path)
    asked: list[tuple[str, str]] = []
    shared = scripted([{"content": "A tea agent is an agent."}, {"content": "Fixed."}])

    def factory(provider: str, model: str) -> LLMAdapter:
        asked.append((provider, model))
        return shared

    terminal = Terminal(["what is a tea agent?", "fix the parser in parse.py"])
    tui = TeaAgentTUI(
        node=config,
        input_fn=terminal.input,
        output_fn=terminal.print,
        adapter_factory=factory,
        route_model=True,
    )
    assert tui.run_repl() == 0
    out = terminal.text
    assert "answered by scripted/scripted (a simple turn, routed to the cheaper model)\n" in out
    assert "answered by scripted/scripted-big\n" in out
    assert asked == [("scripted", "scripted"), ("scripted", "scripted-big")]


def test_route_model_says_when_no_cheaper_model_is_configured(workspace: Path) -> None:
    out = repl(workspace, [], route_model=True)[1]
    assert "route_model: no cheaper model is configured; every turn goes to scripted/scripted.\n" in out


def test_the_inbox_of_a_node_whose_approver_is_down_is_one_line(tmp_path: Path) -> None:
    node = write_node(tmp_path / "node")
    config = load_config(node.config_path)
    terminal = Terminal(["/inbox", "/approve " + "0123456789abcdef" * 2])
    tui = TeaAgentTUI(node=config, input_fn=terminal.input, output_fn=terminal.print)
    assert tui.run_repl() == 0
    lines = [line for line in terminal.text.splitlines() if "teaagent approver serve" in line]
    assert len(lines) == 2, terminal.text  # one sentence each, naming the command that starts it


def test_commands_run_outside_run_repl_too(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    terminal = Terminal()
    tui = TeaAgentTUI(input_fn=terminal.input, output_fn=terminal.print)
    assert tui.root == Path(os.getcwd()).resolve()
    assert tui._handle_tui_command("/permission workspace-write") is True
    assert tui.permission_mode is PermissionMode.WORKSPACE_WRITE
    tui._save_tui_state()  # ':memory:' keeps nothing
    assert not (workspace / STATE_FILE).exists()
