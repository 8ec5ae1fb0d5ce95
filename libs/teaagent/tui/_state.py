"""What the TUI remembers between starts (``.teaagent/tui_state.json``), and sessions kept in memory only."""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from teaagent._files import atomic_write
from teaagent.session import ChatSession, SessionStore, check_session_id

__all__ = [
    "MEMORY",
    "STATE_FILE",
    "STATE_VERSION",
    "MemorySessionStore",
    "TUIState",
    "load_state",
    "save_state",
]

MEMORY: Final = ":memory:"
"""The ``database`` that keeps nothing: sessions, history and state live in this process only."""
STATE_FILE: Final = ".teaagent/tui_state.json"
"""Where the TUI's state lives, relative to its database folder."""
STATE_VERSION: Final = 1
MAX_STATE_BYTES: Final = 64 * 1024  # four names and a version; anything larger is not ours


@dataclass(frozen=True, kw_only=True)
class TUIState:
    """The TUI's choices, picked up by its next start.

    Attributes:
        session_id: The session it was in.
        provider: The LLM provider.
        model: The model.
        model_name: The ``[models.NAME]`` table the model came from, if any.
        permission_mode: The permission mode's value.
    """

    session_id: str | None = None
    provider: str | None = None
    model: str | None = None
    model_name: str | None = None
    permission_mode: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's content."""
        return {"version": STATE_VERSION, **dataclasses.asdict(self), "saved_at": int(time.time())}


def _optional_text(document: dict[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"its {name} is not a non-empty string")
    return value


def load_state(folder: Path) -> tuple[TUIState | None, str | None]:
    """Read ``<folder>/.teaagent/tui_state.json``.

    Args:
        folder: The TUI's database folder.

    Returns:
        ``(state, None)``; ``(None, None)`` when there is no file; ``(None, why)`` when the file
        cannot be used (the TUI says so and starts afresh).
    """
    path = folder / STATE_FILE
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be read: {exc.strerror or exc}"
    try:
        if len(raw) > MAX_STATE_BYTES:
            raise ValueError(f"it is larger than {MAX_STATE_BYTES} bytes")
        document = json.loads(raw)
        if not isinstance(document, dict) or document.get("version") != STATE_VERSION:
            raise ValueError(f"it is not a version {STATE_VERSION} state object")
        session_id = _optional_text(document, "session_id")
        if session_id is not None:
            check_session_id(session_id)
        state = TUIState(
            session_id=session_id,
            provider=_optional_text(document, "provider"),
            model=_optional_text(document, "model"),
            model_name=_optional_text(document, "model_name"),
            permission_mode=_optional_text(document, "permission_mode"),
        )
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{path} is not usable ({exc})"
    return state, None


def save_state(folder: Path, state: TUIState) -> Path:
    """Replace ``<folder>/.teaagent/tui_state.json`` atomically (mode 0600).

    Returns:
        The file's path.

    Raises:
        OSError: It could not be written; the previous file is unchanged.
    """
    path = folder / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write(path, json.dumps(state.to_json(), indent=2, sort_keys=True).encode() + b"\n")
    return path


class MemorySessionStore(SessionStore):
    """A :class:`SessionStore` that keeps its sessions in this process only (``database=':memory:'``)."""

    def __init__(self) -> None:
        super().__init__(MEMORY)
        self._sessions: dict[str, ChatSession] = {}

    def __repr__(self) -> str:
        return "MemorySessionStore()"

    def save(self, session: ChatSession) -> None:
        """Keep a copy of ``session``.

        Raises:
            ValueError: The session is not valid.
        """
        session.validate()
        self._sessions[session.id] = copy.deepcopy(session)

    def load(self, session_id: str) -> ChatSession | None:
        """Return a copy of the session, or None.

        Raises:
            ValueError: ``session_id`` is not a valid session id.
        """
        check_session_id(session_id)
        found = self._sessions.get(session_id)
        return None if found is None else copy.deepcopy(found)

    def delete(self, session_id: str) -> bool:
        """Forget a session; False when there was none."""
        return self._sessions.pop(check_session_id(session_id), None) is not None

    def list_sessions(self) -> list[dict[str, Any]]:
        """The sessions as :meth:`SessionStore.list_sessions` lists them, newest first."""
        found = [
            {
                "id": session.id,
                "created_at": session.created_at,
                "updated_at": session.updated_at,
                "label": session.label,
                "message_count": len(session.messages),
            }
            for session in self._sessions.values()
        ]
        return sorted(found, key=lambda item: item["updated_at"], reverse=True)
