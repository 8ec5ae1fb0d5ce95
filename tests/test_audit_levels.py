"""teaagent.audit levels: what each of L0, L1, L2, L3 lets into the log."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teaagent.audit import (
    MAX_METADATA_CHARS,
    AuditLevel,
    Redactor,
    canonical_json,
    metadata_only,
    metrics_only,
    parse_audit_level,
    shape_payload,
)

OPENAI_KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234"

TOOL_RESULT = {
    "tool_name": "fs.read",
    "call_id": "call_0001",
    "status": "ok",
    "duration_ms": 3.25,
    "result_bytes": 54,
    "cached": False,
    "error": None,
    "cost_cents": 0.012,
    "arguments": {"path": "notes.txt", "limit": 10},
    "result": {"content": f"key {OPENAI_KEY}", "size": 54},
    "reason": "the user asked",
}


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("L0", AuditLevel.L0),
        ("l1", AuditLevel.L1),
        ("L2", AuditLevel.L2),
        ("L3", AuditLevel.L3),
        (AuditLevel.L2, AuditLevel.L2),
    ],
)
def test_levels_are_parsed_by_name(name: str, level: AuditLevel) -> None:
    assert parse_audit_level(name) is level


@pytest.mark.parametrize("name", ["L4", "", "2", "full", " L2"])
def test_an_unknown_level_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"audit level {name!r} is not one of L0, L1, L2, L3.")):
        parse_audit_level(name)


def test_l0_keeps_the_top_level_finite_numbers_only() -> None:
    payload: dict[Any, Any] = {**TOOL_RESULT, "nan": float("nan"), "inf": float("inf"), "flag": True, 3: 4}
    assert metrics_only(payload) == {"duration_ms": 3.25, "result_bytes": 54, "cost_cents": 0.012, "3": 4}
    assert shape_payload(AuditLevel.L0, payload, Redactor()) == metrics_only(payload)


def test_l0_writes_no_string_from_the_payload() -> None:
    shaped = metrics_only(TOOL_RESULT)
    assert all(isinstance(value, (int, float)) for value in shaped.values())


def test_l1_keeps_metadata_and_writes_only_the_size_of_values() -> None:
    shaped = metadata_only(TOOL_RESULT, Redactor())
    assert shaped == {
        "tool_name": "fs.read",
        "call_id": "call_0001",
        "status": "ok",
        "duration_ms": 3.25,
        "result_bytes": 54,
        "cached": False,
        "error": None,
        "cost_cents": 0.012,
        "arguments": f"[OMITTED:{len(canonical_json(TOOL_RESULT['arguments']))} bytes]",
        "result": f"[OMITTED:{len(canonical_json(TOOL_RESULT['result']))} bytes]",
        "reason": "[OMITTED:14 bytes]",
    }
    assert OPENAI_KEY not in str(shaped)
    assert "notes.txt" not in str(shaped)


def test_l1_recognises_metadata_by_name_and_by_ending() -> None:
    payload = {
        "request_id": "r-1",
        "peer_name": "beta",
        "Payload_Digest": "sha256:ab",
        "error_type": "OSError",
        "permission_mode": "prompt",
        "security_tier": "High",
        "label": "free text",
    }
    assert metadata_only(payload, Redactor()) == {**payload, "label": "[OMITTED:9 bytes]"}


def test_l1_counts_utf8_bytes_of_an_omitted_string() -> None:
    assert metadata_only({"message": "été"}, Redactor()) == {"message": "[OMITTED:5 bytes]"}


def test_l1_keeps_a_metadata_string_up_to_the_limit_and_omits_a_longer_one() -> None:
    at_limit = "a" * MAX_METADATA_CHARS
    assert metadata_only({"tool_name": at_limit}, Redactor()) == {"tool_name": at_limit}
    assert metadata_only({"tool_name": at_limit + "a"}, Redactor()) == {"tool_name": "[OMITTED:257 bytes]"}


def test_l1_removes_secrets_from_the_metadata_it_keeps() -> None:
    assert metadata_only({"session_id": f"id {OPENAI_KEY}"}, Redactor()) == {
        "session_id": "id [REDACTED:api_key]"
    }


def test_l2_is_the_redactor_with_its_rules() -> None:
    redactor = Redactor(rules={"reason": "redact"})
    shaped = shape_payload(AuditLevel.L2, TOOL_RESULT, redactor)
    assert shaped == redactor.redact(TOOL_RESULT)
    assert shaped["reason"] == "[REDACTED:field]"
    assert shaped["result"] == {"content": "key [REDACTED:api_key]", "size": 54}
    assert shaped["arguments"] == {"path": "notes.txt", "limit": 10}


def test_l3_writes_everything_without_redaction() -> None:
    shaped = shape_payload(
        AuditLevel.L3, {**TOOL_RESULT, "password": "hunter22"}, Redactor(rules={"reason": "redact"})
    )
    assert shaped == {**TOOL_RESULT, "password": "hunter22"}


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["tool_name", "call_id", "x", "duration_ms", "tokens", "result"]), json_values
    )
)
def test_each_level_keeps_everything_the_level_below_keeps(payload: dict[str, Any]) -> None:
    redactor = Redactor()
    l0 = metrics_only(payload)
    l1 = metadata_only(payload, redactor)
    assert l0.items() <= l1.items()
    l3 = shape_payload(AuditLevel.L3, payload, redactor)
    assert set(l1) == set(l3) == {str(key) for key in payload}
