"""``teaagent bench mcp``: a low-risk call through the gateway against the same upstream called directly.

One upstream MCP server (the SDK's low-level ``Server`` with one read-only ``echo`` tool, the
leanest server there is) is run twice as a stdio process: once spoken to directly by the SDK's
``ClientSession``, once behind ``teaagent mcp gateway`` (a throw-away node, quorum off), spoken to
by the same client. The gateway's call is the direct one plus one more stdio hop and the node's
gate (schema, policy, audit record). Batches of calls alternate between the two, so both see the
same machine; each call is timed from the request to its result.

Figures: p50 and p99 of each in milliseconds, their ratios, and the number of calls of each.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import anyio

from teaagent_bench import python_code
from teaagent_bench._node import write_node

__all__ = ["UPSTREAM_MAIN", "bench_mcp", "serve_upstream"]

UPSTREAM_MAIN: Final = python_code("from teaagent_bench.mcp import serve_upstream; serve_upstream()")
BATCH: Final = 50  # calls per batch; batches alternate between direct and gateway
WARMUP: Final = 20


def serve_upstream() -> None:
    """The bench's upstream: one read-only ``echo`` tool on stdio (``python -c UPSTREAM_MAIN``)."""
    import mcp_types as types
    from mcp.server import Server, ServerRequestContext
    from mcp.server.stdio import stdio_server

    tool = types.Tool(
        name="echo",
        description="Say it back.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    )

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        said = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=said)])

    server: Server[Any] = Server("bench-upstream", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


def _write_node(folder: Path) -> Path:
    command = ", ".join(f'"{part}"' for part in (sys.executable, "-c", UPSTREAM_MAIN))
    return write_node(
        folder,
        'relay_url = "http://127.0.0.1:1"\ntoken = "bench-mcp-token-0123456789"\n\n'
        f'[agent]\npermission_mode = "workspace-write"\n\n[mcp.upstreams.up]\ncommand = [{command}]\n',
    )


def _percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def _run(seconds: float, config: Path) -> dict[str, float]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    direct_parameters = StdioServerParameters(command=sys.executable, args=["-c", UPSTREAM_MAIN])
    gateway_parameters = StdioServerParameters(
        command=sys.executable,
        args=["-m", "teaagent", "mcp", "gateway", "--config", str(config), "--log-level", "error"],
    )
    timings: dict[str, list[float]] = {"direct": [], "gateway": []}
    # The processes' stderr is this process's own (a captured sys.stderr has no file to give them).
    errlog = sys.__stderr__ or sys.stderr
    async with (
        stdio_client(direct_parameters, errlog=errlog) as (direct_read, direct_write),
        ClientSession(direct_read, direct_write) as direct,
        stdio_client(gateway_parameters, errlog=errlog) as (gateway_read, gateway_write),
        ClientSession(gateway_read, gateway_write) as gateway,
    ):
        await direct.initialize()
        await gateway.initialize()
        contenders = (("direct", direct, "echo"), ("gateway", gateway, "up.echo"))
        for _name, session, tool in contenders:
            for _ in range(WARMUP):
                result = await session.call_tool(tool, {"text": "warm"})
                if result.is_error:
                    raise RuntimeError(f"the bench's {tool} failed: {result.content}")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline or len(timings["gateway"]) < 5 * BATCH:
            for name, session, tool in contenders:
                samples = timings[name]
                for _ in range(BATCH):
                    started = time.perf_counter()
                    await session.call_tool(tool, {"text": "hello"})
                    samples.append(time.perf_counter() - started)
    direct_ms = [sample * 1000 for sample in timings["direct"]]
    gateway_ms = [sample * 1000 for sample in timings["gateway"]]
    figures = {
        "direct_p50_ms": statistics.median(direct_ms),
        "direct_p99_ms": _percentile(direct_ms, 0.99),
        "gateway_p50_ms": statistics.median(gateway_ms),
        "gateway_p99_ms": _percentile(gateway_ms, 0.99),
        "calls_each": float(len(gateway_ms)),
    }
    figures["p50_ratio"] = figures["gateway_p50_ms"] / figures["direct_p50_ms"]
    figures["p99_ratio"] = figures["gateway_p99_ms"] / figures["direct_p99_ms"]
    return figures


def bench_mcp(seconds: float) -> dict[str, float]:
    """Time low-risk calls through the gateway and directly, alternating, for about ``seconds``.

    Returns:
        ``direct_p50_ms``, ``direct_p99_ms``, ``gateway_p50_ms``, ``gateway_p99_ms``,
        ``p50_ratio``, ``p99_ratio`` (gateway over direct) and ``calls_each``.
    """
    with tempfile.TemporaryDirectory(prefix="teaagent-bench-mcp-") as folder:
        config = _write_node(Path(folder))
        return anyio.run(_run, seconds, config)
