"""Depth-bounded JSON (``teaagent._json``): the bound at its threshold, brackets inside strings, and
canonical JSON and payload digests refusing values too deep instead of recursing into them."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from relay_support import public_line

from teaagent._canonical import canonical, payload_digest
from teaagent._json import (
    MAX_ARGUMENTS_DEPTH,
    MAX_JSON_DEPTH,
    JSONDepthError,
    check_json_depth,
    check_value_depth,
    json_depth,
    parse_json,
)
from teaagent.quorum import build_request, request_problem
from teaagent.trust import MultiSigQuorumConfig

TOO_DEEP = f"nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"


def nested(depth: int, inner: str = "") -> str:
    """Arrays and objects in turn, ``depth`` levels: ``[{"k": [{"k": ... inner ...}]}]``."""
    text = inner
    for level in range(depth):
        text = f"[{text}]" if level % 2 else f'{{"k": {text or 1}}}'
    return text


def true_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((true_depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((true_depth(item) for item in value), default=0)
    return 0


def test_a_document_at_the_limit_is_parsed_and_one_level_more_is_refused_in_one_sentence() -> None:
    assert MAX_JSON_DEPTH == 64
    assert true_depth(parse_json(nested(MAX_JSON_DEPTH))) == MAX_JSON_DEPTH
    assert true_depth(parse_json(nested(MAX_JSON_DEPTH).encode())) == MAX_JSON_DEPTH
    for deeper in (nested(MAX_JSON_DEPTH + 1), nested(MAX_JSON_DEPTH + 1).encode()):
        with pytest.raises(JSONDepthError, match=f"^The JSON document {TOO_DEEP}\\.$") as refused:
            parse_json(deeper)
        assert refused.value.limit == MAX_JSON_DEPTH
        assert isinstance(refused.value, ValueError)


def test_thirty_thousand_levels_in_sixty_kilobytes_are_refused_not_a_recursion_error() -> None:
    body = b"[" * 30_000 + b"]" * 30_000
    with pytest.raises(JSONDepthError, match=f"^The request body {TOO_DEEP}\\.$"):
        parse_json(body, what="The request body")
    with pytest.raises(JSONDepthError):
        check_json_depth(body)


def test_brackets_inside_strings_do_not_count_and_escaped_quotes_do_not_end_a_string() -> None:
    deep_looking = json.dumps({"a": "[" * 500, "b": '\\"[{' * 100, "c": ["]]]]", "{{{{"]})
    assert json_depth(deep_looking) == 2
    assert parse_json(deep_looking)["a"] == "[" * 500
    assert json_depth(b"[]") == 1
    assert json_depth(b"17") == 0
    assert json_depth("") == 0


def test_text_that_is_not_json_is_still_scanned_in_linear_time_and_left_to_the_parser() -> None:
    # Each quote opens a string that never ends: a scan trying each one to the end would take
    # billions of steps on this body; the pytest timeout fails the test if it does.
    body = b'"\\"' * 20_000
    assert json_depth(body) == 0
    with pytest.raises(json.JSONDecodeError):
        parse_json(body)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:'),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), children, max_size=3)
    ),
    max_leaves=30,
)


@given(json_values)
def test_the_scanned_depth_is_the_depth_of_the_parsed_value(value: Any) -> None:
    text = json.dumps(value)
    assert json_depth(text) == json_depth(text.encode()) == true_depth(value)


def test_a_python_value_is_refused_by_its_depth_whether_made_of_dicts_lists_or_tuples() -> None:
    check_value_depth(json.loads(nested(MAX_JSON_DEPTH)))
    with pytest.raises(JSONDepthError, match=f"^The value {TOO_DEEP}\\.$"):
        check_value_depth(json.loads(nested(MAX_JSON_DEPTH + 1)))
    value: Any = 1
    for _ in range(MAX_JSON_DEPTH + 1):
        value = (value,)
    with pytest.raises(JSONDepthError, match=r"^The call nests"):
        check_value_depth(value, what="The call")


def built(depth: int, leaf: Any) -> Any:
    """``leaf`` in ``depth`` lists, built by hand (too deep for ``json.loads``, a RecursionError)."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("leaf", [1, 1.5], ids=["plain", "a float (rfc8785)"])
def test_canonical_json_refuses_a_value_too_deep_before_either_encoder_recurses(leaf: Any) -> None:
    assert canonical(built(MAX_JSON_DEPTH, leaf))
    for depth in (MAX_JSON_DEPTH + 1, 5_000):
        with pytest.raises(JSONDepthError, match=f"^The value {TOO_DEEP}\\.$"):
            canonical(built(depth, leaf))


def test_a_float_before_a_deep_branch_does_not_let_the_branch_reach_rfc8785() -> None:
    with pytest.raises(JSONDepthError):
        canonical({"a": 1.5, "b": built(3_000, 1)})


def arguments(depth: int) -> dict[str, Any]:
    value: Any = {"leaf": 1.5}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def test_a_calls_arguments_may_nest_as_deep_as_the_limit_of_arguments_and_no_deeper() -> None:
    # Arguments travel at most four levels down (an approver listing's item's request), so their
    # limit leaves every document that carries them within MAX_JSON_DEPTH.
    assert MAX_ARGUMENTS_DEPTH == MAX_JSON_DEPTH - 4
    assert payload_digest("shell.run", arguments(MAX_ARGUMENTS_DEPTH)).startswith("sha256:")
    sentence = f"The arguments object nests arrays and objects more than {MAX_ARGUMENTS_DEPTH} levels deep."
    with pytest.raises(JSONDepthError, match=f"^{re.escape(sentence)}$"):
        payload_digest("shell.run", arguments(MAX_ARGUMENTS_DEPTH + 1))


def test_a_request_whose_arguments_nest_too_deep_is_malformed_with_its_own_sentence() -> None:
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=1,
        peer_agent_ids=["beta"],
        peer_public_keys={"beta": public_line("beta")},
        peer_relay_urls={"beta": "http://127.0.0.1:1"},
        high_risk_patterns=["shell.*"],
    )
    request = build_request(
        origin="alpha",
        run_id="r",
        call_id="c",
        tool_name="shell.run",
        arguments=arguments(MAX_ARGUMENTS_DEPTH),
        reason="",
        config=config,
    )
    assert request_problem(request) is None
    request["arguments"] = arguments(MAX_ARGUMENTS_DEPTH + 1)
    assert request_problem(request) == (
        f"the request's arguments nest arrays and objects more than {MAX_ARGUMENTS_DEPTH} levels deep"
    )
    with pytest.raises(JSONDepthError):
        build_request(
            origin="alpha",
            run_id="r",
            call_id="c",
            tool_name="shell.run",
            arguments=arguments(MAX_ARGUMENTS_DEPTH + 1),
            reason="",
            config=config,
        )
