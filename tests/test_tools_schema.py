"""The compiled validator of teaagent.tools agrees with jsonschema, the reference, on the subset it covers."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from teaagent.tools import workspace_registry
from teaagent.tools._schema import SUPPORTED_KEYWORDS, CompiledSchema, compile_check, fallback_keywords

# -- instances: JSON values, with the names and values the schemas care about mixed in -----------------

KEYS = st.sampled_from(["path", "max_bytes", "name", "tags", "mode", "n", "a", "b", "x", ""]) | st.text(
    max_size=4
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 1, -1, 2, 3, 5, 10, 0.0, 1.0, 2.5, -0.5, 1e300, 0.1, 0.3, 7.0, 1 / 3])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "a", "abc", "read", "write", "src/main.py", "A1", "ü", "😀", "12"])
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(KEYS, children, max_size=5),
    max_leaves=20,
)

# -- schemas of the subset: a fixed set that tools really use, and random ones ----------------------------

FIXED_SCHEMAS: list[Any] = [
    True,
    False,
    {},
    {"type": "object"},
    {"type": ["string", "null"], "minLength": 2},
    {"type": "integer", "minimum": 1, "maximum": 1048576},
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    {"type": "number", "multipleOf": 0.1},
    {"type": "integer", "multipleOf": 3},
    {"multipleOf": 2.5},
    {"enum": ["read", "write", 1, True, None, [1], {"a": 1}]},
    {"enum": ["read", "write"]},
    {"enum": []},
    {"const": 1},
    {"const": [1, True]},
    {"const": {"a": [False]}},
    {"type": "string", "pattern": "^[a-z]+[0-9]*$"},
    {"pattern": "b"},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": False},
    {"prefixItems": [{"const": "a"}], "items": {"type": "boolean"}},
    {"type": "array", "uniqueItems": True},
    {"uniqueItems": True, "items": {"type": ["integer", "boolean", "array", "object"]}},
    {"minProperties": 1, "maxProperties": 2},
    {"maxProperties": 0},
    {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1, "maxLength": 4096},
            "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "additionalProperties": {"type": "integer"},
    },
    {"properties": {"a": True, "b": False}, "additionalProperties": True, "required": ["a"]},
    {"properties": {"a": {"type": "integer"}}, "additionalProperties": {}},
    {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]},
    {"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]},
    {"allOf": [{"type": "number"}, {"maximum": 5}], "title": "annotated", "description": "only annotations"},
    {"not": {"type": ["object", "array"]}},
    {"type": ["integer", "string", "array"], "minimum": 3, "maxLength": 2, "maxItems": 1},
    {"minimum": 0, "minLength": 1, "minItems": 1, "required": ["n"]},
    {"format": "email", "type": "string", "default": "x", "examples": ["a@b"], "$comment": "annotations"},
    {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "boolean"},
]


def subset_schema() -> st.SearchStrategy[Any]:
    """Random schemas built only from the keywords the compiled validator covers."""
    type_names = st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object"])
    numbers = st.integers(-5, 10) | st.sampled_from([0.5, 2.5, -1.5, 0.1])
    counts = st.integers(0, 4)

    def node(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        keywords: dict[str, st.SearchStrategy[Any]] = {
            "type": type_names | st.lists(type_names, min_size=1, max_size=3, unique=True),
            "properties": st.dictionaries(KEYS, children, max_size=3),
            "required": st.lists(KEYS, max_size=3, unique=True),
            "additionalProperties": children,
            "items": children,
            "prefixItems": st.lists(children, min_size=1, max_size=3),
            "enum": st.lists(SCALARS, max_size=4),
            "const": JSON,
            "minLength": counts,
            "maxLength": counts,
            "minimum": numbers,
            "maximum": numbers,
            "exclusiveMinimum": numbers,
            "exclusiveMaximum": numbers,
            "multipleOf": st.sampled_from([1, 2, 3, 0.5, 0.1, 2.5]),
            "minItems": counts,
            "maxItems": counts,
            "uniqueItems": st.booleans(),
            "minProperties": counts,
            "maxProperties": counts,
            "pattern": st.sampled_from(["a", "^[a-z]*$", "[0-9]", "^$", "."]),
            "anyOf": st.lists(children, min_size=1, max_size=3),
            "oneOf": st.lists(children, min_size=1, max_size=3),
            "allOf": st.lists(children, min_size=1, max_size=3),
            "not": children,
            "title": st.just("annotation"),
        }
        return st.fixed_dictionaries({}, optional=keywords)

    return st.recursive(st.booleans() | st.just({}), node, max_leaves=6)


def reference(schema: Any) -> Draft202012Validator:
    return Draft202012Validator(schema)


def test_the_subset_and_the_fallback_do_not_overlap() -> None:
    assert SUPPORTED_KEYWORDS.isdisjoint(fallback_keywords())
    assert {
        "$ref",
        "$defs",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "unevaluatedProperties",
    } <= fallback_keywords()
    assert {"patternProperties", "propertyNames", "contains", "dependentRequired"} <= fallback_keywords()


@pytest.mark.parametrize("schema", FIXED_SCHEMAS, ids=range(len(FIXED_SCHEMAS)))
def test_fixed_schemas_are_in_the_subset(schema: Any) -> None:
    Draft202012Validator.check_schema(schema)
    assert compile_check(schema) is not None


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(index=st.integers(0, len(FIXED_SCHEMAS) - 1), instance=JSON)
def test_compiled_check_agrees_with_jsonschema_on_fixed_schemas(index: int, instance: Any) -> None:
    schema = FIXED_SCHEMAS[index]
    check = compile_check(schema)
    assert check is not None
    assert check(instance) == reference(schema).is_valid(instance)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    instance=st.fixed_dictionaries(
        {"path": st.text(max_size=5) | SCALARS},
        optional={"max_bytes": SCALARS, "mode": JSON},
    )
)
def test_compiled_check_agrees_on_tool_shaped_arguments(instance: dict[str, Any]) -> None:
    schema = FIXED_SCHEMAS[25]
    assert "max_bytes" in schema["properties"]
    check = compile_check(schema)
    assert check is not None
    assert check(instance) == reference(schema).is_valid(instance)


@pytest.mark.slow
@settings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(schema=subset_schema(), instances=st.lists(JSON, min_size=1, max_size=5))
def test_compiled_check_agrees_with_jsonschema_on_random_schemas(schema: Any, instances: list[Any]) -> None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return  # a random combination the meta-schema refuses (e.g. a negative count): not a schema
    check = compile_check(schema)
    assert check is not None
    validator = reference(schema)
    for instance in instances:
        assert check(instance) == validator.is_valid(instance), (schema, instance)


@pytest.mark.parametrize(
    ("schema", "instance", "valid"),
    [
        ({"type": "integer"}, True, False),  # booleans are not integers in JSON
        ({"type": "number"}, False, False),
        ({"type": "integer"}, 1.0, True),  # Draft 2020-12: a number with no fraction is an integer
        ({"type": "integer"}, 1.5, False),
        ({"type": "number"}, 10**30, True),
        ({"enum": [1]}, True, False),
        ({"enum": [True]}, 1, False),
        ({"const": 0}, False, False),
        ({"const": 1}, 1.0, True),
        ({"type": "array", "uniqueItems": True}, [1, True], True),
        ({"type": "array", "uniqueItems": True}, [1, 1.0], False),
        ({"type": "object"}, [], False),
        ({"type": "array"}, (), False),  # a tuple is not a JSON array
        ({"type": "string", "maxLength": 1}, "😀", True),  # lengths count code points
        ({"type": "number", "multipleOf": 0.1}, 0.3, False),  # the reference's float arithmetic
        ({"multipleOf": 0.5}, 1e308, True),  # an overflowing quotient takes exact arithmetic
    ],
)
def test_json_semantics_match_the_reference(schema: dict[str, Any], instance: Any, valid: bool) -> None:
    check = compile_check(schema)
    assert check is not None
    assert check(instance) is valid
    assert reference(schema).is_valid(instance) is valid


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/a", "$defs": {"a": {"type": "string"}}},
        {"properties": {"a": {"$ref": "#"}}},
        {"if": {"type": "string"}, "then": {"minLength": 1}},
        {"patternProperties": {"^x": {"type": "integer"}}},
        {"propertyNames": {"maxLength": 3}},
        {"items": {"contains": {"const": 1}}},
        {"unevaluatedProperties": False},
        {"dependentSchemas": {"a": {"required": ["b"]}}},
        {"dependentRequired": {"a": ["b"]}},
        {"anyOf": [{"$id": "https://example.com/x", "type": "string"}]},
        {"not": {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]}},
    ],
)
def test_keywords_outside_the_subset_fall_back_to_jsonschema(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is None
    compiled = CompiledSchema(schema)
    assert compiled.fast is False


def test_a_fallback_schema_is_enforced_by_the_reference() -> None:
    compiled = CompiledSchema({"patternProperties": {"^x": {"type": "integer"}}})
    assert compiled.is_valid({"x1": 1, "y": "free"})
    assert not compiled.is_valid({"x1": "one"})
    assert compiled.find_error({"x1": "one"}) == " at $.x1: 'one' is not of type 'integer'"


def test_unknown_keywords_are_ignored_as_the_reference_does() -> None:
    schema = {"type": "string", "x-vendor": {"anything": True}, "dependencies": {"a": ["b"]}}
    compiled = CompiledSchema(schema)
    assert compiled.fast
    assert compiled.is_valid("text")
    assert not compiled.is_valid(3)


def test_is_valid_never_raises_on_values_that_are_not_json() -> None:
    compiled = CompiledSchema({"type": "number", "minimum": 0})
    assert compiled.fast
    assert compiled.is_valid(complex(1, 1)) is False  # a complex is a Number but has no order
    assert compiled.find_error(complex(1, 1)) is not None


def test_find_error_is_none_for_a_valid_instance() -> None:
    compiled = CompiledSchema({"type": "object", "required": ["a"]})
    assert compiled.find_error({"a": 1}) is None
    assert compiled.find_error({}) == ": 'a' is a required property"


def test_every_built_in_tool_schema_is_compiled(tmp_path: Any) -> None:
    registry = workspace_registry(tmp_path)
    for tool in registry.list_tools():
        assert compile_check(tool.input_schema) is not None, tool.name
        assert compile_check(tool.output_schema) is not None, tool.name


def test_nan_and_infinities_follow_the_reference_where_it_answers() -> None:
    schema = {"type": "number", "maximum": 5}
    check = compile_check(schema)
    assert check is not None
    for value in (math.inf, -math.inf, math.nan):
        assert check(value) == reference(schema).is_valid(value)
