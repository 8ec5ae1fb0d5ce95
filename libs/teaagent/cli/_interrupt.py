"""Ctrl-C while a call waits for its quorum: the gate withdraws the request, the command says so once.

``teaagent tools call`` waits in the main thread, where Ctrl-C raises ``KeyboardInterrupt`` inside
the gate, which withdraws its request and raises it again. ``teaagent run`` waits in a worker thread
of the run's event loop, which a ``KeyboardInterrupt`` never reaches: :func:`stop_on_ctrl_c` sets the
gate's ``stop`` event first, so that the wait ends and withdraws too. Either way the command ends
with :func:`interrupted`: exit 130 and the gate's one sentence.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Final

import typer

from teaagent.cli._exit import fail

__all__ = ["EXIT_INTERRUPTED", "interrupted", "stop_on_ctrl_c"]

EXIT_INTERRUPTED: Final = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended


@contextlib.contextmanager
def stop_on_ctrl_c(stop: threading.Event) -> Iterator[None]:
    """While inside, Ctrl-C (SIGINT) sets ``stop``, then interrupts as it did before.

    Only in the main thread (the only one that can set a signal handler); elsewhere it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        stop.set()  # first: the quorum wait in its thread ends within a poll and withdraws
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted(gate: object) -> None:
    """End an interrupted command with exit 130 and the gate's sentence of its withdrawn request.

    Returns only when nothing was waiting for a quorum: the caller then lets the interruption go
    on as it was (``raise``).

    Raises:
        typer.Exit: With :data:`EXIT_INTERRUPTED`, when the gate withdrew (or tried to withdraw) a
            request; the sentence is written to stderr.
    """
    withdrawal = getattr(gate, "last_withdrawal", None)
    if isinstance(withdrawal, str):
        raise typer.Exit(fail(withdrawal, EXIT_INTERRUPTED)) from None
