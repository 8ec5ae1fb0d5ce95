"""``teaagent bench``: the keys each benchmark promises (the demo's tests are in test_cli_demo.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import teaagent
from teaagent.cli._main import run


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("core", {"gate_overhead_us_median", "audit_appends_per_s"}),
        (
            "signing",
            {
                "sshsig_verify_per_s",
                "raw_verify_per_s",
                "evaluate_2of3_over_two_raw",
                "ssh_keygen_verify_per_s",
            },
        ),
    ],
)
@pytest.mark.slow
def test_bench_json_prints_one_object_with_the_promised_keys(
    name: str, keys: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["bench", name, "--json", "--seconds", "0.3"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert keys <= set(figures)
    assert all(isinstance(value, float) and value > 0 for key, value in figures.items() if key in keys)


@pytest.mark.slow
def test_bench_without_a_checkout_says_so_in_one_sentence(tmp_path: Path) -> None:
    """An installed wheel ships the library, not bench/: the command says why it cannot run (exit 2)."""
    site = tmp_path / "site"
    shutil.copytree(Path(teaagent.__file__).parent, site / "teaagent")  # the library alone, as a wheel has it
    code = (
        "import sys, teaagent; from teaagent.cli._main import run; "
        "print(teaagent.__file__); sys.exit(run(sys.argv[1:]))"
    )
    environment = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", code, "bench", "core"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stdout.startswith(str(site)), result.stdout  # this teaagent, not the checkout's
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "teaagent: teaagent bench runs from a checkout of teaagent: the benchmarks live in its bench/ "
        "folder, which this installation does not have.\n"
    )


def test_bench_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "everything"]) == 2
    assert "there is no benchmark named 'everything'" in capsys.readouterr().err


def test_bench_output_names_units_targets_and_marks_a_miss() -> None:
    from teaagent.cli._bench import MEANINGS, TARGETS, report, unit

    lines, missed = report(
        "quorum",
        {"p50_ms_c1": 12.0, "floor_ratio": 4.5, "throughput_c64": 250.0, "p99_ms_c1": 30.0, "hops": 10.0},
    )

    # one over, three never measured
    assert missed == [
        "floor_ratio",
        "floor_throughput_ratio_c64",
        "policy_floor_ratio",
        "aiohttp_over_httpx_best",
    ]
    by_key = {line.split()[0]: line for line in lines[:-1]}
    assert by_key["floor_ratio"].split()[2] == "x"
    assert "target <= 3: NOT MET (a 2-of-3 quorum's p50 at concurrency 1 against" in by_key["floor_ratio"]
    assert by_key["p50_ms_c1"].split()[2] == "ms"
    assert "target <= 15: met" in by_key["p50_ms_c1"]
    assert by_key["throughput_c64"].split()[2:4] == ["per", "s"]
    assert by_key["hops"].endswith("10.000")  # no unit, no target
    assert lines[-1] == (
        "2 of 6 targets met; NOT MET: floor_ratio, floor_throughput_ratio_c64, policy_floor_ratio, "
        "aiohttp_over_httpx_best"
    )
    # Every judged figure says what it means and its floor.
    assert {key for targets in TARGETS.values() for key, _op, _target in targets} <= set(MEANINGS)
    assert [unit(key) for key in ("decisions_per_s", "gate_overhead_us_median", "ratio_to_relay")] == [
        "per s",
        "µs",
        "x",
    ]
