"""``teaagent mcp serve`` with the peers' quorum: 2 of 3, real relays and real approvers.

alpha serves its tools over MCP; beta, gamma and delta are its peers, each with its relay (served
in this process) and its approver service (a real ``teaagent approver serve`` process). beta's and
gamma's rules approve ``echo`` commands and deny ``rm``; delta's approver has no rule, so it leaves
every request to an operator who never comes. A ``shell.run`` therefore needs beta and gamma.

alpha is in ``prompt`` mode, so the client's user is asked first (by elicitation), then the peers.
Every scenario runs over stdio (``ClientSession`` with the handshake) and over streamable HTTP.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from relay_support import APPROVE_ECHO, DENY_RM, Node, free_port

from teaagent._http import client_verify
from teaagent.audit import verify_log_or_raise

pytestmark = pytest.mark.slow

READY = 20.0
RULES = DENY_RM + APPROVE_ECHO


@pytest.fixture(scope="module")
def cluster(star_cluster: Callable[..., dict[str, Node]]) -> dict[str, Node]:
    return star_cluster(
        "mcp-quorum",
        leaves=["beta", "gamma", "delta"],
        required=2,
        timeout_seconds=60,
        rules={"beta": RULES, "gamma": RULES},
        extra_toml={"alpha": '\n[agent]\npermission_mode = "prompt"\n'},
        approvers=["beta", "gamma", "delta"],
    )


def text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def approve_once(
    context: ClientRequestContext, params: types.ElicitRequestParams
) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"answer": "once"})


@asynccontextmanager
async def stdio_session(alpha: Node) -> AsyncIterator[ClientSession]:
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "teaagent", "mcp", "serve", "--config", str(alpha.config_path), "--log-level", "info"],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    async with (
        stdio_client(parameters) as (read, write),
        ClientSession(read, write, elicitation_callback=approve_once) as session,
    ):
        await session.initialize()
        yield session


@contextmanager
def http_server(alpha: Node) -> Iterator[str]:
    port = free_port()
    log = alpha.folder / f"mcp-http-{port}.log"
    command = [sys.executable, "-m", "teaagent", "mcp", "serve", "--config", str(alpha.config_path)]
    with log.open("wb") as handle:
        process = subprocess.Popen([*command, "--http", str(port)], stdout=handle, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + READY
        while True:
            assert process.poll() is None, log.read_text()
            try:
                httpx.get(url, timeout=0.5, verify=client_verify())
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0, log.read_text()


@asynccontextmanager
async def http_session(alpha: Node, url: str) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers=alpha.headers, timeout=httpx2.Timeout(30, read=120)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, elicitation_callback=approve_once) as session,
    ):
        await session.initialize()
        yield session


async def scenario(session: ClientSession) -> dict[str, Any]:
    """List, read, refuse, and one approved and one denied high-risk call; what the client saw."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    listing = await session.list_tools()
    read = await session.call_tool("fs.list", {"path": "."})
    refused = await session.call_tool("shell.run", {"command": 42})
    approved = await session.call_tool(
        "shell.run", {"command": "echo approved by two"}, progress_callback=on_progress
    )
    denied = await session.call_tool("shell.run", {"command": "rm -rf build"})
    with anyio.fail_after(10):  # a notification may be handled just after its call's result
        while not progress:
            await anyio.sleep(0.01)
    return {
        "tools": {tool.name: tool for tool in listing.tools},
        "read": read,
        "refused": refused,
        "approved": approved,
        "denied": denied,
        "progress": progress,
    }


def check(seen: dict[str, Any], alpha: Node) -> None:
    tools = seen["tools"]
    assert tools["shell.run"].meta["teaagent/high_risk"] is True
    assert tools["fs.delete"].meta["teaagent/high_risk"] is True
    assert tools["fs.read"].meta["teaagent/high_risk"] is False
    assert seen["read"].is_error is False
    assert seen["refused"].is_error is True
    assert text(seen["refused"]).startswith("shell.run: arguments are invalid")
    approved = seen["approved"]
    assert approved.is_error is False, text(approved)
    assert approved.structured_content["stdout"] == "approved by two\n"
    denied = seen["denied"]
    assert denied.is_error is True
    assert denied.meta == {"teaagent/error": "denied"}
    # Who denied, and why, as the peers signed it.
    assert text(denied) == (
        "shell.run was denied by beta: nothing is removed here; gamma: nothing is removed here "
        "(2 approvals from 3 peers needed)."
    )
    values = [value for value, _total, _message in seen["progress"]]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    first_message = seen["progress"][0][2]
    assert first_message is not None
    # The request id's prefix, the count, who received it, the time left, the command a peer runs.
    assert re.match(r"request ([0-9a-f]{8}) for shell\.run: 0 approvals of the 2 needed; ", first_message)
    short = first_message.split()[1]
    assert re.search(r"; \d+s left \(expires at ", first_message)
    assert first_message.endswith(
        f"A peer's operator approves it with: teaagent approvals approve {short} --config <their node.toml>"
    )
    assert all(
        message is not None and message.startswith(f"request {short} ") for *_, message in seen["progress"]
    )
    assert all(total == 60.0 for _value, total, _message in seen["progress"])


def certificates(alpha: Node) -> list[dict[str, Any]]:
    path = alpha.data_dir / "audit" / "alpha.jsonl"
    verify_log_or_raise(path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [
        r["payload"]["certificate"]
        for r in records
        if r["event_type"] == "approval_granted" and "certificate" in r["payload"]
    ]


def test_over_stdio_a_2_of_3_quorum_approves_and_denies(cluster: dict[str, Node]) -> None:
    alpha = cluster["alpha"]
    before = len(certificates(alpha)) if (alpha.data_dir / "audit" / "alpha.jsonl").exists() else 0

    async def main() -> dict[str, Any]:
        async with stdio_session(alpha) as session:
            return await scenario(session)

    check(anyio.run(main), alpha)
    [certificate] = certificates(alpha)[before:]
    signers = sorted(approval["statement"]["signer"] for approval in certificate["approvals"])
    assert signers == ["beta", "gamma"]
    assert certificate["request"]["arguments"] == {"command": "echo approved by two"}


def test_over_streamable_http_a_2_of_3_quorum_approves_and_denies(cluster: dict[str, Node]) -> None:
    alpha = cluster["alpha"]
    before = len(certificates(alpha)) if (alpha.data_dir / "audit" / "alpha.jsonl").exists() else 0

    async def main(url: str) -> dict[str, Any]:
        async with http_session(alpha, url) as session:
            return await scenario(session)

    with http_server(alpha) as url:
        seen = anyio.run(main, url)
    check(seen, alpha)
    assert len(certificates(alpha)[before:]) == 1
