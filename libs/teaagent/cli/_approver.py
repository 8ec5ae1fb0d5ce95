"""``teaagent approver serve``: run this node's approver (its signing authority) in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from teaagent.cli._serve import serve_app, wait_for_store

app = typer.Typer(
    help="The node's approver: its signing authority, its rules and its operators' inbox.",
    no_args_is_help=True,
)


@app.command("serve")
def serve(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="The node configuration file (default: $TEAAGENT_CONFIG)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: [approver] port).")] = None,
    log_level: Annotated[str, typer.Option(help="critical, error, warning, info or debug.")] = "info",
    access_log: Annotated[
        bool, typer.Option(help="Log one line per HTTP call (off by default: long-polls make many).")
    ] = False,
) -> None:
    """Serve the approver of the node in CONFIG on [approver] port, one worker, until interrupted.

    It listens on the loopback by default: its API is for this node's operators. A port already in
    use exits 2 with one sentence; SIGTERM or Ctrl-C stops the engine and exits 0.
    """
    # The command line is the one place the library starts a service; the import stays here.
    from teaagent_approver import Settings, create_app

    settings = Settings(config=str(config)) if config is not None else Settings()
    application = create_app(settings)
    node = application.state.config
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
