"""``teaagent mcp gateway``: a real upstream MCP server (written below with the SDK) behind alpha's gate.

The upstream is this file run as a program: an ``MCPServer`` with a read-only ``echo``, a ``pid``,
a ``merge_pr`` that records each merge in a file, and a ``fail`` that raises. alpha's gateway
fronts it twice: as ``github`` (a stdio command) and as ``web`` (the same server on streamable
HTTP). ``github.merge_*`` is high risk in alpha's ``[quorum]``: 2 of beta, gamma and delta, each
with its relay and its real approver service; beta's rules approve merges, gamma's leave them to
an operator, delta's approver never decides.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from relay_support import Node, free_port, rule

from teaagent.audit import verify_log_or_raise

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a whole cluster per test, on a loaded host

READY = 20.0
MERGE_RULES = rule("github.merge_*", "approve")


def upstream(transport: str, port: int, merges: str) -> None:
    """The upstream MCP server: stdio, or streamable HTTP on ``port``."""
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("fake-github")

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Say it back."""
        return f"echo: {text}"

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @server.tool(annotations=types.ToolAnnotations(destructive_hint=True))
    def merge_pr(number: int) -> str:
        """Merge a pull request."""
        with open(merges, "a") as handle:
            handle.write(f"{number}\n")
        return f"merged #{number}"

    @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
    def slow(marker: str) -> str:
        """Say that it started, then take a minute."""
        Path(marker).write_text(str(os.getpid()))
        time.sleep(60)
        return "done"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ToolError("the upstream says no")

    if transport == "stdio":
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, star_cluster: Callable[..., dict[str, Node]]
) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("mcp-gateway-upstreams")
    merges = folder / "merges.txt"
    web_port = free_port()
    me = str(Path(__file__).resolve())

    def gateway_config(nodes: dict[str, Node]) -> None:
        alpha = nodes["alpha"]
        config = alpha.config_path.read_text().replace(
            'high_risk_patterns = ["shell.*", "fs.delete"]',
            'high_risk_patterns = ["github.merge_*", "*.delete*"]',
        )
        config += (
            '\n[agent]\npermission_mode = "danger-full-access"\n'
            "\n[mcp.upstreams.github]\n"
            f'command = [{json.dumps(sys.executable)}, {json.dumps(me)}, "stdio", "0", '
            f"{json.dumps(str(merges))}]\n"
            f"env = {{ PYTHONPATH = {json.dumps(os.environ.get('PYTHONPATH', ''))} }}\n"
            f'\n[mcp.upstreams.web]\nurl = "http://127.0.0.1:{web_port}/mcp"\n'
        )
        alpha.config_path.write_text(config)

    with ExitStack() as stack:
        web_log = stack.enter_context((folder / "web.log").open("wb"))
        web = subprocess.Popen(
            [sys.executable, me, "http", str(web_port), str(folder / "web-merges.txt")],
            stdout=web_log,
            stderr=subprocess.STDOUT,
        )
        stack.callback(web.wait, 15)
        stack.callback(web.terminate)
        nodes = star_cluster(
            "mcp-gateway",
            leaves=["beta", "gamma", "delta"],
            required=2,
            timeout_seconds=60,
            rules={"beta": MERGE_RULES},
            prepare=gateway_config,
            approvers=["beta", "gamma", "delta"],
        )
        deadline = time.monotonic() + READY
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{web_port}/mcp", timeout=0.5)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, (folder / "web.log").read_text()
                time.sleep(0.05)
        yield {"nodes": nodes, "merges": merges}


@asynccontextmanager
async def gateway_session(alpha: Node) -> AsyncIterator[ClientSession]:
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "teaagent", "mcp", "gateway", "--config", str(alpha.config_path), "--log-level", "info"],
        env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


