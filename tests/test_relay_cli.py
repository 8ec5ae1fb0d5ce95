"""``teaagent relay serve`` and ``teaagent bench relay`` (the serving itself is in test_relay_cluster.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from teaagent.cli._bench import BENCHMARKS, TARGETS, report
from teaagent.cli._main import run
from teaagent_bench.relay import bench_decisions


def test_serve_refuses_a_missing_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"

    code = run(["relay", "serve", "--config", str(missing)])

    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("teaagent: ")
    assert str(missing) in err
    assert "Traceback" not in err


def test_serve_without_a_configuration_names_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEAAGENT_CONFIG", raising=False)

    code = run(["relay", "serve"])

    assert code == 2
    assert capsys.readouterr().err == (
        "teaagent: no configuration file was given: pass --config PATH or set TEAAGENT_CONFIG.\n"
    )


def test_bench_relay_is_registered_with_its_target() -> None:
    assert "relay" in BENCHMARKS
    assert ("decisions_per_s", ">=", 1000.0) in TARGETS["relay"]
    assert ("relay_ratio_to_floor", "<=", 2.5) in TARGETS["relay"]  # issue 29's target, judged


@pytest.mark.slow
def test_bench_relay_reports_every_figure_and_judges_every_target() -> None:
    # As `teaagent bench relay` runs it: the store's figures, then the relay's decisions.
    figures = BENCHMARKS["relay"](0.2)

    for name in (
        "decisions_per_s",
        "decisions_per_s_httpx",
        "decisions_per_s_aiohttp",
        "client_cpu_us_per_call_httpx",
        "client_cpu_us_per_call_aiohttp",
        "relay_cpu_ms_per_decision",
        # The same decisions in batches of POST /v1/deliveries, as the peers' relays send them.
        "decisions_per_s_batched",
        "relay_cpu_ms_per_decision_batched",
    ):
        assert figures[name] > 0, name
    # The floor's verification, in the same run: part of what the relay spends on each decision.
    assert 0 < figures["verify_ms_per_decision"] < figures["relay_cpu_ms_per_decision"]
    # A bare uvicorn app answering the same calls: the relay's serving, and nothing else.
    assert 0 < figures["http_floor_ms_per_call"] < figures["relay_cpu_ms_per_decision"]
    assert figures["verifications"] >= 1
    assert figures["decisions"] == 150
    assert figures["decision_latency_ms_median"] <= figures["decision_latency_ms_p99"]
    json.dumps(figures)  # the --json output is one JSON object

    assert {key for key, _op, _target in TARGETS["relay"]} <= set(figures)
    floor = figures["verify_ms_per_decision"] + figures["raw_evalsha_wire_client_cpu_us"] / 1000
    assert figures["relay_floor_ms_per_decision"] == pytest.approx(floor)
    assert figures["relay_ratio_to_floor"] == pytest.approx(figures["relay_cpu_ms_per_decision"] / floor)
    # The same floor plus the bare app's CPU per call: a figure beside the target's.
    with_http = floor + figures["http_floor_ms_per_call"]
    assert figures["relay_floor_with_http_ms_per_decision"] == pytest.approx(with_http)
    assert figures["relay_ratio_to_floor_with_http"] == pytest.approx(
        figures["relay_cpu_ms_per_decision"] / with_http
    )
    assert 0 < figures["relay_ratio_to_floor_with_http"] < figures["relay_ratio_to_floor"]
    lines, _missed = report("relay", figures)
    judged = [line for line in lines if line.startswith("relay_ratio_to_floor ")]
    assert len(judged) == 1
    assert "target <= 2.5: " in judged[0]
    assert "(the floor; it does no HTTP)" in judged[0]


def test_bench_decisions_refuses_a_non_positive_duration() -> None:
    with pytest.raises(ValueError, match=r"^seconds must be positive, not 0$"):
        bench_decisions(0)


def test_the_verification_floor_is_averaged_over_as_long_as_the_relays_run() -> None:
    # A burst of a few milliseconds lands in one moment of a host whose speed changes (a shared
    # core); the relay's figure is its average over the whole run, so the floor's must be too.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from teaagent.quorum import APPROVAL_TYPE
    from teaagent.signing import SSHPrivateKey
    from teaagent_bench.relay import _verify_ms, _work

    keys = {
        name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment=name)
        for name in ("alpha", "beta", "delta", "gamma")
    }
    _submissions, decisions = _work(4, keys, "aiohttp")
    approvals = sum(1 for _path, body in decisions if json.loads(body)["statement"]["type"] == APPROVAL_TYPE)
    assert approvals >= 1
    started = time.perf_counter()
    cost, done = _verify_ms(decisions, keys, 0.5)
    assert time.perf_counter() - started >= 0.5
    assert done % approvals == 0  # whole passes over the same approvals
    assert done >= 2 * approvals
    assert cost > 0
    assert _verify_ms(decisions, keys, 0.0)[1] == approvals  # one pass at least, however short
