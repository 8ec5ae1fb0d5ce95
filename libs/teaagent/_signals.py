"""Signals around the start of a child process that runs in a session of its own."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["interrupts_held"]


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back for the block, then deliver those that came, to the handlers
    they had before (Ctrl-C's raises ``KeyboardInterrupt``).

    For starting a process in a session of its own and listing it: such a process hears no Ctrl-C
    (the terminal signals its own process group), so its owner must know it to stop it. An interrupt
    that came between the fork and the listing would leave it running, unknown. Outside the main
    thread, where handlers cannot be set, the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    previous = {number: signal.signal(number, hold) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
    for signum in dict.fromkeys(came):
        signal.raise_signal(signum)
