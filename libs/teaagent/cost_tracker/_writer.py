"""The runner's side of the run log: one writer per run, one atomic append per record."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import threading
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from teaagent.cost_tracker._format import (
    MAX_LABEL_CHARS,
    MAX_NAME_CHARS,
    MODEL_CALL,
    RUN_END,
    RUN_LOG_SUFFIX,
    RUN_LOG_VERSION,
    RUN_START,
    RUNS_DIR,
    STATUS_PATTERN,
    check_run_id,
    format_timestamp,
)

__all__ = ["RunLogWriter"]


def _check_text(value: object, what: str, limit: int, *, empty: bool) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}.")
    if not empty and not value:
        raise ValueError(f"{what} must not be empty.")
    if len(value) > limit:
        raise ValueError(f"{what} is limited to {limit} characters.")
    return value


def _check_count(value: object, what: str) -> int:
    if type(value) is not int:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}.")
    if value < 0:
        raise ValueError(f"{what} must not be negative, not {value}.")
    return value


class RunLogWriter:
    """Writes the run log of one run: ``<root>/.teaagent/runs/<run_id>.jsonl``.

    The constructor appends the ``run_start`` record, :meth:`record_model_call` one ``model_call``
    record per model call, :meth:`finish` the ``run_end`` record (and closes the file). The
    records are described in :mod:`teaagent.cost_tracker`; :class:`CostTracker` reads them.

    Each record is one ``os.write`` of a whole line on an ``O_APPEND`` descriptor, under a thread
    lock and an exclusive ``flock``, so lines from several writers never interleave. When the file
    ends with a line cut short (a crash or a full disk in the middle of an earlier append), the
    next record starts on a new line, and the tracker skips just the broken one. A second writer
    for the same run id appends to the same log; the tracker counts the run once.

    Disk errors are raised (``OSError``) rather than swallowed: a lost record is a cost that no
    report shows, so the caller decides whether the run goes on.

    Use it as a context manager to be sure the file is closed; leaving the block by an exception
    before :meth:`finish` records the run as ``failed``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        run_id: str,
        *,
        label: str = "",
        provider: str,
        model: str,
        at: datetime | None = None,
        fsync: bool = False,
    ) -> None:
        """Create (or reopen) the run's log and append its ``run_start`` record.

        Args:
            root: The workspace root.
            run_id: The run's id, 1 to 64 letters, digits, ``_`` or ``-``; it names the file.
            label: What the run is for, as cost reports group it; ``""`` for none.
            provider: The LLM provider's name (``"openai"``, ``"scripted"``).
            model: The model the run starts with.
            at: When the run started (an aware datetime); None for now.
            fsync: Flush every record to the disk before the call returns.

        Raises:
            ValueError: ``run_id`` is invalid, ``label``, ``provider`` or ``model`` is too long,
                or ``at`` has no time zone.
            TypeError: A field has the wrong type.
            OSError: The folder or the file cannot be created or written.
        """
        self._run_id = check_run_id(run_id)
        label = _check_text(label, "a run label", MAX_LABEL_CHARS, empty=True)
        provider = _check_text(provider, "a provider name", MAX_NAME_CHARS, empty=True)
        model = _check_text(model, "a model name", MAX_NAME_CHARS, empty=True)
        started = format_timestamp(at)
        self._path = Path(os.fspath(root)) / RUNS_DIR / (run_id + RUN_LOG_SUFFIX)
        self._fsync = fsync
        self._lock = threading.Lock()
        self._finished = False
        self._cost_cents = 0.0
        self._input_tokens = 0
        self._output_tokens = 0
        self._model_calls = 0
        # Each level on its own, so both get 0700: the logs say what the workspace spends.
        self._path.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._path.parent.mkdir(mode=0o700, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(self._path, flags, 0o600)
        try:
            self._append(
                {
                    "type": RUN_START,
                    "version": RUN_LOG_VERSION,
                    "run_id": run_id,
                    "label": label,
                    "provider": provider,
                    "model": model,
                    "at": started,
                }
            )
        except BaseException:
            self.close()
            raise

    @property
    def path(self) -> Path:
        """The run's log file."""
        return self._path

    @property
    def run_id(self) -> str:
        """The run the log belongs to."""
        return self._run_id

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` has written the ``run_end`` record."""
        return self._finished

    @property
    def cost_cents(self) -> float:
        """What the model calls recorded by this writer cost, in US cents."""
        return self._cost_cents

    @property
    def input_tokens(self) -> int:
        """Prompt tokens of the model calls recorded by this writer."""
        return self._input_tokens

    @property
    def output_tokens(self) -> int:
        """Generated tokens of the model calls recorded by this writer."""
        return self._output_tokens

    @property
    def model_calls(self) -> int:
        """How many model calls this writer recorded."""
        return self._model_calls

    def record_model_call(
        self,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cost_cents: float,
        at: datetime | None = None,
    ) -> None:
        """Append a ``model_call`` record.

        Args:
            model: The model that answered.
            input_tokens: Prompt tokens of the call.
            output_tokens: Generated tokens of the call.
            cost_cents: What the call cost, in US cents (``LLMResponse.cost_cents``).
            at: When the call was made (an aware datetime); None for now.

        Raises:
            ValueError: ``model`` is empty or too long, a count or the cost is negative, the cost
                is not finite, or ``at`` has no time zone.
            TypeError: A field has the wrong type.
            RuntimeError: The run was already finished.
            OSError: The record cannot be written (nothing of it is left in the file).
        """
        model = _check_text(model, "a model name", MAX_NAME_CHARS, empty=False)
        input_tokens = _check_count(input_tokens, "input_tokens")
        output_tokens = _check_count(output_tokens, "output_tokens")
        if not isinstance(cost_cents, (int, float)) or isinstance(cost_cents, bool):
            raise TypeError(f"cost_cents must be a number, not {type(cost_cents).__name__}.")
        if not math.isfinite(cost_cents) or cost_cents < 0:
            raise ValueError(f"cost_cents must be a finite number of at least 0, not {cost_cents}.")
        record = {
            "type": MODEL_CALL,
            "run_id": self._run_id,
            "model": model,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cost_cents": float(cost_cents),
            "at": format_timestamp(at),
        }
        with self._lock:
            self._append(record)
            self._cost_cents += float(cost_cents)
            self._input_tokens += input_tokens
            self._output_tokens += output_tokens
            self._model_calls += 1

    def finish(self, status: str, at: datetime | None = None) -> None:
        """Append the ``run_end`` record and close the file.

        Args:
            status: How the run ended: ``RunResult.status`` (``completed``, ``failed``,
                ``approval_denied``, ``limit_exceeded``, ``cost_exceeded``) or another lowercase word.
            at: When the run ended (an aware datetime); None for now.

        Raises:
            ValueError: ``status`` is not a lowercase word of at most 32 letters and ``_``, or
                ``at`` has no time zone.
            RuntimeError: The run was already finished.
            OSError: The record cannot be written; the file stays open, so ``finish`` may be retried.
        """
        if not isinstance(status, str) or STATUS_PATTERN.fullmatch(status) is None:
            raise ValueError(f"run status {status!r} must be a lowercase word of letters and '_'.")
        record = {"type": RUN_END, "run_id": self._run_id, "status": status, "at": format_timestamp(at)}
        with self._lock:
            self._append(record)
            self._finished = True
            self._close_descriptor()

    def close(self) -> None:
        """Close the file without finishing the run (its log then has no ``run_end`` record)."""
        with self._lock:
            self._close_descriptor()

    def __enter__(self) -> RunLogWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None and not self._finished and self._fd is not None:
            with contextlib.suppress(OSError):  # the original exception is the one to report
                self.finish("failed")
        self.close()

    # Everything below runs under self._lock (or in the constructor, before the writer is shared).

    def _close_descriptor(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def _append(self, record: dict[str, Any]) -> None:
        if self._finished:
            raise RuntimeError(f"the run log of run {self._run_id} is already finished.")
        if self._fd is None:
            raise RuntimeError(f"the run log of run {self._run_id} is closed.")
        fd = self._fd
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            if end > 0 and os.pread(fd, 1, end - 1) != b"\n":
                line = b"\n" + line  # an earlier append was cut short: do not glue onto its fragment
            try:
                written = os.write(fd, line)
            except OSError:
                _take_back(fd, end)
                raise
            if written != len(line):
                _take_back(fd, end)
                raise OSError(
                    errno.ENOSPC, f"only {written} of {len(line)} bytes of a run-log record were written"
                )
            if self._fsync:
                os.fdatasync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _take_back(fd: int, end: int) -> None:
    """Remove what a failed append left, so the file ends with whole records."""
    with contextlib.suppress(OSError):  # if it stays, the next append starts on a new line
        os.ftruncate(fd, end)
