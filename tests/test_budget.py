"""teaagent.budget: RunBudget's limits, its cost-cap semantics (None / 0 / N) and its checks."""

from __future__ import annotations

import dataclasses
import math

import pytest

import teaagent.errors
from teaagent.budget import (
    CHARS_PER_TOKEN,
    DEFAULT_MAX_ESTIMATED_COST_CENTS,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_MAX_TOOL_CALLS,
    BudgetExceededError,
    RunBudget,
    approx_tokens,
)
from teaagent.errors import CostCapError, RunLimitError

# openai/gpt-4.1 lists at $0.002 in / $0.008 out per 1,000 tokens: 4,000 prompt characters
# (1,000 tokens) cost 0.2 cents and 1,000 output tokens 0.8 cents, so such a call is 1.0 cent.
PAID = ("openai", "gpt-4.1")
ONE_CENT_CALL = (4000, 1000)  # (approx_input_chars, max_output_tokens)


# --- the spec's named tests -------------------------------------------------------------------


def test_budget_zero_cents_rejects_any_spend() -> None:
    budget = RunBudget(max_estimated_cost_cents=0)

    assert budget.check_cost(0) is None
    assert budget.check_cost(0.0) is None
    with pytest.raises(CostCapError, match=r"^The run spent 0\.01 cents, but its cost cap is 0 cents\.$"):
        budget.check_cost(0.01)
    # Even a cost too small to print with four decimals is a positive cost.
    with pytest.raises(CostCapError, match=r"^The run spent 1e-12 cents, but its cost cap is 0 cents\.$"):
        budget.check_cost(1e-12)
    with pytest.raises(BudgetExceededError):
        budget.check_cost_preflight(*PAID, approx_input_chars=1, max_output_tokens=0)


def test_budget_none_allows_unlimited() -> None:
    budget = RunBudget(max_estimated_cost_cents=None)

    assert budget.check_cost(10**12) is None
    assert budget.check_cost_preflight(*PAID, approx_input_chars=10**9, max_output_tokens=10**9) is None
    # "No cost check is performed": not even the provider is looked up.
    assert budget.check_cost_preflight("no-such-provider", "m", 1, 1) is None
    assert budget.check_cost(math.nan) is None


def test_budget_default_500_cents() -> None:
    budget = RunBudget()

    assert budget.max_estimated_cost_cents == 500 == DEFAULT_MAX_ESTIMATED_COST_CENTS
    assert budget.check_cost(500) is None
    with pytest.raises(
        CostCapError, match=r"^The run spent 500\.01 cents, above its cost cap of 500 cents\.$"
    ):
        budget.check_cost(500.01)


def test_zero_cost_cap_blocks_positive_cost_run() -> None:
    # A run under a 0-cent cap whose first model call has a positive estimate is stopped before the
    # call is made (RunBudget's run-level checks, which the runner calls before each model call).
    # The runner issue adds a runner-level test of the same story.
    budget = RunBudget(max_estimated_cost_cents=0)

    with pytest.raises(
        CostCapError,
        match=r"^This model call could cost up to 1 cents, but the run's cost cap is 0 cents\.$",
    ):
        budget.check_cost_preflight(*PAID, *ONE_CENT_CALL)
    # The offline provider costs nothing, so the same run on it is not blocked.
    assert budget.check_cost_preflight("scripted", "scripted", *ONE_CENT_CALL) is None


# --- construction and validate() -------------------------------------------------------------


def test_defaults_are_25_25_500() -> None:
    assert RunBudget() == RunBudget(25, 25, 500)
    assert (DEFAULT_MAX_ITERATIONS, DEFAULT_MAX_TOOL_CALLS) == (25, 25)


def test_budget_is_frozen() -> None:
    budget = RunBudget()
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.max_iterations = 100  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_iterations": 0}, r"^max_iterations must be >= 1, not 0\.$"),
        ({"max_iterations": -5}, r"^max_iterations must be >= 1, not -5\.$"),
        ({"max_tool_calls": -1}, r"^max_tool_calls must be >= 0, not -1\.$"),
        ({"max_estimated_cost_cents": -1}, r"^max_estimated_cost_cents must be >= 0, not -1\.$"),
    ],
)
def test_out_of_range_limits_raise_value_error(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunBudget(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_iterations": 1},
        {"max_tool_calls": 0},
        {"max_estimated_cost_cents": 0},
        {"max_estimated_cost_cents": None},
    ],
)
def test_lowest_valid_limits_are_accepted(kwargs: dict[str, int | None]) -> None:
    budget = RunBudget(**kwargs)  # type: ignore[arg-type]
    assert budget.validate() is None
    assert dataclasses.asdict(budget).items() >= kwargs.items()


