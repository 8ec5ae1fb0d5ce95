"""``teaagent mcp gateway``: the node's gate, N-of-M quorum included, in front of any MCP server.

Each ``[mcp.upstreams.NAME]`` of node.toml is an MCP server (a stdio command, or a streamable HTTP
URL) that the gateway connects to as a client. Its tools are listed as ``NAME.TOOL`` and served
through :class:`~teaagent.mcp_server.GatedToolServer`, so a call goes through the node's gate like
any of its own: schema, permission mode, audit log, and for a name matching ``high_risk_patterns``
(``github.merge_*``, ``*.delete*``) the peers' signed quorum, whose certificate the audit log
keeps. A call is forwarded only once the gate allowed it.

The upstream's annotations become the gate's: ``readOnlyHint`` makes a tool read-only, and any
tool not read-only counts as destructive unless it says ``destructiveHint: false`` (MCP's own
defaults). They are the upstream's word; ``high_risk_patterns`` match names, whatever a tool says.

An upstream that dies (its process exited, its connection broke) fails the call in flight with an
error result and is started again on the next call or listing; the other upstreams keep serving.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Final

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server

from teaagent.config import NodeConfig
from teaagent.config._model import McpUpstream
from teaagent.errors import SchemaValidationError
from teaagent.mcp_server._gated import META_HIGH_RISK, GatedToolServer, ToolCallFailed
from teaagent.tools import ToolAnnotations, ToolDefinition, ToolRegistry
from teaagent.tools._registry import TOOL_NAME_PATTERN

__all__ = ["CONNECT_TIMEOUT_SECONDS", "Gateway", "Upstream", "annotations_of"]

logger = logging.getLogger("teaagent.mcp_server")

CONNECT_TIMEOUT_SECONDS: Final = 30.0  # start (or reach), initialize and list one upstream
_ANY_RESULT: Final = {"type": "object"}  # the upstream's result is checked by its own client


def annotations_of(tool: types.Tool) -> ToolAnnotations:
    """The gate's annotations of an upstream tool, from its MCP hints and MCP's defaults.

    A tool is read-only only when it says so and does not also claim to be destructive; every
    other tool is destructive unless it says ``destructiveHint: false``.
    """
    hints = tool.annotations
    read_only = hints is not None and hints.read_only_hint is True and hints.destructive_hint is not True
    destructive = not read_only and (hints is None or hints.destructive_hint is not False)
    idempotent = hints is not None and hints.idempotent_hint is True
    tier = "Low" if read_only else "High" if destructive else "Medium"
    return ToolAnnotations(
        read_only=read_only, destructive=destructive, idempotent=idempotent, security_tier=tier
    )


class Upstream:
    """One upstream MCP server, connected on demand and restarted after it died.

    Args:
        config: Its ``[mcp.upstreams.NAME]`` table.
        registry: Where its tools are registered as ``NAME.TOOL``.
    """

    def __init__(self, config: McpUpstream, registry: ToolRegistry) -> None:
        self.config = config
        self.name = config.name
        self._registry = registry
        self._session: ClientSession | None = None
        self._closed: anyio.Event | None = None  # set to end the connection's task
        self._lock = anyio.Lock()
        self._tools: dict[str, types.Tool] = {}  # by gateway name
        self._task_group: anyio.abc.TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.restarts = 0

    @property
    def connected(self) -> bool:
        """Whether a connection is open and its upstream has not been seen to end."""
        return self._session is not None and self._closed is not None and not self._closed.is_set()

    def listed(self, gateway_name: str) -> types.Tool | None:
        """The upstream's own listing of a tool, by its gateway name."""
        return self._tools.get(gateway_name)

    def bind(self, task_group: anyio.abc.TaskGroup | None) -> None:
        """Use this task group for the connection's task (the gateway's, for its lifetime); None: stopping."""
        self._task_group = task_group
        self._loop = asyncio.get_running_loop() if task_group is not None else self._loop

    async def ensure(self) -> None:
        """Connect (start the process) and list its tools, unless connected already.

        Raises:
            ToolCallFailed: It cannot be started, reached, initialized or listed in time.
        """
        async with self._lock:
            if self.connected:
                return
            if self._closed is not None:
                self._closed.set()  # a connection seen to end: its task closes what is left of it
            self._session = None
            if self._task_group is None:
                raise ToolCallFailed(f"the upstream {self.name} is not running: the gateway is stopping.")
            closed = anyio.Event()
            try:
                with anyio.fail_after(CONNECT_TIMEOUT_SECONDS):
                    session = await self._task_group.start(self._hold, closed)
                    listing = await _list_all(session)
            except Exception as exc:
                closed.set()
                self._unregister()
                raise ToolCallFailed(f"the upstream {self.name} could not be started: {_why(exc)}.") from None
            if self._closed is not None:
                self.restarts += 1
            self._session, self._closed = session, closed
            self._register(listing)

    async def _hold(self, closed: anyio.Event, *, task_status: anyio.abc.TaskStatus[ClientSession]) -> None:
        """The connection's task: open it, hand over the session, keep it until told to close."""
        started = False
        try:
            async with AsyncExitStack() as stack:
                if self.config.url is not None:
                    client = await stack.enter_async_context(
                        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300))
                    )
                    read, write = await stack.enter_async_context(
                        streamable_http_client(self.config.url, http_client=client)
                    )
                else:
                    program, *arguments = self.config.command
                    parameters = StdioServerParameters(
                        command=program, args=arguments, env=dict(self.config.env)
                    )
                    read, write = await stack.enter_async_context(stdio_client(parameters, errlog=sys.stderr))
                # Its output ending (the process exited) ends this connection at once, so the next
                # call starts the upstream again rather than failing on a dead one.
                session = await stack.enter_async_context(ClientSession(_Watched(read, closed.set), write))
                await session.initialize()
                task_status.started(session)
                started = True
                await closed.wait()
        except Exception as exc:
            if not started:
                raise  # to ensure(), which says why the upstream could not be started
            # Once started, a broken connection only ends this task; the next call reconnects.
            logger.warning("the upstream %s closed: %s", self.name, _why(exc))

    def _register(self, listing: list[types.Tool]) -> None:
        fresh: dict[str, types.Tool] = {}
        for tool in listing:
            name = f"{self.name}.{tool.name}"
            if TOOL_NAME_PATTERN.fullmatch(name) is None:
                logger.warning(
                    "the upstream %s's tool %r is not served: its name is not usable", self.name, tool.name
                )
                continue
            try:
                self._registry.register(
                    name,
                    tool.description or tool.title or "",
                    tool.input_schema,
                    _ANY_RESULT,
                    annotations_of(tool),
                    self._handler(tool.name),
                    allow_override=True,
                )
            except (SchemaValidationError, ValueError, TypeError) as exc:
                # An input schema the gate cannot check is one it cannot gate: not served.
                logger.warning("the upstream %s's tool %s is not served: %s", self.name, tool.name, exc)
                continue
            fresh[name] = tool
        for stale in set(self._tools) - set(fresh):
            self._registry.unregister(stale)
        self._tools = fresh

    def _unregister(self) -> None:
        for name in self._tools:
            if name in self._registry:
                self._registry.unregister(name)
        self._tools = {}

    def _handler(self, tool: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def forward(arguments: dict[str, Any]) -> dict[str, Any]:
            # The gate runs in a worker thread; the connection belongs to the gateway's event loop.
            if self._loop is None:
                raise ToolCallFailed(f"the upstream {self.name} is not running: the gateway is stopping.")
            return asyncio.run_coroutine_threadsafe(self.run(tool, arguments), self._loop).result()

        return forward

    async def run(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Forward one call for the gate: the upstream's result as JSON, its error result raised.

        Raises:
            ToolCallFailed: The upstream failed (see :meth:`call`) or returned an error result,
                which the exception carries so that the client gets it as it was.
        """
        result = await self.call(tool, arguments)
        data: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        if result.is_error:
            raise ToolCallFailed(f"{self.name}.{tool} failed: {_text_of(result)}", result)
        return data

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Forward one call; an upstream that died fails it and is restarted on the next one.

        Raises:
            ToolCallFailed: The upstream cannot be started, or died during the call.
        """
        await self.ensure()
        session = self._session
        assert session is not None
        try:
            result = await session.call_tool(tool, arguments)
        except Exception as exc:
            await self.drop(session)
            raise ToolCallFailed(
                f"the upstream {self.name} failed during {self.name}.{tool}: {_why(exc)}; it is started "
                "again on the next call."
            ) from None
        assert isinstance(result, types.CallToolResult)
        return result

    async def drop(self, session: ClientSession | None = None) -> None:
        """Close the connection (end the process); the next call starts it again."""
        async with self._lock:
            if session is not None and session is not self._session:
                return  # someone already dropped it, and maybe reconnected
            if self._closed is not None:
                self._closed.set()
            self._session = None


class _Watched:
    """A transport's read stream that calls ``on_end`` once the stream has ended."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _list_all(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _page in range(100):  # a server whose cursor never ends is cut short
        result = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        tools.extend(result.tools)
        cursor = result.next_cursor
        if cursor is None:
            break
    return tools


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {CONNECT_TIMEOUT_SECONDS:g} seconds"
    text = str(exc).strip().rstrip(".") or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _text_of(result: types.CallToolResult) -> str:
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    text = " ".join(texts).strip() or "it returned an error result"
    return text if len(text) <= 500 else text[:497] + "..."


class Gateway:
    """The gateway of a node: its upstreams' tools, behind its gate.

    Args:
        node: The node configuration, with its ``[mcp.upstreams.*]``.
    """

    def __init__(self, node: NodeConfig) -> None:
        self.node = node
        self.registry = ToolRegistry()
        self.upstreams = {
            name: Upstream(config, self.registry) for name, config in node.mcp.upstreams.items()
        }
        self.tools = GatedToolServer(
            node,
            self.registry,
            name=f"teaagent gateway {node.agent_id}",
            run_prefix="mcp-gateway",
            refresh=self.refresh,
            describe=self._describe,
            to_result=types.CallToolResult.model_validate,
            lifespan=self._lifespan,
            run_at_once=self._run_at_once,
            instructions=(
                "Tools of other MCP servers, named SERVER.TOOL. A high-risk call waits for the "
                f"signed approval of {node.quorum.describe_quorum()}."
                if node.quorum.enabled
                else "Tools of other MCP servers, named SERVER.TOOL."
            ),
        )

    @property
    def server(self) -> Server[Any]:
        """The MCP server to serve."""
        return self.tools.server

    @asynccontextmanager
    async def _lifespan(self, _server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        async with anyio.create_task_group() as task_group:
            for upstream in self.upstreams.values():
                upstream.bind(task_group)
            try:
                await self.refresh(None)
                yield {}
            finally:
                for upstream in self.upstreams.values():
                    upstream.bind(None)
                    await upstream.drop()

    async def refresh(self, tool_name: str | None) -> None:
        """Connect the upstreams not connected: all of them, or the one a tool name belongs to."""
        if tool_name is not None:
            upstream = self.upstreams.get(tool_name.split(".", 1)[0])
            targets = [upstream] if upstream is not None else []
        else:
            targets = [upstream for upstream in self.upstreams.values() if not upstream.connected]

        async def one(upstream: Upstream) -> None:
            try:
                await upstream.ensure()
            except ToolCallFailed as exc:
                logger.warning("%s", exc)

        async with anyio.create_task_group() as task_group:
            for upstream in targets:
                task_group.start_soon(one, upstream)

    async def _run_at_once(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Forward a call the gate admitted in the event loop (no thread hop to reach the upstream)."""
        upstream_name, tool = name.split(".", 1)
        return await self.upstreams[upstream_name].run(tool, arguments)

    def _describe(self, tool: ToolDefinition) -> types.Tool:
        upstream = self.upstreams[tool.name.split(".", 1)[0]]
        listed = upstream.listed(tool.name)
        if listed is None:  # pragma: no cover - registered and recorded together, in the loop's thread
            return self.tools.mcp_tool(tool)
        meta = dict(listed.meta or {})
        meta[META_HIGH_RISK] = self.node.quorum.is_high_risk(tool.name)
        return listed.model_copy(update={"name": tool.name, "meta": meta})
