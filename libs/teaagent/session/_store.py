"""Sessions on disk: one JSON file per session, replaced atomically on every save."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Final

from teaagent._files import UnusableFileError, atomic_write, read_json_file, sync_folder
from teaagent.errors import ConfigError
from teaagent.session._session import SESSION_ID_PATTERN, ChatSession, check_session_id
from teaagent.session._time import parse_timestamp

__all__ = ["MAX_SESSION_FILE_BYTES", "SESSIONS_DIR", "STALE_TEMP_SECONDS", "SessionStore"]

logger = logging.getLogger("teaagent.session")

#: Where a workspace keeps its sessions, relative to the root.
SESSIONS_DIR: Final = ".teaagent/sessions"
MAX_SESSION_FILE_BYTES: Final = 64 * 1024 * 1024  # a long conversation with pasted files; more is not a chat
STALE_TEMP_SECONDS: Final = 3600  # a save takes well under a second; an hour-old temporary file is a crash's
_SUFFIX: Final = ".json"
_TEMP: Final = re.compile(r"\.[A-Za-z0-9_-]{1,64}\.[A-Za-z0-9_]+\.tmp")


class _CorruptSessionError(UnusableFileError):
    """The file is not a usable session; the message completes 'the session file P ...'."""


class SessionStore:
    """The sessions of one workspace, in ``<root>/.teaagent/sessions/<id>.json``.

    Writes are atomic: the session goes to a temporary file in the same folder, which is flushed to
    the disk (``fsync``) and then renamed over the old file (``os.replace``), and the folder is
    flushed so the rename survives a power cut. A process killed in the middle of a save leaves the
    previous version whole (and, at worst, a ``.<id>.*.tmp`` file that nothing reads, which
    :meth:`list_sessions` removes once it is :data:`STALE_TEMP_SECONDS` old). Files and the
    folder are private to the user (modes 0600 and 0700): conversations hold whatever was pasted in.

    Several processes may save and load at once; when two save one session, the last rename wins.
    """

    def __init__(self, root: str | os.PathLike[str] = ".") -> None:
        """Open the store of a workspace; nothing is read or created until it is used.

        Args:
            root: The workspace root; sessions live in ``<root>/.teaagent/sessions``.
        """
        self._folder = Path(os.fspath(root)) / SESSIONS_DIR
        self._lock = threading.Lock()
        # list_sessions reads every file; a file's summary is kept while its identity is unchanged.
        # os.replace gives every save a new inode, so a saved file never matches an old entry.
        self._summaries: dict[str, tuple[tuple[int, int, int, int], dict[str, Any]]] = {}

    def __repr__(self) -> str:
        return f"SessionStore({str(self._folder.parent.parent)!r})"

    @property
    def folder(self) -> Path:
        """The folder holding the session files."""
        return self._folder

    def path_for(self, session_id: str) -> Path:
        """Return the file of a session (which may not exist).

        Raises:
            ValueError: ``session_id`` is not 1 to 64 letters, digits, ``_`` or ``-``.
        """
        return self._folder / (check_session_id(session_id) + _SUFFIX)

    def save(self, session: ChatSession) -> None:
        """Persist session to .teaagent/sessions/<id>.json.

        Creates the file if it doesn't exist; overwrites if it does. The write is atomic: readers
        see the old session or the new one, never a mix, even when the process dies half-way.

        Raises:
            ValueError: A field of the session is invalid, or the session would take more than
                :data:`MAX_SESSION_FILE_BYTES` bytes.
            TypeError: ``session`` is not a :class:`ChatSession`, or one of its fields has the wrong type.
            OSError: The folder or the file cannot be written; the previous version stays in place.
        """
        if not isinstance(session, ChatSession):
            raise TypeError(f"SessionStore.save takes a ChatSession, not {type(session).__name__}.")
        session.validate()
        body = json.dumps(session.to_dict(), ensure_ascii=False, indent=2).encode("utf-8") + b"\n"
        if len(body) > MAX_SESSION_FILE_BYTES:
            raise ValueError(
                f"session {session.id} takes {len(body)} bytes, more than the {MAX_SESSION_FILE_BYTES} a"
                " session file may hold; start a new session."
            )
        path = self.path_for(session.id)
        self._make_folder()
        atomic_write(path, body)

    def load(self, session_id: str) -> ChatSession | None:
        """Load a session by ID.

        Returns:
            ChatSession if found, None otherwise.

        Raises:
            ValueError: ``session_id`` is not 1 to 64 letters, digits, ``_`` or ``-``.
            ConfigError: The file exists but is not a usable session (the message names it and why).
        """
        path = self.path_for(session_id)
        try:
            session = _read_session(path)
        except FileNotFoundError:
            return None
        except UnusableFileError as exc:
            raise ConfigError(f"the session file {path} {exc}; fix or remove it.") from None
        return session

    def delete(self, session_id: str) -> bool:
        """Remove a session's file.

        Returns:
            True when a file was removed, False when there was none.

        Raises:
            ValueError: ``session_id`` is not 1 to 64 letters, digits, ``_`` or ``-``.
            OSError: The file exists but cannot be removed.
        """
        try:
            os.unlink(self.path_for(session_id))
        except FileNotFoundError:
            return False
        sync_folder(self._folder)
        return True

    def list_sessions(self) -> list[dict[str, Any]]:
        """List all saved sessions as lightweight dicts.

        A file that cannot be read or is not a session is skipped and reported through the
        ``teaagent.session`` logger at WARNING; the others are listed all the same.

        Returns:
            list of {'id', 'created_at', 'updated_at', 'label', 'message_count'} dicts,
            sorted by updated_at descending (ties by id).

        Raises:
            OSError: The sessions folder exists but cannot be listed.
        """
        try:
            names = sorted(entry.name for entry in os.scandir(self._folder))
        except FileNotFoundError:
            return []
        summaries: list[dict[str, Any]] = []
        seen: set[str] = set()
        for name in names:
            if _TEMP.fullmatch(name):
                self._remove_if_stale(self._folder / name)
                continue
            if not name.endswith(_SUFFIX) or SESSION_ID_PATTERN.fullmatch(name[: -len(_SUFFIX)]) is None:
                continue  # not ours
            seen.add(name)
            summary = self._summary(self._folder / name)
            if summary is not None:
                summaries.append(summary)
        with self._lock:
            for name in set(self._summaries) - seen:
                del self._summaries[name]
        # Sort on the parsed time: two zones, or a varying number of decimals, do not sort as text.
        summaries.sort(key=lambda item: item["id"])
        summaries.sort(key=lambda item: parse_timestamp(item["updated_at"], "updated_at"), reverse=True)
        return summaries

    @staticmethod
    def _remove_if_stale(path: Path) -> None:
        """Remove a temporary file left by a save that was killed, once no save can still be writing it."""
        try:
            if time.time() - os.stat(path, follow_symlinks=False).st_mtime > STALE_TEMP_SECONDS:
                os.unlink(path)
                logger.info("removed %s, left by a save that did not finish", path)
        except OSError:
            pass  # gone already, or not ours to remove: it is only clutter

    def _summary(self, path: Path) -> dict[str, Any] | None:
        try:
            info = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return None  # removed since the folder was listed
        except OSError as exc:
            logger.warning("skipping the session file %s: it cannot be read (%s)", path, exc.strerror)
            return None
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            cached = self._summaries.get(path.name)
        if cached is not None and cached[0] == identity:
            return dict(cached[1])
        try:
            session = _read_session(path)
        except FileNotFoundError:
            return None
        except UnusableFileError as exc:
            logger.warning("skipping the session file %s: it %s", path, exc)
            return None
        summary = {
            "id": session.id,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "label": session.label,
            "message_count": len(session.messages),
        }
        with self._lock:
            self._summaries[path.name] = (identity, summary)
        return dict(summary)

    def _make_folder(self) -> None:
        # Each level on its own, so both get 0700 (mkdir's mode applies to the last one only).
        self._folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._folder.mkdir(mode=0o700, exist_ok=True)


def _read_session(path: Path) -> ChatSession:
    """Read and check one session file.

    Raises:
        FileNotFoundError: There is no such file.
        UnusableFileError: It is not a usable session.
    """
    document = read_json_file(path, MAX_SESSION_FILE_BYTES)
    try:
        session = ChatSession.from_dict(document)
    except ValueError as exc:
        raise _CorruptSessionError(f"is not a valid session ({str(exc).rstrip('.')})") from None
    if session.id + _SUFFIX != path.name:
        raise _CorruptSessionError(f"holds session {session.id!r}, not the one its name says")
    return session
