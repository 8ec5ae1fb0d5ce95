"""What the TUI's parts share: its files and limits, how it shortens what it shows, and a run's shapes."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from teaagent.audit import AuditLogger
from teaagent.budget import RunBudget
from teaagent.llm import LLMAdapter
from teaagent.policy import ApprovalPolicy
from teaagent.runner import AgentRunner, RunResult
from teaagent.tui._screen import visible

__all__ = [
    "AUDIT_FILE",
    "HISTORY_FILE",
    "SUBAGENT_TOOL",
    "AdapterFactory",
]

log = logging.getLogger("teaagent.tui")

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

QUIT_HINT: Final = "Type /quit or press Ctrl-D to leave."


def short(value: object, limit: int = SHOWN_CHARS) -> str:
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    text = visible(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def sentence(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


@dataclass(frozen=True)
class ModelChoice:
    provider: str
    model: str
    name: str | None = None  # the [models.NAME] table it comes from

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.model}"


USAGE_COUNTERS: Final = ("iterations", "tool_calls", "input_tokens", "output_tokens")
"""What ``/usage`` adds up of each run, as the run's result names it (its columns, in order)."""


@dataclass
class Usage:
    """One model's runs in this session: how many, their counters (:data:`USAGE_COUNTERS`), their cost."""

    runs: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_COUNTERS, 0))
    cost_cents: float = 0.0

    def add(self, data: Mapping[str, Any]) -> None:
        self.runs += 1
        for name in USAGE_COUNTERS:
            self.counts[name] += int(data.get(name) or 0)
        self.cost_cents += float(data.get("cost_cents") or 0.0)


@dataclass
class Job:
    """One task running in its worker thread."""

    task: str
    choice: ModelChoice
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
class Prompt:
    """A question from a worker thread that the UI thread puts to the user."""

    kind: str  # "approval" | "question"
    request: Any
    answer: Any = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class Wait:
    kind: str  # "model" | "tool"
    detail: str
    since: float
