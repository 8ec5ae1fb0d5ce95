"""Chat sessions: messages, the focus stack, and the store that keeps them in the workspace.

A session is one JSON file, ``<root>/.teaagent/sessions/<id>.json`` (mode 0600), replaced
atomically on every save::

    {"version": 1, "id": "3f2a...", "created_at": "2026-06-05T12:00:00.000001Z",
     "updated_at": "2026-06-05T12:03:10.250000Z", "label": "fix the parser",
     "messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "...",
                   "tool_calls": [{"call_id": "c1", "tool_name": "fs.read", "arguments": {...}}]},
                  {"role": "tool", "content": "{...}", "tool_call_id": "c1", "tool_name": "fs.read"},
                  {"role": "assistant", "content": "..."}],
     "focus_stack": {"max_size": 32, "entries": [{"kind": "file", "value": "src/parse.py",
                     "note": "", "pushed_at": "2026-06-05T12:01:00.000000Z"}]}}

:meth:`SessionStore.load` returns None for a session that does not exist and raises
:class:`~teaagent.errors.ConfigError` (naming the file) for one that exists but cannot be used;
:meth:`SessionStore.list_sessions` skips such files and logs them instead.
"""

from __future__ import annotations

from teaagent.session._focus import (
    FOCUS_KINDS,
    MAX_FOCUS_ENTRIES,
    MAX_FOCUS_NOTE_CHARS,
    MAX_FOCUS_VALUE_CHARS,
    FocusEntry,
    FocusStackManager,
)
from teaagent.session._session import (
    MAX_LABEL_CHARS,
    MAX_TOOL_CALLS_PER_MESSAGE,
    MESSAGE_ROLES,
    SESSION_FORMAT_VERSION,
    SESSION_ID_PATTERN,
    ChatMessage,
    ChatSession,
    ChatToolCall,
    check_session_id,
    new_session,
)
from teaagent.session._store import MAX_SESSION_FILE_BYTES, SESSIONS_DIR, STALE_TEMP_SECONDS, SessionStore

__all__ = [
    "FOCUS_KINDS",
    "MAX_FOCUS_ENTRIES",
    "MAX_FOCUS_NOTE_CHARS",
    "MAX_FOCUS_VALUE_CHARS",
    "MAX_LABEL_CHARS",
    "MAX_SESSION_FILE_BYTES",
    "MAX_TOOL_CALLS_PER_MESSAGE",
    "MESSAGE_ROLES",
    "SESSIONS_DIR",
    "SESSION_FORMAT_VERSION",
    "SESSION_ID_PATTERN",
    "STALE_TEMP_SECONDS",
    "ChatMessage",
    "ChatSession",
    "ChatToolCall",
    "FocusEntry",
    "FocusStackManager",
    "SessionStore",
    "check_session_id",
    "new_session",
]
