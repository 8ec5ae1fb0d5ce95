"""The streaming routes against a real ``teaagent agent serve`` process, read by a real SSE client.

A client that goes away mid-stream leaves the run running; another one reads the rest from
``GET /runs/events`` with ``Last-Event-ID``, and answers what ``GET /runs/state`` says the run waits on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import AgentNode, AgentProcess, write_node
from httpx_sse import ServerSentEvent, connect_sse
from relay_support import wait_until

pytestmark = pytest.mark.slow

WAIT = 20.0
SHELL = {"content": "", "tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "echo hi"}}]}


@pytest.fixture
def slow_node(tmp_path: Path) -> AgentNode:
    return write_node(
        tmp_path / "alpha",
        permission_mode="allow",
        turns=[
            {
                "content": "Looking first.",
                "tool_calls": [{"tool_name": "fs.list", "arguments": {"path": "."}}],
            },
            {"content": "And now the answer, after a while.", "delay_seconds": 1.5},
        ],
    )


def client_of(node: AgentNode) -> httpx.Client:
    return httpx.Client(base_url=node.url, headers=node.headers, timeout=httpx.Timeout(WAIT))


def events(source: Any) -> Iterator[ServerSentEvent]:
    yield from source.iter_sse()


def test_a_run_streams_as_it_goes(slow_node: AgentNode, tmp_path: Path) -> None:
    with AgentProcess(slow_node, tmp_path), client_of(slow_node) as client:
        started = time.monotonic()
        seen: list[tuple[str, float]] = []
        with connect_sse(client, "POST", "/runs", json={"text": "go"}) as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            for event in events(source):
                seen.append((event.event, time.monotonic() - started))
                if event.event == "result":
                    result = json.loads(event.data)
        kinds = [kind for kind, _ in seen]
        assert kinds[:2] == ["run_accepted", "run_started"]
        assert kinds[-1] == "result"
        assert result["text"] == "And now the answer, after a while."
        # The first frames came before the model's second turn (1.5 s late) had even answered:
        # measured against the result's frame, not the clock, so that a loaded host's slow start
        # of the run does not count against the stream.
        first = dict((kind, at) for kind, at in reversed(seen))
        assert first["run_started"] + 1.0 < first["result"]
        assert first["tool_result"] + 1.0 < first["result"]


def test_a_client_that_goes_away_leaves_the_run_running_and_reconnects_with_last_event_id(
    slow_node: AgentNode, tmp_path: Path
) -> None:
    with AgentProcess(slow_node, tmp_path), client_of(slow_node) as client:
        with connect_sse(client, "POST", "/runs", json={"text": "go"}) as source:
            for event in events(source):
                if event.event == "tool_result":
                    last_id = int(event.id)
                    break
        # The stream is closed; the run goes on without a reader.
        state = client.get("/runs/state").json()
        assert state["running"] is True
        with connect_sse(client, "GET", "/runs/events", headers={"Last-Event-ID": str(last_id)}) as source:
            rest = list(events(source))
        assert int(rest[0].id) == last_id + 1
        assert rest[-1].event == "result"
        assert json.loads(rest[-1].data)["stop"] == "completed"
        # The whole stream again, from the first frame: every id once, in order.
        with connect_sse(client, "GET", "/runs/events") as source:
            everything = list(events(source))
        assert [int(e.id) for e in everything] == list(range(1, len(everything) + 1))
        assert [e.data for e in everything[last_id:]] == [e.data for e in rest]
        history = client.get("/sessions/current/history").json()["messages"]
        assert history[-1]["text"] == "And now the answer, after a while."


def test_a_reconnecting_client_answers_the_approval_the_run_waits_on(tmp_path: Path) -> None:
    node = write_node(tmp_path / "alpha", permission_mode="allow", turns=[SHELL, {"content": "it ran"}])
    with AgentProcess(node, tmp_path), client_of(node) as client:
        with connect_sse(
            client, "POST", "/runs", json={"text": "go", "approvals": {"mode": "ask"}}
        ) as source:
            for event in events(source):
                if event.event == "approval_requested":
                    break
        pending = wait_until(lambda: client.get("/runs/state").json()["pending"], WAIT)
        assert (pending["kind"], pending["command"]) == ("approval", "echo hi")
        answer = client.post("/runs/approvals", json={"call_id": pending["call_id"], "approve": True})
        assert answer.json() == {"resolved": True}
        with connect_sse(client, "GET", "/runs/events") as source:
            result = json.loads(list(events(source))[-1].data)
        assert result["stop"] == "completed"
        assert result["tools"][0]["ok"] is True


def test_a_client_that_went_away_cannot_hang_the_run(tmp_path: Path) -> None:
    node = write_node(tmp_path / "alpha", permission_mode="allow", turns=[SHELL, {"content": "never"}])
    with AgentProcess(node, tmp_path), client_of(node) as client:
        body = {"text": "go", "approvals": {"mode": "ask"}, "answer_timeout": 1.0}
        with connect_sse(client, "POST", "/runs", json=body) as source:
            for event in events(source):
                if event.event == "approval_requested":
                    break
        assert wait_until(lambda: not client.get("/runs/state").json()["running"], WAIT)
        with connect_sse(client, "GET", "/runs/events") as source:
            frames = list(events(source))
        answered = next(json.loads(e.data) for e in frames if e.event == "approval_answered")
        assert (answered["approved"], answered["by"]) == (False, "timeout")
        assert json.loads(frames[-1].data)["stop"] == "approval_denied"


def test_cancel_from_another_client_ends_the_stream(tmp_path: Path) -> None:
    node = write_node(tmp_path / "alpha", turns=[{"content": "slow", "delay_seconds": 30}])
    with AgentProcess(node, tmp_path), client_of(node) as client, client_of(node) as other:
        kinds = []
        with connect_sse(client, "POST", "/runs", json={"text": "go"}) as source:
            for event in events(source):
                kinds.append(event.event)
                if event.event == "model_request":
                    assert other.post("/runs/cancel").json() == {"cancelled": True}
                if event.event == "result":
                    result = json.loads(event.data)
        assert result["stop"] == "cancelled"
        assert kinds[-2:] == ["run_finished", "result"]
