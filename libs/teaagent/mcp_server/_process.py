"""Who a process is, beyond its pid: its start time and the machine's boot, so reused pids are told apart."""

from __future__ import annotations

import enum
import os
import socket
from pathlib import Path
from typing import Final

__all__ = ["Liveness", "boot_id", "host_name", "liveness", "process_start_time"]

_PROC: Final = Path("/proc")
_BOOT_ID_FILE: Final = _PROC / "sys/kernel/random/boot_id"
_GONE_STATES: Final = frozenset({"Z", "X", "x"})  # zombie or dead: exited, its files (and flocks) released
_STARTTIME_INDEX: Final = 19  # field 22 of /proc/<pid>/stat, counted from field 3 (the one after the name)


class Liveness(enum.Enum):
    """What can be said about a recorded process."""

    ALIVE = "alive"  # the same process (same pid, start time and boot) is running
    DEAD = "dead"  # it exited, the machine rebooted, or its pid now belongs to another process
    UNKNOWN = "unknown"  # it ran on another host: nothing here can tell


def _read_stat(pid: int) -> tuple[str, int] | None:
    """Return the state letter and start time (clock ticks after boot) of a process, or None if there is none.

    Raises:
        OSError: ``/proc/<pid>/stat`` exists but cannot be read.
    """
    try:
        data = (_PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The name (field 2) is in parentheses and may hold spaces and parentheses itself.
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode("ascii"), int(fields[_STARTTIME_INDEX])


def process_start_time(pid: int) -> int | None:
    """Return when a process started, in clock ticks after boot, or None where ``/proc`` is missing.

    Raises:
        ProcessLookupError: There is no such process.
    """
    if not _PROC.joinpath("self/stat").exists():
        return None
    stat = _read_stat(pid)
    if stat is None:
        raise ProcessLookupError(f"there is no process {pid}.")
    return stat[1]


_boot_id: str | None = None


def boot_id() -> str | None:
    """Return this boot's random id (Linux), or None where the kernel does not publish one."""
    global _boot_id
    if _boot_id is None:
        try:
            _boot_id = _BOOT_ID_FILE.read_text(encoding="ascii").strip() or None
        except OSError:
            return None
    return _boot_id


def host_name() -> str:
    """Return this machine's host name."""
    return socket.gethostname()


def liveness(pid: int, start_time: int | None, boot: str | None, host: str) -> Liveness:
    """Tell whether the process recorded as (pid, start time, boot id, host) is still running.

    A pid alone is not enough: after the process exits the kernel hands its number to the next
    one, so the recorded start time must match too, and a different boot id means a reboot.
    A zombie (exited, not yet reaped by its parent) counts as dead.

    Args:
        pid: The recorded pid (at least 1).
        start_time: Its recorded start time, or None when it was not known.
        boot: The recorded boot id, or None.
        host: The recorded host name, or ``""`` when it was not known.
    """
    if host and host != host_name():
        return Liveness.UNKNOWN
    current_boot = boot_id()
    if boot is not None and current_boot is not None and boot != current_boot:
        return Liveness.DEAD
    if _PROC.joinpath("self/stat").exists():
        try:
            stat = _read_stat(pid)
        except (OSError, ValueError, IndexError):
            return Liveness.ALIVE  # unreadable: assume the worst, that it still holds what it took
        if stat is None or stat[0] in _GONE_STATES:
            return Liveness.DEAD
        if start_time is not None and stat[1] != start_time:
            return Liveness.DEAD
        return Liveness.ALIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return Liveness.DEAD
    except PermissionError:
        return Liveness.ALIVE  # another user's process: it exists
    return Liveness.ALIVE
