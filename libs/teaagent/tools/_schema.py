"""JSON Schema (Draft 2020-12) checks for tool arguments and results, fast on the hot path.

``jsonschema`` is the reference: it checks every schema against the meta-schema when a tool is
registered and writes the error message when an instance fails. Its ``is_valid`` costs tens of
microseconds per call, though, so each schema is also compiled once into a tree of closures that
answers valid/invalid for the common subset of keywords in about a microsecond. A schema that uses
any keyword outside that subset (``$ref``, ``if``, ``patternProperties``, ``contains``...) is left to
``jsonschema`` whole. Every rule below mirrors ``jsonschema``'s own keyword functions (its
``_keywords.py`` and ``_utils.py``), quirks included, and a property test holds the two in agreement.

``jsonschema`` is imported when a schema is first checked, not with this module: the node's
configuration imports the tools package, and a relay, an approver or a one-shot command that loads
it registers no tool.
"""

from __future__ import annotations

import functools
import itertools
import numbers
import re
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Final

from teaagent.errors import SchemaValidationError

if TYPE_CHECKING:
    from jsonschema.exceptions import SchemaError, ValidationError

__all__ = ["CompiledSchema", "check_schema", "compile_check", "describe_error", "fallback_keywords"]

Check = Callable[[Any], bool]

MAX_ERROR_DETAIL_CHARS: Final = 300  # the message quotes the instance, which may be a whole file

DRAFT_2020_12: Final = frozenset(
    {"https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2020-12/schema#"}
)

SUPPORTED_KEYWORDS: Final = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "pattern",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
    }
)
"""Keywords the compiled validator asserts itself."""

ANNOTATION_KEYWORDS: Final = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "format",  # jsonschema asserts formats only when given a format checker; we give none
        "deprecated",
        "readOnly",
        "writeOnly",
        "contentMediaType",
        "contentEncoding",
    }
)
"""Keywords that assert nothing; listed for the reader, they need no code."""


@functools.cache
def fallback_keywords() -> frozenset[str]:
    """Keywords jsonschema asserts that we do not, and the reference machinery whose meaning depends
    on the whole document: a schema holding any of them is validated by jsonschema alone."""
    from jsonschema import Draft202012Validator  # only once a schema is compiled

    return (frozenset(Draft202012Validator.VALIDATORS) - SUPPORTED_KEYWORDS - {"format"}) | {
        "$defs",
        "definitions",
        "$id",
        "$anchor",
        "$dynamicAnchor",
        "$vocabulary",
        "$recursiveRef",
        "$recursiveAnchor",
        "then",  # read by ``if`` only, but a reader expects them to count
        "else",
        "minContains",
        "maxContains",
    }


class _Unsupported(Exception):
    """The schema uses a keyword outside the compiled subset."""


# -- the reference's equality, which keeps booleans apart from numbers ------------------------------

_TRUE = object()
_FALSE = object()


def _unbool(element: Any) -> Any:
    if element is True:
        return _TRUE
    if element is False:
        return _FALSE
    return element


def _equal(one: Any, two: Any) -> bool:
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return bool(one == two)
    if isinstance(one, Sequence) and isinstance(two, Sequence):
        return len(one) == len(two) and all(_equal(i, j) for i, j in zip(one, two, strict=True))
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return len(one) == len(two) and all(
            key in two and _equal(value, two[key]) for key, value in one.items()
        )
    return bool(_unbool(one) == _unbool(two))


def _unique(container: list[Any]) -> bool:
    # The reference sorts when it can and compares neighbours, else compares every pair; the same
    # algorithm gives the same answer in the corner cases where sorting is not a total order.
    try:
        ordered = sorted(_unbool(i) for i in container)
        return all(
            not _equal(i, j) for i, j in zip(ordered, itertools.islice(ordered, 1, None), strict=False)
        )
    except (NotImplementedError, TypeError):
        seen: list[Any] = []
        for element in container:
            element = _unbool(element)
            if any(_equal(i, element) for i in seen):
                return False
            seen.append(element)
        return True


# -- JSON types (Draft 2020-12: booleans are not numbers, 1.0 is an integer) --------------------------


def _is_string(x: Any) -> bool:
    return isinstance(x, str)


def _is_object(x: Any) -> bool:
    return isinstance(x, dict)


def _is_array(x: Any) -> bool:
    return isinstance(x, list)


def _is_boolean(x: Any) -> bool:
    return isinstance(x, bool)


def _is_null(x: Any) -> bool:
    return x is None


