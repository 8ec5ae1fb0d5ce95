"""``teaagent approver serve``: run this node's approver (its signing authority) in the foreground."""

from __future__ import annotations

from typing import Annotated

import typer

from teaagent.cli._options import AccessLogOption, ConfigOption, LogLevelOption, created_service
from teaagent.cli._serve import serve_app, wait_for_store

app = typer.Typer(
    help="The node's approver: its signing authority, its rules and its operators' inbox.",
    no_args_is_help=True,
)


@app.command("serve")
def serve(
    config: ConfigOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: [approver] port).")] = None,
    log_level: LogLevelOption = "info",
    access_log: AccessLogOption = False,
) -> None:
    """Serve the approver of the node in CONFIG on [approver] port, one worker, until interrupted.

    It listens on the loopback by default: its API is for this node's operators. A port already in
    use exits 2 with one sentence; SIGTERM or Ctrl-C stops the engine and exits 0.
    """
    # The command line is the one place the library starts a service; the import stays here.
    import teaagent_approver

    application, node = created_service(teaagent_approver, config)
    what = f"the approver of {node.agent_id}"
    serve_app(
        application,
        host=host,
        port=port if port is not None else node.approver.port,
        what=what,
        log_level=log_level,
        access_log=access_log,
        wait_first=lambda: wait_for_store(node, what, starts_embedded=False),
    )
