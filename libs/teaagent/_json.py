"""Reading JSON that came from the network, with a bound on how deeply it nests.

Python's ``json`` and the canonical encoder (``rfc8785``) recurse once per level of arrays and
objects: a 60 KB body of ``[[[[...]]]]`` (30,000 levels) fits every size limit and ends in a
``RecursionError``, which no caller expects (a 500 answer, a delivery retried until it expires).
No document of the protocol, nor any body or answer of a node's services, nests more than a
few levels beyond a tool call's arguments, so every JSON document a node reads from a peer, a
client or its own services goes through :func:`parse_json` (or :func:`check_json_depth`, before
a parser of its own such as pydantic's), and every value written as canonical JSON is bounded
alike (:func:`teaagent._canonical.canonical`).

This module sits below every other (it imports none of teaagent), as ``_canonical`` does.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, Final

__all__ = [
    "MAX_ARGUMENTS_DEPTH",
    "MAX_JSON_DEPTH",
    "JSONDepthError",
    "check_json_depth",
    "check_value_depth",
    "json_depth",
    "parse_json",
]

MAX_JSON_DEPTH: Final = 64  # a tool call's arguments, not a data structure
# A call's arguments travel at most four levels down: in the approver's listing, an item's request
# ({"items": [{"request": {"arguments": ...}}]}). Bounded this much tighter, every document that
# carries them stays within MAX_JSON_DEPTH.
MAX_ARGUMENTS_DEPTH: Final = MAX_JSON_DEPTH - 4

# A JSON string, escapes included; an unterminated one runs to the end (so the scan stays linear).
_STRING: Final = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKETS: Final = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEPS: Final = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 and -1 as signed bytes


class JSONDepthError(ValueError):
    """A JSON document or value nests arrays and objects more deeply than the limit allows.

    A ``ValueError`` like every other refusal of a malformed document; its message is the one
    sentence a caller passes on.
    """

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


def _too_deep(what: str, limit: int) -> JSONDepthError:
    return JSONDepthError(f"{what} nests arrays and objects more than {limit} levels deep.", limit=limit)


def json_depth(data: bytes | bytearray | str) -> int:
    """Return how deeply the JSON text ``data`` nests arrays and objects (``[]`` is 1, ``1`` is 0).

    Brackets inside strings do not count. Text that is not JSON gets a number too (it is refused
    by the parser anyway); the scan never recurses and is linear in the length of ``data``.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS).translate(_STEPS)
    return max(0, max(accumulate(array("b", brackets)), default=0))


def check_json_depth(
    data: bytes | bytearray | str, *, limit: int = MAX_JSON_DEPTH, what: str = "The JSON document"
) -> None:
    """Refuse the JSON text ``data`` when it nests deeper than ``limit``, before any parser reads it.

    For a caller that parses with a parser of its own (pydantic's ``model_validate_json``); the
    others call :func:`parse_json`. A text with no more brackets than ``limit`` is passed at once.

    Raises:
        JSONDepthError: ``data`` nests arrays and objects more than ``limit`` levels deep; the
            message begins with ``what`` ("The request body", "The answer").
    """
    if isinstance(data, str):
        brackets = data.count("[") + data.count("{")
    else:
        brackets = data.count(b"[") + data.count(b"{")
    if brackets > limit and json_depth(data) > limit:
        raise _too_deep(what, limit)


def parse_json(
    data: bytes | bytearray | str, *, limit: int = MAX_JSON_DEPTH, what: str = "The JSON document"
) -> Any:
    """Parse the JSON text ``data`` (``json.loads``), refusing one that nests deeper than ``limit``.

    Args:
        data: JSON text, as bytes (UTF-8, -16 or -32, as ``json.loads`` reads them) or str.
        limit: The deepest nesting of arrays and objects allowed.
        what: What ``data`` is, to begin the refusal's sentence with.

    Returns:
        The parsed value.

    Raises:
        JSONDepthError: ``data`` nests arrays and objects more than ``limit`` levels deep.
        json.JSONDecodeError: ``data`` is not JSON (also a ``ValueError``).
        UnicodeDecodeError: ``data`` is bytes that are no Unicode text (also a ``ValueError``).
    """
    check_json_depth(data, limit=limit, what=what)
    return json.loads(data)


def check_value_depth(value: Any, *, limit: int = MAX_JSON_DEPTH, what: str = "The value") -> None:
    """Refuse a Python value that would be JSON nesting deeper than ``limit`` (before encoding it).

    Mappings, lists and tuples count as a level each; the walk never recurses and stops at the
    first level too deep.

    Raises:
        JSONDepthError: ``value`` nests more than ``limit`` levels deep; the message begins with ``what``.
    """
    level: list[Any] = [value]
    depth = 0
    while level:
        containers = [item for item in level if isinstance(item, Mapping | list | tuple)]
        if not containers:
            return
        depth += 1
        if depth > limit:
            raise _too_deep(what, limit)
        level = [
            child
            for container in containers
            for child in (container.values() if isinstance(container, Mapping) else container)
        ]
