"""``teaagent approvals web``: the approver's web inbox, opened with a one-time sign-in link.

The approver serves the page itself (``/web`` on its port, loopback-only by default); this command
asks it for a one-time sign-in code with the node's token, prints the link, and opens a browser when
this machine has a desktop to show one on. The link works once, for a few minutes; the node's token
signs in too.
"""

from __future__ import annotations

import os
import sys
import webbrowser
from typing import Annotated

import httpx
import typer

from teaagent.cli._approvals import app as approvals_app
from teaagent.cli._exit import EXIT_FAILED, bad_usage, fail
from teaagent.cli._options import ConfigOption
from teaagent.config import load_config
from teaagent.errors import ConfigError

__all__ = ["has_desktop", "web"]


def has_desktop() -> bool:
    """Whether a browser opened here would show on a screen (a desktop session, or macOS/Windows)."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


@approvals_app.command("web")
def web(
    config: ConfigOption = None,
    browser: Annotated[
        bool, typer.Option("--browser/--no-browser", help="Open a browser when this machine has a desktop.")
    ] = True,
) -> None:
    """Print the web inbox's address with a one-time sign-in link (and open a browser where one shows)."""
    try:
        node = load_config(config)
        token = node.load_token()
    except ConfigError as exc:
        bad_usage(str(exc).rstrip(".") + ".")
    base = f"http://127.0.0.1:{node.approver.port}"
    try:
        response = httpx.post(f"{base}/web/links", headers={"Authorization": f"Bearer {token}"}, timeout=10.0)
    except httpx.HTTPError:
        raise typer.Exit(
            fail(
                f"the approver at {base} does not answer; start it with "
                f"`teaagent approver serve --config {node.path}`.",
                EXIT_FAILED,
            )
        ) from None
    if response.status_code == 401:
        bad_usage(
            f"the approver at {base} refuses this configuration's token; is it {node.agent_id}'s approver?"
        )
    if response.status_code == 404:
        raise typer.Exit(
            fail(f"the approver at {base} serves no web inbox (TEAAGENT_APPROVER_WEB is false).", EXIT_FAILED)
        )
    try:
        response.raise_for_status()
        answer = response.json()
        url = base + str(answer["path"])
        minutes = max(1, int(answer["expires_in"]) // 60)
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        raise typer.Exit(
            fail(
                f"the approver at {base} answered {response.status_code} without a sign-in link.", EXIT_FAILED
            )
        ) from None
    typer.echo(f"The web inbox of {node.agent_id}: {base}/web/")
    typer.echo(f"Sign in with this one-time link (it works once, for {minutes} minutes): {url}")
    if browser and has_desktop():
        try:
            opened = webbrowser.open(url)
        except webbrowser.Error:
            opened = False
        if opened:
            typer.echo("Opened it in a browser.")
