"""A run's hard limits: iterations, tool calls and cost in cents.

The cost cap (``max_estimated_cost_cents``) reads:

========  ==============================================================================
value     meaning
========  ==============================================================================
``None``  unlimited: no cost check is performed
``0``     no spend: any positive cost (spent, or estimated before a call) raises at once
``N > 0`` a hard cap of N cents: reaching N exactly is allowed, going above it raises
========  ==============================================================================

The runner asks before each step (:meth:`RunBudget.check_iteration`, :meth:`RunBudget.check_tool_calls`,
:meth:`RunBudget.check_cost_preflight`) and after each model call (:meth:`RunBudget.check_cost`), so a
step that would break a limit is refused before it is taken.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from teaagent.errors import CostCapError, RunLimitError
from teaagent.llm import estimate_cost_preflight

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_MAX_ESTIMATED_COST_CENTS",
    "DEFAULT_MAX_ITERATIONS",
    "DEFAULT_MAX_TOOL_CALLS",
    "RunBudget",
    "approx_tokens",
]

DEFAULT_MAX_ITERATIONS = 25  # room for a read-edit-test loop on a real task; a runaway model stops soon
DEFAULT_MAX_TOOL_CALLS = 25  # one tool call per iteration on average
DEFAULT_MAX_ESTIMATED_COST_CENTS = 500  # a $5.00 hard cap per run
# The providers' published rule of thumb (about 4 characters of English per token). It is only the
# prompt side of the preflight estimate, which already charges every allowed output token.
CHARS_PER_TOKEN = 4
# Per-call costs summed in floats drift by a few ulps (499.9 + 0.1 is not 500.0); a total within
# this relative distance of the cap counts as reaching it, not exceeding it. Zero times anything
# is zero, so a cap of 0 still refuses every positive cost.
_CAP_RELATIVE_TOLERANCE = 1e-12


def approx_tokens(chars: int) -> int:
    """Return the token count assumed for ``chars`` characters of prompt: ``ceil(chars / 4)``.

    Args:
        chars: Characters of prompt text.

    Returns:
        The estimated number of tokens, rounded up.

    Raises:
        TypeError: ``chars`` is not an int (a bool is refused too).
        ValueError: ``chars`` is negative.
    """
    _require_int("chars", chars, minimum=0)
    return -(-chars // CHARS_PER_TOKEN)


def _require_int(name: str, value: object, *, minimum: int) -> int:
    # bool is an int subclass: True would pass as 1, so refuse it by name.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}.")
    return value


def _require_cents(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of cents, not {type(value).__name__}.")
    # A NaN compares false with everything and would pass every cap: refuse it.
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of cents >= 0, not {value!r}.")
    return float(value)


def _exceeds(total: float, cap: int) -> bool:
    return total > cap and not math.isclose(total, cap, rel_tol=_CAP_RELATIVE_TOLERANCE, abs_tol=0.0)


def _cents(value: float, cap: int) -> str:
    """Write ``value`` for a message: above ``cap`` never reads as within it, nor positive as 0."""
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    if value > 0 and float(text) <= cap:
        return repr(value)
    return text


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _check_limit(name: str, value: object, limit: int, noun: str) -> None:
    """Refuse ``value`` (an int >= 0) above ``limit``: ``The run stopped at its limit of 3 iterations.``"""
    if _require_int(name, value, minimum=0) > limit:
        raise RunLimitError(f"The run stopped at its limit of {_count(limit, noun)}.")


@dataclass(frozen=True)
class RunBudget:
    """The hard limits of one agent run, checked by the runner before every step.

    The budget is checked when it is built, so an invalid one never exists; :meth:`validate`
    repeats the same checks for callers that want to say so explicitly.

    Attributes:
        max_iterations: Model turns the run may take (>= 1).
        max_tool_calls: Tool calls the run may make (>= 0; 0 means the run may not call tools).
        max_estimated_cost_cents: The cost cap in US cents: None for unlimited, 0 for no spend,
            N for a hard cap of N cents (see the module docstring).

    Raises:
        TypeError: A limit is not an int (a bool or a float is refused too).
        ValueError: A limit is out of range.
    """

    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    max_estimated_cost_cents: int | None = DEFAULT_MAX_ESTIMATED_COST_CENTS

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the pre-conditions of the budget.

        Raises:
            TypeError: ``max_iterations``, ``max_tool_calls`` or a non-None ``max_estimated_cost_cents``
                is not an int; bools and floats are refused.
            ValueError: ``max_iterations`` < 1, ``max_tool_calls`` < 0, or ``max_estimated_cost_cents`` < 0.
        """
        _require_int("max_iterations", self.max_iterations, minimum=1)
        _require_int("max_tool_calls", self.max_tool_calls, minimum=0)
        if self.max_estimated_cost_cents is not None:
            _require_int("max_estimated_cost_cents", self.max_estimated_cost_cents, minimum=0)

    def check_iteration(self, iteration: int) -> None:
        """Refuse to start iteration number ``iteration`` (counted from 1) when it is past the limit.

        Args:
            iteration: The number of the iteration about to start; iteration ``max_iterations`` runs,
                the next one raises.

        Raises:
            RunLimitError: ``iteration`` > ``max_iterations``.
            TypeError: ``iteration`` is not an int.
            ValueError: ``iteration`` is negative.
        """
        _check_limit("iteration", iteration, self.max_iterations, "iteration")

    def check_tool_calls(self, count: int) -> None:
        """Refuse the tool call that would bring the run's total to ``count`` when that is past the limit.

        Args:
            count: The run's tool calls including the one about to be made; the ``max_tool_calls``-th
                call runs, the next one raises.

        Raises:
            RunLimitError: ``count`` > ``max_tool_calls`` (with a limit of 0, any call at all).
            TypeError, ValueError: As :meth:`check_iteration` for its ``iteration``.
        """
        if self.max_tool_calls == 0 and _require_int("count", count, minimum=0) > 0:
            raise RunLimitError("The run may not call tools: its tool-call limit is 0.")
        _check_limit("count", count, self.max_tool_calls, "tool call")

    def check_cost(self, spent_cents: float) -> None:
        """Refuse to go on when the run has spent more than its cap.

        Does nothing when ``max_estimated_cost_cents`` is None. With a cap of 0 any positive spend
        raises; with a cap of N, spending exactly N is allowed and more raises.

        Args:
            spent_cents: What the run's model calls have cost so far, in US cents.

        Raises:
            CostCapError: ``spent_cents`` is above the cap.
            TypeError: ``spent_cents`` is not a number.
            ValueError: ``spent_cents`` is negative, NaN or infinite.
        """
        cap = self.max_estimated_cost_cents
        if cap is None:
            return
        spent = _require_cents("spent_cents", spent_cents)
        if not _exceeds(spent, cap):
            return
        if cap == 0:
            raise CostCapError(f"The run spent {_cents(spent, cap)} cents, but its cost cap is 0 cents.")
        raise CostCapError(f"The run spent {_cents(spent, cap)} cents, above its cost cap of {cap} cents.")

    def check_cost_preflight(
        self,
        provider: str,
        model: str,
        approx_input_chars: int,
        max_output_tokens: int,
        *,
        spent_cents: float = 0.0,
    ) -> None:
        """Refuse a model call before it is made when it could take the run above its cost cap.

        The call's estimate is :func:`teaagent.llm.estimate_cost_preflight` with
        ``ceil(approx_input_chars / 4)`` prompt tokens and every one of ``max_output_tokens`` charged;
        the check compares ``spent_cents + estimate`` with the cap, so with the default
        ``spent_cents=0`` it compares the estimate alone. Does nothing when the cap is None or the
        estimate is 0 (a free call is never refused here; :meth:`check_cost` stops a run already
        over its cap); with a cap of 0 any positive estimate raises.

        Args:
            provider: A provider name from :func:`teaagent.llm.available_providers`.
            model: The model the call will use.
            approx_input_chars: Characters of the prompt about to be sent.
            max_output_tokens: The most tokens the call may generate.
            spent_cents: What the run has already spent, in US cents.

        Raises:
            CostCapError: ``spent_cents`` plus the estimate is above the cap.
            ValueError: ``provider`` is unknown, or an argument is negative or not finite.
            TypeError: A count is not an int, or ``spent_cents`` is not a number.
            ConfigError: ``TEAAGENT_PRICES_FILE`` names a missing or malformed price file.
        """
        cap = self.max_estimated_cost_cents
        if cap is None:
            return
        spent = _require_cents("spent_cents", spent_cents)
        _require_int("approx_input_chars", approx_input_chars, minimum=0)
        estimate = estimate_cost_preflight(
            provider, model, approx_tokens(approx_input_chars), max_output_tokens
        )
        call_cents = estimate["total_max_cents"]
        total = spent + call_cents
        # A free call cannot take the run anywhere; a run already over its cap is check_cost's to stop.
        if call_cents == 0 or not _exceeds(total, cap):
            return
        if cap == 0:
            raise CostCapError(
                f"This model call could cost up to {_cents(call_cents, cap)} cents, "
                "but the run's cost cap is 0 cents."
            )
        raise CostCapError(
            f"This model call could cost up to {_cents(call_cents, 0)} cents, which would bring the run "
            f"to {_cents(total, cap)} cents, above its cost cap of {cap} cents."
        )
