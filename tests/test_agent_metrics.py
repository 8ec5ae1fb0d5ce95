"""``GET /metrics`` of the agent service: Prometheus text of its calls, without the token (as the
relay's and the approver's), over a real socket."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from agent_support import write_node
from relay_support import ServedApp

from teaagent_agent import create_app

pytestmark = pytest.mark.slow


def _sample(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    return None


def test_the_agent_service_counts_its_calls_by_route_method_and_status(tmp_path: Path) -> None:
    node = write_node(tmp_path / "one")
    other = create_app(write_node(tmp_path / "two").settings())  # a registry of its own
    with ServedApp(create_app(node.settings()), name="agent") as agent, ServedApp(other) as beside:
        for _ in range(3):
            assert httpx.get(f"{agent.url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{agent.url}/sessions", timeout=10).status_code == 401
        assert httpx.get(f"{agent.url}/sessions", headers=node.headers, timeout=10).status_code == 200
        response = httpx.get(f"{agent.url}/metrics", timeout=10)  # no token, as the other services'
        untouched = httpx.get(f"{beside.url}/metrics", timeout=10).text
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    calls = "teaagent_agent_http_requests_total"
    assert _sample(text, calls, route="/health", method="GET", status="200") == 3
    assert _sample(text, calls, route="/sessions", method="GET", status="401") == 1
    assert _sample(text, calls, route="/sessions", method="GET", status="200") == 1
    latency = "teaagent_agent_http_request_duration_seconds_count"
    assert _sample(text, latency, route="/health") == 3
    assert _sample(untouched, calls, route="/health", method="GET", status="200") is None


def test_the_agent_service_documents_metrics_and_ready(tmp_path: Path) -> None:
    node = write_node(tmp_path)
    paths = create_app(node.settings()).openapi()["paths"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert set(paths["/ready"]["get"]["responses"]) >= {"200", "503"}
