"""The REPL's commands: their table (``/help`` lists it), their aliases, and how a line reaches one.

Each command is a function of the TUI and what follows the command on the line; they live in the
command modules by concept (sessions, models and permissions, usage and context, tools and peers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from teaagent.tui import _cmd_model, _cmd_peers, _cmd_session, _cmd_usage
from teaagent.tui._base import TUIBase

__all__ = ["COMMANDS", "Command", "handle"]


@dataclass(frozen=True)
class Command:
    """One REPL command: how it is typed and what it does, for ``/help``."""

    name: str
    usage: str
    help: str


COMMANDS: Final = (
    Command("/help", "/help [COMMAND]", "List the commands, or say what one does."),
    Command("/quit", "/quit", "Leave the TUI (Ctrl-D too)."),
    Command("/new", "/new", "Start a new session: a fresh conversation, no session approvals."),
    Command("/sessions", "/sessions", "List the saved sessions, newest first."),
    Command("/resume", "/resume ID", "Go back to a saved session (a unique prefix of its id will do)."),
    Command("/model", "/model [NAME]", "Show the model and the configured ones, or switch to NAME."),
    Command("/permission", "/permission [MODE]", "Show the permission mode, or set it."),
    Command("/approvals", "/approvals", "What runs without asking: the mode, session approvals, presets."),
    Command("/cost", "/cost", "What this session's runs cost, and the workspace's totals."),
    Command("/usage", "/usage", "Runs, turns, tool calls and tokens of this session, by model."),
    Command("/context", "/context", "What the next model call carries and how full its window is."),
    Command("/compact", "/compact [FOCUS]", "Summarise the older messages to free the context window."),
    Command("/tools", "/tools", "The tools the model may call, and which need the peers' quorum."),
    Command("/quorum", "/quorum", "This session's high-risk calls: waiting, approved by whom, denied."),
    Command("/inbox", "/inbox", "Requests from peers waiting for this node's decision."),
    Command("/approve", "/approve ID [REASON]", "Approve a peer's request with this node's key."),
    Command("/deny", "/deny ID [REASON]", "Deny a peer's request with this node's key."),
)
_ALIASES: Final = {"/exit": "/quit", "/q": "/quit", "/?": "/help", "/clear": "/new"}
_BY_NAME: Final = {command.name: command for command in COMMANDS}


def cmd_help(tui: TUIBase, argument: str) -> None:
    if argument:
        wanted = argument if argument.startswith("/") else f"/{argument}"
        command = _BY_NAME.get(_ALIASES.get(wanted, wanted))
        if command is None:
            tui._screen.say(f"There is no command {wanted}; /help lists them.", "yellow")
            return
        tui._screen.say(f"{command.usage}  {command.help}")
        return
    tui._screen.say("Type a task for the agent, or one of these commands:")
    width = max(len(command.usage) for command in COMMANDS)
    for command in COMMANDS:
        tui._screen.say(f"  {command.usage.ljust(width)}  {command.help}")
    tui._screen.say(
        "During a run, Ctrl-C cancels it; while a call waits for its quorum, Ctrl-C withdraws it.", "dim"
    )


def cmd_quit(tui: TUIBase, _argument: str) -> None:
    tui._screen.say("Goodbye.")
    tui._quit = True


def handle(tui: TUIBase, raw_command: str) -> bool:
    """Dispatch a raw REPL command string.

    Args:
        tui: The TUI it is typed in.
        raw_command: The full text entered at the prompt.

    Returns:
        bool: True if the command was handled, False if unrecognised (a line that is not a
        ``/command`` is a task, not a command: False as well).
    """
    text = raw_command.strip()
    if not text.startswith("/"):
        return False
    word, _, rest = text.partition(" ")
    name = _ALIASES.get(word.lower(), word.lower())
    handler = _HANDLERS.get(name)
    if handler is None:
        return False
    handler(tui, rest.strip())
    return True


_HANDLERS: Final[dict[str, Callable[[TUIBase, str], None]]] = {
    "/help": cmd_help,
    "/quit": cmd_quit,
    "/new": _cmd_session.cmd_new,
    "/sessions": _cmd_session.cmd_sessions,
    "/resume": _cmd_session.cmd_resume,
    "/model": _cmd_model.cmd_model,
    "/permission": _cmd_model.cmd_permission,
    "/approvals": _cmd_model.cmd_approvals,
    "/cost": _cmd_usage.cmd_cost,
    "/usage": _cmd_usage.cmd_usage,
    "/context": _cmd_usage.cmd_context,
    "/compact": _cmd_usage.cmd_compact,
    "/tools": _cmd_peers.cmd_tools,
    "/quorum": _cmd_peers.cmd_quorum,
    "/inbox": _cmd_peers.cmd_inbox,
    "/approve": _cmd_peers.cmd_approve,
    "/deny": _cmd_peers.cmd_deny,
}
