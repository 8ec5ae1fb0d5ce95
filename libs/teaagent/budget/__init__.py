"""A run's hard limits (iterations, tool calls, cost in cents) and the error raised when one is reached.

See :class:`RunBudget` for the meaning of the cost cap (None unlimited, 0 no spend, N a hard cap).
"""

from __future__ import annotations

from teaagent.budget._budget import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_ESTIMATED_COST_CENTS,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_MAX_TOOL_CALLS,
    RunBudget,
    approx_tokens,
)
from teaagent.errors import BudgetExceededError

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_ESTIMATED_COST_CENTS",
    "DEFAULT_MAX_ITERATIONS",
    "DEFAULT_MAX_TOOL_CALLS",
    "BudgetExceededError",
    "RunBudget",
    "approx_tokens",
]
