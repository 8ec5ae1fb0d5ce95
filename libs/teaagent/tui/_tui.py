"""``TeaAgentTUI``: a REPL over the agent runner, where a high-risk call visibly waits for its peers.

Threads. The REPL, every prompt and every line drawn live on the caller's thread (the *UI thread*).
Each task runs in a worker thread (:meth:`AgentRunner.run`); whatever the run reports (its events,
the relay's status of a quorum request, an approval to ask about, a question from the model) is put
on one queue that the UI thread drains while the run lasts, so that the screen is only ever drawn
from one thread and Ctrl-C (which Python delivers to the main thread) always reaches the REPL:
during a quorum wait it stops the wait (the call is refused and the run ends with that refusal);
at any other moment of a run it cancels the run; at the prompt it says how to leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import queue
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from teaagent._words import moment, needed_from, plural, time_left
from teaagent.approver_client import resolve_request
from teaagent.audit import AuditLogger
from teaagent.budget import RunBudget
from teaagent.config import NodeConfig
from teaagent.cost_tracker import CostTracker, RunLogWriter
from teaagent.errors import ConfigError, RelayError, TeaAgentError
from teaagent.llm import (
    PROVIDER_CONFIGS,
    LLMAdapter,
    LLMMessage,
    LLMRequest,
    available_providers,
    create_llm_adapter,
    price_for,
)
from teaagent.policy import (
    ApprovalPolicy,
    JITApprovalState,
    PermissionMode,
    PromptAnswer,
    PromptRequest,
    QuorumGate,
)
from teaagent.runner import DEFAULT_SYSTEM_PROMPT, AgentRunner, Question, RunEvent, RunResult
from teaagent.session import MAX_LABEL_CHARS, ChatSession, SessionStore, check_session_id, new_session
from teaagent.signing import Signer
from teaagent.tools import ToolAnnotations, ToolRegistry, workspace_registry
from teaagent.tui._context import (
    COMPACT_KEEP_MESSAGES,
    COMPACT_MAX_TOKENS,
    COMPACT_SYSTEM_PROMPT,
    compacted,
    context_size,
    is_simple_turn,
    transcript,
)
from teaagent.tui._inbox import approver_client, decide, decision_lines, inbox_rows
from teaagent.tui._quorum import QuorumBoard
from teaagent.tui._screen import (
    FunctionReader,
    LineReader,
    PlainScreen,
    RichScreen,
    Screen,
    ToolkitReader,
    visible,
)
from teaagent.tui._state import MEMORY, STATE_FILE, MemorySessionStore, TUIState, load_state, save_state

if TYPE_CHECKING:
    from teaagent.approver_client import ApprovalItem
    from teaagent.relay_client import RequestStatus, WaitProgress

__all__ = [
    "AUDIT_FILE",
    "COMMANDS",
    "HISTORY_FILE",
    "SUBAGENT_TOOL",
    "AdapterFactory",
    "Command",
    "TeaAgentTUI",
]

_log = logging.getLogger("teaagent.tui")

AdapterFactory = Callable[[str, str], LLMAdapter]
"""Makes the adapter of one model: ``adapter_factory(provider, model)``."""

HISTORY_FILE: Final = ".teaagent/tui_history"
"""The prompt history on a terminal, relative to the database folder."""
AUDIT_FILE: Final = ".teaagent/audit/tui.jsonl"
"""The audit log of a TUI without a node, relative to its root (a node's lives in its data_dir)."""
SUBAGENT_TOOL: Final = "agent.delegate"
"""The tool through which the model hands a sub-task to a child run (``subagent=True``)."""
SUBAGENT_MAX_ITERATIONS: Final = 8  # a sub-task, not a second session
SUBAGENT_MAX_TOOL_CALLS: Final = 16
SUBAGENT_MAX_COST_CENTS: Final = 50  # half a dollar at most, and never more than the parent's own cap
SUBAGENT_MAX_TASK_CHARS: Final = 4000
TICK_SECONDS: Final = 0.25  # how often the live line and the heartbeat are looked at during a run
TOOL_PROGRESS_AFTER_SECONDS: Final = 1  # most tool calls end sooner: no line for them
AGAIN_SECONDS: Final = 2.0  # a second Ctrl-C at the prompt within this leaves the REPL
SHOWN_CHARS: Final = 300  # of a tool's arguments or result on one line; the audit log has them whole
RUN_LABEL: Final = "tui"

_QUIT_HINT: Final = "Type /quit or press Ctrl-D to leave."


@dataclass(frozen=True)
class Command:
    """One REPL command: how it is typed and what it does, for ``/help``."""

    name: str
    usage: str
    help: str


COMMANDS: Final = (
    Command("/help", "/help [COMMAND]", "List the commands, or say what one does."),
    Command("/quit", "/quit", "Leave the TUI (Ctrl-D too)."),
    Command("/new", "/new", "Start a new session: a fresh conversation, no session approvals."),
    Command("/sessions", "/sessions", "List the saved sessions, newest first."),
    Command("/resume", "/resume ID", "Go back to a saved session (a unique prefix of its id will do)."),
    Command("/model", "/model [NAME]", "Show the model and the configured ones, or switch to NAME."),
    Command("/permission", "/permission [MODE]", "Show the permission mode, or set it."),
    Command("/approvals", "/approvals", "What runs without asking: the mode, session approvals, presets."),
    Command("/cost", "/cost", "What this session's runs cost, and the workspace's totals."),
    Command("/usage", "/usage", "Runs, turns, tool calls and tokens of this session, by model."),
    Command("/context", "/context", "What the next model call carries and how full its window is."),
    Command("/compact", "/compact [FOCUS]", "Summarise the older messages to free the context window."),
    Command("/tools", "/tools", "The tools the model may call, and which need the peers' quorum."),
    Command("/quorum", "/quorum", "This session's high-risk calls: waiting, approved by whom, denied."),
    Command("/inbox", "/inbox", "Requests from peers waiting for this node's decision."),
    Command("/approve", "/approve ID [REASON]", "Approve a peer's request with this node's key."),
    Command("/deny", "/deny ID [REASON]", "Deny a peer's request with this node's key."),
)
_ALIASES: Final = {"/exit": "/quit", "/q": "/quit", "/?": "/help", "/clear": "/new"}
_BY_NAME: Final = {command.name: command for command in COMMANDS}

_MODE_NOTES: Final = {
    PermissionMode.READ_ONLY: "reads only; nothing is written or run",
    PermissionMode.WORKSPACE_WRITE: "writes inside the workspace; destructive calls are refused, never asked",
    PermissionMode.PROMPT: "reads freely; asks before anything that writes or runs",
    PermissionMode.ALLOW: "writes freely; asks before anything destructive",
    PermissionMode.DANGER_FULL_ACCESS: "does anything without asking (high-risk calls still need the quorum)",
}


def _short(value: object, limit: int = SHOWN_CHARS) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    text = visible(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _sentence(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


@dataclass(frozen=True)
class _ModelChoice:
    provider: str
    model: str
    name: str | None = None  # the [models.NAME] table it comes from

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.model}"


@dataclass
class _Usage:
    runs: int = 0
    iterations: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_cents: float = 0.0

    def add(self, data: Mapping[str, Any]) -> None:
        self.runs += 1
        self.iterations += int(data.get("iterations") or 0)
        self.tool_calls += int(data.get("tool_calls") or 0)
        self.input_tokens += int(data.get("input_tokens") or 0)
        self.output_tokens += int(data.get("output_tokens") or 0)
        self.cost_cents += float(data.get("cost_cents") or 0.0)


@dataclass
class _Job:
    """One task running in its worker thread."""

    task: str
    choice: _ModelChoice
    routed: bool
    adapter: LLMAdapter
    policy: ApprovalPolicy
    audit: AuditLogger
    budget: RunBudget
    runner: AgentRunner
    thread: threading.Thread | None = None
    result: RunResult | None = None
    error: BaseException | None = None
    cancel_requested: bool = False
    children: list[AgentRunner] = field(default_factory=list)
    sub_tasks: int = 0


@dataclass
class _Prompt:
    """A question from a worker thread that the UI thread puts to the user."""

    kind: str  # "approval" | "question"
    request: Any
    answer: Any = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Wait:
    kind: str  # "model" | "tool"
    detail: str
    since: float


class TeaAgentTUI:
    """Top-level class for the interactive terminal UI.

    A REPL over :class:`~teaagent.runner.AgentRunner`, as a person uses Claude Code or Codex: each
    line typed is a task for the agent, or a command (``/help`` lists them). Runs go through the
    node's policy gate: a call the permission mode leaves to a person is asked about at the
    prompt, and a high-risk call waits for its peers' quorum with who signed so far and the time
    left on screen; Ctrl-C withdraws that wait.

    Args:
        database: Where sessions, the prompt history and the TUI's state live: ``':memory:'``
            keeps nothing (sessions last as long as the process, no file is written but the audit
            and run logs every run leaves); any other value is a folder (relative to ``root``)
            whose ``.teaagent/`` holds ``sessions/`` (:class:`~teaagent.session.SessionStore`),
            ``tui_history`` and ``tui_state.json``. Give the workspace itself (``'.'``) to share
            sessions with ``teaagent run --session`` and the agent service.
        provider: The LLM provider (one of :func:`teaagent.llm.available_providers`); None for the
            saved one, else the node's ``[agent] provider``, else ``scripted`` (offline).
        model: The model; None for the saved one, else the node's, else the provider's default.
            ``/model`` switches it.
        root: The workspace the agent works in (a node's ``workspace`` when ``node`` is given).
        allow_destructive: Approve every destructive call without asking (as ``--dangerously``
            flags do); high-risk calls still need the quorum.
        permission_mode: What runs without asking (``/permission`` changes it). A saved mode is
            picked up when this is left at its default.
        input_fn: Reads a line, as :func:`input` does (``input_fn(prompt)``); EOFError ends the
            REPL. Left as :func:`input` on a terminal, prompt_toolkit reads instead (history,
            completion of commands, session ids and models).
        output_fn: Prints, as :func:`print` does: ``output_fn(line)``, and for streamed text
            ``output_fn(piece, end="", flush=True)``. Left as :func:`print`, rich draws instead
            (colours, a live status line); any other function gets plain text.
        adapter_factory: Makes the model's adapter: ``adapter_factory(provider, model)``; None to
            build it from the environment and the node's configuration
            (:func:`~teaagent.llm.create_llm_adapter`). It is called once per model used.
        initial_task: A task run as soon as the REPL starts, before the first prompt.
        session_id: Resume this session (or start one of that id); None for the saved one, else a
            new session.
        progress: Show a progress line while the model thinks or a tool runs (redrawn in place on
            a terminal, printed once per step elsewhere). A quorum wait is always shown.
        stream: Print the model's reply as it arrives, instead of whole.
        subagent: Give the model the ``agent.delegate`` tool, which runs a sub-task as a child run
            with its own budget (at most 8 turns, 16 tool calls, 50 cents), shown nested; the
            child's calls go through the same policy and quorum.
        route_model: Send simple turns (a short one-line question, no code, no request for work)
            to the cheapest configured model (``[models.NAME]``) that is cheaper than the current
            one; the run's last line says which model answered.
        heartbeat: Print a line every this many seconds while a run waits on the model, a tool or
            a quorum without anything else to show; 0 for none.
        node: The node whose tools, policy, quorum, audit log and approver the TUI uses
            (``teaagent tui --config node.toml``); None for a workspace of its own, without quorum.
        operator_signer: Sign ``/approve`` and ``/deny`` here with an operator's key instead of
            leaving it to the approver's node key.
        budget: Every run's limits; :class:`~teaagent.budget.RunBudget` defaults when None.
        script_path: The script the offline ``scripted`` provider plays (the built-in factory): a
            bundled script's name (``quorum``...) or a file; None for the node's ``[agent] script``,
            else ``$TEAAGENT_LLM_SCRIPT``, else the bundled ``demo``.

    Raises:
        ValueError: ``root`` is not a readable directory, ``provider`` is unknown,
            ``permission_mode`` is not a mode, ``heartbeat`` is negative, or ``session_id`` is
            not a valid session id.
    """

    def __init__(
        self,
        database: str = MEMORY,
        provider: str | None = None,
        model: str | None = None,
        root: str | os.PathLike[str] = ".",
        allow_destructive: bool = False,
        permission_mode: PermissionMode = PermissionMode.PROMPT,
        input_fn: Callable[..., str] = input,
        output_fn: Callable[..., None] = print,
        adapter_factory: AdapterFactory | None = None,
        initial_task: str | None = None,
        session_id: str | None = None,
        progress: bool = False,
        stream: bool = False,
        subagent: bool = False,
        route_model: bool = False,
        heartbeat: int = 0,
        *,
        node: NodeConfig | None = None,
        operator_signer: Signer | None = None,
        budget: RunBudget | None = None,
        script_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.node = node
        root_path = Path(os.fspath(node.workspace if node is not None else root))
        if not root_path.is_dir() or not os.access(root_path, os.R_OK | os.X_OK):
            raise ValueError(f"root must be a readable directory: {root_path}")
        self.root = root_path.resolve()
        if provider is not None and provider not in available_providers():
            raise ValueError(
                f"Unknown LLM provider {provider!r}; choose one of: {', '.join(available_providers())}."
            )
        try:
            mode = PermissionMode(permission_mode)
        except ValueError:
            known = ", ".join(item.value for item in PermissionMode)
            raise ValueError(f"permission mode {permission_mode!r} is not one of {known}.") from None
        if isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 0:
            raise ValueError(f"heartbeat must be a whole number of seconds >= 0, not {heartbeat!r}.")
        self.allow_destructive = bool(allow_destructive)
        self.progress = bool(progress)
        self.stream = bool(stream)
        self.subagent = bool(subagent)
        self.route_model = bool(route_model)
        self.heartbeat = heartbeat
        self.initial_task = initial_task
        self.operator_signer = operator_signer
        self.budget = budget if budget is not None else RunBudget()
        self._adapter_factory = adapter_factory
        self._script_path = script_path
        # Where things are kept.
        self._memory = database == MEMORY
        self.database: Path | None = None if self._memory else (self.root / Path(database)).resolve()
        self._store: SessionStore = (
            MemorySessionStore() if self.database is None else SessionStore(self.database)
        )
        # Output and input.
        self._screen: Screen = RichScreen() if output_fn is print else PlainScreen(output_fn)
        self._reader: LineReader | None = None
        self._input_fn = input_fn
        # What is remembered from last time, where the caller left the choice to it.
        self._notes: list[tuple[str, str]] = []
        state, problem = (None, None) if self.database is None else load_state(self.database)
        if problem is not None:
            self._notes.append((f"The saved state is ignored: {problem}.", "yellow"))
        if state is not None and state.permission_mode and mode is PermissionMode.PROMPT:
            try:
                mode = PermissionMode(state.permission_mode)
            except ValueError:
                self._notes.append(
                    (f"The saved permission mode {state.permission_mode!r} is ignored.", "yellow")
                )
        self._mode = mode
        self._choice = self._initial_choice(provider, model, state)
        # The session: asked for, else the saved one, else a new one.
        wanted = session_id if session_id is not None else (state.session_id if state is not None else None)
        if session_id is not None:
            check_session_id(session_id)
        self._session, how = self._open_session(wanted)
        self._session_note = how
        self._jit = JITApprovalState()
        self._board = QuorumBoard()
        self._usage: dict[str, _Usage] = {}
        # Runs.
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._stop_wait = threading.Event()
        self._adapters: dict[_ModelChoice, LLMAdapter] = {}
        self._base_registry: ToolRegistry | None = None
        self._registry: ToolRegistry | None = None
        self._gate: QuorumGate | None = None
        if node is not None:
            from teaagent.runner._node import node_quorum_gate

            self._gate = node_quorum_gate(
                node,
                on_progress=self._relay_note,
                on_status=self._relay_status,
                on_wait=self._relay_wait,
                stop=self._stop_wait,
            )
        self._waits: dict[str, WaitProgress] = {}  # the last view of each quorum wait shown
        self._job: _Job | None = None
        self._waiting: _Wait | None = None
        self._streamed = False
        self._last_line = time.monotonic()
        self._last_interrupt = 0.0
        self._inbox: list[ApprovalItem] = []
        # Every request /inbox has shown, as shown: a typed prefix must fit one of them alone.
        self._inbox_shown: dict[tuple[str, str], ApprovalItem] = {}
        self._quit = False
        self._eof = False

    # -- what it is set to ---------------------------------------------------------------------------

    @property
    def session(self) -> ChatSession:
        """The current session."""
        return self._session

    @property
    def provider(self) -> str:
        """The current LLM provider."""
        return self._choice.provider

    @property
    def model(self) -> str:
        """The current model."""
        return self._choice.model

    @property
    def permission_mode(self) -> PermissionMode:
        """The current permission mode."""
        return self._mode

    @property
    def state_path(self) -> Path | None:
        """``<database>/.teaagent/tui_state.json``, or None with ``':memory:'``."""
        return None if self.database is None else self.database / STATE_FILE

    def set_permission_mode(self, mode: PermissionMode | str) -> None:
        """Set the permission mode for the next runs and save the state.

        Raises:
            ValueError: ``mode`` is not a permission mode.
        """
        self._mode = PermissionMode(mode)
        self._save_tui_state()

    # -- the REPL ------------------------------------------------------------------------------------

    def run_repl(self) -> int:
        """Start the interactive REPL loop. Blocks until the user exits.

        The initial task runs first; then each line is a task or a command, until ``/quit``, the
        end of input, or a second Ctrl-C at the prompt. A failed run, a provider error, a refused
        or withdrawn quorum, an unknown command: each is a message, and the REPL goes on.

        Returns:
            int: Exit code. 0 = clean exit, non-zero = error (1: the TUI itself failed; 130: it
            was interrupted where it could not go on).
        """
        try:
            self._reader = self._make_reader()
            self._banner()
            if self.initial_task and self.initial_task.strip():
                self._guarded(self.initial_task)
            while not self._quit and not self._eof:
                line = self._read_line()
                if line is None:
                    break
                self._guarded(line)
            if self._eof:
                self._screen.say("End of input: goodbye.")
            return 0
        except KeyboardInterrupt:
            self._say_safely("Interrupted.")
            return 130
        except Exception as exc:  # the last resort: one sentence, never a traceback on the screen
            _log.exception("the TUI failed")
            self._say_safely(f"The TUI failed: {type(exc).__name__}: {exc}")
            return 1
        finally:
            self._screen_off()

    def _say_safely(self, text: str) -> None:
        try:
            self._screen.status(None)
            self._screen.say(text, "red")
        except Exception:  # the screen itself is what failed: nothing more can be said
            _log.exception("the TUI could not say %r", text)

    def _screen_off(self) -> None:
        try:
            self._screen.status(None)
        except Exception:
            _log.exception("the status line could not be cleared")

    def _make_reader(self) -> LineReader:
        if self._input_fn is input and sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty():
            history = None if self.database is None else self.database / HISTORY_FILE
            try:
                return ToolkitReader(history)
            except Exception as exc:  # no usable terminal after all: read plainly
                self._notes.append((f"Line editing is off: {exc}", "yellow"))
        return FunctionReader(self._input_fn)

    def _banner(self) -> None:
        say = self._screen.say
        who = self.node.agent_id if self.node is not None else "local workspace"
        session = f"session {self._session.id[:12]} ({self._session_note})"
        say(f"teaagent · {who} · {self._choice.label} · {self._mode.value} · {session}", "bold")
        if self.node is not None and self.node.quorum.enabled:
            quorum = self.node.quorum
            say(
                f"High-risk calls ({', '.join(quorum.high_risk_patterns)}) need "
                f"{plural(quorum.required_approvals, 'approval')} from {', '.join(quorum.peer_agent_ids)}.",
                "dim",
            )
        if self.route_model and self._cheaper_choice() is None:
            say(
                f"route_model: no cheaper model is configured; every turn goes to {self._choice.label}.",
                "dim",
            )
        for text, style in self._notes:
            say(text, style)
        self._notes.clear()
        say("Type a task, or /help for the commands.", "dim")

    def _read_line(self) -> str | None:
        """The next line typed; None at the end of input or when the user leaves with Ctrl-C twice."""
        assert self._reader is not None
        completions = self._completions()
        while True:
            try:
                line = self._reader.read("› ", completions=completions)
            except EOFError:
                self._end_prompt_line()
                self._eof = True
                return None
            except KeyboardInterrupt:
                self._end_prompt_line()
                now = time.monotonic()
                if now - self._last_interrupt <= AGAIN_SECONDS:
                    self._screen.say("Goodbye.")
                    self._quit = True
                    return None
                self._last_interrupt = now
                self._screen.say(f"(Ctrl-C again to leave.) {_QUIT_HINT}", "dim")
                continue
            return line

    def _end_prompt_line(self) -> None:
        # input() leaves the cursor after its prompt at Ctrl-C or Ctrl-D; prompt_toolkit moves on itself.
        if isinstance(self._reader, FunctionReader):
            self._screen.say("")

    def _completions(self) -> dict[str, Any]:
        tree: dict[str, Any] = {command.name: None for command in COMMANDS}
        with contextlib.suppress(OSError, ConfigError):  # no completion of ids, then
            tree["/resume"] = {item["id"]: None for item in self._store.list_sessions()[:50]}
        tree["/model"] = {name: None for name in self._model_names()}
        tree["/permission"] = {mode.value: None for mode in PermissionMode}
        tree["/help"] = {command.name.lstrip("/"): None for command in COMMANDS}
        return tree

    def _guarded(self, line: str) -> None:
        """Handle one line; whatever goes wrong is a message, and the REPL goes on."""
        try:
            self._dispatch(line)
        except KeyboardInterrupt:
            self._screen.status(None)
            self._screen.say("Interrupted.", "yellow")
        except Exception as exc:
            _log.exception("handling %r failed", line)
            self._screen.status(None)
            self._screen.say(f"That failed: {type(exc).__name__}: {exc}", "red")

    def _dispatch(self, line: str) -> None:
        text = line.strip()
        if not text:
            return
        if text.startswith("/"):
            if not self._handle_tui_command(text):
                word = text.split()[0]
                self._screen.say(f"Unknown command {word}; /help lists the commands.", "yellow")
            return
        self._run_task(text)

    # -- state ---------------------------------------------------------------------------------------

    def _save_tui_state(self) -> None:
        """Persist current session state to .teaagent/tui_state.json.

        The session, the model and the permission mode, written atomically under the database
        folder (nothing with ``':memory:'``). A write that fails is said on the screen; the TUI
        goes on with what it has.
        """
        if self.database is None:
            return
        state = TUIState(
            session_id=self._session.id,
            provider=self._choice.provider,
            model=self._choice.model,
            model_name=self._choice.name,
            permission_mode=self._mode.value,
        )
        try:
            save_state(self.database, state)
        except OSError as exc:
            self._screen.say(f"The TUI's state could not be saved in {self.state_path}: {exc}", "yellow")

    def _initial_choice(
        self, provider: str | None, model: str | None, state: TUIState | None
    ) -> _ModelChoice:
        node = self.node
        if provider is None and model is None and state is not None and state.provider in PROVIDER_CONFIGS:
            assert state.provider is not None
            name = state.model_name if node is not None and state.model_name in node.models else None
            return _ModelChoice(
                state.provider, state.model or PROVIDER_CONFIGS[state.provider].default_model, name
            )
        if provider is None:
            provider = node.agent.provider if node is not None else "scripted"
        if model is None and node is not None and provider == node.agent.provider and node.agent.model:
            model = node.agent.model
        return _ModelChoice(provider, model or PROVIDER_CONFIGS[provider].default_model)

    def _open_session(self, session_id: str | None) -> tuple[ChatSession, str]:
        if session_id is None:
            return new_session(), "new"
        try:
            found = self._store.load(session_id)
        except (ConfigError, ValueError, OSError) as exc:
            self._notes.append((f"Session {session_id} cannot be resumed: {exc}", "yellow"))
            return new_session(), "new"
        if found is None:
            return new_session(session_id=session_id), "new"
        return found, f"resumed, {_count(len(found.messages), 'message')}"

    # -- commands ------------------------------------------------------------------------------------

    def _handle_tui_command(self, raw_command: str) -> bool:
        """
        Dispatch a raw REPL command string.

        Args:
            raw_command: The full text entered at the prompt.

        Returns:
            bool: True if the command was handled, False if unrecognised (a line that is not a
            ``/command`` is a task, not a command: False as well).
        """
        text = raw_command.strip()
        if not text.startswith("/"):
            return False
        word, _, rest = text.partition(" ")
        name = _ALIASES.get(word.lower(), word.lower())
        handlers: dict[str, Callable[[str], None]] = {
            "/help": self._cmd_help,
            "/quit": self._cmd_quit,
            "/new": self._cmd_new,
            "/sessions": self._cmd_sessions,
            "/resume": self._cmd_resume,
            "/model": self._cmd_model,
            "/permission": self._cmd_permission,
            "/approvals": self._cmd_approvals,
            "/cost": self._cmd_cost,
            "/usage": self._cmd_usage,
            "/context": self._cmd_context,
            "/compact": self._cmd_compact,
            "/tools": self._cmd_tools,
            "/quorum": self._cmd_quorum,
            "/inbox": self._cmd_inbox,
            "/approve": self._cmd_approve,
            "/deny": self._cmd_deny,
        }
        handler = handlers.get(name)
        if handler is None:
            return False
        handler(rest.strip())
        return True

    def _cmd_help(self, argument: str) -> None:
        if argument:
            wanted = argument if argument.startswith("/") else f"/{argument}"
            command = _BY_NAME.get(_ALIASES.get(wanted, wanted))
            if command is None:
                self._screen.say(f"There is no command {wanted}; /help lists them.", "yellow")
                return
            self._screen.say(f"{command.usage}  {command.help}")
            return
        self._screen.say("Type a task for the agent, or one of these commands:")
        width = max(len(command.usage) for command in COMMANDS)
        for command in COMMANDS:
            self._screen.say(f"  {command.usage.ljust(width)}  {command.help}")
        self._screen.say(
            "During a run, Ctrl-C cancels it; while a call waits for its quorum, Ctrl-C withdraws it.", "dim"
        )

    def _cmd_quit(self, _argument: str) -> None:
        self._screen.say("Goodbye.")
        self._quit = True

    def _cmd_new(self, _argument: str) -> None:
        self._session = new_session()
        self._session_note = "new"
        self._jit.clear()
        self._board.clear()
        self._save_tui_state()
        self._screen.say(f"New session {self._session.id}.")

    def _cmd_sessions(self, _argument: str) -> None:
        try:
            items = self._store.list_sessions()
        except (OSError, ConfigError) as exc:
            self._screen.say(f"The sessions cannot be listed: {exc}", "red")
            return
        if not items:
            self._screen.say(
                "No saved sessions yet."
                + (" (':memory:' keeps them in this process only.)" if self._memory else "")
            )
            return
        rows = []
        for item in items:
            mark = "*" if item["id"] == self._session.id else ""
            rows.append(
                [
                    mark,
                    item["id"],
                    str(item["updated_at"])[:19].replace("T", " "),
                    str(item["message_count"]),
                    _short(item["label"] or "", 50),
                ]
            )
        self._screen.table(["", "SESSION", "UPDATED (UTC)", "MESSAGES", "LABEL"], rows)

    def _cmd_resume(self, argument: str) -> None:
        if not argument:
            self._screen.say("Usage: /resume ID (/sessions lists them).", "yellow")
            return
        try:
            ids = [item["id"] for item in self._store.list_sessions()]
        except (OSError, ConfigError) as exc:
            self._screen.say(f"The sessions cannot be listed: {exc}", "red")
            return
        matching = [session_id for session_id in ids if session_id == argument] or [
            session_id for session_id in ids if session_id.startswith(argument)
        ]
        if not matching:
            self._screen.say(f"No session {argument}; /sessions lists them.", "yellow")
            return
        if len(matching) > 1:
            self._screen.say(f"{argument} names {len(matching)} sessions: {', '.join(matching)}.", "yellow")
            return
        try:
            found = self._store.load(matching[0])
        except (ConfigError, ValueError, OSError) as exc:
            self._screen.say(f"Session {matching[0]} cannot be resumed: {exc}", "red")
            return
        if found is None:
            self._screen.say(f"Session {matching[0]} is gone.", "yellow")
            return
        self._session = found
        self._session_note = "resumed"
        self._jit.clear()
        self._board.clear()
        self._save_tui_state()
        label = f": {_short(found.label, 60)}" if found.label else ""
        self._screen.say(f"Resumed session {found.id} ({_count(len(found.messages), 'message')}){label}.")

    def _model_names(self) -> list[str]:
        names = list(self.node.models) if self.node is not None else []
        return names + [
            f"{provider}/{PROVIDER_CONFIGS[provider].default_model}" for provider in PROVIDER_CONFIGS
        ]

    def _parse_model(self, text: str) -> _ModelChoice:
        node = self.node
        if node is not None and text in node.models:
            settings = node.models[text]
            return _ModelChoice(settings.provider, settings.model, text)
        provider, slash, rest = text.partition("/")
        if slash and provider in PROVIDER_CONFIGS and rest:
            return _ModelChoice(provider, rest)
        if text in PROVIDER_CONFIGS:
            # A provider alone: the node's model when it is the node's provider, else its default.
            if node is not None and node.agent.provider == text and node.agent.model:
                return _ModelChoice(text, node.agent.model)
            return _ModelChoice(text, PROVIDER_CONFIGS[text].default_model)
        return _ModelChoice(self._choice.provider, text)

    def _cmd_model(self, argument: str) -> None:
        if argument:
            self._choice = self._parse_model(argument)
            self._save_tui_state()
            self._screen.say(
                f"Model: {self._choice.label}"
                + (f" ([models.{self._choice.name}])" if self._choice.name else "")
                + "."
            )
            return
        self._screen.say(
            f"Model: {self._choice.label}" + (f" ([models.{self._choice.name}])" if self._choice.name else "")
        )
        if self.node is not None and self.node.models:
            self._screen.say("Configured in [models]:")
            for name, settings in self.node.models.items():
                mark = " (current)" if self._choice.name == name else ""
                self._screen.say(f"  {name}: {settings.provider}/{settings.model}{mark}")
        self._screen.say(
            f"Providers: {', '.join(PROVIDER_CONFIGS)}. Switch with /model NAME or /model PROVIDER/MODEL.",
            "dim",
        )

    def _cmd_permission(self, argument: str) -> None:
        if argument:
            try:
                self._mode = PermissionMode(argument)
            except ValueError:
                known = ", ".join(mode.value for mode in PermissionMode)
                self._screen.say(f"{argument!r} is not a permission mode; choose one of {known}.", "yellow")
                return
            self._save_tui_state()
            self._screen.say(f"Permission mode: {self._mode.value} ({_MODE_NOTES[self._mode]}).")
            return
        for mode in PermissionMode:
            mark = "*" if mode is self._mode else " "
            self._screen.say(f" {mark} {mode.value.ljust(18)} {_MODE_NOTES[mode]}")
        self._screen.say("Set it with /permission MODE.", "dim")

    def _cmd_approvals(self, _argument: str) -> None:
        say = self._screen.say
        say(f"Permission mode: {self._mode.value} ({_MODE_NOTES[self._mode]}).")
        say(
            "Destructive calls: approved without asking (allow_destructive)."
            if self.allow_destructive
            else "Destructive calls: "
            + (
                "refused."
                if self._mode in (PermissionMode.READ_ONLY, PermissionMode.WORKSPACE_WRITE)
                else "asked about, unless approved below."
            )
        )
        tools = sorted(self._jit.session_approved_tools)
        say(f"Approved for this session: {', '.join(tools) if tools else 'nothing yet'}.")
        from teaagent.policy import ApprovalPresetStore

        try:
            presets = ApprovalPresetStore(self.root).list()
        except ConfigError as exc:
            say(f"Workspace presets: unusable ({exc}).", "red")
            presets = []
        if presets:
            say(f"Workspace presets ({ApprovalPresetStore(self.root).path}):")
            for preset in presets:
                scope = f", run {preset.origin_run_id}" if preset.origin_run_id else ""
                until = f", until {moment(preset.expires_at)}" if preset.expires_at else ""
                digest = f", only {preset.payload_digest[:19]}…" if preset.payload_digest else ""
                say(f"  {preset.preset_id}  {preset.tool_pattern}{digest}{scope}{until}")
        else:
            say("Workspace presets: none.")
        if self.node is not None and self.node.quorum.enabled:
            quorum = self.node.quorum
            say(
                f"High-risk calls ({', '.join(quorum.high_risk_patterns)}) also need "
                f"{needed_from(quorum.required_approvals, len(quorum.peer_agent_ids))} "
                f"({', '.join(quorum.peer_agent_ids)}): no local approval replaces the quorum."
            )

    def _cmd_cost(self, _argument: str) -> None:
        say = self._screen.say
        total = _Usage()
        for usage in self._usage.values():
            total.cost_cents += usage.cost_cents
            total.runs += usage.runs
        say(f"This session: {total.cost_cents:.4f} cents over {_count(total.runs, 'run')}.")
        for label, usage in sorted(self._usage.items()):
            say(f"  {label}: {usage.cost_cents:.4f} cents")
        try:
            tracker = CostTracker(self.root)
            by_model = tracker.get_summary_by_model()
            by_day = tracker.get_summary_by_day()
        except (OSError, ConfigError) as exc:
            say(f"The workspace's run logs cannot be read: {exc}", "red")
            return
        if not by_model:
            say("The workspace has no run logs yet.")
            return
        spent = sum(float(row["cost_cents"]) for row in by_model.values())
        today = time.strftime("%Y-%m-%d", time.gmtime())
        today_cents = float(by_day.get(today, {}).get("cost_cents", 0.0))
        say(f"This workspace: {spent:.4f} cents in all, {today_cents:.4f} today (UTC).")
        for model_name, row in sorted(by_model.items()):
            say(
                f"  {model_name}: {float(row['cost_cents']):.4f} cents over {_count(int(row['runs']), 'run')}"
            )

    def _cmd_usage(self, _argument: str) -> None:
        if not self._usage:
            self._screen.say("No runs in this session yet.")
            return
        rows = []
        for label, usage in sorted(self._usage.items()):
            rows.append(
                [
                    label,
                    str(usage.runs),
                    str(usage.iterations),
                    str(usage.tool_calls),
                    str(usage.input_tokens),
                    str(usage.output_tokens),
                ]
            )
        self._screen.table(["MODEL", "RUNS", "TURNS", "TOOL CALLS", "TOKENS IN", "TOKENS OUT"], rows)

    def _window(self) -> int | None:
        if self.node is not None and self._choice.name is not None:
            settings = self.node.models.get(self._choice.name)
            if settings is not None:
                return settings.context_window
        return None

    def _tool_chars(self) -> int:
        try:
            registry = self._tools()
        except (OSError, ValueError, ConfigError):
            return 0
        specs = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
            for tool in registry.list_tools()
        ]
        return len(json.dumps(specs))

    def _cmd_context(self, _argument: str) -> None:
        size = context_size(self._session.messages, DEFAULT_SYSTEM_PROMPT, self._tool_chars(), self._window())
        say = self._screen.say
        say(
            f"Session {self._session.id[:12]}: {_count(size.messages, 'message')}; the next call "
            f"carries about {size.tokens} tokens of {self._choice.label}'s {size.window} "
            f"({size.percent:.1f}%)."
        )
        say(
            f"  messages {size.message_chars // 4} tokens · system prompt {size.system_chars // 4} · "
            f"tool descriptions {size.tool_chars // 4}",
            "dim",
        )
        focus = self._session.focus_stack.list()
        if focus:
            say("Focus: " + ", ".join(f"{entry.kind} {entry.value}" for entry in focus))
        if size.messages > COMPACT_KEEP_MESSAGES:
            say("/compact summarises the older messages.", "dim")

    def _cmd_compact(self, argument: str) -> None:
        messages = list(self._session.messages)
        if len(messages) <= COMPACT_KEEP_MESSAGES:
            self._screen.say(f"Nothing to compact: the session has {_count(len(messages), 'message')}.")
            return
        older = messages[:-COMPACT_KEEP_MESSAGES]
        choice = self._choice
        try:
            adapter = self._adapter(choice)
        except (ConfigError, ValueError, TeaAgentError) as exc:
            self._screen.say(f"Cannot compact: {exc}", "red")
            return
        system = COMPACT_SYSTEM_PROMPT + (f" Keep in particular: {argument}" if argument else "")
        request = LLMRequest(
            messages=[LLMMessage("system", system), LLMMessage("user", transcript(older))],
            model=choice.model,
            max_tokens=COMPACT_MAX_TOKENS,
        )
        before = context_size(messages, "", 0, None).tokens
        self._screen.status("compacting…", key="compact")
        try:
            response = asyncio.run(adapter.complete(request))
        except Exception as exc:  # the provider's error, as one sentence; the session is unchanged
            self._screen.status(None)
            self._screen.say(f"The session was not compacted: {_sentence(exc)}", "red")
            return
        self._screen.status(None)
        if not response.content.strip():
            self._screen.say("The session was not compacted: the model wrote no summary.", "red")
            return
        try:
            with RunLogWriter(
                self.root,
                secrets.token_hex(16),
                label=f"{RUN_LABEL}-compact",
                provider=choice.provider,
                model=choice.model,
            ) as writer:
                writer.record_model_call(
                    choice.model, response.input_tokens, response.output_tokens, float(response.cost_cents)
                )
                writer.finish("completed")
        except OSError as exc:
            self._screen.say(f"The compaction's cost could not be recorded: {exc}", "yellow")
        self._usage.setdefault(choice.label, _Usage()).add(
            {
                "input_tokens": response.input_tokens,
                "output_tokens": response.output_tokens,
                "cost_cents": response.cost_cents,
            }
        )
        replaced = compacted(messages, response.content)
        self._session.messages = replaced[:-1]
        last = replaced[-1]
        self._session.add_message(last.role, last.content)  # moves updated_at too
        try:
            self._store.save(self._session)
        except (OSError, ValueError) as exc:
            self._screen.say(f"The compacted session could not be saved: {exc}", "red")
            return
        after = context_size(self._session.messages, "", 0, None).tokens
        self._screen.say(
            f"Compacted {_count(len(older), 'message')} into a summary: about {before} → {after} tokens."
        )

    def _cmd_tools(self, _argument: str) -> None:
        try:
            registry = self._tools()
        except (OSError, ValueError, ConfigError) as exc:
            self._screen.say(f"The tools cannot be loaded: {exc}", "red")
            return
        quorum = self.node.quorum if self.node is not None else None
        rows = []
        for tool in registry.list_tools():
            notes = tool.annotations
            kind = "destructive" if notes.destructive else ("read-only" if notes.read_only else "writes")
            risk = (
                "quorum" if quorum is not None and quorum.enabled and quorum.is_high_risk(tool.name) else ""
            )
            limit = (
                f"{tool.rate_limit.max_calls}/{tool.rate_limit.window_seconds:g}s" if tool.rate_limit else ""
            )
            rows.append([tool.name, kind, risk, limit, _short(tool.description.split(". ")[0], 60)])
        rows.append(["ask_user", "read-only", "", "", "Ask you a question (built in)"])
        self._screen.table(["TOOL", "KIND", "NEEDS", "LIMIT", "WHAT IT DOES"], rows)

    def _cmd_quorum(self, _argument: str) -> None:
        if not self._board.calls:
            enabled = self.node is not None and self.node.quorum.enabled
            self._screen.say(
                "No high-risk call in this session yet."
                if enabled
                else "The quorum is not enabled here: no call needs peers."
            )
            return
        self._screen.table(
            ["REQUEST", "TOOL", "STATE", "SIGNED BY", "DENIED BY", "QUORUM", "WHEN"], self._board.rows()
        )
        for call in self._board.calls:
            if call.outcome and not call.waiting:
                self._screen.say(f"  {call.request_id[:12]}: {visible(call.outcome)}", "dim")

    def _approver_or_say(self) -> Any:
        if self.node is None:
            self._screen.say("The inbox is a node's: start with teaagent tui --config node.toml.", "yellow")
            return None
        try:
            return approver_client(self.node)
        except ConfigError as exc:
            self._screen.say(str(exc), "red")
            return None

    def _cmd_inbox(self, _argument: str) -> None:
        client = self._approver_or_say()
        if client is None:
            return
        assert self.node is not None
        with client:
            try:
                items = client.list_requests("pending")
                # Settled at their origin while they could still be decided: shown as such, once.
                now = time.time()
                items += [item for item in client.list_requests("settled") if item.expires_at >= now]
            except RelayError as exc:
                self._screen.say(str(exc), "red")
                return
        self._inbox = items
        for item in items:
            self._inbox_shown.setdefault((item.origin, item.request_id), item)
        if not items:
            self._screen.say(f"No pending requests for {self.node.agent_id}.")
            return
        self._screen.table(["REQUEST", "ORIGIN", "TOOL", "LEFT", "RULE", "ARGUMENTS"], inbox_rows(items))
        self._screen.say(
            "Decide with /approve ID or /deny ID [REASON]; `teaagent approvals show ID` prints one whole.",
            "dim",
        )

    def _cmd_approve(self, argument: str) -> None:
        self._decide(argument, deny=False)

    def _cmd_deny(self, argument: str) -> None:
        self._decide(argument, deny=True)

    def _decide(self, argument: str, *, deny: bool) -> None:
        verb = "/deny" if deny else "/approve"
        typed, _, reason = argument.partition(" ")
        if not typed:
            self._screen.say(f"Usage: {verb} ID [REASON] (/inbox lists the requests).", "yellow")
            return
        client = self._approver_or_say()
        if client is None:
            return
        assert self.node is not None
        with client:
            try:
                item = resolve_request(
                    client, typed, seen=self._inbox_shown.values(), among="shown by /inbox"
                )
            except ValueError as exc:
                self._screen.say(str(exc), "yellow")
                return
            except RelayError as exc:
                self._screen.say(str(exc), "red")
                return
            try:
                result = decide(
                    client,
                    self.node,
                    item,
                    deny=deny,
                    reason=reason.strip(),
                    signer=self.operator_signer,
                )
            except (RelayError, TeaAgentError) as exc:
                self._screen.say(str(exc), "red")
                return
        try:
            node_key: str | None = self.node.own_public_key().fingerprint
        except ConfigError:
            node_key = None  # the decision is then shown with its key alone
        for line in decision_lines(result, self.node.agent_id, node_key):
            self._screen.say(line, "green" if not deny else "yellow")
        self._inbox = [listed for listed in self._inbox if listed is not item]

    # -- models --------------------------------------------------------------------------------------

    def _adapter(self, choice: _ModelChoice) -> LLMAdapter:
        """The adapter of ``choice``, made once.

        Raises:
            ConfigError: The provider cannot be reached with this configuration (a key, a URL, a script).
            MissingAPIKeyError: The provider's key is not set.
            ValueError: The provider is unknown.
        """
        adapter = self._adapters.get(choice)
        if adapter is not None:
            return adapter
        if self._adapter_factory is not None:
            adapter = self._adapter_factory(choice.provider, choice.model)
            if not isinstance(adapter, LLMAdapter):
                raise ConfigError(f"adapter_factory returned {type(adapter).__name__}, not an LLMAdapter.")
        else:
            adapter = self._built_in_adapter(choice)
        self._adapters[choice] = adapter
        return adapter

    def _built_in_adapter(self, choice: _ModelChoice) -> LLMAdapter:
        node = self.node
        environ: Mapping[str, str] | None = None
        base_url: str | None = None
        if node is not None and choice.name is not None and choice.name in node.models:
            settings = node.models[choice.name]
            base_url = settings.base_url
            key_env = PROVIDER_CONFIGS[choice.provider].api_key_env
            if settings.token and key_env:
                environ = {**os.environ, key_env: settings.token}
        elif node is not None and choice.provider == node.agent.provider:
            base_url = node.agent.base_url
        if choice.provider == "scripted":
            base_url = None  # the offline provider calls no server
        script = self._script_path if choice.provider == "scripted" else None
        if (
            script is None
            and node is not None
            and choice.name is None
            and choice.provider == node.agent.provider
        ):
            script = node.agent.script  # [agent] script belongs to [agent] provider
        return create_llm_adapter(
            choice.provider, choice.model, environ=environ, base_url=base_url, script_path=script
        )

    def _price(self, choice: _ModelChoice) -> float:
        price = price_for(choice.provider, choice.model)
        return price.input_per_1k + price.output_per_1k

    def _cheaper_choice(self) -> _ModelChoice | None:
        """The cheapest configured model that is cheaper than the current one, if any."""
        if self.node is None:
            return None
        try:
            current = self._price(self._choice)
            candidates = [
                (self._price(option), option.label, option)
                for option in (
                    _ModelChoice(settings.provider, settings.model, name)
                    for name, settings in self.node.models.items()
                )
            ]
        except (ConfigError, ValueError) as exc:  # a broken price file: no routing, and it is said
            self._screen.say(
                f"route_model: no price to compare ({exc}); the turn goes to the current model.", "yellow"
            )
            return None
        cheaper = sorted(
            (candidate for candidate in candidates if candidate[0] < current), key=lambda item: item[:2]
        )
        return cheaper[0][2] if cheaper else None

    # -- tools and policy ----------------------------------------------------------------------------

    def _tools(self) -> ToolRegistry:
        """The tools of the model's runs (with ``agent.delegate`` when ``subagent``), made once.

        Raises:
            ConfigError: The node's rate limits name a tool that is not a workspace tool.
            OSError: The workspace is gone.
        """
        if self._registry is not None:
            return self._registry
        if self.node is not None:
            from teaagent.runner._node import node_registry

            base = node_registry(self.node)
        else:
            base = workspace_registry(self.root)
        registry = base
        if self.subagent:
            registry = ToolRegistry(rate_limiter=base.rate_limiter)
            for tool in base.list_tools():
                registry.register(
                    tool.name,
                    tool.description,
                    tool.input_schema,
                    tool.output_schema,
                    tool.annotations,
                    tool.handler,
                    tool.rate_limit,
                    tool.capability_manifest,
                )
            registry.register(
                SUBAGENT_TOOL,
                "Hand a self-contained sub-task to a helper agent, which works on it with the same tools "
                f"and rules (at most {SUBAGENT_MAX_ITERATIONS} turns) and returns its answer. Use it for "
                "a separable piece of work; describe the sub-task fully, the helper sees nothing else.",
                {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "minLength": 1, "maxLength": SUBAGENT_MAX_TASK_CHARS},
                        "max_iterations": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": SUBAGENT_MAX_ITERATIONS,
                        },
                    },
                    "required": ["task"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "status": {"type": "string"},
                        "answer": {"type": "string"},
                        "error": {"type": "string"},
                        "iterations": {"type": "integer"},
                        "tool_calls": {"type": "integer"},
                        "cost_cents": {"type": "number"},
                    },
                    "required": ["status", "answer"],
                },
                # The delegation itself changes nothing: every call the child makes is checked on its own.
                ToolAnnotations(read_only=True, stateful=True),
                self._delegate,
            )
        self._base_registry, self._registry = base, registry
        return registry

    def _policy(self) -> ApprovalPolicy:
        """This run's policy: the node's (or the workspace's), with the session's approvals.

        Raises:
            ConfigError: The quorum is on and the node's own public key cannot be read.
        """
        if self.node is not None:
            from teaagent.runner._node import node_policy

            base = node_policy(self.node, prompter=self._prompter, quorum_gate=self._gate, mode=self._mode)
        else:
            base = ApprovalPolicy.for_workspace(self.root, mode=self._mode, prompter=self._prompter)
        # One JIT state for the whole session: "for the session" outlives one run.
        return dataclasses.replace(base, jit_state=self._jit, allow_all_destructive=self.allow_destructive)

    def _audit_path(self) -> Path:
        if self.node is not None:
            from teaagent.runner._node import node_audit_path

            return node_audit_path(self.node)
        return self.root / AUDIT_FILE

    # -- runs ----------------------------------------------------------------------------------------

    def _run_task(self, task: str) -> RunResult | None:
        try:
            job = self._prepare(task)
        except (TeaAgentError, ValueError, OSError) as exc:
            self._screen.say(f"The run cannot start: {_sentence(exc)}", "red")
            return None
        self._stop_wait.clear()
        self._job = job
        job.thread = threading.Thread(target=self._work, args=(job,), name="teaagent-tui-run", daemon=True)
        self._last_line = time.monotonic()
        job.thread.start()
        try:
            self._pump(job)
        finally:
            self._job = None
            self._waiting = None
            self._screen.status(None)
        if job.error is not None:
            self._screen.say(f"The run could not finish: {_sentence(job.error)}", "red")
        self._save_tui_state()
        return job.result

    def _prepare(self, task: str) -> _Job:
        choice, routed = self._choice, False
        if self.route_model and is_simple_turn(task):
            cheaper = self._cheaper_choice()
            if cheaper is not None:
                choice, routed = cheaper, True
        adapter = self._adapter(choice)
        registry = self._tools()
        policy = self._policy()
        run_id = secrets.token_hex(16)
        audit = AuditLogger(self._audit_path(), run_id=run_id)
        if audit.disk_error is not None:
            audit.close()
            raise ConfigError(f"The audit log {audit.path} cannot be written: {audit.disk_error}.")
        if not self._session.label:
            self._session.label = task[:MAX_LABEL_CHARS]
        try:
            runner = AgentRunner(
                adapter=adapter,
                registry=registry,
                policy=policy,
                audit=audit,
                budget=self.budget,
                run_id=run_id,
                provider=choice.provider,
                model=choice.model,
                root=self.root,
                event_sink=lambda event: self._queue.put(("event", event, 0)),
                ask=self._ask,
                session_store=self._store,
                session=self._session,
                label=RUN_LABEL,
                stream=self.stream,
            )
        except BaseException:
            audit.close()
            raise
        return _Job(
            task=task,
            choice=choice,
            routed=routed,
            adapter=adapter,
            policy=policy,
            audit=audit,
            budget=self.budget,
            runner=runner,
        )

    def _work(self, job: _Job) -> None:
        try:
            job.result = job.runner.run(job.task)
        except BaseException as exc:  # reported by the UI thread; the REPL goes on
            job.error = exc
        finally:
            try:
                job.audit.close()
            finally:
                self._queue.put(("done", job))

    def _pump(self, job: _Job) -> None:
        """Draw what the run reports until it ends; Ctrl-C withdraws a quorum wait or cancels the run."""
        while True:
            try:
                try:
                    item = self._queue.get(timeout=TICK_SECONDS)
                except queue.Empty:
                    item = None
                if item is not None:
                    if item[0] == "done" and item[1] is job:
                        return
                    self._handle(item)
                self._tick()
            except KeyboardInterrupt:
                self._interrupt(job)

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "event":
            self._show(item[1], item[2])
        elif kind == "status":
            self._board.update(item[1])  # the live line and /quorum; the lines come with "wait"
            return
        elif kind == "wait":
            if not self._show_wait(item[1]):
                return  # nothing new was printed: no reason to keep quiet
        elif kind == "note":
            self._screen.say(f"  {visible(item[1])}", "dim")
        elif kind == "prompt":
            self._answer(item[1])
        self._last_line = time.monotonic()

    def _interrupt(self, job: _Job) -> None:
        call = self._board.current
        if call is not None:
            self._stop_wait.set()
            self._board.withdraw()
            self._screen.status(None)
            # The gate sees the stop within a poll, signs the withdrawal and hands it to the relay,
            # which tells every peer; the run then ends with the gate's sentence of how it went.
            self._screen.say(
                f"Withdrawing request {call.request_id[:12]}: {call.tool_name} will not run, the peers drop "
                "it, and the run ends with the refusal.",
                "yellow",
            )
            return
        if job.cancel_requested:
            self._screen.say("Still stopping: a tool call that has started finishes first.", "yellow")
            return
        job.cancel_requested = True
        job.runner.cancel()
        for child in list(job.children):
            child.cancel()
        self._screen.status(None)
        self._screen.say("Cancelling the run…", "yellow")

    def _tick(self) -> None:
        now = time.time()
        call = self._board.current
        if call is not None:
            if self._screen.live:
                self._screen.status(call.live_line(now), key=("quorum", call.request_id))
        elif self._waiting is not None and self.progress:
            wait = self._waiting
            elapsed = int(time.monotonic() - wait.since)
            if wait.kind == "model":
                self._screen.status(
                    f"⠿ thinking… ({wait.detail}) {elapsed}s · Ctrl-C cancels", key=("model", wait.detail)
                )
            elif elapsed >= TOOL_PROGRESS_AFTER_SECONDS:
                self._screen.status(
                    f"⠿ {wait.detail} is running… {elapsed}s · Ctrl-C cancels", key=("tool", wait.detail)
                )
        if self.heartbeat and time.monotonic() - self._last_line >= self.heartbeat:
            text = self._heartbeat_text(now)
            if text is not None:
                self._screen.say(f"… {text}", "dim")
            self._last_line = time.monotonic()

    def _heartbeat_text(self, now: float) -> str | None:
        call = self._board.current
        if call is not None:
            left = time_left(call.expires_at - now)
            return f"still waiting for {call.tool_name}'s quorum: {call.summary()}, {left} left"
        wait = self._waiting
        if wait is None:
            return None
        elapsed = int(time.monotonic() - wait.since)
        if wait.kind == "model":
            return f"still waiting for the model ({wait.detail}), {elapsed}s"
        return f"{wait.detail} still running, {elapsed}s"

    # -- what the run reports ------------------------------------------------------------------------

    def _relay_note(self, line: str) -> None:
        # "request ...: waiting ..." lines are the board's to show; the others are the relay's troubles.
        if not line.startswith("request ") and " needs " not in line:
            self._queue.put(("note", line))

    def _relay_status(self, status: RequestStatus) -> None:
        self._queue.put(("status", status))

    def _relay_wait(self, progress: WaitProgress) -> None:
        self._queue.put(("wait", progress))

    def _show_wait(self, progress: WaitProgress) -> bool:
        """Print what changed of a quorum wait, and the wait itself when sent or reminded.

        Returns:
            False when nothing was printed.
        """
        from teaagent.relay_client import describe_wait, wait_news

        before = self._waits.get(progress.request_id)
        self._waits[progress.request_id] = progress
        lines = wait_news(before, progress)
        for line in lines:
            colour = "green" if line.startswith("✓") else "red" if line.startswith("✗") else "dim"
            self._screen.say(f"  {visible(line)}", colour)
        if progress.why in ("sent", "reminder") and progress.waiting:
            self._screen.say(f"  {visible(describe_wait(progress))}", "yellow")
            return True
        return bool(lines)

    def _show(self, event: RunEvent, depth: int) -> None:
        data = event.data
        kind = event.kind
        say = self._screen.say
        pad = "  │ " * depth
        if kind == "run_started":
            if depth:
                say(
                    f"{'  │ ' * (depth - 1)}  ↳ sub-task (run {str(data['run_id'])[-8:]}): "
                    f"{_short(data['task'], 120)}",
                    "magenta",
                )
            elif self._job is not None and self._job.routed:
                say(f"A simple turn: routed to {self._job.choice.label}, the cheaper model.", "dim")
        elif kind == "model_request":
            self._waiting = _Wait("model", f"turn {data['iteration']}", time.monotonic())
        elif kind == "model_delta":
            if depth == 0 and self.stream:
                # The reply is arriving: no "thinking" line to redraw between its pieces.
                self._waiting = None
                if not self._streamed:
                    self._screen.status(None)
                self._streamed = True
                self._screen.write(visible(str(data["text"])))
        elif kind == "model_response":
            self._waiting = None
            self._screen.status(None)
            content = str(data["content"]).strip()
            if self._streamed and depth == 0:
                self._streamed = False
                self._screen.write("\n")
            elif content:
                say(f"{pad}{visible(content)}")
        elif kind == "tool_call":
            self._waiting = _Wait("tool", str(data["tool_name"]), time.monotonic())
            say(f"{pad}→ {visible(str(data['tool_name']))} {_short(data['arguments'])}", "cyan")
        elif kind == "approval_waiting":
            self._waiting = None
            if data.get("via") == "quorum":
                begun = self._board.begin(data)
                self._screen.status(None)
                say(f"{pad}{begun.opening()}", "yellow")
        elif kind == "approval_granted":
            if data.get("via") == "quorum":
                call = self._board.granted(str(data["call_id"]))
                self._screen.status(None)
                signers = ", ".join(call.signers) if call is not None and call.signers else "the peers"
                say(
                    f"{pad}✓ quorum reached for {data['tool_name']}: signed by {signers}; "
                    "the certificate is verified before it runs.",
                    "green",
                )
            else:
                say(f"{pad}✓ {data['tool_name']} approved ({data.get('answer', data.get('via'))})", "green")
            self._waiting = _Wait("tool", str(data["tool_name"]), time.monotonic())
        elif kind == "approval_denied":
            self._waiting = None
            self._board.denied(str(data["call_id"]), str(data["reason"]))
            self._screen.status(None)
            say(f"{pad}✗ {visible(str(data['reason']))}", "red")
        elif kind == "tool_result":
            self._waiting = None
            self._screen.status(None)
            name = visible(str(data["tool_name"]))
            if data["ok"]:
                say(f"{pad}← {name} {_short(data['result'])}", "green")
            else:
                say(f"{pad}← {name} failed: {_short(data['error'])}", "red")
        elif kind == "run_finished":
            self._waiting = None
            self._screen.status(None)
            self._finished(data, depth)

    def _finished(self, data: Mapping[str, Any], depth: int) -> None:
        job = self._job
        choice = job.choice if job is not None else self._choice
        self._usage.setdefault(choice.label, _Usage()).add(data)
        status = str(data["status"])
        style = "green" if status == "completed" else "red"
        counts = (
            f"{status} · {_count(int(data['iterations']), 'turn')} · "
            f"{_count(int(data['tool_calls']), 'tool call')} · {float(data['cost_cents']):.4f} cents"
        )
        if depth:
            self._screen.say(f"{'  │ ' * (depth - 1)}  ↳ sub-task {counts}", style)
            return
        if status != "completed" and data.get("error_message"):
            self._screen.say(f"The run ended {status}: {visible(str(data['error_message']))}", style)
        routed = " (a simple turn, routed to the cheaper model)" if job is not None and job.routed else ""
        self._screen.say(f"{counts} · answered by {choice.label}{routed}", "dim")

    # -- asking the user, from the run's threads -----------------------------------------------------

    def _put_to_user(self, prompt: _Prompt) -> Any:
        """Hand ``prompt`` to the UI thread and wait for its answer (in a run's thread).

        A Ctrl-C that cancels the run answers no at once, even if it struck just as the prompt
        was taken off the queue and before it was shown.
        """
        job = self._job
        self._queue.put(("prompt", prompt))
        while not prompt.done.wait(TICK_SECONDS):
            if job is not None and job.cancel_requested:
                break
        return prompt.answer

    def _prompter(self, request: PromptRequest) -> PromptAnswer:
        answer: PromptAnswer = self._put_to_user(_Prompt("approval", request, PromptAnswer.DENY))
        return answer

    def _ask(self, question: Question) -> str | None:
        answer: str | None = self._put_to_user(_Prompt("question", question, None))
        return answer

    def _answer(self, prompt: _Prompt) -> None:
        """Put a worker's question to the user; Ctrl-C or the end of input answers no."""
        assert self._reader is not None
        self._screen.status(None)
        try:
            if prompt.kind == "approval":
                prompt.answer = self._ask_approval(prompt.request)
            else:
                prompt.answer = self._ask_question(prompt.request)
        except KeyboardInterrupt:
            self._end_prompt_line()
            self._screen.say("  (Ctrl-C: no.)", "yellow")
        except EOFError:
            self._end_prompt_line()
            self._eof = True
            self._screen.say("  (end of input: no.)", "yellow")
        finally:
            prompt.done.set()  # whatever happened, the worker is answered (denied, declined by default)

    def _ask_approval(self, request: PromptRequest) -> PromptAnswer:
        assert self._reader is not None
        what = "destructive" if request.annotations.get("destructive") else "not read-only"
        self._screen.say(
            f"⚠ {visible(request.tool_name)} {_short(request.arguments)} is {what}: it needs your approval.",
            "bold yellow",
        )
        if request.reason:
            self._screen.say(f"  reason: {_short(request.reason)}")
        text = self._reader.read(
            "  allow it? [o]nce, for the [s]ession, or [d]eny (default): ", remember=False
        )
        answer = text.strip().lower()
        if answer in ("o", "once", "y", "yes"):
            return PromptAnswer.ONCE
        if answer in ("s", "session", "a", "always"):
            return PromptAnswer.SESSION
        return PromptAnswer.DENY

    def _ask_question(self, question: Question) -> str | None:
        assert self._reader is not None
        self._screen.say(f"? {visible(question.question)}", "bold cyan")
        for number, option in enumerate(question.options, start=1):
            self._screen.say(f"  {number}. {visible(option)}")
        text = self._reader.read("  your answer (empty to decline): ", remember=False).strip()
        if text.isdigit() and 1 <= int(text) <= len(question.options):
            return question.options[int(text) - 1]
        return text or None

    # -- sub-agents ----------------------------------------------------------------------------------

    def _delegate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``agent.delegate``: run a sub-task as a child run with its own budget (in the gate's thread)."""
        job = self._job
        if job is None or self._base_registry is None:
            raise RuntimeError("a sub-task needs a run to belong to")
        job.sub_tasks += 1
        parent_cap = job.budget.max_estimated_cost_cents
        budget = RunBudget(
            max_iterations=min(
                int(arguments.get("max_iterations", SUBAGENT_MAX_ITERATIONS)), SUBAGENT_MAX_ITERATIONS
            ),
            max_tool_calls=SUBAGENT_MAX_TOOL_CALLS,
            max_estimated_cost_cents=SUBAGENT_MAX_COST_CENTS
            if parent_cap is None
            else min(SUBAGENT_MAX_COST_CENTS, parent_cap),
        )
        child = AgentRunner(
            adapter=job.adapter,
            registry=self._base_registry,
            policy=job.policy,
            audit=job.audit,
            budget=budget,
            run_id=f"{job.runner.run_id}-sub{job.sub_tasks}",
            provider=job.choice.provider,
            model=job.choice.model,
            root=self.root,
            event_sink=lambda event: self._queue.put(("event", event, 1)),
            ask=self._ask,
            label=f"{RUN_LABEL}-subagent",
        )
        job.children.append(child)
        if job.cancel_requested:
            child.cancel()
        result = child.run(str(arguments["task"]))
        return {
            "status": result.status,
            "answer": result.final_answer.content if result.final_answer is not None else "",
            "error": result.error_message or "",
            "iterations": result.iterations,
            "tool_calls": result.tool_calls,
            "cost_cents": result.cost_cents,
        }
