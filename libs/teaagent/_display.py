"""Showing a peer's request to a person: its text made visible, its arguments pretty, its long values named.

A peer's arguments and its model's reason are hostile input: an escape sequence, a right-to-left
override or a zero-width character could hide what is really asked. The operators' command line
(``teaagent approvals``) and the approver's web inbox show them through these functions alone.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["INVISIBLE_CATEGORIES", "LONG_VALUE_CHARS", "long_values", "pretty_arguments", "visible"]

LONG_VALUE_CHARS: Final = 200  # a string argument longer than this is named (and folded on a page)
INVISIBLE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def visible(text: str, *, newlines: bool = False) -> str:
    r"""Return ``text`` with every character a terminal would not show as itself escaped (``\u202e``).

    Args:
        text: The text.
        newlines: Keep line feeds (a multi-line reason); tabs and everything else are escaped.
    """
    if text.isprintable():
        return text  # the common case, in C: nothing printable is in an invisible category
    out = []
    for char in text:
        if newlines and char == "\n":
            out.append(char)
        elif unicodedata.category(char) in INVISIBLE_CATEGORIES:
            code = ord(char)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


def pretty_arguments(arguments: Any) -> str:
    """The arguments as indented JSON, non-ASCII kept readable and invisible characters escaped."""
    return visible(json.dumps(arguments, indent=2, ensure_ascii=False, sort_keys=True), newlines=True)


def long_values(value: Any, path: str = "") -> Iterator[tuple[str, int]]:
    """``(path, length)`` of every string in ``value`` longer than :data:`LONG_VALUE_CHARS` (``a.b[2]``)."""
    if isinstance(value, str):
        if len(value) > LONG_VALUE_CHARS:
            yield path or "(the value)", len(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from long_values(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from long_values(item, f"{path}[{index}]")
