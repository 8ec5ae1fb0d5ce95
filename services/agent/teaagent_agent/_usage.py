"""What the workspace's runs spent, read from their run logs (``teaagent.cost_tracker``'s format).

A run of the agent service is labelled with its session's id, so its model calls (and its time,
from its log's ``run_start`` to its ``run_end``) add up under that session; runs labelled
otherwise (``teaagent run``'s ``cli``) count toward the models, the days and the total only. The
logs are read afresh on every call, bounded per line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any, Final

from teaagent.cost_tracker import (
    MAX_RECORD_BYTES,
    MODEL_CALL,
    RUN_END,
    RUN_LOG_SUFFIX,
    RUN_START,
    RUNS_DIR,
    Usage,
)

__all__ = ["Totals", "UsageScan", "scan_usage"]

MAX_LOG_FILES: Final = 100_000  # runs of a workspace; past it the oldest names are not read


@dataclass
class Totals(Usage):
    """Counters of some model calls: tokens and cost (:class:`Usage`), how many, when, which models."""

    requests: int = 0
    seconds: float = 0.0  # the finished runs' time, start to end
    first: datetime | None = None
    last: datetime | None = None
    models: set[str] = field(default_factory=set)

    def add(self, record: dict[str, Any], at: datetime) -> None:
        self.requests += 1
        self.add_usage(
            int(record["input_tokens"]), int(record["output_tokens"]), float(record.get("cost_cents", 0.0))
        )
        self.first = at if self.first is None or at < self.first else self.first
        self.last = at if self.last is None or at > self.last else self.last
        self.models.add(str(record["model"]))

    def out(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": 0,
            "reasoning_tokens": 0,
            "total_tokens": self.input_tokens + self.output_tokens,
            "cache_share": None,
            "cost_cents": round(self.cost_cents, 6),
        }


@dataclass
class UsageScan:
    """The model calls of a workspace, added up four ways."""

    by_session: dict[str, Totals] = field(default_factory=dict)
    by_model: dict[str, Totals] = field(default_factory=dict)
    by_day: dict[date, Totals] = field(default_factory=dict)
    total: Totals = field(default_factory=Totals)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _lines(path: Path) -> Iterable[bytes]:
    try:
        with open(path, "rb") as handle:
            while True:
                line = handle.readline(MAX_RECORD_BYTES + 2)
                if not line:
                    return
                if len(line) <= MAX_RECORD_BYTES + 1:
                    yield line
                else:
                    while line and not line.endswith(b"\n"):
                        line = handle.readline(MAX_RECORD_BYTES + 2)
    except OSError:
        return


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def scan_usage(workspace: Path, sessions: set[str]) -> UsageScan:
    """Add up every model call of the workspace's run logs; ``sessions`` are the labels that are sessions."""
    scan = UsageScan()
    folder = workspace / RUNS_DIR
    try:
        names = sorted(entry.name for entry in os.scandir(folder))[-MAX_LOG_FILES:]
    except OSError:
        return scan
    labels: dict[str, str] = {}
    started: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    calls: list[tuple[str, dict[str, Any], datetime]] = []
    for name in names:
        if not name.endswith(RUN_LOG_SUFFIX) or name.startswith("."):
            continue
        for line in _lines(folder / name):
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
                continue
            kind = record.get("type")
            if kind == RUN_START and isinstance(record.get("label"), str):
                labels.setdefault(record["run_id"], record["label"])
                at = _parse_time(record.get("at"))
                if at is not None:
                    started.setdefault(record["run_id"], at)
            elif kind == RUN_END:
                at = _parse_time(record.get("at"))
                if at is not None:
                    ended.setdefault(record["run_id"], at)
            elif kind == MODEL_CALL:
                at = _parse_time(record.get("at"))
                if (
                    at is None
                    or not _count(record.get("input_tokens"))
                    or not _count(record.get("output_tokens"))
                    or not isinstance(record.get("model"), str)
                ):
                    continue
                calls.append((record["run_id"], record, at))
    for run_id, record, at in calls:
        scan.total.add(record, at)
        scan.by_model.setdefault(str(record["model"]), Totals()).add(record, at)
        scan.by_day.setdefault(at.astimezone(UTC).date(), Totals()).add(record, at)
        label = labels.get(run_id, "")
        if label in sessions:
            scan.by_session.setdefault(label, Totals()).add(record, at)
    for run_id, label in labels.items():
        if label in sessions and run_id in started and run_id in ended:
            seconds = (ended[run_id] - started[run_id]).total_seconds()
            scan.by_session.setdefault(label, Totals()).seconds += max(0.0, seconds)
    return scan
