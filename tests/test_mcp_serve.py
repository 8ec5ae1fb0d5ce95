"""``teaagent mcp serve`` against the official MCP client: a node without quorum, in ``prompt`` mode.

A real ``teaagent mcp serve`` process, spoken to by the SDK's ``ClientSession`` over stdio (the
handshake era, where the server pushes its elicitation) and by its ``Client`` over streamable HTTP
(2026-07-28, where the question comes back as an ``InputRequiredResult`` and the client retries).
The quorum's own path is in test_mcp_quorum.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from conftest import SSHKey
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from relay_support import free_port

from teaagent._http import client_verify
from teaagent.audit import verify_log_or_raise

pytestmark = pytest.mark.slow

TOKEN = "mcp-test-token-0123456789abcdef"
READY = 20.0


@pytest.fixture
def node(tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]) -> Path:
    key = ssh_key_factory("alpha")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "README.md").write_text("hello from alpha\n")
    path = tmp_path / "node.toml"
    path.write_text(
        f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\nredis_url = "redis://127.0.0.1:1/0"\n'
        f'relay_url = "http://127.0.0.1:1"\ntoken = "{TOKEN}"\n[agent]\npermission_mode = "prompt"\n'
    )
    return path


def server_parameters(config: Path, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "teaagent", "mcp", "serve", "--config", str(config), *extra],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )


@asynccontextmanager
async def stdio_session(config: Path, **callbacks: Any) -> AsyncIterator[ClientSession]:
    async with (
        stdio_client(server_parameters(config)) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


def text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


def answering(*answers: str, asked: list[str] | None = None) -> Any:
    """An elicitation callback that answers each question in turn (and records what it was asked)."""
    queue = list(answers)

    async def callback(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        assert params.requested_schema["properties"]["answer"]["enum"] == ["once", "session", "deny"]
        if asked is not None:
            asked.append(params.message)
        answer = queue.pop(0)
        if answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"answer": answer})

    return callback


def audit_records(config: Path) -> list[dict[str, Any]]:
    path = config.parent / ".teaagent-alpha" / "audit" / "alpha.jsonl"
    verify_log_or_raise(path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tools_are_listed_with_their_schemas_annotations_and_risk(node: Path) -> None:
    async def main() -> None:
        async with stdio_session(node) as session:
            listing = await session.list_tools()
        tools = {tool.name: tool for tool in listing.tools}
        assert list(tools) == ["fs.read", "fs.write", "fs.list", "fs.search", "fs.delete", "shell.run"]
        read = tools["fs.read"]
        assert read.input_schema["required"] == ["path"]
        assert read.annotations == types.ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True
        )
        shell = tools["shell.run"]
        assert (shell.annotations.read_only_hint, shell.annotations.destructive_hint) == (False, True)
        # No [quorum] here: nothing is high risk.
        assert shell.meta == {"teaagent/high_risk": False, "teaagent/security_tier": "Critical"}

    anyio.run(main)


def test_a_read_only_call_runs_and_a_refused_one_is_an_error_result(node: Path) -> None:
    async def main() -> None:
        # This client declares no elicitation: prompt mode's safe default denies what needs asking.
        async with stdio_session(node) as session:
            read = await session.call_tool("fs.read", {"path": "README.md"})
            write = await session.call_tool("fs.write", {"path": "notes.md", "content": "x"})
            bad = await session.call_tool("fs.read", {"path": 3})
        assert read.is_error is False
        assert read.structured_content == {"content": "hello from alpha\n", "size": 17, "truncated": False}
        assert write.is_error is True
        assert text(write) == (
            "fs.write is not read-only and the permission mode is prompt, and asking for approval "
            "failed: the MCP client does not support elicitation, so its user cannot be asked."
        )
        assert write.meta == {"teaagent/error": "denied"}
        assert bad.is_error is True
        assert text(bad).startswith("fs.read: arguments are invalid")
        assert not (node.parent / "workspace" / "notes.md").exists()

    anyio.run(main)
    kinds = [(r["event_type"], r["payload"]["tool_name"]) for r in audit_records(node)]
    assert kinds == [
        ("tool_call", "fs.read"),
        ("tool_result", "fs.read"),
        ("approval_denied", "fs.write"),
        ("tool_error", "fs.read"),
    ]


def test_prompt_mode_asks_the_clients_user_by_elicitation_on_a_handshake_session(node: Path) -> None:
    asked: list[str] = []

    async def main() -> None:
        callback = answering("deny", "session", asked=asked)
        async with stdio_session(node, elicitation_callback=callback) as session:
            denied = await session.call_tool("fs.write", {"path": "a.md", "content": "one"})
            first = await session.call_tool("fs.write", {"path": "a.md", "content": "two"})
            second = await session.call_tool("fs.write", {"path": "b.md", "content": "three"})
        assert text(denied) == "fs.write was denied at the approval prompt."
        assert first.is_error is False
        assert second.is_error is False

    anyio.run(main)
    # "session" holds for the server's life: the third call was not asked about.
    assert asked == [
        'alpha asks to run fs.write {"content": "one", "path": "a.md"}. Reason: MCP call from mcp',
        'alpha asks to run fs.write {"content": "two", "path": "a.md"}. Reason: MCP call from mcp',
    ]
    assert (node.parent / "workspace" / "a.md").read_text() == "two"
    assert (node.parent / "workspace" / "b.md").read_text() == "three"


@contextmanager
def http_server(config: Path) -> Iterator[str]:
    port = free_port()
    log = config.parent / f"mcp-http-{port}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "teaagent", "mcp", "serve", "--config", str(config), "--http", str(port)],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
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


def test_streamable_http_needs_the_token_and_asks_by_returning_the_question(node: Path) -> None:
    asked: list[str] = []

    async def main(url: str) -> None:
        async with httpx2.AsyncClient() as anonymous:
            refused = await anonymous.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json() == {
            "error": "unauthorized",
            "message": "This MCP server needs the node's bearer token.",
        }
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(
                streamable_http_client(url, http_client=http),
                elicitation_callback=answering("once", "decline", asked=asked),
            ) as client,
        ):
            assert client.protocol_version == "2026-07-28"
            assert next(tool.name for tool in (await client.list_tools()).tools) == "fs.read"
            written = await client.call_tool("fs.write", {"path": "c.md", "content": "via http"})
            declined = await client.call_tool("fs.write", {"path": "d.md", "content": "no"})
            # An answer is bound to the call it was asked about: a state of another call is refused.
            first = await client.session.call_tool(
                "fs.write", {"path": "e.md", "content": "x"}, allow_input_required=True
            )
            assert isinstance(first, types.InputRequiredResult)
            replayed = await client.session.call_tool(
                "fs.write",
                {"path": "e.md", "content": "other"},
                request_state=first.request_state,
                input_responses={"approval": types.ElicitResult(action="accept", content={"answer": "once"})},
            )
        assert written.is_error is False, text(written)
        assert text(declined) == "fs.write was denied at the approval prompt."
        assert replayed.is_error is True
        assert "its approval answer does not belong to this call" in text(replayed)

    with http_server(node) as url:
        anyio.run(main, url)
    assert (node.parent / "workspace" / "c.md").read_text() == "via http"
    assert not (node.parent / "workspace" / "d.md").exists()
    assert not (node.parent / "workspace" / "e.md").exists()
    assert len(asked) == 2


def test_a_second_server_on_the_same_workspace_is_refused(node: Path) -> None:
    async def main() -> None:
        async with stdio_session(node) as session:
            await session.list_tools()  # the first server holds the lock by now
            second = subprocess.run(
                [sys.executable, "-m", "teaagent", "mcp", "serve", "--config", str(node)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert second.returncode == 2
            workspace = (node.parent / "workspace").resolve()
            assert second.stderr.startswith(
                f"teaagent: the workspace {workspace} is locked by another process (pid "
            )

    anyio.run(main)