@pytest.mark.parametrize("field", ["max_iterations", "max_tool_calls", "max_estimated_cost_cents"])
@pytest.mark.parametrize(
    ("value", "type_name"), [(True, "bool"), (False, "bool"), (5.0, "float"), ("5", "str")]
)
def test_non_int_limits_raise_type_error(field: str, value: object, type_name: str) -> None:
    with pytest.raises(TypeError, match=rf"^{field} must be an int, not {type_name}\.$"):
        RunBudget(**{field: value})  # type: ignore[arg-type]


def test_validate_rechecks_a_budget_changed_behind_its_back() -> None:
    budget = RunBudget()
    object.__setattr__(budget, "max_iterations", 0)  # what frozen=True is there to prevent
    with pytest.raises(ValueError, match=r"^max_iterations must be >= 1, not 0\.$"):
        budget.validate()


# --- iterations and tool calls ---------------------------------------------------------------


def test_iteration_limit_allows_the_last_iteration_and_refuses_the_next() -> None:
    budget = RunBudget(max_iterations=3)
    assert budget.check_iteration(3) is None
    with pytest.raises(RunLimitError, match=r"^The run stopped at its limit of 3 iterations\.$"):
        budget.check_iteration(4)


def test_iteration_limit_of_one_reads_in_the_singular() -> None:
    with pytest.raises(RunLimitError, match=r"^The run stopped at its limit of 1 iteration\.$"):
        RunBudget(max_iterations=1).check_iteration(2)


def test_tool_call_limit_allows_the_last_call_and_refuses_the_next() -> None:
    budget = RunBudget(max_tool_calls=2)
    assert budget.check_tool_calls(2) is None
    with pytest.raises(RunLimitError, match=r"^The run stopped at its limit of 2 tool calls\.$"):
        budget.check_tool_calls(3)


def test_tool_call_limit_of_zero_refuses_the_first_call() -> None:
    budget = RunBudget(max_tool_calls=0)
    assert budget.check_tool_calls(0) is None
    with pytest.raises(RunLimitError, match=r"^The run may not call tools: its tool-call limit is 0\.$"):
        budget.check_tool_calls(1)


@pytest.mark.parametrize("method", ["check_iteration", "check_tool_calls"])
def test_counts_must_be_non_negative_ints(method: str) -> None:
    check = getattr(RunBudget(), method)
    with pytest.raises(ValueError, match=r"must be >= 0, not -1\.$"):
        check(-1)
    with pytest.raises(TypeError, match=r"must be an int, not bool\.$"):
        check(True)


def test_run_limit_and_cost_cap_errors_are_budget_errors() -> None:
    assert issubclass(RunLimitError, BudgetExceededError)
    assert issubclass(CostCapError, BudgetExceededError)
    assert BudgetExceededError is teaagent.errors.BudgetExceededError


# --- spent cost ------------------------------------------------------------------------------


def test_cost_cap_allows_reaching_it_and_refuses_exceeding_it() -> None:
    budget = RunBudget(max_estimated_cost_cents=10)
    assert budget.check_cost(10) is None
    assert budget.check_cost(10.0) is None
    with pytest.raises(
        CostCapError, match=r"^The run spent 10\.0001 cents, above its cost cap of 10 cents\.$"
    ):
        budget.check_cost(10.0001)


def test_a_tiny_excess_still_reads_as_above_the_cap() -> None:
    with pytest.raises(
        CostCapError, match=r"^The run spent 10\.0000001 cents, above its cost cap of 10 cents\.$"
    ):
        RunBudget(max_estimated_cost_cents=10).check_cost(10.0000001)


def test_float_drift_of_summed_costs_counts_as_reaching_the_cap() -> None:
    spent = sum([0.7] * 10)  # ten calls of 0.7 cents: 7.000000000000001 in floats
    assert spent > 7
    assert RunBudget(max_estimated_cost_cents=7).check_cost(spent) is None


