"""Workspace locks: one process at a time works in a workspace, across every process of the machine."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shlex
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from teaagent._fields import json_fields
from teaagent.errors import ConfigError, WorkspaceLockConflictError
from teaagent.mcp_server._process import Liveness, boot_id, host_name, liveness, process_start_time

__all__ = [
    "ACQUIRE_ATTEMPTS",
    "LOCKS_DIR_NAME",
    "LOCK_FILE_NAME",
    "MAX_COMMAND_CHARS",
    "SETTLE_SECONDS",
    "STATE_DIR_NAME",
    "WorkspaceLock",
    "WorkspaceRegistry",
]

logger = logging.getLogger("teaagent.mcp_server")

STATE_DIR_NAME: Final = ".teaagent"  # the workspace's state folder, which the workspace tools never modify
LOCK_FILE_NAME: Final = "workspace.lock"
LOCKS_DIR_NAME: Final = "workspace-locks"  # inside a registry's state_dir, one file per workspace
LOCK_FORMAT_VERSION: Final = 1
ACQUIRE_ATTEMPTS: Final = 100  # a retry follows a release by someone else; this many in a row is a storm
SETTLE_SECONDS: Final = 1.0  # a new holder writes its details microseconds after taking the lock
_SETTLE_POLL: Final = 0.01
_MAX_LOCK_FILE_BYTES: Final = 4096  # the details are about 300 bytes
_LOCK_FIELDS: Final = frozenset(
    {"version", "workspace_path", "owner_pid", "acquired_at", "owner_start_time", "boot_id", "host"}
)
_OPTIONAL_FIELDS: Final = frozenset({"command"})  # absent from the files of earlier versions
MAX_COMMAND_CHARS: Final = 500  # of the holder's command line: enough to tell it; the file stays small


@dataclass
class WorkspaceLock:
    """Who holds a workspace, as its lock file records it.

    Attributes:
        workspace_path: The workspace, resolved to an absolute path without symbolic links.
        owner_pid: The holder's process id.
        acquired_at: When it took the lock, ISO 8601 UTC.
        owner_start_time: The holder's start time in clock ticks after boot (Linux), which tells it
            apart from a later process given the same pid; None where unknown.
        boot_id: The boot the holder ran in (Linux), or None.
        host: The holder's host name.
        command: The holder's command line (``sys.orig_argv``, at most :data:`MAX_COMMAND_CHARS`
            characters), so that a conflict names the process to stop; empty where unknown.
    """

    workspace_path: str
    owner_pid: int
    acquired_at: str
    owner_start_time: int | None = field(default=None, kw_only=True)
    boot_id: str | None = field(default=None, kw_only=True)
    host: str = field(default="", kw_only=True)
    command: str = field(default="", kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        """Return the details as the lock file stores them (with a ``version`` key)."""
        return {"version": LOCK_FORMAT_VERSION, **json_fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> WorkspaceLock:
        """Rebuild the details from :meth:`to_dict`'s output.

        Raises:
            ValueError: ``data`` is not such an object.
        """
        if (
            not isinstance(data, dict)
            or not _LOCK_FIELDS <= set(data) <= _LOCK_FIELDS | _OPTIONAL_FIELDS
            or data["version"] != LOCK_FORMAT_VERSION
        ):
            raise ValueError("not the details of a workspace lock")
        command = data.get("command", "")
        if not isinstance(command, str):
            raise ValueError("command is not a string")
        pid, start = data["owner_pid"], data["owner_start_time"]
        if type(pid) is not int or pid < 1:
            raise ValueError("the owner pid is not a positive integer")
        if start is not None and (type(start) is not int or start < 0):
            raise ValueError("the owner start time is not a non-negative integer")
        for key in ("workspace_path", "acquired_at", "host"):
            if not isinstance(data[key], str):
                raise ValueError(f"{key} is not a string")
        if data["boot_id"] is not None and not isinstance(data["boot_id"], str):
            raise ValueError("boot_id is not a string")
        return cls(
            data["workspace_path"],
            pid,
            data["acquired_at"],
            owner_start_time=start,
            boot_id=data["boot_id"],
            host=data["host"],
            command=_printable(command)[:MAX_COMMAND_CHARS],
        )

    def liveness(self) -> Liveness:
        """Tell whether the recorded holder is still running (see :func:`~teaagent.mcp_server.liveness`)."""
        return liveness(self.owner_pid, self.owner_start_time, self.boot_id, self.host)


@dataclass
class _Held:
    fd: int
    lock: WorkspaceLock
    lock_file: Path


class WorkspaceRegistry:
    """Locks workspaces so that one process at a time works in each, across processes.

    The lock of a workspace is a file: ``<workspace>/.teaagent/workspace.lock`` by default, or
    ``<state_dir>/workspace-locks/<sha256 of the resolved path>.lock`` when the registry is given a
    ``state_dir`` (for read-only workspaces). Every process that shares a workspace must use the
    same setting, since the two places do not see each other.

    How it holds:

    1. The holder keeps the lock file open with an exclusive ``flock``. The kernel drops that lock
       when the process ends, however it ends (``SIGKILL`` included), so a dead holder never blocks
       anyone, and a pid reused by a later process cannot fake one: liveness is the kernel's.
    2. The file records the holder: pid, start time (``/proc/<pid>/stat``), boot id, host,
       command line and ``acquired_at``. They name the holder in a conflict (its command line
       too, so that the user knows which process to stop), and they fail closed: details naming
       another process that is still running (same pid and start time, same boot) are honoured
       even when no ``flock`` backs them.
    3. Zombie cleanup: a process that takes the ``flock`` of a file left by a dead holder (exited, or a
       pid now reused, or an earlier boot) overwrites its details and logs that it did. The ``flock``
       serialises this, so when several processes race for a stale lock exactly one wins.
    4. Release removes the file while still holding the ``flock``, then closes it. A process that had
       opened the old file and gets its ``flock`` afterwards sees that the path no longer leads to
       that file, and starts again on the new one.

    Locks are not re-entrant: a second :meth:`acquire_lock` of a held workspace raises
    :class:`~teaagent.errors.WorkspaceLockConflictError` even in the holding process (from this
    registry or another), since two sessions of one server working in one workspace are what the
    lock is there to prevent. :meth:`release_lock` is a no-op for a workspace this registry does not
    hold, and never releases another process's lock (a forked child's copy of a registry does not
    release its parent's locks; the child's inherited descriptor keeps the lock held until the parent
    releases it and the child closes or exits).

    Thread-safe.
    """

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        """Make a registry; nothing is created until a lock is taken.

        Args:
            state_dir: A folder for the lock files, one per workspace; None to keep each lock in its
                workspace's ``.teaagent`` folder.
        """
        self._state_dir = None if state_dir is None else Path(os.fspath(state_dir)).absolute()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"WorkspaceRegistry(state_dir={None if self._state_dir is None else str(self._state_dir)!r})"

    def lock_file(self, workspace_path: str | os.PathLike[str]) -> Path:
        """Return the lock file of a workspace (which may not exist).

        Raises:
            FileNotFoundError: The workspace does not exist.
            NotADirectoryError: It is not a folder.
        """
        return self._lock_file(_resolve(workspace_path))

    def held(self) -> list[WorkspaceLock]:
        """Return the locks this registry holds in this process."""
        with self._lock:
            pid = os.getpid()
            return [held.lock for held in self._held.values() if held.lock.owner_pid == pid]

    def holder(self, workspace_path: str | os.PathLike[str]) -> WorkspaceLock | None:
        """Return the details of the workspace's holder when it is still running, else None.

        It reads the lock file without taking any lock, so it never gets in the way of
        :meth:`acquire_lock`; a holder on another host is returned, since nothing here can tell.

        Raises:
            FileNotFoundError: The workspace does not exist.
            NotADirectoryError: It is not a folder.
        """
        path = self.lock_file(workspace_path)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            details = _read_details(fd)
        finally:
            os.close(fd)
        if details is None or details.liveness() is Liveness.DEAD:
            return None
        return details

    def acquire_lock(self, workspace_path: str | os.PathLike[str]) -> WorkspaceLock:
        """Acquire a workspace lock.

        Performs zombie cleanup: if the lock is held by a dead PID, it is
        automatically released before acquiring.

        Args:
            workspace_path: The workspace folder.

        Returns:
            The lock's details, as written to its file.

        Raises:
            WorkspaceLockConflictError: Another live process holds the lock, or this process
                already does.
            FileNotFoundError: The workspace does not exist.
            NotADirectoryError: It is not a folder.
            ConfigError: The lock file's file system does not support ``flock``, or the lock file
                is a symbolic link or not a regular file.
            OSError: The lock file cannot be created or written.
        """
        workspace = _resolve(workspace_path)
        with self._lock:
            held = self._held.get(workspace)
            if held is not None:
                if held.lock.owner_pid == os.getpid():
                    raise WorkspaceLockConflictError(
                        f"the workspace {workspace} is already locked by this process (pid {os.getpid()})."
                    )
                self._forget_inherited(workspace, held)
            path = self._lock_file(workspace)
            fd, lock = self._take(workspace, path)
            self._held[workspace] = _Held(fd, lock, path)
            return lock

    def release_lock(self, workspace_path: str | os.PathLike[str]) -> None:
        """Release the lock for workspace_path. No-op if not locked.

        Only a lock this registry took in this process is released; anyone else's is left alone.

        Raises:
            OSError: The lock file cannot be removed (the lock is released all the same).
        """
        workspace = str(Path(os.fspath(workspace_path)).resolve())
        with self._lock:
            held = self._held.get(workspace)
            if held is None:
                return
            if held.lock.owner_pid != os.getpid():
                self._forget_inherited(workspace, held)
                return
            del self._held[workspace]
            try:
                if _same_file(held.fd, held.lock_file):  # never remove a file someone else put there
                    os.unlink(held.lock_file)
            finally:
                os.close(held.fd)  # closing drops the flock, after the file is gone
            logger.debug("released the workspace lock of %s", workspace)

    def release_all(self) -> None:
        """Release every lock this registry holds in this process.

        Raises:
            OSError: A lock file cannot be removed (every lock is released all the same).
        """
        with self._lock:
            workspaces = list(self._held)
        errors: list[OSError] = []
        for workspace in workspaces:
            try:
                self.release_lock(workspace)
            except OSError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- inside -----------------------------------------------------------------------------------

    def _lock_file(self, workspace: str) -> Path:
        if self._state_dir is None:
            return Path(workspace) / STATE_DIR_NAME / LOCK_FILE_NAME
        digest = hashlib.sha256(os.fsencode(workspace)).hexdigest()
        return self._state_dir / LOCKS_DIR_NAME / f"{digest}.lock"

    def _forget_inherited(self, workspace: str, held: _Held) -> None:
        """Drop a forked child's copy of its parent's lock; the parent still holds it."""
        del self._held[workspace]
        with contextlib.suppress(OSError):
            os.close(held.fd)  # the parent's descriptor keeps the flock; this only closes the child's

    def _take(self, workspace: str, path: Path) -> tuple[int, WorkspaceLock]:
        """Take the flock of the workspace's lock file and write our details into it.

        Runs under self._lock. Returns the descriptor, which holds the flock until it is closed.
        """
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        settle_until = time.monotonic() + SETTLE_SECONDS
        for _attempt in range(ACQUIRE_ATTEMPTS):
            fd = _open_lock_file(path)
            try:
                if not _try_flock(fd, path):
                    holder = _read_details(fd)
                    alive = holder is not None and holder.liveness() is not Liveness.DEAD
                    if alive or time.monotonic() >= settle_until:
                        raise _conflict(workspace, holder if alive else None)
                    # The new holder has the flock but has not written its details yet: wait for them.
                    os.close(fd)
                    time.sleep(_SETTLE_POLL)
                    continue
                if not _same_file(fd, path):
                    os.close(fd)  # released (and removed) between our open and our flock: start again
                    continue
                previous = _read_details(fd)
                self._check_previous(workspace, path, previous)
                lock = _our_details(workspace)
                _write_details(fd, lock)
                logger.debug("locked the workspace %s (%s)", workspace, path)
                return fd, lock
            except BaseException:
                with contextlib.suppress(OSError):
                    os.close(fd)
                raise
        raise WorkspaceLockConflictError(
            f"the lock of the workspace {workspace} changed hands {ACQUIRE_ATTEMPTS} times while"
            " this process tried to take it; try again."
        )

    @staticmethod
    def _check_previous(workspace: str, path: Path, previous: WorkspaceLock | None) -> None:
        """Decide about the details a free lock file still holds (we hold its flock now)."""
        if previous is None or previous.owner_pid == os.getpid():
            return  # nothing recorded, or our own leftover
        state = previous.liveness()
        if state is Liveness.ALIVE:
            # Its holder runs but no flock backs it (it lost its descriptor, or cannot flock here):
            # fail closed rather than let two processes work in one workspace.
            raise _conflict(workspace, previous)
        if state is Liveness.UNKNOWN:
            logger.warning(
                "took the workspace lock %s left by pid %d on host %s, which no longer holds it",
                path,
                previous.owner_pid,
                previous.host,
            )
        else:
            logger.warning(
                "cleaned up the workspace lock %s left by pid %d, which has exited (acquired %s)",
                path,
                previous.owner_pid,
                previous.acquired_at,
            )


def _resolve(workspace_path: str | os.PathLike[str]) -> str:
    path = Path(os.fspath(workspace_path))
    try:
        resolved = path.resolve(strict=True)
    except FileNotFoundError:
        raise FileNotFoundError(f"the workspace {path} does not exist.") from None
    if not resolved.is_dir():
        raise NotADirectoryError(f"the workspace {path} is not a folder.")
    return str(resolved)


def _open_lock_file(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"the workspace lock file {path} is a symbolic link; remove it.") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"the workspace lock file {path} is not a regular file; remove it.")
    return fd


def _try_flock(fd: int, path: Path) -> bool:
    """Take the exclusive flock without waiting; False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise ConfigError(
            f"cannot lock {path}: its file system does not support flock ({exc.strerror}); give the"
            " workspace registry a state_dir on a local disk."
        ) from None
    return True


