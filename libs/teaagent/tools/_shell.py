"""Running one shell command with a deadline, bounded output, and nothing left behind."""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Final

__all__ = [
    "DEFAULT_SHELL_TIMEOUT",
    "MAX_SHELL_OUTPUT_BYTES",
    "MAX_SHELL_TIMEOUT",
    "SHELL",
    "TIMEOUT_EXIT_CODE",
    "ShellResult",
    "run_shell",
]

SHELL: Final = "/bin/sh"
DEFAULT_SHELL_TIMEOUT: Final = 30.0  # seconds; a build step or a test file, not a whole test suite
MAX_SHELL_TIMEOUT: Final = 600.0  # seconds; longer jobs belong outside one tool call
MAX_SHELL_OUTPUT_BYTES: Final = 64 * 1024  # per stream: what a model can read, not a log archive
TIMEOUT_EXIT_CODE: Final = -int(signal.SIGKILL)  # the subprocess convention for "killed by SIGKILL"

_READ_CHUNK: Final = 64 * 1024
_POLL_SECONDS: Final = 0.01  # exit polling where pidfd_open is missing (not Linux)
_DRAIN_SECONDS: Final = 1.0  # after the kill, output still buffered in the pipes is read for this long


@dataclass(frozen=True)
class ShellResult:
    """What a command did.

    Attributes:
        exit_code: The shell's exit status; negative when a signal ended it
            (``TIMEOUT_EXIT_CODE``, -9, after a timeout).
        stdout: The head of standard output, decoded as UTF-8 with replacement characters.
        stderr: The head of standard error, decoded likewise.
        timed_out: The deadline passed and the process group was killed.
        truncated: stdout or stderr was longer than the bound and was cut.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool


class _Head:
    """Keeps the first ``limit`` bytes of a stream and notes whether more came."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - self.size
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        if chunk:
            self.chunks.append(chunk)
            self.size += len(chunk)

    def text(self) -> str:
        # When cut, a character split at the cut is dropped rather than shown as a replacement.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return decoder.decode(b"".join(self.chunks), final=not self.truncated)


def run_shell(
    command: str,
    *,
    cwd: str | os.PathLike[str],
    timeout: float,
    env: Mapping[str, str] | None,
    max_output_bytes: int = MAX_SHELL_OUTPUT_BYTES,
) -> ShellResult:
    """Run ``command`` with ``/bin/sh -c`` in its own session, and kill its whole process group after.

    Standard input reads as empty. When the shell exits (or the deadline passes) every process left
    in its group is killed with SIGKILL, so background jobs never outlive the call; a process that
    left the group on purpose (``setsid``) is beyond reach, as it is for any supervisor.

    Args:
        command: The shell command line.
        cwd: The working directory.
        timeout: Seconds before the process group is killed.
        env: The environment of the command (None: this process's own).
        max_output_bytes: Bytes kept from the head of each of stdout and stderr.

    Returns:
        The outcome; a timeout is reported in it, not raised.

    Raises:
        OSError: The shell could not be started.
    """
    process = subprocess.Popen(
        [SHELL, "-c", command],
        cwd=cwd,
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        close_fds=True,
    )
    assert process.stdout is not None  # PIPE was asked for
    assert process.stderr is not None
    heads = {process.stdout: _Head(max_output_bytes), process.stderr: _Head(max_output_bytes)}
    selector = selectors.DefaultSelector()
    exit_fd = _pidfd(process.pid)
    try:
        for stream in heads:
            selector.register(stream, selectors.EVENT_READ)
        if exit_fd is not None:
            selector.register(exit_fd, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        timed_out = False
        while not _has_exited(process):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            wait = remaining if exit_fd is not None else min(remaining, _POLL_SECONDS)
            _pump(selector, heads, wait)
        # The shell is still unreaped here, so its process group id cannot have been reused yet.
        _kill_group(process.pid)
        if exit_fd is not None:
            selector.unregister(exit_fd)
        drain_deadline = time.monotonic() + _DRAIN_SECONDS
        while selector.get_map() and (left := drain_deadline - time.monotonic()) > 0:
            _pump(selector, heads, left)
        process.wait()
    finally:
        selector.close()
        if exit_fd is not None:
            os.close(exit_fd)
        for stream in heads:
            stream.close()
        if process.returncode is None:  # an error above: never leave the group running
            _kill_group(process.pid)
            process.wait()
    out, err = heads[process.stdout], heads[process.stderr]
    return ShellResult(
        exit_code=TIMEOUT_EXIT_CODE if timed_out else process.returncode,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        truncated=out.truncated or err.truncated,
    )


def _pump(selector: selectors.BaseSelector, heads: dict[IO[bytes], _Head], wait: float) -> None:
    """Wait up to ``wait`` seconds for output or exit, and read whatever output is ready."""
    for key, _ in selector.select(wait):
        head = heads.get(key.fileobj)  # type: ignore[call-overload]
        if head is None:
            continue  # the pidfd: the shell exited, the caller's loop sees it
        chunk = os.read(key.fd, _READ_CHUNK)
        if chunk:
            head.add(chunk)  # past the bound it is read and dropped, so the writer never blocks
        else:
            selector.unregister(key.fileobj)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux 5.3+), or None."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def _has_exited(process: subprocess.Popen[bytes]) -> bool:
    """Whether the shell has exited, without reaping it where the platform allows."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:  # pragma: no cover - macOS: poll() reaps, a tiny pid-reuse window remains
        return process.poll() is not None
    try:
        status = waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return status is not None


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
