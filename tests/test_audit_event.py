"""teaagent.audit events: event types, ids, timestamps, the canonical form and the record layout."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teaagent.audit import EVENT_TYPES, GENESIS_HASH, AuditEvent, AuditEventType, canonical_json
from teaagent.audit._event import new_event_id, utc_timestamp

SPEC_EVENT_TYPES = {
    "run_start",
    "run_end",
    "tool_call",
    "tool_result",
    "tool_error",
    "approval_request",
    "approval_granted",
    "approval_denied",
    "model_request",
    "model_response",
    "cost_checkpoint",
    "iteration_limit",
    "tool_call_limit",
    "validation_result",
}


def test_the_event_types_are_those_of_the_specification() -> None:
    assert EVENT_TYPES == SPEC_EVENT_TYPES
    assert {member.value for member in AuditEventType} == SPEC_EVENT_TYPES
    assert AuditEventType.TOOL_CALL == "tool_call"
    assert str(AuditEventType.RUN_START) == "run_start"
    assert AuditEventType.TOOL_RESULT in EVENT_TYPES


def test_event_ids_are_random_uuid4_hex() -> None:
    ids = {new_event_id() for _ in range(1000)}
    assert len(ids) == 1000
    for event_id in list(ids)[:50]:
        assert re.fullmatch(r"[0-9a-f]{32}", event_id)
        parsed = uuid.UUID(hex=event_id)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_timestamps_are_iso_8601_utc_with_microseconds_and_follow_the_clock() -> None:
    before = datetime.now(UTC)
    stamp = utc_timestamp()
    after = datetime.now(UTC)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", stamp)
    parsed = datetime.fromisoformat(stamp)
    assert parsed.tzinfo is not None
    assert parsed.utcoffset() is not None
    assert parsed.utcoffset().total_seconds() == 0
    assert before.replace(microsecond=0) <= parsed <= after


@pytest.mark.slow
def test_the_cached_second_of_the_timestamp_moves_on_with_the_clock() -> None:
    first = utc_timestamp()
    time.sleep(1.01)
    second = utc_timestamp()
    assert second[:19] != first[:19]
    assert (datetime.fromisoformat(second) - datetime.fromisoformat(first)).total_seconds() >= 1.0


def test_an_event_is_frozen_and_fills_its_id_and_time() -> None:
    event = AuditEvent("tool_call", "run-1", {"tool_name": "fs.read"})
    assert re.fullmatch(r"[0-9a-f]{32}", event.event_id)
    assert event.created_at.endswith("Z")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.run_id = "other"  # type: ignore[misc]
    explicit = AuditEvent("run_end", "r", {}, "ab" * 16, "2026-06-05T00:00:00.000000Z")
    assert (explicit.event_id, explicit.created_at) == ("ab" * 16, "2026-06-05T00:00:00.000000Z")


def test_to_json_is_the_canonical_body_closed_by_the_chain_fields() -> None:
    event = AuditEvent("tool_call", "r1", {"b": 1, "a": "é"}, "0" * 32, "2026-06-05T00:00:00.000000Z")
    text = event.to_json(GENESIS_HASH, "e" * 64, "c" * 64)
    assert text == (
        '{"created_at":"2026-06-05T00:00:00.000000Z","event_id":"' + "0" * 32 + '","event_type":"tool_call",'
        '"payload":{"a":"\\u00e9","b":1},"prev_hash":"' + GENESIS_HASH + '","run_id":"r1",'
        '"chain_hmac":"' + "c" * 64 + '","event_hash":"' + "e" * 64 + '"}'
    )
    record = json.loads(text)
    assert record["payload"] == {"a": "é", "b": 1}
    assert event.body(GENESIS_HASH) == canonical_json(
        {key: value for key, value in record.items() if key not in ("event_hash", "chain_hmac")}
    )


def test_to_json_writes_missing_chain_fields_as_null() -> None:
    record = json.loads(AuditEvent("run_start", "r", {}).to_json(None, None, None))
    assert (record["prev_hash"], record["event_hash"], record["chain_hmac"]) == (None, None, None)


def test_the_canonical_form_is_the_documented_json_dumps_call() -> None:
    value = {
        "z": [1, 2.5, 1e-05, 1e16, 100.0, -0.0, True, None],
        "a": 'quote" backslash\\ tab\t nl\n ctrl\x01 del\x7f é 😀 lone\ud800',
        "é": {"b": 2, "a": 1},
        "10": 0,
        "9": 0,
    }
    documented = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    assert canonical_json(value) == documented
    assert canonical_json(value).isascii()
    assert canonical_json(value) == (
        r'{"10":0,"9":0,"a":"quote\" backslash\\ tab\t nl\n ctrl\u0001 del\u007f '
        r'\u00e9 \ud83d\ude00 lone\ud800",'
        r'"z":[1,2.5,1e-05,1e+16,100.0,-0.0,true,null],"\u00e9":{"a":1,"b":2}}'
    )
    assert json.loads(canonical_json(value)) == value
    assert canonical_json(json.loads(canonical_json(value))) == canonical_json(value)


def test_the_canonical_form_refuses_nan_and_infinity() -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        canonical_json({"cost": float("nan")})
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        canonical_json([float("inf")])


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_json_values)
def test_the_canonical_form_is_the_documented_call_for_any_json_value(value: Any) -> None:
    documented = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    assert canonical_json(value) == documented


@settings(max_examples=200, deadline=None)
@given(
    st.text(),
    st.text(),
    st.dictionaries(st.text(max_size=8), _json_values, max_size=4),
    st.text(),
    st.text(),
    st.none() | st.text(),
)
def test_the_body_is_the_canonical_json_of_the_record_whatever_its_fields_hold(
    event_type: str,
    run_id: str,
    payload: dict[str, Any],
    event_id: str,
    created_at: str,
    prev_hash: str | None,
) -> None:
    event = AuditEvent(event_type, run_id, payload, event_id, created_at)
    record = {
        "created_at": created_at,
        "event_id": event_id,
        "event_type": event_type,
        "payload": payload,
        "prev_hash": prev_hash,
        "run_id": run_id,
    }
    assert event.body(prev_hash) == json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def test_a_body_with_fields_that_are_not_plain_strings_is_still_the_canonical_json() -> None:
    class Name(str):
        pass

    event = AuditEvent(Name("tool_call"), "r", {"n": 1}, "ab" * 16, "2026-06-05T00:00:00.000000Z")
    assert event.body(None) == canonical_json(
        {
            "created_at": "2026-06-05T00:00:00.000000Z",
            "event_id": "ab" * 16,
            "event_type": "tool_call",
            "payload": {"n": 1},
            "prev_hash": None,
            "run_id": "r",
        }
    )


@pytest.mark.slow
def test_a_forked_child_never_hands_out_the_ids_its_parent_drew() -> None:
    new_event_id()  # the parent now holds ids drawn ahead of need
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids and leave at once
        try:
            os.write(writer, "".join(new_event_id() for _ in range(10)).encode("ascii"))
        finally:
            os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        child_text = pipe.read().decode("ascii")
    os.waitpid(pid, 0)
    child = {child_text[start : start + 32] for start in range(0, len(child_text), 32)}
    parent = {new_event_id() for _ in range(10)}
    assert len(child) == 10
    assert not child & parent
