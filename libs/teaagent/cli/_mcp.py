"""``teaagent mcp``: the node's tools as an MCP server, and a quorum-gated gateway to MCP servers.

``mcp serve`` serves the node's tool registry over MCP (stdio, or streamable HTTP at ``/mcp`` with
``--http PORT``), every call through the node's full gate exactly as ``teaagent tools call``
makes it, and holds the workspace's lock while it runs. ``mcp gateway`` serves the tools of the
``[mcp.upstreams.*]`` servers as ``NAME.TOOL`` behind the same gate, so ``high_risk_patterns``
put any MCP server's dangerous tools behind the peers' signed quorum.

Over HTTP every request needs the node's bearer token (``Authorization: Bearer ...``). Logs go to
stderr; on stdio, stdout carries the protocol alone.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Annotated

import anyio
import typer

from teaagent.cli._exit import bad_usage
from teaagent.cli._options import ConfigOption
from teaagent.cli._serve import serve_app
from teaagent.config import NodeConfig, load_config
from teaagent.errors import WorkspaceLockConflictError
from teaagent.runner._node import node_registry

if TYPE_CHECKING:
    from teaagent.mcp_server import GatedToolServer

# The MCP SDK takes about a second to import: only `mcp serve` and `mcp gateway` load it, not
# every teaagent command (each service and CLI call starts a process).
MCP_PATH = "/mcp"  # teaagent.mcp_server._transport.MCP_PATH (checked by a test)

app = typer.Typer(
    help="The node's tools over MCP, and a quorum-gated gateway in front of MCP servers.",
    no_args_is_help=True,
)

_HTTP_HELP = f"Serve streamable HTTP on this port (at {MCP_PATH}, behind the node's token) instead of stdio."


def _logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(), format="teaagent mcp: %(message)s")
    # One line per relay poll is noise: the gate's own lines say what the quorum does.
    quiet = max(logging.WARNING, logging.getLogger().level)
    for name in ("httpx", "httpx2", "mcp.client"):
        logging.getLogger(name).setLevel(quiet)


def _serve(
    server: GatedToolServer, node: NodeConfig, http: int | None, host: str, what: str, level: str
) -> None:
    from teaagent.mcp_server._transport import http_app, serve_stdio

    if http is None:
        anyio.run(serve_stdio, server)
        return
    application = http_app(server, token=node.load_token(), host=host)
    serve_app(application, host=host, port=http, what=what, log_level=level, access_log=False, path=MCP_PATH)


@app.command("serve")
def serve(
    config: ConfigOption = None,
    http: Annotated[int | None, typer.Option("--http", metavar="PORT", help=_HTTP_HELP)] = None,
    host: Annotated[str, typer.Option(help="The address --http listens on.")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info or debug.")] = "warning",
) -> None:
    """Serve the node's tools over MCP, every call through its policy gate and quorum."""
    from teaagent.mcp_server import GatedToolServer, WorkspaceRegistry

    _logging(log_level)
    node = load_config(config)
    registry = node_registry(node)
    locks = WorkspaceRegistry()
    try:
        locks.acquire_lock(node.workspace)
    except WorkspaceLockConflictError as exc:
        bad_usage(str(exc))
    try:
        server = GatedToolServer(
            node,
            registry,
            name=f"teaagent {node.agent_id}",
            run_prefix="mcp",
            instructions=(
                f"The tools of the teaagent node {node.agent_id}, in its workspace. A high-risk call "
                f"waits for the signed approval of {node.quorum.describe_quorum()}."
                if node.quorum.enabled
                else f"The tools of the teaagent node {node.agent_id}, in its workspace."
            ),
        )
        _serve(server, node, http, host, f"the MCP server of {node.agent_id}", log_level)
    finally:
        locks.release_lock(node.workspace)


@app.command("gateway")
def gateway(
    config: ConfigOption = None,
    http: Annotated[int | None, typer.Option("--http", metavar="PORT", help=_HTTP_HELP)] = None,
    host: Annotated[str, typer.Option(help="The address --http listens on.")] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info or debug.")] = "warning",
) -> None:
    """Serve the tools of the [mcp.upstreams.*] servers as NAME.TOOL, behind the node's gate and quorum."""
    from teaagent.mcp_server import Gateway

    _logging(log_level)
    node = load_config(config)
    if not node.mcp.upstreams:
        bad_usage(f"{node.path} has no [mcp.upstreams.NAME] table, so the gateway has nothing to serve.")
    gateway = Gateway(node)
    _serve(gateway.tools, node, http, host, f"the MCP gateway of {node.agent_id}", log_level)
