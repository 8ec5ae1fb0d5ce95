"""``teaagent._signals.interrupts_held``: an interrupt during the block comes after it, to the
handler it had before."""

from __future__ import annotations

import os
import signal
from types import FrameType

import pytest

from teaagent._signals import interrupts_held


def _interrupted_block(done: list[str]) -> None:
    with interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        done.append("the rest of the block")


def test_a_ctrl_c_in_the_block_is_raised_after_it() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _interrupted_block(done)
    assert done == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_sigterm_in_the_block_reaches_its_own_handler_after_it_once() -> None:
    heard: list[str] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        heard.append(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            assert heard == []
        assert heard == ["SIGTERM"]
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_block_with_no_interrupt_changes_nothing() -> None:
    with interrupts_held():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