@pytest.mark.parametrize(
    ("spent", "error", "message"),
    [
        (-0.01, ValueError, r"^spent_cents must be a finite number of cents >= 0, not -0\.01\.$"),
        (math.nan, ValueError, r"^spent_cents must be a finite number of cents >= 0, not nan\.$"),
        (math.inf, ValueError, r"^spent_cents must be a finite number of cents >= 0, not inf\.$"),
        (True, TypeError, r"^spent_cents must be a number of cents, not bool\.$"),
        ("3", TypeError, r"^spent_cents must be a number of cents, not str\.$"),
    ],
)
def test_spent_cents_must_be_a_finite_non_negative_number(
    spent: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        RunBudget().check_cost(spent)  # type: ignore[arg-type]


# --- preflight estimate ----------------------------------------------------------------------


def test_prompt_characters_become_tokens_rounded_up() -> None:
    assert CHARS_PER_TOKEN == 4
    assert [approx_tokens(n) for n in (0, 1, 3, 4, 5, 8, 9)] == [0, 1, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match=r"^chars must be >= 0, not -1\.$"):
        approx_tokens(-1)


def test_preflight_allows_an_estimate_equal_to_the_cap() -> None:
    assert RunBudget(max_estimated_cost_cents=1).check_cost_preflight(*PAID, *ONE_CENT_CALL) is None


def test_preflight_refuses_an_estimate_above_the_cap() -> None:
    # One more prompt character is one more token: 0.0002 cents over.
    with pytest.raises(
        CostCapError,
        match=r"^This model call could cost up to 1\.0002 cents, which would bring the run to 1\.0002 cents, "
        r"above its cost cap of 1 cents\.$",
    ):
        RunBudget(max_estimated_cost_cents=1).check_cost_preflight(
            *PAID, approx_input_chars=4001, max_output_tokens=1000
        )


def test_preflight_adds_what_the_run_already_spent() -> None:
    budget = RunBudget(max_estimated_cost_cents=5)
    assert budget.check_cost_preflight(*PAID, *ONE_CENT_CALL, spent_cents=4.0) is None
    with pytest.raises(
        CostCapError,
        match=r"^This model call could cost up to 1 cents, which would bring the run to 5\.01 cents, "
        r"above its cost cap of 5 cents\.$",
    ):
        budget.check_cost_preflight(*PAID, *ONE_CENT_CALL, spent_cents=4.01)


def test_preflight_with_zero_estimate_passes_a_zero_cap() -> None:
    budget = RunBudget(max_estimated_cost_cents=0)
    assert budget.check_cost_preflight(*PAID, approx_input_chars=0, max_output_tokens=0) is None
    assert budget.check_cost_preflight("openai-compatible", "qwen2.5-coder:7b", 10**6, 10**6) is None


def test_preflight_never_refuses_a_free_call() -> None:
    # Even for a run already over its cap: stopping that run is check_cost's job, not the preflight's.
    assert (
        RunBudget(max_estimated_cost_cents=0).check_cost_preflight("scripted", "s", 10, 10, spent_cents=0.5)
        is None
    )
    over = RunBudget(max_estimated_cost_cents=5)
    assert over.check_cost_preflight(*PAID, 0, 0, spent_cents=6.0) is None
    with pytest.raises(CostCapError):
        over.check_cost(6.0)


def test_preflight_charges_every_allowed_output_token() -> None:
    # Prompt-free call: 1,250 output tokens at 0.0008 cents each is exactly the 1-cent cap.
    budget = RunBudget(max_estimated_cost_cents=1)
    assert budget.check_cost_preflight(*PAID, approx_input_chars=0, max_output_tokens=1250) is None
    with pytest.raises(CostCapError):
        budget.check_cost_preflight(*PAID, approx_input_chars=0, max_output_tokens=1251)


def test_preflight_with_a_cap_refuses_bad_arguments() -> None:
    budget = RunBudget()
    with pytest.raises(ValueError, match=r"^Unknown LLM provider 'nope'; choose one of: "):
        budget.check_cost_preflight("nope", "m", 1, 1)
    with pytest.raises(ValueError, match=r"^approx_input_chars must be >= 0, not -1\.$"):
        budget.check_cost_preflight(*PAID, approx_input_chars=-1, max_output_tokens=1)
    with pytest.raises(ValueError, match=r"^max_output_tokens must be >= 0, not -1\.$"):
        budget.check_cost_preflight(*PAID, approx_input_chars=1, max_output_tokens=-1)
    with pytest.raises(ValueError, match=r"^spent_cents must be a finite number of cents >= 0, not nan\.$"):
        budget.check_cost_preflight(*PAID, *ONE_CENT_CALL, spent_cents=math.nan)
