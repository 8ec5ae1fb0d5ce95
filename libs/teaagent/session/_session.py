"""Chat messages and sessions, and the dictionaries a session file holds."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from teaagent._files import FILE_ID_PATTERN, check_file_id
from teaagent.session._focus import FocusStackManager
from teaagent.session._time import parse_timestamp, utc_now

__all__ = [
    "MAX_LABEL_CHARS",
    "MAX_TOOL_CALLS_PER_MESSAGE",
    "MESSAGE_ROLES",
    "SESSION_FORMAT_VERSION",
    "SESSION_ID_PATTERN",
    "ChatMessage",
    "ChatSession",
    "ChatToolCall",
    "check_session_id",
    "new_session",
]

#: Who wrote a message: ``tool`` is a tool call's result, as the run that called it recorded it.
MESSAGE_ROLES: Final = ("user", "assistant", "system", "tool")
MAX_TOOL_CALLS_PER_MESSAGE: Final = 1000  # far beyond any model's reply; a file claiming more is not one
#: A session id names its file: letters, digits, ``_`` and ``-`` only, so no id reaches outside the folder.
SESSION_ID_PATTERN: Final = FILE_ID_PATTERN
MAX_LABEL_CHARS: Final = 500  # a title a list can show, as the agent HTTP API allows
SESSION_FORMAT_VERSION: Final = 1

_MESSAGE_FIELDS: Final = frozenset({"role", "content"})
_MESSAGE_EXTRA_FIELDS: Final = frozenset({"tool_calls", "tool_call_id", "tool_name", "ok"})
_TOOL_CALL_FIELDS: Final = frozenset({"call_id", "tool_name", "arguments"})
_SESSION_FIELDS: Final = frozenset(
    {"version", "id", "created_at", "updated_at", "label", "messages", "focus_stack"}
)


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` once it can name a session file (:func:`~teaagent._files.check_file_id`)."""
    return check_file_id(session_id, "session id")


@dataclass(frozen=True)
class ChatToolCall:
    """One tool call an assistant message asked for.

    Attributes:
        call_id: The call's id in its run (the ``tool_call_id`` of the ``tool`` message with its result).
        tool_name: The tool.
        arguments: Its arguments, as the model gave them.
    """

    call_id: str
    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"call_id": self.call_id, "tool_name": self.tool_name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: object) -> ChatToolCall:
        if (
            not isinstance(data, Mapping)
            or set(data) != _TOOL_CALL_FIELDS
            or not isinstance(data["call_id"], str)
            or not isinstance(data["tool_name"], str)
            or not isinstance(data["arguments"], dict)
        ):
            raise ValueError("a tool call must be an object of a 'call_id', a 'tool_name' and 'arguments'.")
        return cls(call_id=data["call_id"], tool_name=data["tool_name"], arguments=dict(data["arguments"]))


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation.

    A run records its tool calls too: the assistant message that asked for them carries
    ``tool_calls``, and each result is a ``tool`` message naming its call (``tool_call_id``,
    ``tool_name``, ``ok``). Only the text of the ``user``, ``system`` and plain ``assistant``
    messages is sent to the model again when the session goes on (:attr:`conversational`).

    Attributes:
        role: ``'user'``, ``'assistant'``, ``'system'`` or ``'tool'``.
        content: The text (a ``tool`` message's: the result the model was given).
        tool_calls: The calls an ``assistant`` message asked for.
        tool_call_id: The call a ``tool`` message answers.
        tool_name: The tool of a ``tool`` message.
        ok: False for a ``tool`` message whose call failed or was refused.

    Raises:
        ValueError: ``role`` is not one of :data:`MESSAGE_ROLES`.
        TypeError: ``content`` is not a string.
    """

    role: str
    content: str
    tool_calls: tuple[ChatToolCall, ...] = field(default=(), kw_only=True)
    tool_call_id: str | None = field(default=None, kw_only=True)
    tool_name: str | None = field(default=None, kw_only=True)
    ok: bool = field(default=True, kw_only=True)

    def __post_init__(self) -> None:
        if self.role not in MESSAGE_ROLES:
            raise ValueError(f"message role {self.role!r} is not one of {', '.join(MESSAGE_ROLES)}.")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be a string, not {type(self.content).__name__}.")
        if not isinstance(self.tool_calls, tuple) or not all(
            isinstance(call, ChatToolCall) for call in self.tool_calls
        ):
            raise TypeError("a message's tool_calls must be a tuple of ChatToolCall.")

    @property
    def conversational(self) -> bool:
        """Whether the message is sent to the model again: not a tool call, nor a tool's result."""
        return self.role != "tool" and not self.tool_calls

    def to_dict(self) -> dict[str, Any]:
        """Return the message as stored in a session file (the tool keys only when it has them)."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        if self.tool_name is not None:
            data["tool_name"] = self.tool_name
        if not self.ok:
            data["ok"] = False
        return data

    @classmethod
    def from_dict(cls, data: object) -> ChatMessage:
        """Rebuild a message from :meth:`to_dict`'s output.

        Raises:
            ValueError: ``data`` is not an object with ``role`` and ``content`` (and, besides, only
                the tool keys), or one is invalid.
        """
        if (
            not isinstance(data, Mapping)
            or not set(data) >= _MESSAGE_FIELDS
            or not set(data) <= _MESSAGE_FIELDS | _MESSAGE_EXTRA_FIELDS
        ):
            raise ValueError(
                "a message must be an object with exactly the keys 'content' and 'role', and its "
                "tool keys ('tool_calls', 'tool_call_id', 'tool_name', 'ok')."
            )
        calls = data.get("tool_calls", [])
        if not isinstance(calls, list) or len(calls) > MAX_TOOL_CALLS_PER_MESSAGE:
            raise ValueError(
                f"a message's tool_calls must be a list of at most {MAX_TOOL_CALLS_PER_MESSAGE}."
            )
        for key in ("tool_call_id", "tool_name"):
            if key in data and not isinstance(data[key], str):
                raise ValueError(f"a message's {key} must be a string.")
        if "ok" in data and not isinstance(data["ok"], bool):
            raise ValueError("a message's ok must be true or false.")
        try:
            return cls(
                role=data["role"],
                content=data["content"],
                tool_calls=tuple(ChatToolCall.from_dict(call) for call in calls),
                tool_call_id=data.get("tool_call_id"),
                tool_name=data.get("tool_name"),
                ok=data.get("ok", True),
            )
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

    def add_message(self, role: str, content: str, **tool: Any) -> ChatMessage:
        """Append a message and move :attr:`updated_at` to now.

        Args:
            role: Who wrote it.
            content: The text.
            tool: The tool fields of :class:`ChatMessage` (``tool_calls``, ``tool_call_id``,
                ``tool_name``, ``ok``).

        Returns:
            The new message.

        Raises:
            ValueError: ``role`` is not one of :data:`MESSAGE_ROLES`.
            TypeError: ``content`` is not a string, or a tool field is wrong.
        """
        message = ChatMessage(role=role, content=content, **tool)
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
