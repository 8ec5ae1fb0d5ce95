"""The benches' own helper processes (a floor server, a relay of its own): start-up, CPU, stop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import httpx

from teaagent.testing import free_port

__all__ = ["free_port", "process_cpu_seconds", "stop", "wait_ready"]


def process_cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has spent so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, what: str, timeout: float) -> None:
    """Wait until ``url/health`` answers 200; RuntimeError (with the log's tail) if ``what`` exits or
    does not answer within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {log.read_text(errors='replace')[-1000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=0.5).status_code == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(
        f"{what} did not answer within {timeout:g} s: {log.read_text(errors='replace')[-1000:]}"
    )


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
