"""``teaagent agent serve``: run this node's agent service (the agent HTTP API) in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from teaagent.cli._options import AccessLogOption, ConfigOption, LogLevelOption, created_service
from teaagent.cli._serve import serve_app

app = typer.Typer(help="The node's agent service: runs over HTTP, streamed.", no_args_is_help=True)


@app.command("serve")
def serve(
    config: ConfigOption = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default: [agent] host, loopback).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: [agent] port).")] = None,
    log_level: LogLevelOption = "info",
    access_log: AccessLogOption = False,
) -> None:
    """Serve the agent of the node in CONFIG on [agent] port, one worker, until interrupted.

    It listens on ``[agent] host`` (loopback unless configured). A port already in use exits 2
    with one sentence; SIGTERM or Ctrl-C stops the runs in flight (their streams end with their
    result) and exits 0.
    """
    # The command line is the one place the library starts a service; the import stays here.
    import teaagent_agent

    application, node = created_service(teaagent_agent, config)
    serve_app(
        application,
        host=host or node.agent.host,
        port=port if port is not None else node.agent.port,
        what=f"the agent of {node.agent_id}",
        log_level=log_level,
        access_log=access_log,
    )