def _is_number(x: Any) -> bool:
    kind = type(x)
    if kind is int or kind is float:
        return True
    return not isinstance(x, bool) and isinstance(x, numbers.Number)


def _is_integer(x: Any) -> bool:
    kind = type(x)
    if kind is int:
        return True
    if kind is float:
        return bool(x.is_integer())
    if isinstance(x, bool):
        return False
    return isinstance(x, int) or (isinstance(x, float) and x.is_integer())


_TYPE_CHECKS: Final[dict[str, Check]] = {
    "string": _is_string,
    "object": _is_object,
    "array": _is_array,
    "boolean": _is_boolean,
    "null": _is_null,
    "number": _is_number,
    "integer": _is_integer,
}


def _accept(x: Any) -> bool:
    return True


def _reject(x: Any) -> bool:
    return False


def _all_of(checks: Sequence[Check]) -> Check:
    """One check that passes when every check passes, in order, without a loop for one or two."""
    checks = tuple(checks)
    if not checks:
        return _accept
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks

        def both(x: Any) -> bool:
            return first(x) and second(x)

        return both

    def every(x: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a loop beats any()/all() over a generator here
            if not check(x):
                return False
        return True

    return every


# -- compiling one schema node ---------------------------------------------------------------------


def _compile(schema: Any) -> Check:
    if schema is True:
        return _accept
    if schema is False:
        return _reject
    if not isinstance(schema, dict):
        raise _Unsupported("a schema is neither an object nor a boolean")
    for keyword in schema:
        if keyword in fallback_keywords():
            raise _Unsupported(keyword)
    if "$schema" in schema and schema["$schema"] not in DRAFT_2020_12:
        raise _Unsupported("$schema")  # another draft changes what the keywords mean

    anywhere = _generic_checks(schema)
    if "type" not in schema:
        kind_checks = {kind: build(schema, None) for kind, build in _KIND_BUILDERS.items()}
        return _all_of([*_guarded(kind_checks, set(kind_checks)), *anywhere])
    types = [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
    type_check = _type_check(types)
    # Once the type check passed, only the keywords of the declared types can apply.
    kinds = {_KIND_OF_TYPE[name] for name in types if name in _KIND_OF_TYPE}
    if len(types) == 1 and kinds:
        # One declared type: its own checks start with the type check, in the same closure.
        (kind,) = kinds
        own = _KIND_BUILDERS[kind](schema, type_check)
        return _all_of([own if own is not None else type_check, *anywhere])
    kind_checks = {kind: build(schema, None) for kind, build in _KIND_BUILDERS.items() if kind in kinds}
    return _all_of([type_check, *_guarded(kind_checks, kinds), *anywhere])


_KIND_OF_TYPE: Final = {
    "object": "object",
    "array": "array",
    "string": "string",
    "number": "number",
    "integer": "number",
}


def _type_check(types: list[str]) -> Check:
    checks = tuple(_TYPE_CHECKS[name] for name in types)  # the meta-schema allows only these names
    if len(checks) == 1:
        return checks[0]

    def any_type(x: Any) -> bool:
        for check in checks:  # noqa: SIM110 - a loop beats any()/all() over a generator here
            if check(x):
                return True
        return False

    return any_type


def _guarded(kind_checks: dict[str, Check | None], kinds: set[str]) -> list[Check]:
    """Wrap each kind's checks so that they only apply to instances of that kind, as in the reference."""
    guarded: list[Check] = []
    for kind in ("object", "array", "string", "number"):
        check = kind_checks.get(kind)
        if check is None or kind not in kinds:
            continue
        guarded.append(_guard(_KIND_GUARDS[kind], check))
    return guarded


_KIND_GUARDS: Final[dict[str, Check]] = {
    "object": _is_object,
    "array": _is_array,
    "string": _is_string,
    "number": _is_number,
}


def _guard(is_kind: Check, check: Check) -> Check:
    def guarded(x: Any) -> bool:
        return not is_kind(x) or check(x)

    return guarded


def _object_check(schema: dict[str, Any], typed: Check | None) -> Check | None:
    """properties, required, additionalProperties, min/maxProperties fused in one closure.

    With ``typed``, the closure also checks the type first (and always exists).
    """
    properties = {name: _compile(sub) for name, sub in schema.get("properties", {}).items()}
    required = tuple(schema.get("required", ()))
    additional_schema = schema.get("additionalProperties", True)
    additional: Check | None = _compile(additional_schema)
    if additional is _accept:
        additional = None  # ``true`` or ``{}``: extra properties need no visit
    min_properties = schema.get("minProperties", 0)
    max_properties = schema.get("maxProperties")
    if (
        not properties
        and not required
        and additional is None
        and not min_properties
        and max_properties is None
    ):
        return None
    # A property whose schema is ``true`` needs no visit.
    checked = tuple((name, check) for name, check in properties.items() if check is not _accept)
    property_get = properties.get

    def object_check(x: Any) -> bool:
        if typed is not None and not isinstance(x, dict):
            return False
        for name in required:
            if name not in x:
                return False
        if min_properties and len(x) < min_properties:
            return False
        if max_properties is not None and len(x) > max_properties:
            return False
        if additional is None:
            for name, check in checked:  # noqa: SIM110 - a loop beats any()/all() over a generator here
                if name in x and not check(x[name]):
                    return False
            return True
        for name, value in x.items():
            own = property_get(name)
            if own is None:
                if not additional(value):
                    return False
            elif not own(value):
                return False
        return True

    return object_check


def _array_check(schema: dict[str, Any], typed: Check | None) -> Check | None:
    """prefixItems, items, min/maxItems, uniqueItems fused in one closure."""
    prefix = tuple(_compile(sub) for sub in schema.get("prefixItems", ()))
    items = _compile(schema["items"]) if "items" in schema else None
    if items is _accept:
        items = None
    min_items = schema.get("minItems", 0)
    max_items = schema.get("maxItems")
    unique = bool(schema.get("uniqueItems", False))
    if not prefix and items is None and not min_items and max_items is None and not unique:
        return None if typed is None else typed
    start = len(prefix)

    def array_check(x: Any) -> bool:
        if typed is not None and not isinstance(x, list):
            return False
        size = len(x)
        if size < min_items or (max_items is not None and size > max_items):
            return False
        for check, value in zip(prefix, x, strict=False):
            if not check(value):
                return False
        if items is not None:
            for index in range(start, size):
                if not items(x[index]):
                    return False
        return not unique or _unique(x)

    return array_check


def _string_check(schema: dict[str, Any], typed: Check | None) -> Check | None:
    """minLength, maxLength (code points, as Python's len) and pattern (re.search, as the reference)."""
    min_length = schema.get("minLength", 0)
    max_length = schema.get("maxLength")
    search = re.compile(schema["pattern"]).search if "pattern" in schema else None
    if not min_length and max_length is None and search is None:
        return None if typed is None else typed

    def string_check(x: Any) -> bool:
        if typed is not None and not isinstance(x, str):
            return False
        size = len(x)
        if size < min_length or (max_length is not None and size > max_length):
            return False
        return search is None or search(x) is not None

    return string_check


def _number_check(schema: dict[str, Any], typed: Check | None) -> Check | None:
    """minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf."""
    minimum = schema.get("minimum")
    maximum = schema.get("maximum")
    exclusive_minimum = schema.get("exclusiveMinimum")
    exclusive_maximum = schema.get("exclusiveMaximum")
    multiple_of = schema.get("multipleOf")
    bounds = (minimum, maximum, exclusive_minimum, exclusive_maximum, multiple_of)
    if all(bound is None for bound in bounds):
        return None if typed is None else typed

    def number_check(x: Any) -> bool:
        if typed is not None and not typed(x):  # "number" or "integer"
            return False
        if minimum is not None and x < minimum:
            return False
        if maximum is not None and x > maximum:
            return False
        if exclusive_minimum is not None and x <= exclusive_minimum:
            return False
        if exclusive_maximum is not None and x >= exclusive_maximum:
            return False
        return multiple_of is None or _is_multiple(x, multiple_of)

    return number_check


def _is_multiple(x: Any, divisor: Any) -> bool:
    if isinstance(divisor, float):
        quotient = x / divisor
        try:
            return bool(int(quotient) == quotient)
        except OverflowError:
            # An enormous quotient: exact arithmetic, as the reference does.
            return (Fraction(x) / Fraction(divisor)).denominator == 1
    return not x % divisor


_KIND_BUILDERS: Final[dict[str, Callable[[dict[str, Any], Check | None], Check | None]]] = {
    "object": _object_check,
    "array": _array_check,
    "string": _string_check,
    "number": _number_check,
}


def _generic_checks(schema: dict[str, Any]) -> list[Check]:
    """enum, const, allOf, anyOf, oneOf, not: they apply to instances of every type."""
    checks: list[Check] = []
    if "enum" in schema:
        checks.append(_enum_check(list(schema["enum"])))
    if "const" in schema:
        expected = schema["const"]

        def const_check(x: Any) -> bool:
            return _equal(x, expected)

        checks.append(const_check)
    if "allOf" in schema:
        checks.extend(_compile(sub) for sub in schema["allOf"])
    if "anyOf" in schema:
        alternatives = tuple(_compile(sub) for sub in schema["anyOf"])

        def any_of(x: Any) -> bool:
            for check in alternatives:  # noqa: SIM110 - a loop beats any()/all() over a generator here
                if check(x):
                    return True
            return False

        checks.append(any_of)
    if "oneOf" in schema:
        options = tuple(_compile(sub) for sub in schema["oneOf"])

        def one_of(x: Any) -> bool:
            matched = False
            for check in options:
                if check(x):
                    if matched:
                        return False
                    matched = True
            return matched

        checks.append(one_of)
    if "not" in schema:
        negated = _compile(schema["not"])

        def not_check(x: Any) -> bool:
            return not negated(x)

        checks.append(not_check)
    return checks


def _enum_check(values: list[Any]) -> Check:
    if values and all(type(value) is str for value in values):
        # Strings equal only strings under the reference's rules, so a set lookup says the same.
        allowed = frozenset(values)

        def string_enum(x: Any) -> bool:
            return isinstance(x, str) and x in allowed

        return string_enum

    def enum_check(x: Any) -> bool:
        for value in values:  # noqa: SIM110 - a loop beats any()/all() over a generator here
            if _equal(value, x):
                return True
        return False

    return enum_check


# -- the public face of this module ------------------------------------------------------------------


def compile_check(schema: Any) -> Check | None:
    """Compile ``schema`` into a fast check, or return None when it uses keywords outside the subset.

    The schema must already have passed :func:`check_schema`. The check may raise on instances that
    are not JSON (a complex number compared with a minimum); :class:`CompiledSchema` handles that.
    """
    try:
        return _compile(schema)
    except _Unsupported:
        return None


def check_schema(schema: Any, *, tool_name: str, which: str) -> None:
    """Check ``schema`` against the Draft 2020-12 meta-schema.

    Args:
        schema: The schema to check; tools take an object.
        tool_name: The tool it belongs to, for the message.
        which: ``input_schema`` or ``output_schema``, for the message.

    Raises:
        SchemaValidationError: The schema is not an object or is not a valid Draft 2020-12 schema.
    """
    if not isinstance(schema, dict):
        raise SchemaValidationError(
            f"{tool_name}: {which} must be a JSON Schema object, not {type(schema).__name__}"
        )
    from jsonschema import Draft202012Validator  # imported once a tool registers
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise SchemaValidationError(
            f"{tool_name}: {which} is not a valid JSON Schema (Draft 2020-12){describe_error(exc)}"
        ) from exc


def describe_error(error: ValidationError | SchemaError) -> str:
    """Return `` at $.path: message`` for one validation error (``: message`` at the root).

    The result is meant to follow a subject: ``f"arguments are invalid{describe_error(error)}"``.
    """
    where = "" if error.json_path == "$" else f" at {error.json_path}"
    return f"{where}: {_clip(error.message)}"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_DETAIL_CHARS else text[: MAX_ERROR_DETAIL_CHARS - 1] + "…"


class CompiledSchema:
    """A schema checked once and compiled once: a fast yes/no, and the reference's reason on a no."""

    __slots__ = ("_check", "_reference", "fast", "schema")

    def __init__(self, schema: dict[str, Any]) -> None:
        """Compile ``schema``, which must already have passed :func:`check_schema`."""
        from jsonschema import Draft202012Validator  # imported once a tool registers

        self.schema = schema
        self._reference = Draft202012Validator(schema)
        check = compile_check(schema)
        self.fast: bool = check is not None
        """True when the compiled subset covers the schema; False when jsonschema does all the work."""
        self._check: Check = check if check is not None else self._reference.is_valid

    def is_valid(self, instance: Any) -> bool:
        """Return True when ``instance`` satisfies the schema, never raising."""
        try:
            return self._check(instance)
        except Exception:  # not JSON (a complex compared with a minimum...): let find_error decide
            return False

    def find_error(self, instance: Any) -> str | None:
        """Return why ``instance`` fails, as `` at $.path: message``, or None when it is valid.

        The reference (jsonschema) decides here: the compiled check only ever sends it the
        instances it refused.
        """
        from jsonschema.exceptions import best_match  # imported with the validator

        try:
            error = best_match(self._reference.iter_errors(instance))
        except Exception as exc:  # an unresolvable $ref, a value the reference cannot compare...
            return f": it cannot be checked against the schema ({type(exc).__name__}: {_clip(str(exc))})"
        return None if error is None else describe_error(error)
