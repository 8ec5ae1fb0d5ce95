"""``teaagent bench``: the keys each benchmark promises (the demo's tests are in test_cli_demo.py)."""

from __future__ import annotations

import json

import pytest

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


def test_bench_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "everything"]) == 2
    assert "there is no benchmark named 'everything'" in capsys.readouterr().err
