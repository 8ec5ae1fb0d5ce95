"""``teaagent tui``: the node's agent in a terminal REPL (:class:`teaagent.tui.TeaAgentTUI`).

Tasks run with the node's tools, policy, quorum and audit log, exactly as ``teaagent run`` runs
them; ``/inbox``, ``/approve`` and ``/deny`` decide its peers' requests through its approver.
Sessions, the prompt history and the TUI's state live in the workspace's ``.teaagent/`` unless
``--database`` says otherwise (``:memory:`` keeps nothing).

Exit codes: 0 when the user leaves; 1 when the TUI itself failed; 2 bad usage or configuration.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from teaagent.cli._exit import bad_usage
from teaagent.cli._options import ConfigOption, ScriptOption
from teaagent.config import load_config
from teaagent.policy import PermissionMode


def _on_terminal() -> bool:
    return sys.stdout is not None and sys.stdout.isatty()


def tui(
    config: ConfigOption = None,
    provider: Annotated[
        str | None, typer.Option("--provider", help="The LLM provider; the saved one, else [agent] provider.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="The model; the saved one, else [agent] model.")
    ] = None,
    permission: Annotated[
        str | None,
        typer.Option(
            "--permission", help="The permission mode; the saved one, else [agent] permission_mode."
        ),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option("--session", help="Resume (or start) this session; the saved one by default."),
    ] = None,
    database: Annotated[
        str | None,
        typer.Option(
            "--database",
            help="The folder whose .teaagent/ keeps sessions, history and state (the workspace by "
            "default); :memory: keeps nothing.",
        ),
    ] = None,
    task: Annotated[str | None, typer.Option("--task", help="A task to run first.")] = None,
    allow_destructive: Annotated[
        bool, typer.Option("--allow-destructive", help="Approve destructive calls without asking.")
    ] = False,
    stream: Annotated[
        bool | None,
        typer.Option("--stream/--no-stream", help="Print replies as they arrive (on a terminal)."),
    ] = None,
    progress: Annotated[
        bool | None,
        typer.Option("--progress/--no-progress", help="A progress line while waiting (on a terminal)."),
    ] = None,
    subagent: Annotated[
        bool, typer.Option("--subagent", help="Let the model hand sub-tasks to child runs.")
    ] = False,
    route_model: Annotated[
        bool, typer.Option("--route-model", help="Send simple turns to the cheapest configured model.")
    ] = False,
    heartbeat: Annotated[
        int, typer.Option("--heartbeat", min=0, help="A line every N seconds of a long wait; 0 for none.")
    ] = 0,
    script: ScriptOption = None,
    key: Annotated[
        Path | None,
        typer.Option("--key", readable=False, help="Sign /approve and /deny with this operator key."),
    ] = None,
    agent: Annotated[
        bool, typer.Option("--agent", help="Sign /approve and /deny with a key held by ssh-agent.")
    ] = False,
    key_id: Annotated[
        str | None, typer.Option("--key-id", help="With --agent: the fingerprint of the key to use.")
    ] = None,
) -> None:
    """Work with the node's agent in a REPL: tasks, /commands, quorum waits in view, the peers' inbox."""
    from teaagent.cli._operator_keys import local_signer
    from teaagent.tui import MEMORY, TeaAgentTUI, load_state

    node = load_config(config)
    explicit: PermissionMode | None = None
    if permission is not None:
        try:
            explicit = PermissionMode(permission)
        except ValueError:
            known = ", ".join(mode.value for mode in PermissionMode)
            bad_usage(f"--permission is one of {known}, not {permission!r}.")
    signer = local_signer(node, key, agent, key_id)
    folder = database if database is not None else str(node.workspace)
    if folder != MEMORY and (node.workspace / folder).exists() and not (node.workspace / folder).is_dir():
        bad_usage(f"--database {folder} is a file; give the folder whose .teaagent/ keeps the sessions.")
    # The saved mode, else the node's: TeaAgentTUI itself only restores over its own default.
    mode = node.agent.permission_mode
    if folder != MEMORY:
        state, _problem = load_state(node.workspace / folder)
        if state is not None and state.permission_mode in {item.value for item in PermissionMode}:
            mode = PermissionMode(state.permission_mode)
    try:
        app = TeaAgentTUI(
            database=folder,
            provider=provider,
            model=model,
            permission_mode=explicit or mode,
            allow_destructive=allow_destructive,
            initial_task=task,
            session_id=session,
            progress=_on_terminal() if progress is None else progress,
            stream=_on_terminal() if stream is None else stream,
            subagent=subagent,
            route_model=route_model,
            heartbeat=heartbeat,
            node=node,
            operator_signer=signer,
            script_path=script,
        )
    except ValueError as exc:
        bad_usage(str(exc))
    if explicit is not None and app.permission_mode is not explicit:
        app.set_permission_mode(explicit)  # asked for on the command line: it wins over a saved mode
    raise typer.Exit(app.run_repl())
