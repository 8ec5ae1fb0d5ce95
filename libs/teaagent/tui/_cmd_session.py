"""``/new``, ``/sessions``, ``/resume``: the chat sessions of the TUI."""

from __future__ import annotations

from teaagent.errors import ConfigError
from teaagent.session import new_session
from teaagent.tui._base import TUIBase
from teaagent.tui._common import count, short


def cmd_new(tui: TUIBase, _argument: str) -> None:
    tui._session = new_session()
    tui._session_note = "new"
    tui._jit.clear()
    tui._board.clear()
    tui._save_tui_state()
    tui._screen.say(f"New session {tui._session.id}.")


def cmd_sessions(tui: TUIBase, _argument: str) -> None:
    try:
        items = tui._store.list_sessions()
    except (OSError, ConfigError) as exc:
        tui._screen.say(f"The sessions cannot be listed: {exc}", "red")
        return
    if not items:
        tui._screen.say(
            "No saved sessions yet."
            + (" (':memory:' keeps them in this process only.)" if tui._memory else "")
        )
        return
    rows = []
    for item in items:
        mark = "*" if item["id"] == tui._session.id else ""
        rows.append(
            [
                mark,
                item["id"],
                str(item["updated_at"])[:19].replace("T", " "),
                str(item["message_count"]),
                short(item["label"] or "", 50),
            ]
        )
    tui._screen.table(["", "SESSION", "UPDATED (UTC)", "MESSAGES", "LABEL"], rows)


def cmd_resume(tui: TUIBase, argument: str) -> None:
    if not argument:
        tui._screen.say("Usage: /resume ID (/sessions lists them).", "yellow")
        return
    try:
        ids = [item["id"] for item in tui._store.list_sessions()]
    except (OSError, ConfigError) as exc:
        tui._screen.say(f"The sessions cannot be listed: {exc}", "red")
        return
    matching = [session_id for session_id in ids if session_id == argument] or [
        session_id for session_id in ids if session_id.startswith(argument)
    ]
    if not matching:
        tui._screen.say(f"No session {argument}; /sessions lists them.", "yellow")
        return
    if len(matching) > 1:
        tui._screen.say(f"{argument} names {len(matching)} sessions: {', '.join(matching)}.", "yellow")
        return
    try:
        found = tui._store.load(matching[0])
    except (ConfigError, ValueError, OSError) as exc:
        tui._screen.say(f"Session {matching[0]} cannot be resumed: {exc}", "red")
        return
    if found is None:
        tui._screen.say(f"Session {matching[0]} is gone.", "yellow")
        return
    tui._session = found
    tui._session_note = "resumed"
    tui._jit.clear()
    tui._board.clear()
    tui._save_tui_state()
    label = f": {short(found.label, 60)}" if found.label else ""
    tui._screen.say(f"Resumed session {found.id} ({count(len(found.messages), 'message')}){label}.")
