"""``teaagent bench agent``: the agent service's stream against a bare uvicorn SSE floor, in the same run.

Two real processes on loopback ports, one client (this process, httpx):

* the agent service (``teaagent agent serve``) of a throw-away node whose model is the offline
  scripted one, with the quorum off;
* the floor: a bare Starlette endpoint under uvicorn that streams the very frames the service sent
  for the same run (recorded first), one chunk per frame, with nothing behind it.

Figures, alternating service and floor so that both see the same machine:

* time to first event: from sending ``POST /runs`` (a one-turn run in a fresh session) to the first
  frame's bytes; the floor's from sending its request to its first frame. Medians.
* events per second to one client: a run whose one reply streams ``DELTAS`` words, each a
  ``model_delta`` frame: its frames over the time from sending ``POST /runs`` to the last byte;
  the floor streams the same frames, timed the same way.

The first frame of a run is ``run_accepted`` (published once the run holds the workspace, before
its runner starts); the time to the runner's own first frame, ``run_started``, is reported too.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx

from teaagent._http import client_verify
from teaagent_bench import python_code
from teaagent_bench._node import write_node
from teaagent_bench._processes import free_port, stop

__all__ = ["DELTAS", "bench_agent", "floor_app"]

DELTAS: Final = 5000  # words of the long reply: frames enough for a steady rate
READY_SECONDS: Final = 30.0
TOKEN: Final = "bench-agent-token-0123456789"  # noqa: S105 - a throw-away node's token
MIN_ROUNDS: Final = 5
FLOOR_MAIN: Final = python_code("from teaagent_bench.agent import _serve_floor; _serve_floor")


def floor_app(frames_path: str) -> Any:
    """The floor: ``POST /first`` and ``POST /many`` stream the recorded frames, one chunk each."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    recorded = json.loads(Path(frames_path).read_text())
    streams = {name: [frame.encode() for frame in frames] for name, frames in recorded.items()}

    def endpoint(name: str) -> Any:
        async def stream(request: Request) -> StreamingResponse:
            await request.body()

            async def frames() -> Any:
                for frame in streams[name]:
                    yield frame

            return StreamingResponse(frames(), media_type="text/event-stream")

        return stream

    return Starlette(
        routes=[
            Route("/first", endpoint("first"), methods=["POST"]),
            Route("/many", endpoint("many"), methods=["POST"]),
            Route("/health", endpoint("first"), methods=["GET"]),
        ]
    )


def _serve_floor(frames_path: str, port: int) -> None:  # pragma: no cover - runs in the floor's process
    import uvicorn

    uvicorn.run(floor_app(frames_path), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _write_node(folder: Path, port: int) -> Path:
    return write_node(
        folder,
        f'relay_url = "http://127.0.0.1:{free_port()}"\ntoken = "{TOKEN}"\n\n'
        f'[agent]\nprovider = "scripted"\nport = {port}\n',
    )


@contextlib.contextmanager
def _process(command: list[str], env: dict[str, str], url: str, log: Path) -> Iterator[None]:
    with log.open("ab") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{command[3:5]} exited: {log.read_text()[-1000:]}")
            try:
                httpx.get(f"{url}/health", timeout=1.0, verify=client_verify())  # one SSL context a process
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} did not answer within {READY_SECONDS:g} s") from None
                time.sleep(0.05)
        yield
    finally:
        stop(process, 10)


def _timed(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, float, float, int]:
    """Seconds from sending to the first frame, to ``run_started``'s, to the last byte; frames read."""
    started = time.perf_counter()
    first = run_started = None
    frames = 0
    with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}: {response.read()[:300]!r}")
        for chunk in response.iter_bytes():
            now = time.perf_counter()
            if first is None and b"\nevent: " in b"\n" + chunk:
                first = now
            if run_started is None and b"event: run_started\n" in chunk:
                run_started = now
            frames += chunk.count(b"\n\n")
    ended = time.perf_counter()
    if first is None or run_started is None:
        raise RuntimeError(f"{path} streamed no run_started frame")
    return first - started, run_started - started, ended - started, frames


