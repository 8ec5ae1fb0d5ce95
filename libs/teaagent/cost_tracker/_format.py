"""The run-log format: one JSON object per line, written by the runner, read by the cost tracker."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from teaagent._files import FILE_ID_PATTERN, check_file_id

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_NAME_CHARS",
    "MAX_RECORD_BYTES",
    "MODEL_CALL",
    "RECORD_TYPES",
    "RUNS_DIR",
    "RUN_END",
    "RUN_ID_PATTERN",
    "RUN_LOG_SUFFIX",
    "RUN_LOG_VERSION",
    "RUN_START",
    "STATUS_PATTERN",
    "ModelCall",
    "RunEnd",
    "RunStart",
    "check_run_id",
    "format_timestamp",
    "parse_record",
]

#: Where a workspace keeps its run logs, relative to the root: ``<root>/.teaagent/runs/<run_id>.jsonl``.
RUNS_DIR: Final = ".teaagent/runs"
RUN_LOG_SUFFIX: Final = ".jsonl"
#: The ``version`` a ``run_start`` record carries.
RUN_LOG_VERSION: Final = 1
RUN_START: Final = "run_start"
MODEL_CALL: Final = "model_call"
RUN_END: Final = "run_end"
#: The record types this version writes and reads; readers ignore other types (later versions may add some).
RECORD_TYPES: Final = (RUN_START, MODEL_CALL, RUN_END)
#: A run id names its log file: letters, digits, ``_`` and ``-`` only, so no id reaches outside the folder.
RUN_ID_PATTERN: Final = FILE_ID_PATTERN
#: A run's final status: a lowercase word such as ``RunResult.status`` (``completed``, ``cost_exceeded``).
STATUS_PATTERN: Final = re.compile(r"[a-z][a-z_]{0,31}")
MAX_LABEL_CHARS: Final = 500  # a title a report can show
MAX_NAME_CHARS: Final = 200  # provider and model names are short identifiers
MAX_RECORD_BYTES: Final = 16 * 1024  # a record is about 200 bytes; a longer line is not one of ours


def check_run_id(run_id: object) -> str:
    """Return ``run_id`` once it can name a run log (:func:`~teaagent._files.check_file_id`)."""
    return check_file_id(run_id, "run id")


def format_timestamp(moment: datetime | None) -> str:
    """Return ``moment`` (now when None) in UTC ISO 8601 with microseconds: ``2026-06-05T12:00:00.000001Z``.

    Raises:
        ValueError: ``moment`` is a naive datetime (without a time zone).
        TypeError: ``moment`` is not a datetime.
    """
    if moment is None:
        moment = datetime.now(UTC)
    elif not isinstance(moment, datetime):
        raise TypeError(f"a run-log time must be a datetime, not {type(moment).__name__}.")
    elif moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("a run-log time must be an aware datetime (with a time zone).")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class RunStart:
    """A ``run_start`` record: the run began."""

    run_id: str
    label: str
    provider: str
    model: str
    at: datetime


@dataclass(frozen=True)
class ModelCall:
    """A ``model_call`` record: one model call and what it cost."""

    run_id: str
    model: str
    input_tokens: int
    output_tokens: int
    cost_cents: float
    at: datetime


@dataclass(frozen=True)
class RunEnd:
    """A ``run_end`` record: the run ended with ``status``."""

    run_id: str
    status: str
    at: datetime


class _BadRecord(ValueError):
    pass


def _text(record: dict[str, Any], key: str, limit: int, *, empty: bool = True) -> str:
    value = record.get(key)
    if not isinstance(value, str) or len(value) > limit or (not empty and not value):
        raise _BadRecord(key)
    return value


def _count(record: dict[str, Any], key: str) -> int:
    value = record.get(key)
    if type(value) is not int or value < 0:
        raise _BadRecord(key)
    return value


def _cents(record: dict[str, Any], key: str) -> float:
    value = record.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _BadRecord(key)
    if not math.isfinite(value) or value < 0:
        raise _BadRecord(key)
    return float(value)


def _moment(record: dict[str, Any]) -> datetime:
    value = record.get("at")
    if not isinstance(value, str):
        raise _BadRecord("at")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _BadRecord("at") from None
    if moment.tzinfo is None:  # without a zone its day is unknown
        raise _BadRecord("at")
    return moment.astimezone(UTC)


def parse_record(record: object) -> RunStart | ModelCall | RunEnd | None:
    """Check one decoded line of a run log.

    Unknown keys are ignored, and so is a record whose ``type`` is not one of :data:`RECORD_TYPES`
    (None is returned): a later version may add fields and record types.

    Returns:
        The record, or None for an object of another type.

    Raises:
        ValueError: ``record`` is not an object, or a record of a known type has a missing or invalid field.
    """
    if not isinstance(record, dict):
        raise ValueError("a run-log line must be a JSON object.")
    kind = record.get("type")
    try:
        if kind == MODEL_CALL:
            return ModelCall(
                run_id=check_run_id(record.get("run_id")),
                model=_text(record, "model", MAX_NAME_CHARS, empty=False),
                input_tokens=_count(record, "input_tokens"),
                output_tokens=_count(record, "output_tokens"),
                cost_cents=_cents(record, "cost_cents"),
                at=_moment(record),
            )
        if kind == RUN_START:
            return RunStart(
                run_id=check_run_id(record.get("run_id")),
                label=_text(record, "label", MAX_LABEL_CHARS),
                provider=_text(record, "provider", MAX_NAME_CHARS),
                model=_text(record, "model", MAX_NAME_CHARS),
                at=_moment(record),
            )
        if kind == RUN_END:
            status = _text(record, "status", 32)
            if STATUS_PATTERN.fullmatch(status) is None:
                raise _BadRecord("status")
            return RunEnd(run_id=check_run_id(record.get("run_id")), status=status, at=_moment(record))
    except _BadRecord as exc:
        raise ValueError(f"a {kind} record has a missing or invalid {exc.args[0]!r}.") from None
    if not isinstance(kind, str):
        raise ValueError("a run-log record has no 'type'.")
    return None
