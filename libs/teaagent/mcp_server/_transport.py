"""Serving a :class:`~teaagent.mcp_server.GatedToolServer` over stdio or streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from fastapi import FastAPI
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from starlette.types import ASGIApp, Receive, Scope, Send

from teaagent.mcp_server._gated import GatedToolServer
from teaagent.service._limits import send_error

__all__ = ["MCP_PATH", "http_app", "serve_stdio"]

MCP_PATH: Final = "/mcp"  # the streamable HTTP endpoint, as MCP clients expect it
MAX_LINE_BYTES: Final = 16 * 1024 * 1024  # one JSON-RPC message: a tool call's arguments, not an upload

logger = logging.getLogger("teaagent.mcp_server")


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@asynccontextmanager
async def pipe_stdio() -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """The stdio transport on the event loop's own pipe readers and writers, without threads.

    The SDK's ``stdio_server`` reads and writes through a worker thread per line, two thread hops
    per message; an MCP host's stdin and stdout are pipes, which the loop can watch itself. As
    the SDK does, it serves from private copies of descriptors 0 and 1 and points them at the null
    device and at stderr meanwhile, so that nothing a tool or its child prints reaches the wire;
    both are restored on exit.
    """
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
    )
    write_transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound, outbound_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def read_lines() -> None:
        async with inbound_send:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, ConnectionError) as exc:  # a line over the limit: the stream is lost
                    logger.warning("the MCP client's input cannot be read on: %s", exc)
                    return
                if not line:
                    return
                try:
                    message: Any = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                except ValueError as exc:
                    await inbound_send.send(exc)
                    continue
                await inbound_send.send(SessionMessage(message))

    async def write_lines() -> None:
        async with outbound_receive:
            async for item in outbound_receive:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                writer.write(data.encode() + b"\n")
                try:
                    await writer.drain()
                except ConnectionError:
                    return  # the client went away: the read side ends the session

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(read_lines)
            tasks.start_soon(write_lines)
            try:
                yield inbound, outbound
            finally:
                tasks.cancel_scope.cancel()
    finally:
        read_transport.close()
        with contextlib.suppress(OSError):
            write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


async def serve_stdio(server: GatedToolServer) -> None:
    """Serve one MCP client on this process's stdin and stdout until it closes stdin.

    Descriptor 1 points at stderr while it serves, so nothing a tool prints (a shell command's
    output) can corrupt the protocol. On pipes (what MCP hosts give) the loop reads and writes
    them itself (:func:`pipe_stdio`); otherwise (a terminal, a file) through the SDK's transport.
    """
    options = server.server.create_initialization_options()
    try:
        if _is_pipe(0) and _is_pipe(1):
            async with pipe_stdio() as (read_stream, write_stream):
                await server.server.run(read_stream, write_stream, options)
        else:
            async with stdio_server() as (read_stream, write_stream):
                await server.server.run(read_stream, write_stream, options)
    finally:
        server.close()


class _BearerToken:
    """Lets through only the requests that carry the node's bearer token (fail closed)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self._expected):
            await self._app(scope, receive, send)
            return
        message = "This MCP server needs the node's bearer token."
        await send_error(send, 401, "unauthorized", message, headers=[(b"www-authenticate", b"Bearer")])


def http_app(server: GatedToolServer, *, token: str, host: str) -> FastAPI:
    """Return the streamable HTTP application of ``server`` at :data:`MCP_PATH`, behind the token.

    Every request needs ``Authorization: Bearer <the node's token>``: the tools run in the node's
    workspace. The SDK's DNS-rebinding protection is on for a loopback ``host``. When the service
    stops (``app.state.stopping``, set by ``serve_app``), the calls waiting for a quorum or a user
    are stopped (denied) so the stop is not held up by them.

    Args:
        server: The gated server.
        token: The node's bearer token.
        host: The address served, for the SDK's Host-header checks.
    """
    mcp_app = server.server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    manager = server.server.session_manager

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with manager.run(), anyio.create_task_group() as tasks:

            async def stop_calls_on_stop() -> None:
                await app.state.stopping.wait()
                server.stop_calls()

            tasks.start_soon(stop_calls_on_stop)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
                server.close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.stopping = asyncio.Event()
    app.mount("/", _BearerToken(mcp_app, token))
    return app
