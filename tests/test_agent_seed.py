"""The agent HTTP API as the seed describes it and as the relay and the approver serve: a real
``teaagent agent serve`` over HTTP, with the offline scripted model.

Its OpenAPI document and pages without the token (as on the relay and the approver), a session's
history with its runs' tool calls, a session's usage with its runs' seconds, ``remember`` that lets
the same program run unasked and nothing else, and a ``tool_call`` audit record for every call.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import AgentNode, AgentProcess, frames, write_node

pytestmark = pytest.mark.slow

WAIT = 30.0


@pytest.fixture
def node(tmp_path: Path) -> AgentNode:
    return write_node(tmp_path / "alpha", permission_mode="prompt")


@pytest.fixture
def client(node: AgentNode, tmp_path: Path) -> Iterator[httpx.Client]:
    with (
        AgentProcess(node, tmp_path),
        httpx.Client(base_url=node.url, headers=node.headers, timeout=WAIT) as c,
    ):
        yield c


def run(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/runs", json=body)
    assert response.status_code == 200, response.text
    found = frames(response.text)
    assert found[-1][0] == "result", found[-3:]
    return {"frames": found, "kinds": [kind for kind, _ in found], **found[-1][1]}


def test_the_openapi_document_and_its_pages_need_no_token_like_the_relays(
    node: AgentNode, client: httpx.Client
) -> None:
    bare = httpx.Client(base_url=node.url, timeout=WAIT)
    with bare:
        document = bare.get("/openapi.json")
        docs = bare.get("/docs")
        redoc = bare.get("/redoc")
        refused = bare.get("/sessions")
    assert document.status_code == 200
    assert "/runs" in document.json()["paths"]
    assert "/openapi.json" in document.json()["info"]["description"]
    assert docs.status_code == 200
    assert "swagger-ui" in docs.text
    assert "/openapi.json" in docs.text
    assert redoc.status_code == 200
    assert refused.status_code == 401
    assert refused.json()["error"] == "unauthorized"
