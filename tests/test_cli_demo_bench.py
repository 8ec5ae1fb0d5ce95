"""``teaagent demo`` tells the whole story and leaves evidence that verifies; ``teaagent bench`` keys."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from teaagent.audit import verify_log
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.quorum import verify_certificate


@pytest.mark.slow
def test_the_demo_runs_end_to_end_and_its_evidence_verifies(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    result = subprocess.run(
        [sys.executable, "-m", "teaagent", "demo", "--dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert "approved by beta, gamma (2 of 3)" in result.stdout
    assert "no quorum could be obtained" in result.stderr  # with no relay up, the call was refused
    assert "a forged approval claiming to be beta is refused" in result.stdout
    # The high-risk command really ran, and only after the quorum.
    assert not (folder / "alpha" / "workspace" / "build").exists()
    certificate = json.loads((folder / "certificate.json").read_text())
    node = load_config(folder / "alpha.toml")
    outcome = verify_certificate(certificate, node.quorum, origin_public_key=node.own_public_key().to_line())
    assert list(outcome.signers) == ["beta", "gamma"]
    audit = folder / "alpha" / "data" / "audit"
    report = verify_log(audit / "alpha.jsonl")
    assert report.ok
    assert report.hmac_checked
    assert not verify_log(audit / "tampered.jsonl").ok
    records = [json.loads(line) for line in (audit / "alpha.jsonl").read_text().splitlines()]
    granted = [r for r in records if r["event_type"] == "approval_granted"]
    assert len(granted) == 1
    assert (
        granted[0]["payload"]["certificate"]["request"]["request_id"] == certificate["request"]["request_id"]
    )


def test_the_demo_refuses_a_folder_that_is_not_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "something").write_text("x")

    assert run(["demo", "--dir", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"teaagent: the demo folder {tmp_path} is not empty; give an empty or new one.\n"
    )


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