def _same_file(fd: int, path: Path) -> bool:
    """True when ``path`` still leads to the file open on ``fd``."""
    try:
        on_disk = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (opened.st_dev, opened.st_ino)


def _read_details(fd: int) -> WorkspaceLock | None:
    """Return the details in a lock file, or None when it is empty, being written or not ours."""
    try:
        data = os.pread(fd, _MAX_LOCK_FILE_BYTES + 1, 0)
    except OSError:
        return None
    if not data or len(data) > _MAX_LOCK_FILE_BYTES:
        return None
    try:
        return WorkspaceLock.from_dict(json.loads(data))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None


def _our_details(workspace: str) -> WorkspaceLock:
    pid = os.getpid()
    try:
        start_time = process_start_time(pid)
    except (OSError, ValueError, IndexError):  # pragma: no cover - our own /proc entry is always readable
        start_time = None
    return WorkspaceLock(
        workspace,
        pid,
        datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        owner_start_time=start_time,
        boot_id=boot_id(),
        host=host_name(),
        command=_command_line(),
    )


def _command_line() -> str:
    """This process's command line as a shell would take it, on one line, cut to :data:`MAX_COMMAND_CHARS`."""
    line = _printable(shlex.join(sys.orig_argv))
    return line if len(line) <= MAX_COMMAND_CHARS else line[: MAX_COMMAND_CHARS - 1] + "…"


def _printable(text: str) -> str:
    """``text`` on one line, without control characters (it ends up in an error sentence)."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _write_details(fd: int, lock: WorkspaceLock) -> None:
    data = json.dumps(lock.to_dict(), sort_keys=True).encode("utf-8") + b"\n"
    # A reader that catches the file between these two calls sees no details and waits for them.
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _conflict(workspace: str, holder: WorkspaceLock | None) -> WorkspaceLockConflictError:
    if holder is None:
        return WorkspaceLockConflictError(f"the workspace {workspace} is locked by another process.")
    if holder.owner_pid == os.getpid():
        return WorkspaceLockConflictError(
            f"the workspace {workspace} is already locked by this process (pid {holder.owner_pid})."
        )
    where = f" on host {holder.host}" if holder.host and holder.host != host_name() else ""
    command = f": {holder.command}" if holder.command else ""
    return WorkspaceLockConflictError(
        f"the workspace {workspace} is locked by another process (pid {holder.owner_pid}{where}{command});"
        " one process at a time works in a workspace: stop that one, or wait for it to finish."
    )
