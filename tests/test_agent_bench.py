"""``teaagent bench agent``: the service's stream and the bare SSE floor, measured in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from teaagent.cli._bench import TARGETS
from teaagent.cli._main import run
from teaagent_bench.agent import DELTAS, floor_app

pytestmark = pytest.mark.slow


def test_bench_agent_reports_both_sides_and_their_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "agent", "--json", "--seconds", "0.1"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) == {
        "rounds",
        "frames_per_long_run",
        "first_event_ms_median",
        "floor_first_event_ms_median",
        "first_event_floor_ratio",
        "run_started_ms_median",
        "floor_run_started_ms_median",
        "events_per_s",
        "floor_events_per_s",
        "events_floor_ratio",
    }
    assert figures["rounds"] >= 5
    # Every word of the long reply was a frame of its own, besides the run's other frames.
    assert figures["frames_per_long_run"] > DELTAS
    assert 0 < figures["first_event_ms_median"] <= figures["run_started_ms_median"]
    ratio = figures["first_event_ms_median"] / figures["floor_first_event_ms_median"]
    assert figures["first_event_floor_ratio"] == pytest.approx(ratio)
    assert figures["events_floor_ratio"] == pytest.approx(
        figures["events_per_s"] / figures["floor_events_per_s"]
    )
    assert {key for key, _op, _target in TARGETS["agent"]} <= set(figures)


@pytest.mark.anyio
async def test_the_floor_streams_exactly_the_recorded_frames(tmp_path: Path) -> None:
    frames = ["id: 1\nevent: a\ndata: {}\n\n", "id: 2\nevent: b\ndata: {}\n\n"]
    path = tmp_path / "frames.json"
    path.write_text(json.dumps({"first": frames[:1], "many": frames}))
    transport = httpx.ASGITransport(app=floor_app(str(path)))
    async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
        assert (await client.post("/many", json={})).text == "".join(frames)
        assert (await client.post("/first", json={})).text == frames[0]
