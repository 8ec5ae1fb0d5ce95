"""teaagent.runner._types: the run's shapes, ApprovalRequest's JSON form, and that it keeps its secret."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import hashlib
import json
import math
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

import teaagent.errors
from teaagent.budget import BudgetExceededError
from teaagent.runner import (
    BYTES_KEY,
    REDACTED,
    RUN_STATUSES,
    ApprovalRequest,
    CostCapError,
    FinalAnswer,
    RunLimitError,
    RunResult,
    ToolRequest,
)

# Not valid UTF-8, so it can only appear in the output through an encoding.
SECRET = bytes(range(200, 232))


class Tier(enum.Enum):
    HIGH = "High"


def make_request(
    arguments: dict[str, Any] | None = None, secret: bytes | None = SECRET, **changes: Any
) -> ApprovalRequest:
    fields: dict[str, Any] = {
        "call_id": "call-1",
        "tool_name": "shell.run",
        "arguments": {"command": "rm -rf build"} if arguments is None else arguments,
        "reason": "shell.run is high-risk and needs 2 of 3 peers.",
        "annotations": {"destructive": True, "read_only": False},
        "run_id": "run-7",
        "workspace_secret": secret,
        **changes,
    }
    return ApprovalRequest(**fields)


def secret_forms(secret: bytes) -> list[str]:
    """The ways a secret could show in text: hex, base64 (standard and URL-safe), its length and digest."""
    b64 = base64.b64encode(secret).decode()
    urlsafe = base64.urlsafe_b64encode(secret).decode()
    return [
        secret.hex(),
        secret.hex().upper(),
        b64,
        b64.rstrip("="),
        urlsafe.rstrip("="),
        hashlib.sha256(secret).hexdigest(),
        "workspace_secret",
    ]


def assert_secret_absent(text: str, secret: bytes = SECRET) -> None:
    assert secret not in text.encode("utf-8")
    assert secret not in text.encode("latin-1", errors="ignore")
    for form in secret_forms(secret):
        assert form not in text


# --- the plain shapes ------------------------------------------------------------------------


def test_tool_request_and_final_answer_carry_the_spec_fields() -> None:
    request = ToolRequest(tool_name="fs.read", arguments={"path": "a"}, call_id="c1", reasoning=None)
    answer = FinalAnswer(content="done", metadata={"model": "scripted"})
    assert [f.name for f in dataclasses.fields(request)] == ["tool_name", "arguments", "call_id", "reasoning"]
    assert [f.name for f in dataclasses.fields(answer)] == ["content", "metadata"]


@pytest.mark.parametrize(
    ("instance", "field"),
    [
        (ToolRequest("fs.read", {}, "c1", None), "tool_name"),
        (FinalAnswer("done", {}), "content"),
        (make_request(), "workspace_secret"),
        (RunResult("r", None, 0, 0, "completed", {}, None, 0.0, 0, 0), "status"),
    ],
)
def test_run_types_are_frozen(instance: object, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, field, "changed")


def test_runner_reexports_the_budget_errors() -> None:
    assert RunLimitError is teaagent.errors.RunLimitError
    assert CostCapError is teaagent.errors.CostCapError
    assert issubclass(RunLimitError, BudgetExceededError)
    assert issubclass(CostCapError, BudgetExceededError)


# --- RunResult -------------------------------------------------------------------------------


def test_run_statuses_are_the_five_of_the_spec() -> None:
    assert RUN_STATUSES == ("completed", "failed", "approval_denied", "limit_exceeded", "cost_exceeded")


def run_result(**changes: Any) -> RunResult:
    fields: dict[str, Any] = {
        "run_id": "run-7",
        "final_answer": FinalAnswer("done", {}),
        "iterations": 3,
        "tool_calls": 2,
        "status": "completed",
        "metadata": {},
        "error_message": None,
        "cost_cents": 1.5,
        "input_tokens": 100,
        "output_tokens": 20,
        **changes,
    }
    return RunResult(**fields)


@pytest.mark.parametrize("status", RUN_STATUSES)
def test_every_spec_status_is_accepted(status: str) -> None:
    assert run_result(status=status).status == status


@pytest.mark.parametrize("status", ["succeeded", "Completed", ""])
def test_any_other_status_is_refused(status: str) -> None:
    with pytest.raises(
        ValueError,
        match=r"^A run status must be one of completed, failed, approval_denied, limit_exceeded, "
        rf"cost_exceeded, not '{status}'\.$",
    ):
        run_result(status=status)


@pytest.mark.parametrize("field", ["iterations", "tool_calls", "input_tokens", "output_tokens"])
def test_run_counts_may_be_zero_but_not_negative(field: str) -> None:
    assert getattr(run_result(**{field: 0}), field) == 0
    with pytest.raises(ValueError, match=rf"^{field} must be an int >= 0, not -1\.$"):
        run_result(**{field: -1})


def test_run_cost_must_be_finite_and_non_negative() -> None:
    assert run_result(cost_cents=0.0).cost_cents == 0.0
    for cost in (-0.5, math.nan):
        with pytest.raises(ValueError, match=r"^cost_cents must be a finite number >= 0, not "):
            run_result(cost_cents=cost)


# --- ApprovalRequest: construction and repr --------------------------------------------------


def test_approval_request_constructor_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        ApprovalRequest("c", "t", {}, "r", {}, None, SECRET)  # type: ignore[call-arg]


def test_workspace_secret_must_be_bytes() -> None:
    with pytest.raises(TypeError, match=r"^workspace_secret must be bytes or None, not str\.$"):
        make_request(secret="hunter2")  # type: ignore[arg-type]


def test_repr_does_not_leak_the_secret() -> None:
    request = make_request()
    for text in (repr(request), str(request)):
        assert "shell.run" in text  # the repr is there, just without the secret
        assert_secret_absent(text)
        assert repr(SECRET) not in text


def test_an_approval_request_is_the_policys_question_with_the_secret() -> None:
    from teaagent.policy import PromptRequest

    request = make_request()
    assert isinstance(request, PromptRequest)
    asked = PromptRequest(
        **{field.name: getattr(request, field.name) for field in dataclasses.fields(PromptRequest)}
    )
    approval = ApprovalRequest.asking(asked)
    assert approval == dataclasses.replace(request, workspace_secret=None)
    assert [field.name for field in dataclasses.fields(ApprovalRequest)][-1] == "workspace_secret"


# --- ApprovalRequest.to_dict -----------------------------------------------------------------


def test_to_dict_has_the_public_fields_only() -> None:
    data = make_request().to_dict()
    assert data == {
        "call_id": "call-1",
        "tool_name": "shell.run",
        "arguments": {"command": "rm -rf build"},
        "reason": "shell.run is high-risk and needs 2 of 3 peers.",
        "annotations": {"destructive": True, "read_only": False},
        "run_id": "run-7",
    }


def test_to_dict_does_not_depend_on_the_secret_at_all() -> None:
    # Not its value, its length nor its digest: the output is the same with any secret or none.
    outputs = {
        json.dumps(make_request(secret=secret).to_dict(), sort_keys=True)
        for secret in (SECRET, b"x", b"y" * 500, b"", None)
    }
    assert len(outputs) == 1
    assert_secret_absent(outputs.pop())


def test_to_dict_converts_nested_values_to_json() -> None:
    circular: list[Any] = ["again"]
    circular.append(circular)
    arguments = {
        "blob": b"\x00\xffdata",
        "tags": {"b", "a", "c"},
        "frozen": frozenset({3, 1, 2}),
        "pair": (1, (2, 3)),
        "path": Path("src") / "main.py",
        "posix": PurePosixPath("/etc/hosts"),
        "tier": Tier.HIGH,
        "when": dt.datetime(2026, 6, 5, 12, 30, tzinfo=dt.UTC),
        "day": dt.date(2026, 6, 5),
        "limits": [math.nan, math.inf, -math.inf, 1.5],
        "numbers": {1: "one", Tier.HIGH: "enum key"},
        "nested": {"deeper": [{"raw": bytearray(b"ab")}]},
        "object": complex(1, 2),
        "circular": circular,
    }
    data = make_request(arguments).to_dict()
    text = json.dumps(data, allow_nan=False)  # strict JSON: no NaN or Infinity literals

    converted = json.loads(text)["arguments"]
    assert converted["blob"] == {BYTES_KEY: base64.b64encode(b"\x00\xffdata").decode()}
    assert base64.b64decode(converted["blob"][BYTES_KEY]) == b"\x00\xffdata"
    assert converted["tags"] == ["a", "b", "c"]
    assert converted["frozen"] == [1, 2, 3]
    assert converted["pair"] == [1, [2, 3]]
    assert converted["path"] == str(Path("src") / "main.py")
    assert converted["posix"] == "/etc/hosts"
    assert converted["tier"] == "High"
    assert converted["when"] == "2026-06-05T12:30:00+00:00"
    assert converted["day"] == "2026-06-05"
    assert converted["limits"] == ["NaN", "Infinity", "-Infinity", 1.5]
    assert converted["numbers"] == {"1": "one", "High": "enum key"}
    assert converted["nested"] == {"deeper": [{"raw": {BYTES_KEY: "YWI="}}]}
    assert converted["object"] == "(1+2j)"
    assert converted["circular"] == ["again", "[circular reference]"]


def test_to_dict_does_not_change_the_request() -> None:
    arguments = {"tags": {"x"}, "blob": b"1"}
    request = make_request(arguments)
    request.to_dict()
    assert request.arguments == {"tags": {"x"}, "blob": b"1"}


@pytest.mark.parametrize(
    "leaky",
    [
        SECRET,
        b"prefix" + SECRET + b"suffix",
        bytearray(SECRET),
        SECRET.hex(),
        "key=" + SECRET.hex().upper(),
        base64.b64encode(SECRET).decode(),
        base64.urlsafe_b64encode(SECRET).decode().rstrip("="),
        {"nested": ["deep", SECRET]},
    ],
)
def test_arguments_holding_the_secret_are_redacted(leaky: object) -> None:
    data = make_request({"value": leaky, "harmless": "ls"}).to_dict()
    text = json.dumps(data)
    assert_secret_absent(text)
    assert REDACTED in text
    assert data["arguments"]["harmless"] == "ls"


def test_a_text_secret_is_redacted_from_every_field() -> None:
    secret = b"correct horse battery staple"
    data = make_request(
        {"note": "the key is correct horse battery staple"},
        secret=secret,
        reason="copied correct horse battery staple by mistake",
    ).to_dict()
    text = json.dumps(data)
    assert "correct horse battery staple" not in text
    assert data["arguments"]["note"] == REDACTED
    assert data["reason"] == REDACTED
    assert data["tool_name"] == "shell.run"
