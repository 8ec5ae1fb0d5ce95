"""``teaagent bench approver``: one approver's rule decisions and the relay's ceiling, in the same run."""

from __future__ import annotations

import json

import pytest

from teaagent.cli._bench import TARGETS
from teaagent.cli._main import run
from teaagent_bench.approver import MIN_REQUESTS

pytestmark = pytest.mark.slow


def test_bench_approver_reports_both_rates_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "approver", "--json", "--seconds", "0.1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {
        "decisions",
        "decisions_per_s",
        "approver_cpu_ms_per_decision",
        "relay_cpu_ms_per_decision",
        "relay_decisions_per_s",
        "ratio_to_relay",
        "observer_cpu_share",
    }
    # The requests decided after the first audit line seen, which starts the clock, were timed.
    assert 1 <= figures["decisions"] < MIN_REQUESTS
    assert figures["decisions_per_s"] > 0
    assert figures["relay_decisions_per_s"] > 0
    # CPU time moves in clock ticks (10 ms): a few decisions may take none that the kernel counted.
    assert figures["approver_cpu_ms_per_decision"] >= 0
    assert figures["relay_cpu_ms_per_decision"] >= 0
    assert figures["ratio_to_relay"] == pytest.approx(
        figures["decisions_per_s"] / figures["relay_decisions_per_s"]
    )
    # Watching costs little of the machine the approver runs on: a /metrics read on one kept
    # client, not a new httpx client per poll (about 20 ms of CPU each, a third of a core at
    # 20 polls a second).
    assert 0 <= figures["observer_cpu_share"] < 0.15
    assert {key for key, _op, _target in TARGETS["approver"]} <= set(figures)


def test_bench_inbox_scale_times_the_approvers_look_by_its_own_clock() -> None:
    from teaagent_bench.approver import bench_inbox_scale

    figures = bench_inbox_scale((3, 30))
    names = ("approvals_list", "inbox_page", "approver_round")
    assert set(figures) == {
        *(f"{name}_{what}_{size}" for name in names for what in ("ms", "redis_commands") for size in (3, 30)),
        *(f"relay_intake_ms_{size}" for size in (3, 30)),
        *(f"inbox_scale_ratio_{name}" for name in names),
    }
    for size in (3, 30):
        # Each median is of real durations: the look's from the approver's histogram, the intake's
        # from the bench's clock around its POST.
        assert figures[f"approver_round_ms_{size}"] > 0
        assert figures[f"relay_intake_ms_{size}"] > 0
        assert figures[f"approver_round_redis_commands_{size}"] > 0
    for name in names:
        assert figures[f"inbox_scale_ratio_{name}"] == pytest.approx(
            figures[f"{name}_ms_30"] / figures[f"{name}_ms_3"]
        )
