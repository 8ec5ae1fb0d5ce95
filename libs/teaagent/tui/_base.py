"""The state of a TUI that its parts share, declared once: the REPL, its runs and its commands use it."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teaagent.budget import RunBudget
from teaagent.config import NodeConfig
from teaagent.llm import LLMAdapter
from teaagent.policy import JITApprovalState, PermissionMode, QuorumGate
from teaagent.session import ChatSession, SessionStore
from teaagent.signing import Signer
from teaagent.tools import ToolRegistry
from teaagent.tui._common import AdapterFactory, Job, ModelChoice, Usage, Wait
from teaagent.tui._quorum import QuorumBoard
from teaagent.tui._screen import LineReader, Screen

if TYPE_CHECKING:
    from teaagent.approver_client import ApprovalItem
    from teaagent.relay_client import WaitProgress

__all__ = ["TUIBase"]


class TUIBase:
    """What :class:`~teaagent.tui.TeaAgentTUI` sets up in ``__init__``, for the modules of its parts."""

    node: NodeConfig | None
    root: Path
    budget: RunBudget
    stream: bool
    subagent: bool
    progress: bool
    heartbeat: int
    route_model: bool
    allow_destructive: bool
    _adapter_factory: AdapterFactory | None
    _script_path: str | os.PathLike[str] | None
    _screen: Screen
    _store: SessionStore
    _session: ChatSession
    _choice: ModelChoice
    _mode: PermissionMode
    _jit: JITApprovalState
    _board: QuorumBoard
    _usage: dict[str, Usage]
    _queue: queue.Queue[tuple[Any, ...]]
    _stop_wait: threading.Event
    _adapters: dict[ModelChoice, LLMAdapter]
    _base_registry: ToolRegistry | None
    _registry: ToolRegistry | None
    _gate: QuorumGate | None
    _waits: dict[str, WaitProgress]
    _job: Job | None
    _waiting: Wait | None
    _streamed: bool
    _last_line: float
    _reader: LineReader | None
    database: Path | None
    operator_signer: Signer | None
    _memory: bool
    _quit: bool
    _session_note: str
    _inbox: list[ApprovalItem]
    _inbox_shown: dict[tuple[str, str], ApprovalItem]
    # What one part calls of another: the REPL's, and the runs'.
    _save_tui_state: Callable[[], None]
    _end_prompt_line: Callable[[], None]
    _tools: Callable[[], ToolRegistry]
    _adapter: Callable[[ModelChoice], LLMAdapter]
