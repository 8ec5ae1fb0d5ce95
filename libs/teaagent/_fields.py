"""A dataclass's fields as JSON values: the one ``to_dict`` of the records that print or store themselves.

This module sits below every other (it imports none of teaagent), as ``_json`` does.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["json_fields", "json_value"]


def json_value(value: Any) -> Any:
    """``value`` as JSON values: a tuple or list as a new list, a mapping as a new dict, an enum as its value.

    Nested tuples, lists and mappings are converted alike; anything else is returned as it is.
    """
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {key: json_value(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [json_value(item) for item in value]
    return value


def json_fields(
    instance: Any, *, keys: Mapping[str, str] | None = None, leave_out: Collection[str] = ()
) -> dict[str, Any]:
    """The fields of the dataclass ``instance``, in their declared order, as JSON values (:func:`json_value`).

    Args:
        instance: A dataclass instance.
        keys: The key a field is written under when it is not the field's name (``{"preset_id": "id"}``).
        leave_out: Fields not written (the caller adds them its own way, or never).

    Returns:
        A new dict; the caller may add to it.
    """
    names = keys or {}
    return {
        names.get(field.name, field.name): json_value(getattr(instance, field.name))
        for field in dataclasses.fields(instance)
        if field.name not in leave_out
    }
