"""The agent run: the loop, the shapes a run passes around, and the errors that stop it at its budget.

:class:`AgentRunner` runs one task (see :mod:`teaagent.runner._runner` for the loop, step by step);
its :class:`RunEvent` stream tells callbacks and async iterators what happens as it happens.

``RunLimitError`` (iteration or tool-call limit) and ``CostCapError`` (estimated cost above the
cap) are both :class:`teaagent.budget.BudgetExceededError`.
"""

from __future__ import annotations

from teaagent.errors import CostCapError, RunLimitError
from teaagent.runner._ask import ASK_USER_TOOL, AskCallback, Question
from teaagent.runner._events import EVENT_KINDS, MAX_EVENT_HISTORY, EventSink, RunEvent
from teaagent.runner._run_state import MAX_TOOL_RESULT_CHARS
from teaagent.runner._runner import (
    CANCELLED_MESSAGE,
    DEFAULT_MAX_OUTPUT_TOKENS,
    DEFAULT_SYSTEM_PROMPT,
    AgentRunner,
)
from teaagent.runner._types import (
    BYTES_KEY,
    REDACTED,
    RUN_STATUSES,
    ApprovalRequest,
    FinalAnswer,
    RunResult,
    RunStatus,
    ToolRequest,
    ValidationResult,
    Validator,
)

__all__ = [
    "ASK_USER_TOOL",
    "BYTES_KEY",
    "CANCELLED_MESSAGE",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "DEFAULT_SYSTEM_PROMPT",
    "EVENT_KINDS",
    "MAX_EVENT_HISTORY",
    "MAX_TOOL_RESULT_CHARS",
    "REDACTED",
    "RUN_STATUSES",
    "AgentRunner",
    "ApprovalRequest",
    "AskCallback",
    "CostCapError",
    "EventSink",
    "FinalAnswer",
    "Question",
    "RunEvent",
    "RunLimitError",
    "RunResult",
    "RunStatus",
    "ToolRequest",
    "ValidationResult",
    "Validator",
]
