"""``teaagent bench mcp``: the gateway's low-risk call against the same upstream called directly."""

from __future__ import annotations

import json

import pytest

from teaagent.cli._bench import TARGETS
from teaagent.cli._main import run
from teaagent_bench.mcp import BATCH

pytestmark = pytest.mark.slow


def test_bench_mcp_reports_both_sides_their_percentiles_and_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["bench", "mcp", "--json", "--seconds", "0.1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {
        "direct_p50_ms",
        "direct_p99_ms",
        "gateway_p50_ms",
        "gateway_p99_ms",
        "p50_ratio",
        "p99_ratio",
        "calls_each",
    }
    assert figures["calls_each"] >= 5 * BATCH
    assert 0 < figures["direct_p50_ms"] <= figures["direct_p99_ms"]
    assert 0 < figures["gateway_p50_ms"] <= figures["gateway_p99_ms"]
    # The gateway is the direct call plus one more hop: never faster than the call it forwards.
    assert figures["gateway_p50_ms"] > figures["direct_p50_ms"]
    assert figures["p50_ratio"] == pytest.approx(figures["gateway_p50_ms"] / figures["direct_p50_ms"])
    assert figures["p99_ratio"] == pytest.approx(figures["gateway_p99_ms"] / figures["direct_p99_ms"])
    assert {key for key, _op, _target in TARGETS["mcp"]} <= set(figures)
