"""A terminal's Ctrl-C the moment a child process exists: between its fork and its owner's listing
of it, the window a process of a session of its own must not be lost in."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest


def children_born(monkeypatch: pytest.MonkeyPatch, *, ctrl_c: bool) -> list[subprocess.Popen[bytes]]:
    """Every child ``subprocess.Popen`` starts from now on (until ``monkeypatch.undo()``), listed as it
    is born; with ``ctrl_c``, this process gets SIGINT the moment each one exists."""
    born: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        born.append(real(*args, **kwargs))
        if ctrl_c:
            os.kill(os.getpid(), signal.SIGINT)
        return born[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    return born
