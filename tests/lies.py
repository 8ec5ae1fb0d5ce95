"""Lies a relay could tell, generated from the fields of a genuine answer (``tests/test_lying_relay.py``,
``tests/test_hostile_relay.py``).

:func:`lies` walks every value of a JSON document, nested objects and lists included, and gives for
each a few plausible other values, one change at a time: another tool, other arguments, another
digest, another id, another origin, another state or type, times moved, lists reordered, truncated
or grown, objects with a field more or less. The cases come from the document itself, so a field
added later is lied about without touching the tests.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Lie", "Path", "lies"]

Path = tuple[str | int, ...]
ECHO_COMMAND = "echo hello"  # what a relay labels a dangerous command with
STATES = ("pending", "approved", "denied", "expired", "withdrawn", "settled")


@dataclass(frozen=True)
class Lie:
    """One change: the value at ``path`` is said to be ``value``."""

    path: Path
    what: str
    value: Any

    @property
    def name(self) -> str:
        return ".".join(map(str, self.path)) + f": {self.what}"

    def told(self, document: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``document`` with this lie in it (the path must exist in it)."""
        told = copy.deepcopy(document)
        target: Any = told
        for step in self.path[:-1]:
            target = target[step]
        target[self.path[-1]] = copy.deepcopy(self.value)
        return told

    def fits(self, document: dict[str, Any]) -> bool:
        """Whether ``document`` has this lie's path."""
        target: Any = document
        for step in self.path:
            if (isinstance(target, dict) and step in target) or (
                isinstance(target, list) and isinstance(step, int) and step < len(target)
            ):
                target = target[step]
            else:
                return False
        return True


def _paths(value: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    if path:
        yield path, value
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _paths(inner, (*path, index))


def _plausible(path: Path, value: Any) -> list[tuple[str, Any]]:
    name = next((step for step in reversed(path) if isinstance(step, str)), "")
    if isinstance(value, bool):
        return [("negated", not value)]
    if isinstance(value, int | float):
        if name in ("required_approvals", "required", "v"):
            return [("another count", value + 1)]
        return [
            ("moved 61 s later", value + 61),
            ("moved 61 s earlier", value - 61),
            ("beyond JSON's exact integers", 2**63),
        ]
    if isinstance(value, str):
        others = {
            "tool_name": [("another tool", "fs.read")],
            "command": [("the command of echo hello", ECHO_COMMAND)],
            "request_id": [("another id", secrets.token_hex(16))],
            "origin": [("another origin", "gamma")],
            "signer": [("another signer", "delta")],
            "payload_digest": [("another digest", "sha256:" + secrets.token_hex(32))],
            "state": [(f"state {state}", state) for state in STATES],
            "peers": [("another peer", "zeta")],
            "signers": [("another signer", "zeta")],
            "type": [("another type", "teaagent.approval"), ("another type", "teaagent.denial")],
        }.get(name)
        return [item for item in (others or []) if item[1] != value] + [("edited", value + " (edited)")]
    if isinstance(value, list):
        changes: list[tuple[str, Any]] = [
            ("one more", [*value, copy.deepcopy(value[-1]) if value else "zeta"])
        ]
        if len(value) > 1:
            changes += [("reordered", list(reversed(value))), ("truncated", value[:-1])]
        if value:
            changes.append(("emptied", []))
        return changes
    if isinstance(value, dict):
        changes = [("with one more field", {**value, "extra": "x"})]
        if value:
            first = next(iter(value))
            changes.append((f"without {first}", {key: inner for key, inner in value.items() if key != first}))
        return changes
    if value is None:
        made_up = {"statement": {"type": "teaagent.approval"}, "signature": "AAAA"}
        huge = {"certificate": {"request": {}, "request_signature": "AAAA", "approvals": [2**63]}}
        return [("a signed document made up", made_up), ("evidence made up, with a huge integer", huge)]
    return []


def lies(document: dict[str, Any]) -> list[Lie]:
    """Every one-change lie about ``document``, in document order."""
    return [
        Lie(path, what, other) for path, value in _paths(document) for what, other in _plausible(path, value)
    ]
