"""``teaagent bench runner``: the runner's overhead per iteration, besides the model and the tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from teaagent.audit import verify_log
from teaagent.cli._bench import TARGETS
from teaagent.cli._main import run
from teaagent.runner._gate import ToolGate
from teaagent_bench.runner import _FloorLog, _read_note, _workspace, bench_core, bench_runner


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


def test_bench_core_reports_the_gate_against_its_floor_measured_in_the_same_run() -> None:
    figures = bench_core(0.1)

    assert {
        "gate_overhead_us_median",
        "gate_call_us_median",
        "bare_call_us_median",
        "gate_calls_measured",
        "api_call_us_median",
        "floor_us_median",
        "gate_floor_ratio",
        "api_floor_ratio",
        "audit_appends_per_s",
    } == set(figures)
    assert figures["gate_floor_ratio"] == figures["gate_call_us_median"] / figures["floor_us_median"]
    assert figures["api_floor_ratio"] == figures["api_call_us_median"] / figures["floor_us_median"]
    assert figures["floor_us_median"] > 0
    assert ("gate_floor_ratio", "<=", 2.5) in TARGETS["core"]
    assert ("api_floor_ratio", "<=", 2.5) in TARGETS["core"]


def test_the_floor_writes_the_gates_record_as_a_chain_that_verifies(tmp_path: Path) -> None:
    registry, policy, audit = _workspace(tmp_path, _read_note)  # the bench's own tool, policy and log
    key = audit.get_chain_key()
    arguments = {"path": "src/main.py"}
    result = _read_note(arguments)
    floor = _FloorLog(tmp_path / "floor.jsonl", key, "bench")
    for index in range(3):
        floor.append("notes.read", f"call-{index}", arguments, result)
    floor.close()
    ToolGate(registry=registry, policy=policy, audit=audit, run_id="bench").call(
        "notes.read", arguments, call_id="call-0"
    )

    report = verify_log(tmp_path / "floor.jsonl", chain_key=key)
    assert (report.ok, report.records, report.hmac_checked) == (True, 6, True)
    floor_records = [json.loads(line) for line in (tmp_path / "floor.jsonl").read_text().splitlines()[:2]]
    gate_records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    # The same fields and values but the records' own ids, times and chain: the same work to write.
    for record in (*floor_records, *gate_records):
        for field in ("created_at", "event_id", "chain_hmac", "event_hash", "prev_hash"):
            record[field] = len(record[field])
    assert [r["event_type"] for r in gate_records] == ["tool_call", "tool_result"]
    assert floor_records == gate_records
