"""Every exception of the specification is importable from the module it names, under one root."""

from __future__ import annotations

import importlib

import pytest

import teaagent.errors
from teaagent.errors import TeaAgentError

# The specification's exception table: name -> the module it must be importable from.
SPEC_EXCEPTIONS = {
    "ApprovalDeniedError": "teaagent.policy",
    "ToolNotFoundError": "teaagent.tools",
    "ToolRateLimitError": "teaagent.tools",
    "SchemaValidationError": "teaagent.tools",
    "MissingAPIKeyError": "teaagent.llm",
    "WorkspaceLockConflictError": "teaagent.mcp_server",
    "RunLimitError": "teaagent.runner",
    "CostCapError": "teaagent.runner",
    "BudgetExceededError": "teaagent.budget",
}


@pytest.mark.parametrize(("name", "module"), sorted(SPEC_EXCEPTIONS.items()))
def test_spec_exception_is_importable_from_its_module_and_is_one_class(name: str, module: str) -> None:
    exported = getattr(importlib.import_module(module), name)

    assert exported is getattr(teaagent.errors, name)
    assert issubclass(exported, TeaAgentError)


def test_every_error_class_descends_from_the_one_root() -> None:
    classes = [getattr(teaagent.errors, name) for name in teaagent.errors.__all__]

    assert all(issubclass(cls, TeaAgentError) for cls in classes)
    assert set(teaagent.errors.__all__) >= set(SPEC_EXCEPTIONS) | {"TeaAgentError"}


def test_budget_errors_are_one_family() -> None:
    assert issubclass(teaagent.errors.RunLimitError, teaagent.errors.BudgetExceededError)
    assert issubclass(teaagent.errors.CostCapError, teaagent.errors.BudgetExceededError)


def test_the_tree_in_the_docstring_names_every_class() -> None:
    doc = teaagent.errors.__doc__ or ""

    missing = [name for name in teaagent.errors.__all__ if name not in doc]
    assert missing == []
