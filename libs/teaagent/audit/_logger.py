"""The audit logger: JSONL records chained by SHA-256 and authenticated by HMAC-SHA256."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from teaagent.audit._event import GENESIS_HASH, AuditEvent, new_event_id
from teaagent.audit._keys import ChainMac, check_chain_key, default_key_path, load_or_create_key, sync_folder
from teaagent.audit._levels import AuditLevel, parse_audit_level, shape_payload
from teaagent.audit._redact import Redactor
from teaagent.errors import ConfigError

__all__ = ["AuditLogger"]

_log = logging.getLogger("teaagent.audit")

_TAIL_CHUNK = 8192  # most records are far smaller, so one read usually finds the last line
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
_CHECKED_TYPES_SIZE = 256  # a program uses a few dozen event types; the set of checked ones stops there
_HEX_HASH = re.compile(r"[0-9a-f]{64}")


class AuditLogger:
    """Appends audit events to a JSONL file as a hash chain authenticated with an HMAC key.

    Each line is one record (:meth:`AuditEvent.to_json`): ``prev_hash`` is the previous record's
    ``event_hash`` (:data:`~teaagent.audit.GENESIS_HASH` for the first), ``event_hash`` the hex SHA-256
    of the record's canonical body (every field but ``event_hash`` and ``chain_hmac``, see
    :func:`~teaagent.audit.canonical_json`) and ``chain_hmac`` the hex HMAC-SHA256 of the same body
    under the chain key. Since the body holds ``prev_hash``, the HMAC covers the link too: changing,
    removing, inserting or reordering records breaks a hash or a link, and recomputing them needs the
    key. Removing the last records leaves a shorter chain that verifies: keep the report's
    ``last_event_hash`` elsewhere (in the run's result, for instance) to detect that.

    Writing: each record is one ``os.write`` of the whole line on an ``O_APPEND`` descriptor, under a
    thread lock and an exclusive ``flock`` on the file. Several loggers, in one process or several,
    can therefore share a file and still form one chain: before writing, a logger compares the file's
    size with where its last record ended and, when another writer has appended since, re-reads the
    last line to link to it. A logger made before ``fork()`` reopens the file in the child, since an
    inherited descriptor would share the parent's ``flock``. ``fsync=False`` (the default) leaves
    records in the page cache, where a crash of the machine (not of the process) can lose the last
    ones; ``fsync=True`` calls ``fdatasync`` after every record, at the cost of a disk flush.

    Resuming: when the file already holds records, the chain continues from its last line (read
    backwards from the end, never parsing the whole file). A last line cut short by a crash is left
    in place for the verifier to report, and the next record starts on a new line.

    The chain key: ``chain_key`` when given, otherwise the key file beside the log
    (:func:`~teaagent.audit.default_key_path`: the log's path followed by ``.key``), read when it
    exists and created with a fresh random key and mode 0600 when it does not. The key appears in no
    record and no message. Whoever holds it can rewrite the log undetectably, so keep it where the
    agent's tools cannot read it (outside the workspace).

    Disk errors never propagate from :meth:`log`: the event stays in :attr:`events`, the error is
    kept in :attr:`disk_error` (until the next one replaces it) and counted in
    :attr:`disk_error_count`, and the next append tries again, from opening the file onwards.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        redaction_config: Mapping[str, str] | None = None,
        audit_level: str = "L2",
        *,
        chain_key: bytes | None = None,
        fsync: bool = False,
        run_id: str | None = None,
    ) -> None:
        """Prepare the logger and open the log (creating it and its folder when missing).

        Args:
            path: File path for the JSONL audit log.
            redaction_config: Field name to redaction rule, used at level L2 (see :class:`Redactor`).
            audit_level: 'L0' (metrics only) | 'L1' (metadata) | 'L2' (redacted payloads) | 'L3' (full).
            chain_key: The HMAC key (at least 16 bytes); None to use the key file beside the log.
            fsync: Flush every record to the disk before :meth:`log` returns.
            run_id: The ``run_id`` of events logged without one; None for a fresh random id.

        Raises:
            ValueError: ``audit_level`` is not a level, ``redaction_config`` holds an unknown rule,
                or ``chain_key`` is too short.
            TypeError: ``chain_key`` is not bytes.
            ConfigError: The existing key file holds no key.
        """
        self._path = Path(path)
        self._level = parse_audit_level(audit_level)
        self._redactor = Redactor(rules=redaction_config)
        self._fsync = fsync
        self.run_id = run_id if run_id is not None else new_event_id()
        self._key_path = None if chain_key is not None else default_key_path(self._path)
        self._key = None if chain_key is None else check_chain_key(chain_key)
        self._mac = None if self._key is None else ChainMac(self._key)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()
        self._end = -1  # the file's size after our last record; anything else means re-read the tail
        self._prev_hash = GENESIS_HASH
        self._newline_first = False  # the file ends with a line cut short: start ours on a new line
        self._flock_warned = False
        self._events: list[AuditEvent] = []
        self._checked_types: set[str] = set()
        self._disk_error: OSError | None = None
        self._disk_error_count = 0
        self._failing = False
        with self._lock:
            try:
                self._ready()
            except OSError as exc:
                self._record(exc)

    @property
    def path(self) -> Path:
        """The JSONL file."""
        return self._path

    @property
    def key_path(self) -> Path | None:
        """The key file beside the log, or None when the key was given to the constructor."""
        return self._key_path

    @property
    def audit_level(self) -> AuditLevel:
        """How much of each payload is written."""
        return self._level

    @property
    def events(self) -> list[AuditEvent]:
        """In-memory list of events logged in this session (a copy; written or not)."""
        with self._lock:
            return list(self._events)

    @property
    def disk_error(self) -> OSError | None:
        """Last OS error encountered writing to disk, or None."""
        return self._disk_error

    @property
    def disk_error_count(self) -> int:
        """How many disk errors were recorded: failed appends, and a failed opening in the constructor."""
        return self._disk_error_count

    def get_chain_key(self) -> bytes:
        """Return the HMAC key used for chain integrity.

        Raises:
            OSError: The key file could neither be read nor created (see :attr:`disk_error`).
            ConfigError: The key file holds no key.
        """
        with self._lock:
            return self._chain_key()

    def log(self, event_type: str, payload: Mapping[str, Any], *, run_id: str | None = None) -> None:
        """Append an audit event.

        Thread-safe. Events are appended atomically. If a disk error occurs,
        it is recorded in self.disk_error but not raised — callers must
        poll disk_error if they need to detect failures.

        Args:
            event_type: One of :data:`~teaagent.audit.EVENT_TYPES` for the library's events; any
                name of lowercase letters, digits, ``_``, ``.`` and ``-`` (64 at most) is accepted.
            payload: The event's details; the audit level decides what is written.
            run_id: The run it belongs to; None for the logger's :attr:`run_id`.

        Raises:
            ValueError: ``event_type`` is not such a name.
            TypeError: ``payload`` is not a mapping.
        """
        if event_type not in self._checked_types:
            if not isinstance(event_type, str) or not _EVENT_TYPE.fullmatch(event_type):
                raise ValueError(
                    f"audit event type {event_type!r} must be 1 to 64 lowercase letters, digits,"
                    " '_', '.' or '-', starting with a letter."
                )
            if len(self._checked_types) < _CHECKED_TYPES_SIZE:
                self._checked_types.add(str(event_type))
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise TypeError(f"an audit payload must be a mapping, not {type(payload).__name__}.")
        shaped = shape_payload(self._level, payload, self._redactor)
        event = AuditEvent(str(event_type), self.run_id if run_id is None else str(run_id), shaped)
        with self._lock:
            self._events.append(event)
            try:
                self._append(event)
            except OSError as exc:
                self._record(exc)
                self._forget_descriptor()  # the next append starts again from opening the file
            except ConfigError as exc:  # the key file was broken after the logger started
                self._record(OSError(errno.EINVAL, str(exc)))

    def close(self) -> None:
        """Close the file; a later :meth:`log` opens it again."""
        with self._lock:
            self._forget_descriptor()

    def __enter__(self) -> AuditLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Everything below runs under self._lock.

    def _record(self, exc: OSError) -> None:
        self._disk_error = exc
        self._disk_error_count += 1
        if not self._failing:  # once per outage, not once per event of a full disk
            self._failing = True
            _log.warning("cannot write the audit log %s: %s", self._path, exc)

    def _forget_descriptor(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # already unusable: forgetting it is the point
                os.close(fd)

    def _chain_key(self) -> bytes:
        if self._key is None:
            assert self._key_path is not None
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._key = load_or_create_key(self._key_path)
            self._mac = ChainMac(self._key)
        return self._key

    def _ready(self) -> int:
        """Return the log's descriptor, opening the key and the file if needed."""
        if self._pid != os.getpid():
            # A forked child: the inherited descriptor shares the parent's flock, so use one of our own.
            self._pid = os.getpid()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        if self._fd is None:
            self._chain_key()
            self._path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
            try:
                fd = os.open(self._path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                if self._fsync:
                    sync_folder(self._path.parent)
            except FileExistsError:
                fd = os.open(self._path, flags)
            self._fd = fd
            self._end = -1
        return self._fd

    def _append(self, event: AuditEvent) -> None:
        fd = self._ready()
        assert self._mac is not None
        locked = self._flock(fd)
        try:
            end = os.lseek(fd, 0, os.SEEK_END)
            if end != self._end:
                self._resume(fd, end)
            body = event.body(self._prev_hash)
            data = body.encode("ascii")
            event_hash = hashlib.sha256(data).hexdigest()
            chain_hmac = self._mac.hexdigest(data)
            line = f'{body[:-1]},"chain_hmac":"{chain_hmac}","event_hash":"{event_hash}"}}\n'.encode("ascii")
            if self._newline_first:
                line = b"\n" + line
            written = os.write(fd, line)
            if written != len(line):
                self._take_back(fd, end)
                raise OSError(
                    errno.ENOSPC, f"only {written} of {len(line)} bytes of an audit record were written"
                )
            self._prev_hash = event_hash
            self._end = end + written
            self._newline_first = False
            self._failing = False
            if self._fsync:
                os.fdatasync(fd)
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _flock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # a file system without locks: one writer per file still chains correctly
            if not self._flock_warned:
                self._flock_warned = True
                _log.warning("cannot lock the audit log %s (%s); use one writer per file", self._path, exc)
            return False
        return True

    def _take_back(self, fd: int, end: int) -> None:
        """Remove the part of a record that a short write left, so the next record starts a clean line."""
        try:
            os.ftruncate(fd, end)
        except OSError:
            self._end = -1  # the fragment stays: the next append sees it and starts a new line

    def _resume(self, fd: int, end: int) -> None:
        """Link to the file's last record: at the first append, or after another writer's."""
        line, cut_short = _last_line(fd, end)
        self._newline_first = cut_short
        self._prev_hash = GENESIS_HASH if line is None else _event_hash_of(line, self._path)
        self._end = end


def _last_line(fd: int, size: int) -> tuple[bytes | None, bool]:
    """Return the file's last complete line (without its newline) and whether a partial line follows.

    Reads backwards from the end in growing chunks, so a resume costs one read however long the log.
    """
    if size <= 0:
        return None, False
    data = b""
    position = size
    chunk = _TAIL_CHUNK
    while True:
        step = min(chunk, position)
        position -= step
        data = os.pread(fd, step, position) + data
        chunk *= 2
        last = data.rfind(b"\n")
        if last >= 0:
            previous = data.rfind(b"\n", 0, last)
            if previous >= 0 or position == 0:
                return data[previous + 1 : last], not data.endswith(b"\n")
        elif position == 0:
            return None, bool(data)


def _event_hash_of(line: bytes, path: Path) -> str:
    try:
        record = json.loads(line)
        event_hash = record["event_hash"]
        if isinstance(event_hash, str) and _HEX_HASH.fullmatch(event_hash):
            return event_hash
    except (ValueError, TypeError, KeyError):
        pass
    _log.warning("the last line of %s is not an audit record; the chain starts again from genesis", path)
    return GENESIS_HASH
