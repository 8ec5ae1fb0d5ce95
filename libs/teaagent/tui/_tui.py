"""``TeaAgentTUI``: a REPL over the agent runner, where a high-risk call visibly waits for its peers.

Threads. The REPL, every prompt and every line drawn live on the caller's thread (the *UI thread*).
Each task runs in a worker thread (:meth:`AgentRunner.run`); whatever the run reports (its events,
the relay's status of a quorum request, an approval to ask about, a question from the model) is put
on one queue that the UI thread drains while the run lasts, so that the screen is only ever drawn
from one thread and Ctrl-C (which Python delivers to the main thread) always reaches the REPL:
during a quorum wait it stops the wait (the call is refused and the run ends with that refusal);
at any other moment of a run it cancels the run; at the prompt it says how to leave.

Here: the REPL, its reading and its saved state. The runs (model, tools and gate, worker thread,
what a run shows and asks) are :mod:`teaagent.tui._runs`; the ``/commands`` are the table of
:mod:`teaagent.tui._commands` and its command modules (``_cmd_*.py``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teaagent._words import plural
from teaagent.budget import RunBudget
from teaagent.config import NodeConfig
from teaagent.errors import ConfigError
from teaagent.llm import PROVIDER_CONFIGS, LLMAdapter, available_providers
from teaagent.policy import JITApprovalState, PermissionMode, QuorumGate
from teaagent.runner._node import node_quorum_gate
from teaagent.session import ChatSession, SessionStore, check_session_id, new_session
from teaagent.signing import Signer
from teaagent.tools import ToolRegistry
from teaagent.tui import _commands
from teaagent.tui._cmd_model import model_names
from teaagent.tui._commands import COMMANDS, Command
from teaagent.tui._common import (
    AGAIN_SECONDS,
    AUDIT_FILE,
    HISTORY_FILE,
    QUIT_HINT,
    SUBAGENT_TOOL,
    AdapterFactory,
    Job,
    ModelChoice,
    Usage,
    Wait,
    count,
    log,
)
from teaagent.tui._quorum import QuorumBoard
from teaagent.tui._runs import RunsMixin
from teaagent.tui._screen import FunctionReader, LineReader, PlainScreen, RichScreen, Screen, ToolkitReader
from teaagent.tui._state import MEMORY, STATE_FILE, MemorySessionStore, TUIState, load_state, save_state

if TYPE_CHECKING:
    from teaagent.approver_client import ApprovalItem
    from teaagent.relay_client import WaitProgress


__all__ = [
    "AUDIT_FILE",
    "COMMANDS",
    "HISTORY_FILE",
    "SUBAGENT_TOOL",
    "AdapterFactory",
    "Command",
    "TeaAgentTUI",
]


class TeaAgentTUI(RunsMixin):
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
        self._usage: dict[str, Usage] = {}
        # Runs.
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._stop_wait = threading.Event()
        self._adapters: dict[ModelChoice, LLMAdapter] = {}
        self._base_registry: ToolRegistry | None = None
        self._registry: ToolRegistry | None = None
        self._gate: QuorumGate | None = None
        if node is not None:
            self._gate = node_quorum_gate(
                node,
                on_progress=self._relay_note,
                on_status=self._relay_status,
                on_wait=self._relay_wait,
                stop=self._stop_wait,
            )
        self._waits: dict[str, WaitProgress] = {}  # the last view of each quorum wait shown
        self._job: Job | None = None
        self._waiting: Wait | None = None
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
            log.exception("the TUI failed")
            self._say_safely(f"The TUI failed: {type(exc).__name__}: {exc}")
            return 1
        finally:
            self._screen_off()

    def _say_safely(self, text: str) -> None:
        try:
            self._screen.status(None)
            self._screen.say(text, "red")
        except Exception:  # the screen itself is what failed: nothing more can be said
            log.exception("the TUI could not say %r", text)

    def _screen_off(self) -> None:
        try:
            self._screen.status(None)
        except Exception:
            log.exception("the status line could not be cleared")

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
                self._screen.say(f"(Ctrl-C again to leave.) {QUIT_HINT}", "dim")
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
        tree["/model"] = {name: None for name in model_names(self)}
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
            log.exception("handling %r failed", line)
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

    def _initial_choice(self, provider: str | None, model: str | None, state: TUIState | None) -> ModelChoice:
        node = self.node
        if provider is None and model is None and state is not None and state.provider in PROVIDER_CONFIGS:
            assert state.provider is not None
            name = state.model_name if node is not None and state.model_name in node.models else None
            return ModelChoice(
                state.provider, state.model or PROVIDER_CONFIGS[state.provider].default_model, name
            )
        if provider is None:
            provider = node.agent.provider if node is not None else "scripted"
        if model is None and node is not None and provider == node.agent.provider and node.agent.model:
            model = node.agent.model
        return ModelChoice(provider, model or PROVIDER_CONFIGS[provider].default_model)

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
        return found, f"resumed, {count(len(found.messages), 'message')}"

    # -- commands ------------------------------------------------------------------------------------

    def _handle_tui_command(self, raw_command: str) -> bool:
        """Dispatch a raw REPL command string (see :func:`teaagent.tui._commands.handle`).

        Returns:
            bool: True if the command was handled, False if unrecognised (a line that is not a
            ``/command`` is a task, not a command: False as well).
        """
        return _commands.handle(self, raw_command)
