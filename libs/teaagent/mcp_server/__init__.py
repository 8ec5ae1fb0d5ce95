"""The node's MCP server (``teaagent mcp serve``), and the workspace registry: one process per workspace.

:class:`GatedToolServer` serves a tool registry over MCP with every call through the node's full
policy gate (see :mod:`teaagent.mcp_server._gated`); :func:`serve_stdio` and :func:`http_app`
put it on stdio or streamable HTTP. :class:`Gateway` (``teaagent mcp gateway``) serves the tools
of the ``[mcp.upstreams.*]`` MCP servers behind the same gate.

A lock is an exclusive ``flock`` on ``<workspace>/.teaagent/workspace.lock`` (or on a file per
workspace in the registry's ``state_dir``), held for as long as the holder keeps it; the file
records the holder's pid, start time, boot id, host and ``acquired_at``, which name it in a
:class:`~teaagent.errors.WorkspaceLockConflictError`. A lock left by a process that has died is
taken over ("zombie cleanup") by exactly one of the processes that want it. See
:class:`WorkspaceRegistry` for the whole protocol.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from teaagent.errors import WorkspaceLockConflictError
from teaagent.mcp_server._locks import (
    ACQUIRE_ATTEMPTS,
    LOCK_FILE_NAME,
    LOCKS_DIR_NAME,
    SETTLE_SECONDS,
    STATE_DIR_NAME,
    WorkspaceLock,
    WorkspaceRegistry,
)
from teaagent.mcp_server._process import Liveness, liveness, process_start_time

if TYPE_CHECKING:
    from teaagent.mcp_server._gated import GatedToolServer, ToolCallFailed
    from teaagent.mcp_server._gateway import Gateway, Upstream
    from teaagent.mcp_server._transport import MCP_PATH, http_app, serve_stdio

# The server's names load the MCP SDK and FastAPI (about a second of CPU), imported when first
# asked for; the registry's do not, so that a process that only takes a workspace's lock (the
# agent service, a test's racer) never pays for them.
_SERVER_NAMES = {
    "GatedToolServer": "_gated",
    "ToolCallFailed": "_gated",
    "Gateway": "_gateway",
    "Upstream": "_gateway",
    "MCP_PATH": "_transport",
    "http_app": "_transport",
    "serve_stdio": "_transport",
}


def __getattr__(name: str) -> Any:
    module = _SERVER_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ACQUIRE_ATTEMPTS",
    "LOCKS_DIR_NAME",
    "LOCK_FILE_NAME",
    "MCP_PATH",
    "SETTLE_SECONDS",
    "STATE_DIR_NAME",
    "GatedToolServer",
    "Gateway",
    "Liveness",
    "ToolCallFailed",
    "Upstream",
    "WorkspaceLock",
    "WorkspaceLockConflictError",
    "WorkspaceRegistry",
    "http_app",
    "liveness",
    "process_start_time",
    "serve_stdio",
]
