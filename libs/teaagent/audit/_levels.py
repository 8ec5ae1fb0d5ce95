"""Audit levels: how much of an event's payload reaches the log.

Every record keeps its ``event_type``, ``run_id``, ``event_id`` and ``created_at`` whatever the level;
the level decides what the ``payload`` holds:

===== ============ ================================================================================
level name         the payload written
===== ============ ================================================================================
L0    metrics      the top-level fields whose value is a finite number (int or float, not a boolean):
                   durations, token counts, costs, sizes. No string from the payload.
L1    metadata     L0, plus top-level booleans and nulls, plus top-level strings of at most
                   :data:`MAX_METADATA_CHARS` characters under a metadata name (:data:`METADATA_FIELDS`,
                   or a name ending in one of :data:`METADATA_SUFFIXES`: tool names, call ids, statuses,
                   digests), secret detectors applied; every other field is written as
                   ``"[OMITTED:<n> bytes]"`` with the size of its canonical JSON (of its UTF-8 text for a
                   string): argument and result values never appear.
L2    redacted     the whole payload through :class:`~teaagent.audit.Redactor`: field rules, built-in
                   sensitive names and secret detectors (the default level).
L3    full         the whole payload, only coerced to JSON values; no redaction at all.
===== ============ ================================================================================

Only top-level fields count as metrics or metadata: the library's events carry them there
(``{"tool_name": ..., "call_id": ..., "duration_ms": ..., "arguments": {...}}``), while nested
structures are arguments and results, whose numbers are values too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from teaagent.audit._event import canonical_json
from teaagent.audit._redact import _PASSTHROUGH, Redactor

__all__ = [
    "MAX_METADATA_CHARS",
    "METADATA_FIELDS",
    "METADATA_SUFFIXES",
    "AuditLevel",
    "metadata_only",
    "metrics_only",
    "parse_audit_level",
    "shape_payload",
]

MAX_METADATA_CHARS = 256  # names, ids and digests are short; a longer string is content, not metadata

METADATA_FIELDS = frozenset(
    {
        "agent_id",
        "call_id",
        "decision",
        "digest",
        "error_type",
        "model",
        "origin",
        "outcome",
        "payload_digest",
        "peer_id",
        "permission_mode",
        "provider",
        "request_id",
        "security_tier",
        "session_id",
        "signer",
        "state",
        "status",
        "stop_reason",
        "tool",
        "tool_name",
    }
)
"""Top-level field names whose short string values level L1 keeps."""

METADATA_SUFFIXES = ("_id", "_name", "_digest", "_status", "_type", "_mode", "_state", "_tier")
"""Name endings that mark a top-level string field as metadata at level L1."""


class AuditLevel(StrEnum):
    """How much of each payload the log keeps (see the module docstring's table)."""

    L0 = "L0"
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"


def parse_audit_level(value: str) -> AuditLevel:
    """Return the :class:`AuditLevel` that ``value`` names (``"L2"``, ``"l2"`` or a member).

    Args:
        value: The level's name.

    Returns:
        The level.

    Raises:
        ValueError: ``value`` is not one of L0, L1, L2, L3.
    """
    try:
        return AuditLevel(value.upper() if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(f"audit level {value!r} is not one of L0, L1, L2, L3.") from None


def _is_metric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metrics_only(payload: Mapping[Any, Any]) -> dict[str, Any]:
    """Level L0: keep the top-level fields whose value is a finite number, nothing else.

    Args:
        payload: The event's details.

    Returns:
        A new dict of ``name: number``.
    """
    return {
        str(name): _PASSTHROUGH.redact_value(value) for name, value in payload.items() if _is_metric(value)
    }


def _is_metadata_name(name: str) -> bool:
    lowered = name.lower()
    return lowered in METADATA_FIELDS or lowered.endswith(METADATA_SUFFIXES)


def _omitted(value: Any) -> str:
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
    else:
        size = len(canonical_json(_PASSTHROUGH.redact_value(value)))  # ASCII: one byte per character
    return f"[OMITTED:{size} bytes]"


def metadata_only(payload: Mapping[Any, Any], redactor: Redactor) -> dict[str, Any]:
    """Level L1: keep metrics, flags and short metadata strings; write every other field's size.

    Args:
        payload: The event's details.
        redactor: Whose secret detectors clean the kept strings and field names.

    Returns:
        A new dict of JSON values.
    """
    shaped: dict[str, Any] = {}
    for key, value in payload.items():
        name = redactor.scrub(str(key))
        if value is None or isinstance(value, bool) or _is_metric(value):
            shaped[name] = _PASSTHROUGH.redact_value(value)
        elif isinstance(value, str) and len(value) <= MAX_METADATA_CHARS and _is_metadata_name(name):
            shaped[name] = redactor.scrub(str.__str__(value))
        else:
            shaped[name] = _omitted(value)
    return shaped


def shape_payload(level: AuditLevel, payload: Mapping[Any, Any], redactor: Redactor) -> dict[str, Any]:
    """Return what the log keeps of ``payload`` at ``level`` (a new dict of JSON values).

    Args:
        level: The audit level.
        payload: The event's details.
        redactor: The field rules and detectors of level L2 (L1 uses its detectors only).

    Returns:
        The payload to write.
    """
    if level is AuditLevel.L2:
        return redactor.redact(payload)
    if level is AuditLevel.L1:
        return metadata_only(payload, redactor)
    if level is AuditLevel.L0:
        return metrics_only(payload)
    return _PASSTHROUGH.redact(payload)
