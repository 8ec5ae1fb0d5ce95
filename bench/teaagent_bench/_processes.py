"""The benches' own helper processes (a floor server, a relay of its own): start-up, CPU, stop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from teaagent.testing import free_port

__all__ = ["free_port", "process_cpu_seconds", "stop"]


def process_cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has spent so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
