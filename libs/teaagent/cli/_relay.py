"""``teaagent relay serve``: run this node's relay (its mailbox between peers) in the foreground."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

import typer

from teaagent.cli._options import AccessLogOption, ConfigOption, LogLevelOption, created_service
from teaagent.cli._serve import serve_app, wait_for_store

app = typer.Typer(help="The node's relay: its mailbox between peers.", no_args_is_help=True)


@app.command("serve")
def serve(
    config: ConfigOption = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default: relay_url's host).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: relay_url's port).")] = None,
    log_level: LogLevelOption = "info",
    access_log: AccessLogOption = False,
) -> None:
    """Serve the relay of the node in CONFIG on its relay_url, one worker, until interrupted.

    With ``[tls] cert`` and ``key`` in the configuration it serves HTTPS (its ``relay_url`` is then
    ``https://``). A port already in use exits 2 with one sentence; SIGTERM or Ctrl-C answers the
    long-polls in flight and exits 0.
    """
    # The command line is the one place the library starts a service; the import stays here.
    import teaagent_relay

    application, node = created_service(teaagent_relay, config)
    url = urlsplit(node.relay_url)
    what = f"the relay of {node.agent_id}"
    serve_app(
        application,
        host=host or url.hostname or "127.0.0.1",
        port=port if port is not None else (url.port or (443 if url.scheme == "https" else 80)),
        what=what,
        tls_cert=node.tls.cert,
        tls_key=node.tls.key,
        log_level=log_level,
        access_log=access_log,
        wait_first=lambda: wait_for_store(node, what, starts_embedded=True),
    )
