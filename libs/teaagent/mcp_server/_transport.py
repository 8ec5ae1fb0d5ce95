"""Serving a :class:`~teaagent.mcp_server.GatedToolServer` over stdio or streamable HTTP."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import anyio
from fastapi import FastAPI
from mcp.server.stdio import stdio_server
from starlette.types import ASGIApp, Receive, Scope, Send

from teaagent.mcp_server._gated import GatedToolServer

__all__ = ["MCP_PATH", "http_app", "serve_stdio"]

MCP_PATH: Final = "/mcp"  # the streamable HTTP endpoint, as MCP clients expect it


async def serve_stdio(server: GatedToolServer) -> None:
    """Serve one MCP client on this process's stdin and stdout until it closes stdin.

    The SDK moves the process's own file descriptor 1 to stderr while it serves, so nothing a tool
    prints (a shell command's output) can corrupt the protocol.
    """
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.server.run(read_stream, write_stream, server.server.create_initialization_options())
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
        body = json.dumps(
            {"error": "unauthorized", "message": "This MCP server needs the node's bearer token."}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


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
