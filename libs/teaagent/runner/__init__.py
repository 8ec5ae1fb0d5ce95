"""The agent run: the shapes a run passes around and the errors that stop it at its budget.

``RunLimitError`` (iteration or tool-call limit) and ``CostCapError`` (estimated cost above the
cap) are both :class:`teaagent.budget.BudgetExceededError`.
"""

from __future__ import annotations

from teaagent.errors import CostCapError, RunLimitError
from teaagent.runner._types import (
    BYTES_KEY,
    REDACTED,
    RUN_STATUSES,
    ApprovalRequest,
    FinalAnswer,
    RunResult,
    RunStatus,
    ToolRequest,
)

__all__ = [
    "BYTES_KEY",
    "REDACTED",
    "RUN_STATUSES",
    "ApprovalRequest",
    "CostCapError",
    "FinalAnswer",
    "RunLimitError",
    "RunResult",
    "RunStatus",
    "ToolRequest",
]
