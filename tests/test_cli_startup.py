"""``teaagent.cli._startup.collector_held``: a command's start-up with the cyclic collector held."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from teaagent.cli._startup import collector_held


@pytest.fixture(autouse=True)
def _collector_on_after() -> Iterator[None]:
    """Whatever a test does, the collector runs again after it (this process runs other tests)."""
    assert gc.isenabled()
    yield
    gc.enable()


def test_the_collector_is_held_in_the_block_and_runs_again_after() -> None:
    with collector_held():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_block_that_raises_lets_the_collector_run_again() -> None:
    with pytest.raises(KeyError), collector_held():
        raise KeyError("start-up failed")
    assert gc.isenabled()


def test_a_block_inside_another_leaves_it_held_until_the_outer_one_ends() -> None:
    with collector_held():
        with collector_held():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with collector_held():
        assert not gc.isenabled()
    assert not gc.isenabled()
