"""The benches' own helper processes (a floor server, a relay of its own): start-up, CPU, stop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from teaagent.testing import free_port

__all__ = ["free_port", "process_context_switches", "process_cpu_seconds", "stop"]


def process_cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has spent so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_context_switches(pid: int) -> tuple[int, int]:
    """How often the threads of process ``pid`` have left the CPU so far: (to wait, preempted).

    The first count is the voluntary switches (a thread waited: for a socket, a lock, a timer),
    the second the involuntary ones (the scheduler preempted a thread that could still run), each
    summed over the process's threads (``/proc/<pid>/task/*/status``; a thread that ended
    meanwhile takes its counts with it).
    """
    waited = preempted = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        for line in status.splitlines():
            name, _, value = line.partition(":")
            if name == "voluntary_ctxt_switches":
                waited += int(value)
            elif name == "nonvoluntary_ctxt_switches":
                preempted += int(value)
    return waited, preempted


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
