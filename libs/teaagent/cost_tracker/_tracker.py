"""Cost reports over a workspace's run logs."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from teaagent.cost_tracker._format import (
    MAX_RECORD_BYTES,
    RUN_LOG_SUFFIX,
    RUNS_DIR,
    ModelCall,
    RunStart,
    parse_record,
)
from teaagent.cost_tracker._usage import Usage

__all__ = ["CostTracker"]

logger = logging.getLogger("teaagent.cost_tracker")


@dataclass
class _Totals(Usage):
    model_calls: int = 0
    runs: set[str] = field(default_factory=set)

    def add_call(self, call: ModelCall) -> None:
        self.add_usage(call.input_tokens, call.output_tokens, call.cost_cents)
        self.model_calls += 1
        self.runs.add(call.run_id)

    def add(self, other: _Totals) -> None:
        self.add_usage(other.input_tokens, other.output_tokens, other.cost_cents)
        self.model_calls += other.model_calls
        self.runs |= other.runs

    def summary(self) -> dict[str, float]:
        return {
            "cost_cents": self.cost_cents,
            "runs": len(self.runs),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "model_calls": self.model_calls,
        }


@dataclass
class _Run:
    label: str = ""
    start_model: str = ""
    first_seen: datetime | None = None  # the run_start's time, else the earliest record's
    started: bool = False
    totals: _Totals = field(default_factory=_Totals)


@dataclass
class _Scan:
    runs: dict[str, _Run] = field(default_factory=dict)
    by_model: dict[str, _Totals] = field(default_factory=dict)
    by_day: dict[str, _Totals] = field(default_factory=dict)
    skipped_lines: int = 0


class CostTracker:
    """Adds up what the runs of a workspace cost, from their logs in ``<root>/.teaagent/runs/*.jsonl``.

    Every summary reads the logs afresh, so runs in progress show what they have spent so far.
    Each summary maps a group to ``{'cost_cents': float, 'runs': int, 'input_tokens': int,
    'output_tokens': int, 'model_calls': int}``:

    - :meth:`get_summary_by_label`: a run's label comes from its ``run_start`` record (``""`` when
      it has none, or when its ``run_start`` line is missing).
    - :meth:`get_summary_by_model`: calls are grouped by the model that answered them; ``runs`` counts
      the runs that called the model, and a run that made no call counts under the model it started with.
    - :meth:`get_summary_by_day`: calls are grouped by their UTC day (``YYYY-MM-DD``); ``runs`` counts
      the runs that started that day (a run that goes on past midnight counts on its first day, and
      its later calls on theirs).

    A run is counted once however many files or ``run_start`` records mention it. A line that is
    not a record (not JSON, a known record type with a missing or invalid field, longer than
    :data:`~teaagent.cost_tracker.MAX_RECORD_BYTES`) is skipped, counted in :attr:`skipped_lines`
    and reported through the ``teaagent.cost_tracker`` logger; it never stops a report. Records of
    an unknown type are ignored without counting: a later runner may write more kinds.
    """

    def __init__(self, root: str | os.PathLike[str] = ".") -> None:
        """Point the tracker at a workspace; nothing is read until a summary is asked for.

        Args:
            root: Workspace root. Scans .teaagent/runs/*.jsonl for cost data.
        """
        self._folder = Path(os.fspath(root)) / RUNS_DIR
        self._skipped_lines = 0

    def __repr__(self) -> str:
        return f"CostTracker({str(self._folder.parent.parent)!r})"

    @property
    def folder(self) -> Path:
        """The folder of run logs."""
        return self._folder

    @property
    def skipped_lines(self) -> int:
        """How many lines the last summary skipped because they were not valid records."""
        return self._skipped_lines

    def get_summary_by_label(self) -> dict[str, dict[str, float]]:
        """Aggregate cost grouped by run label.

        Returns:
            {'label': {'cost_cents': float, 'runs': int, 'input_tokens': int,
                       'output_tokens': int, 'model_calls': int}}, labels in sorted order.

        Raises:
            OSError: The runs folder exists but cannot be listed.
        """
        scan = self._scan()
        by_label: dict[str, _Totals] = {}
        for run_id, run in scan.runs.items():
            totals = by_label.setdefault(run.label, _Totals())
            totals.add(run.totals)
            totals.runs.add(run_id)
        return {label: by_label[label].summary() for label in sorted(by_label)}

    def get_summary_by_model(self) -> dict[str, dict[str, float]]:
        """Aggregate cost grouped by model name, as :meth:`get_summary_by_label` does by label.

        Returns:
            ``{model: summary}``, the summaries as :meth:`get_summary_by_label`'s, models in sorted order.

        Raises:
            OSError: The runs folder exists but cannot be listed.
        """
        scan = self._scan()
        for run_id, run in scan.runs.items():
            if run.totals.model_calls == 0 and run.start_model:
                scan.by_model.setdefault(run.start_model, _Totals()).runs.add(run_id)
        return {model: scan.by_model[model].summary() for model in sorted(scan.by_model)}

    def get_summary_by_day(self) -> dict[str, dict[str, float]]:
        """Aggregate cost grouped by calendar day.

        Returns:
            {'YYYY-MM-DD': {'cost_cents': float, 'runs': int, 'input_tokens': int,
                            'output_tokens': int, 'model_calls': int}}, days in order, UTC.

        Raises:
            OSError: The runs folder exists but cannot be listed.
        """
        scan = self._scan()
        runs_by_day: dict[str, set[str]] = {}
        for run_id, run in scan.runs.items():
            if run.first_seen is not None:
                runs_by_day.setdefault(run.first_seen.date().isoformat(), set()).add(run_id)
        for day in runs_by_day:
            scan.by_day.setdefault(day, _Totals())
        result: dict[str, dict[str, float]] = {}
        for day in sorted(scan.by_day):
            summary = scan.by_day[day].summary()
            summary["runs"] = len(runs_by_day.get(day, ()))
            result[day] = summary
        return result

    # -- reading ------------------------------------------------------------------------------

    def _scan(self) -> _Scan:
        scan = _Scan()
        try:
            names = sorted(entry.name for entry in os.scandir(self._folder))
        except FileNotFoundError:
            names = []
        for name in names:
            if name.endswith(RUN_LOG_SUFFIX) and not name.startswith("."):
                self._scan_file(self._folder / name, scan)
        self._skipped_lines = scan.skipped_lines
        return scan

    def _scan_file(self, path: Path, scan: _Scan) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # removed since the folder was listed
        except OSError as exc:
            why = (
                "it is a symbolic link" if exc.errno == errno.ELOOP else f"it cannot be read ({exc.strerror})"
            )
            logger.warning("skipping the run log %s: %s", path, why)
            return
        skipped = 0
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                logger.warning("skipping the run log %s: it is not a regular file", path)
                return
            with os.fdopen(fd, "rb", closefd=False) as handle:
                for number, line in enumerate(_lines(handle), start=1):
                    problem = _take(line, scan)
                    if problem is not None:
                        skipped += 1
                        logger.debug("%s line %d skipped: %s", path, number, problem)
        except OSError as exc:
            logger.warning("stopped reading the run log %s: %s", path, exc.strerror or exc)
        finally:
            os.close(fd)
        if skipped:
            logger.warning("skipped %d malformed line(s) of the run log %s", skipped, path)
        scan.skipped_lines += skipped


def _lines(handle: BinaryIO) -> Iterator[bytes | None]:
    """Yield each non-blank line without its newline, or None for one longer than MAX_RECORD_BYTES.

    Reads at most MAX_RECORD_BYTES + 2 bytes at a time (a record, its newline, and one byte more
    to tell a record of the largest size from a longer line), so a huge line costs no memory.
    """
    chunk = MAX_RECORD_BYTES + 2
    while True:
        line = handle.readline(chunk)
        if not line:
            return
        body = line[:-1] if line.endswith(b"\n") else line
        if len(body) > MAX_RECORD_BYTES:
            while line and not line.endswith(b"\n"):  # drop the rest of the long line
                line = handle.readline(chunk)
            yield None
        elif body.strip():  # blank lines are not records, but not damage either
            yield body


def _take(line: bytes | None, scan: _Scan) -> str | None:
    """Add one line to the scan; return why it was skipped, or None when it was used (or ignored)."""
    if line is None:
        return f"longer than {MAX_RECORD_BYTES} bytes"
    try:
        record = parse_record(json.loads(line))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return "not JSON"
    except ValueError as exc:
        return str(exc)
    if record is None:
        return None
    run = scan.runs.setdefault(record.run_id, _Run())
    if isinstance(record, RunStart):
        if not run.started:  # the first start wins: a resumed run keeps its label
            run.started = True
            run.label = record.label
            run.start_model = record.model
            run.first_seen = record.at
    elif run.first_seen is None or (not run.started and record.at < run.first_seen):
        run.first_seen = record.at
    if isinstance(record, ModelCall):
        run.totals.add_call(record)
        scan.by_model.setdefault(record.model, _Totals()).add_call(record)
        scan.by_day.setdefault(record.at.date().isoformat(), _Totals()).add_call(record)
    # A run_end adds no cost; like any record, it makes its run count even without a run_start.
    return None