def bench_agent(seconds: float) -> dict[str, float]:
    """Measure the service and the floor for about ``seconds`` (at least five rounds of each)."""
    with tempfile.TemporaryDirectory(prefix="teaagent-bench-agent-") as temporary:
        folder = Path(temporary)
        floor_port = free_port()
        scripts = {"short": [{"content": "ok"}], "long": [{"content": " ".join(["word"] * DELTAS)}]}
        env = dict(os.environ)
        env.pop("TEAAGENT_CONFIG", None)
        floor_url = f"http://127.0.0.1:{floor_port}"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        frames_path = folder / "frames.json"
        logs = folder / "bench.log"
        results: dict[str, list[float]] = {
            name: [] for name in ("first", "floor_first", "started", "floor_started", "rate", "floor_rate")
        }
        with contextlib.ExitStack() as stack:
            urls = {}
            # One service per script: the scripted model plays its script from the first turn.
            for name, turns in scripts.items():
                port = free_port()
                (folder / name).mkdir()
                node = _write_node(folder / name, port)
                script = folder / name / "script.json"
                script.write_text(json.dumps(turns))
                urls[name] = f"http://127.0.0.1:{port}"
                command = [sys.executable, "-m", "teaagent", "agent", "serve", "--config", str(node)]
                stack.enter_context(
                    _process(
                        [*command, "--no-access-log", "--log-level", "warning"],
                        {**env, "TEAAGENT_AGENT_LLM_SCRIPT": str(script)},
                        urls[name],
                        logs,
                    )
                )
            client = stack.enter_context(httpx.Client(headers=headers, timeout=120))
            body = {"text": "go"}
            # Record the frames the floor will stream: exactly what the service sent.
            recorded = {}
            for name, url in urls.items():
                client.post(f"{url}/sessions", json={})
                with client.stream("POST", f"{url}/runs", json=body) as response:
                    text = response.read().decode()
                recorded["first" if name == "short" else "many"] = [
                    block + "\n\n" for block in text.split("\n\n") if block
                ]
            frames_path.write_text(json.dumps(recorded))
            stack.enter_context(
                _process(
                    [sys.executable, "-c", f"{FLOOR_MAIN}({str(frames_path)!r}, {floor_port})"],
                    env,
                    floor_url,
                    logs,
                )
            )
            deadline = time.monotonic() + seconds
            rounds = 0
            while rounds < MIN_ROUNDS or time.monotonic() < deadline:
                rounds += 1
                client.post(f"{urls['short']}/sessions", json={})  # a fresh, empty session: not timed
                first, started, _end, _count = _timed(client, f"{urls['short']}/runs", body)
                results["first"].append(first)
                results["started"].append(started)
                first, started, _end, _count = _timed(client, f"{floor_url}/first", body)
                results["floor_first"].append(first)
                results["floor_started"].append(started)
                client.post(f"{urls['long']}/sessions", json={})
                _first, _started, end, count = _timed(client, f"{urls['long']}/runs", body)
                results["rate"].append(count / end)
                _first, _started, end, count = _timed(client, f"{floor_url}/many", body)
                results["floor_rate"].append(count / end)
        medians = {name: statistics.median(values) for name, values in results.items()}
        return {
            "rounds": float(rounds),
            "frames_per_long_run": float(len(recorded["many"])),
            "first_event_ms_median": medians["first"] * 1000,
            "floor_first_event_ms_median": medians["floor_first"] * 1000,
            "first_event_floor_ratio": medians["first"] / medians["floor_first"],
            "run_started_ms_median": medians["started"] * 1000,
            "floor_run_started_ms_median": medians["floor_started"] * 1000,
            "events_per_s": medians["rate"],
            "floor_events_per_s": medians["floor_rate"],
            "events_floor_ratio": medians["rate"] / medians["floor_rate"],
        }
