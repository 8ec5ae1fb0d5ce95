"""``teaagent bench runner``: the runner's overhead per iteration, besides the model and the tool."""

from __future__ import annotations

import json

import pytest

from teaagent.cli._bench import TARGETS
from teaagent.cli._main import run
from teaagent.runner._bench import bench_runner


def test_bench_runner_reports_the_overhead_of_whole_iterations() -> None:
    figures = bench_runner(0.1)

    assert set(figures) == {
        "iteration_overhead_ms_median",
        "iteration_overhead_ms_p90",
        "iteration_ms_median",
        "iterations_measured",
    }
    # Two measured runs of 50 tool-call iterations at least.
    assert figures["iterations_measured"] >= 100
    # The overhead excludes the model's and the tool's time, so it is part of the whole iteration.
    assert 0 < figures["iteration_overhead_ms_median"] <= figures["iteration_ms_median"]


def test_teaagent_bench_runner_prints_json_with_the_targeted_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "runner", "--json", "--seconds", "0.1"]) == 0

    figures = json.loads(capsys.readouterr().out)
    assert TARGETS["runner"] == [("iteration_overhead_ms_median", "<=", 1.0)]
    assert "iteration_overhead_ms_median" in figures