def approvals(node: Node, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "teaagent", "approvals", *args, "--config", str(node.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def audit(alpha: Node) -> list[dict[str, Any]]:
    path = alpha.data_dir / "audit" / "alpha.jsonl"
    verify_log_or_raise(path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_upstream_tools_are_listed_under_their_prefix_and_low_risk_calls_forwarded(
    cluster: dict[str, Any],
) -> None:
    alpha = cluster["nodes"]["alpha"]

    async def main() -> None:
        async with gateway_session(alpha) as session:
            listing = await session.list_tools()
            tools = {tool.name: tool for tool in listing.tools}
            echo = await session.call_tool("github.echo", {"text": "hi"})
            web_echo = await session.call_tool("web.echo", {"text": "over http"})
            failed = await session.call_tool("github.fail", {})
            bad = await session.call_tool("github.echo", {"txt": "typo"})
        names = {"echo", "pid", "merge_pr", "slow", "fail"}
        assert set(tools) == {f"{prefix}.{name}" for prefix in ("github", "web") for name in names}
        assert tools["github.merge_pr"].meta["teaagent/high_risk"] is True
        assert tools["web.merge_pr"].meta["teaagent/high_risk"] is False  # the pattern names github only
        assert tools["github.echo"].annotations.read_only_hint is True
        assert tools["github.echo"].input_schema["required"] == ["text"]
        assert echo.is_error is False
        assert text(echo) == "echo: hi"
        assert echo.structured_content == {"result": "echo: hi"}
        assert text(web_echo) == "echo: over http"
        # The upstream's own error result, handed back as it sent it.
        assert failed.is_error is True
        assert "the upstream says no" in text(failed)
        # The gate checks the upstream's schema before anything is forwarded.
        assert bad.is_error is True
        assert text(bad).startswith("github.echo: arguments are invalid")

    anyio.run(main)
    records = audit(alpha)
    results = [r["payload"]["tool_name"] for r in records if r["event_type"] == "tool_result"]
    assert results[-2:] == ["github.echo", "web.echo"]


def test_a_high_risk_call_is_held_until_the_quorum_approves(cluster: dict[str, Any]) -> None:
    alpha, gamma = cluster["nodes"]["alpha"], cluster["nodes"]["gamma"]
    merges: Path = cluster["merges"]
    progress: list[str] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def main() -> types.CallToolResult:
        async with gateway_session(alpha) as session, anyio.create_task_group() as tasks:
            outcome: list[types.CallToolResult] = []

            async def merge() -> None:
                outcome.append(
                    await session.call_tool("github.merge_pr", {"number": 7}, progress_callback=on_progress)
                )

            tasks.start_soon(merge)
            # beta's rule approves at once; gamma's approver waits for its operator.
            with anyio.fail_after(30):
                while not any("(beta)" in line for line in progress):
                    await anyio.sleep(0.05)
            # beta's approval came within PROGRESS_EVERY_SECONDS of the "sent" notification; it
            # is told when that time is up, not with the first reminder (at 30 s left of 60).
            [told] = [line for line in progress if "(beta)" in line][:1]
            left = re.search(r"; (\d+)s left", told)
            assert left is not None, told
            assert int(left.group(1)) > 30, told
            assert not merges.exists()  # held: nothing was forwarded yet
            listed = json.loads(await anyio.to_thread.run_sync(approvals, gamma, "list", "--json"))
            [item] = [entry for entry in listed if entry["tool_name"] == "github.merge_pr"]
            assert item["arguments"] == {"number": 7}
            await anyio.to_thread.run_sync(approvals, gamma, "approve", item["request_id"])
            with anyio.fail_after(30):
                while not outcome:
                    await anyio.sleep(0.05)
            return outcome[0]

    result = anyio.run(main)
    assert result.is_error is False, text(result)
    assert text(result) == "merged #7"
    assert merges.read_text() == "7\n"
    [granted] = [
        r for r in audit(alpha) if r["event_type"] == "approval_granted" and "certificate" in r["payload"]
    ]
    certificate = granted["payload"]["certificate"]
    assert certificate["request"]["tool_name"] == "github.merge_pr"
    assert sorted(a["statement"]["signer"] for a in certificate["approvals"]) == ["beta", "gamma"]


def test_an_upstream_killed_during_a_call_is_an_error_result_and_is_restarted_on_the_next_call(
    cluster: dict[str, Any],
) -> None:
    alpha = cluster["nodes"]["alpha"]
    marker = alpha.folder / "slow-started"
    marker.unlink(missing_ok=True)

    async def main() -> None:
        async with gateway_session(alpha) as session, anyio.create_task_group() as tasks:
            outcome: list[types.CallToolResult] = []

            async def slow() -> None:
                outcome.append(await session.call_tool("github.slow", {"marker": str(marker)}))

            tasks.start_soon(slow)
            with anyio.fail_after(30):
                while not marker.exists() or not marker.read_text():
                    await anyio.sleep(0.02)
            pid = int(marker.read_text())
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(30):
                while not outcome:
                    await anyio.sleep(0.02)
            [died] = outcome
            other = await session.call_tool("web.echo", {"text": "still here"})
            again = await session.call_tool("github.pid", {})
            echoed = await session.call_tool("github.echo", {"text": "back"})
        assert died.is_error is True
        assert text(died) == (
            "the upstream github failed during github.slow: Connection closed; "
            "it is started again on the next call."
        )
        assert text(other) == "echo: still here"  # the other upstream kept serving
        assert again.is_error is False
        assert int(text(again)) != pid
        assert text(echoed) == "echo: back"

    anyio.run(main)


def test_a_low_risk_call_the_client_cancels_is_on_record_at_once_and_the_gateway_goes_on(
    cluster: dict[str, Any],
) -> None:
    # A low-risk call takes the gate in the gateway's event loop, not a worker thread: the
    # client's cancellation reaches it, and its tool_error record is written then, not when
    # the upstream's minute is up.
    alpha = cluster["nodes"]["alpha"]
    marker = alpha.folder / "slow-cancelled"
    marker.unlink(missing_ok=True)

    def of_the_call() -> list[dict[str, Any]]:
        records = audit(alpha)
        calls = {
            r["payload"]["call_id"]
            for r in records
            if r["event_type"] == "tool_call" and r["payload"].get("arguments") == {"marker": str(marker)}
        }
        return [r for r in records if r["event_type"] != "tool_call" and r["payload"].get("call_id") in calls]

    async def main() -> None:
        async with gateway_session(alpha) as session:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(session.call_tool, "github.slow", {"marker": str(marker)})
                with anyio.fail_after(30):
                    while not marker.exists() or not marker.read_text():
                        await anyio.sleep(0.02)
                tasks.cancel_scope.cancel()
            with anyio.fail_after(30):
                while not of_the_call():
                    await anyio.sleep(0.05)
            echoed = await session.call_tool("web.echo", {"text": "after the cancel"})
        assert text(echoed) == "echo: after the cancel"

    anyio.run(main)
    [record] = of_the_call()
    assert record["event_type"] == "tool_error"
    assert record["payload"]["tool_name"] == "github.slow"
    assert record["payload"]["error_type"] == "CancelledError"


def test_an_upstream_that_died_between_calls_is_started_again_by_the_next_one(
    cluster: dict[str, Any],
) -> None:
    from teaagent.config import load_config
    from teaagent.mcp_server import Gateway

    gateway = Gateway(load_config(cluster["nodes"]["alpha"].config_path))

    async def main() -> None:
        async with gateway.server.lifespan(gateway.server):
            github = gateway.upstreams["github"]
            first = await github.call("pid", {})
            pid = int(text(first))
            os.kill(pid, signal.SIGKILL)
            # The gateway sees the upstream's output end and lets the connection go by itself.
            with anyio.fail_after(30):
                while github.connected:
                    await anyio.sleep(0.02)
            second = await github.call("pid", {})
            assert second.is_error is False
            assert int(text(second)) != pid
            assert github.restarts == 1

    anyio.run(main)
    gateway.tools.close()


if __name__ == "__main__":
    upstream(sys.argv[1], int(sys.argv[2]), sys.argv[3])
