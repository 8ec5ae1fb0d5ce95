"""The terminal UI: a REPL over the node's agent, where a high-risk call visibly waits for its peers.

:class:`TeaAgentTUI` is what ``teaagent tui --config node.toml`` runs, and what an embedder drives
with its own ``input_fn``/``output_fn``. Each line typed is a task for the agent (a run of
:class:`~teaagent.runner.AgentRunner` through the node's policy gate) or a command (``/help``
lists them, :data:`COMMANDS`). While a call waits for its quorum, the screen shows who has signed
so far and the time left; Ctrl-C withdraws the wait, and the run ends with the refusal.

On a terminal, rich draws the output and prompt_toolkit reads the input (history, completion);
elsewhere, plain text goes to ``output_fn`` and lines come from ``input_fn``. The TUI's choices
(session, model, permission mode) are written to ``.teaagent/tui_state.json`` under its database
folder after each change and picked up by the next start.
"""

from __future__ import annotations

from teaagent.tui._quorum import QUORUM_STATES, QuorumBoard, QuorumCall
from teaagent.tui._state import MEMORY, STATE_FILE, TUIState, load_state
from teaagent.tui._tui import (
    AUDIT_FILE,
    COMMANDS,
    HISTORY_FILE,
    SUBAGENT_TOOL,
    AdapterFactory,
    Command,
    TeaAgentTUI,
)

__all__ = [
    "AUDIT_FILE",
    "COMMANDS",
    "HISTORY_FILE",
    "MEMORY",
    "QUORUM_STATES",
    "STATE_FILE",
    "SUBAGENT_TOOL",
    "AdapterFactory",
    "Command",
    "QuorumBoard",
    "QuorumCall",
    "TUIState",
    "TeaAgentTUI",
    "load_state",
]
