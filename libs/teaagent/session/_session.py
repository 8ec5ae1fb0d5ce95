"""Chat messages and sessions, and the dictionaries a session file holds."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from teaagent.session._focus import FocusStackManager
from teaagent.session._time import parse_timestamp, utc_now

__all__ = [
    "MAX_LABEL_CHARS",
    "MESSAGE_ROLES",
    "SESSION_FORMAT_VERSION",
    "SESSION_ID_PATTERN",
    "ChatMessage",
    "ChatSession",
    "check_session_id",
    "new_session",
]

#: Who wrote a message.
MESSAGE_ROLES: Final = ("user", "assistant", "system")
#: A session id names its file: letters, digits, ``_`` and ``-`` only, so no id reaches outside the folder.
SESSION_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_LABEL_CHARS: Final = 500  # a title a list can show, as the agent HTTP API allows
SESSION_FORMAT_VERSION: Final = 1

_MESSAGE_FIELDS: Final = frozenset({"role", "content"})
_SESSION_FIELDS: Final = frozenset(
    {"version", "id", "created_at", "updated_at", "label", "messages", "focus_stack"}
)


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` after checking it can name a session file.

    Raises:
        ValueError: It is not 1 to 64 letters, digits, ``_`` or ``-``.
    """
    if not isinstance(session_id, str) or SESSION_ID_PATTERN.fullmatch(session_id) is None:
        raise ValueError(f"session id {session_id!r} must be 1 to 64 letters, digits, '_' or '-'.")
    return session_id


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation.

    Attributes:
        role: ``'user'``, ``'assistant'`` or ``'system'``.
        content: The text.

    Raises:
        ValueError: ``role`` is not one of :data:`MESSAGE_ROLES`.
        TypeError: ``content`` is not a string.
    """

    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in MESSAGE_ROLES:
            raise ValueError(f"message role {self.role!r} is not one of {', '.join(MESSAGE_ROLES)}.")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be a string, not {type(self.content).__name__}.")

    def to_dict(self) -> dict[str, str]:
        """Return the message as stored in a session file."""
        return {"role": self.role, "content": self.content}

    @classmethod
    def from_dict(cls, data: object) -> ChatMessage:
        """Rebuild a message from :meth:`to_dict`'s output.

        Raises:
            ValueError: ``data`` is not an object with exactly ``role`` and ``content``, or one is invalid.
        """
        if not isinstance(data, Mapping) or set(data) != _MESSAGE_FIELDS:
            raise ValueError("a message must be an object with exactly the keys 'content' and 'role'.")
        try:
            return cls(role=data["role"], content=data["content"])
        except TypeError as exc:
            raise ValueError(str(exc)) from None


@dataclass
class ChatSession:
    """A conversation and what it is focused on.

    Not thread-safe (its :attr:`focus_stack` is): one session belongs to one conversation loop.

    Attributes:
        id: The session id, 1 to 64 letters, digits, ``_`` or ``-``; it names the session's file.
        created_at: When the session began, ISO 8601 with a time zone.
        updated_at: When it last changed, ISO 8601 with a time zone (:meth:`add_message` moves it).
        messages: The conversation, oldest first.
        label: A title for lists, at most :data:`MAX_LABEL_CHARS` characters.
        focus_stack: The files and sub-tasks the session is focused on.

    Raises:
        ValueError: ``id``, a timestamp or ``label`` is invalid.
        TypeError: ``messages`` is not a list of :class:`ChatMessage` or ``focus_stack`` is not a
            :class:`FocusStackManager`.
    """

    id: str
    created_at: str
    updated_at: str
    messages: list[ChatMessage] = field(default_factory=list)
    label: str = ""
    focus_stack: FocusStackManager = field(default_factory=FocusStackManager)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field again (the dataclass is mutable; :meth:`SessionStore.save` calls this).

        Raises:
            ValueError: ``id``, a timestamp or ``label`` is invalid.
            TypeError: ``messages`` or ``focus_stack`` has the wrong type.
        """
        check_session_id(self.id)
        parse_timestamp(self.created_at, "created_at")
        parse_timestamp(self.updated_at, "updated_at")
        if not isinstance(self.messages, list) or not all(isinstance(m, ChatMessage) for m in self.messages):
            raise TypeError("a session's messages must be a list of ChatMessage.")
        if not isinstance(self.label, str):
            raise ValueError(f"a session label must be a string, not {type(self.label).__name__}.")
        if len(self.label) > MAX_LABEL_CHARS:
            raise ValueError(f"a session label is limited to {MAX_LABEL_CHARS} characters.")
        if not isinstance(self.focus_stack, FocusStackManager):
            raise TypeError(
                f"focus_stack must be a FocusStackManager, not {type(self.focus_stack).__name__}."
            )

    def add_message(self, role: str, content: str) -> ChatMessage:
        """Append a message and move :attr:`updated_at` to now.

        Returns:
            The new message.

        Raises:
            ValueError: ``role`` is not one of :data:`MESSAGE_ROLES`.
            TypeError: ``content`` is not a string.
        """
        message = ChatMessage(role=role, content=content)
        self.messages.append(message)
        self.updated_at = utc_now()
        return message

    def to_dict(self) -> dict[str, Any]:
        """Return the session as its file stores it (with a ``version`` key)."""
        return {
            "version": SESSION_FORMAT_VERSION,
            "id": self.id,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "label": self.label,
            "messages": [message.to_dict() for message in self.messages],
            "focus_stack": self.focus_stack.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: object) -> ChatSession:
        """Rebuild a session from :meth:`to_dict`'s output.

        Raises:
            ValueError: ``data`` is not a session of format version :data:`SESSION_FORMAT_VERSION`,
                or a field is invalid.
        """
        if not isinstance(data, Mapping) or set(data) != _SESSION_FIELDS:
            raise ValueError(f"a session must be an object with exactly the keys {sorted(_SESSION_FIELDS)}.")
        if data["version"] != SESSION_FORMAT_VERSION:
            raise ValueError(f"session format version {data['version']!r} is not {SESSION_FORMAT_VERSION}.")
        messages = data["messages"]
        if not isinstance(messages, list):
            raise ValueError("a session's messages must be a list.")
        try:
            return cls(
                id=data["id"],
                created_at=data["created_at"],
                updated_at=data["updated_at"],
                messages=[ChatMessage.from_dict(item) for item in messages],
                label=data["label"],
                focus_stack=FocusStackManager.from_dict(data["focus_stack"]),
            )
        except TypeError as exc:
            raise ValueError(str(exc)) from None


def new_session(label: str = "", *, session_id: str | None = None) -> ChatSession:
    """Start an empty session whose ``created_at`` and ``updated_at`` are now.

    Args:
        label: A title for lists.
        session_id: The id; None for a fresh random one (32 hex characters).

    Raises:
        ValueError: ``label`` is too long or ``session_id`` is invalid.
    """
    now = utc_now()
    return ChatSession(
        id=uuid.uuid4().hex if session_id is None else session_id,
        created_at=now,
        updated_at=now,
        label=label,
    )
