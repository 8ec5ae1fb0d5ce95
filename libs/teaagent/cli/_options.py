"""The options that several commands take, written once: the node configuration, a script, serving."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from teaagent.config import NodeConfig

__all__ = ["AccessLogOption", "ConfigOption", "LogLevelOption", "ScriptOption", "created_service"]

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="The node configuration; $TEAAGENT_CONFIG when omitted.")
]
ScriptOption = Annotated[
    str | None,
    typer.Option(
        "--script",
        help="What the scripted provider plays: a bundled script (demo, quorum, denied, question) "
        "or a JSON file; [agent] script by default.",
    ),
]
LogLevelOption = Annotated[str, typer.Option(help="critical, error, warning, info or debug.")]
AccessLogOption = Annotated[
    bool, typer.Option(help="Log one line per HTTP call (off by default: long-polls make many).")
]


def created_service(service: Any, config: Path | None) -> tuple[Any, NodeConfig]:
    """The application of a service package (its ``Settings`` and ``create_app``) for CONFIG, and its node.

    The command imports the package itself: the command line is the one place the library starts
    a service.
    """
    settings = service.Settings(config=str(config)) if config is not None else service.Settings()
    application = service.create_app(settings)
    node: NodeConfig = application.state.config
    return application, node
