"""The one ``to_dict`` of the library's records: a dataclass's fields as JSON values."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from teaagent._fields import json_fields, json_value


class Colour(enum.StrEnum):
    RED = "red"


@dataclass(frozen=True)
class Record:
    record_id: str
    colour: Colour | None
    peers: tuple[str, ...] = ()
    votes: dict[str, Any] = field(default_factory=dict)
    hidden: int = 0


def test_the_fields_come_in_their_order_as_json_values_renamed_or_left_out() -> None:
    approvals = ({"statement": {"signers": ("a",)}},)
    record = Record("r1", Colour.RED, ("a", "b"), {"beta": approvals})
    written = json_fields(record, keys={"record_id": "id"}, leave_out=("hidden",))
    assert written == {
        "id": "r1",
        "colour": "red",
        "peers": ["a", "b"],
        "votes": {"beta": [{"statement": {"signers": ["a"]}}]},
    }
    assert list(written) == ["id", "colour", "peers", "votes"]
    assert written["votes"]["beta"][0] is not approvals[0]  # a copy: the caller may change it
    assert json_value(None) is None
    assert json_fields(Record("r2", None))["colour"] is None
