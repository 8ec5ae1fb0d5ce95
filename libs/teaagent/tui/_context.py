"""What the next model call carries (``/context``), how a session is compacted (``/compact``), and
which turns count as simple enough for a cheaper model (``route_model``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from teaagent.session import ChatMessage

__all__ = [
    "CHARS_PER_TOKEN",
    "COMPACT_KEEP_MESSAGES",
    "COMPACT_MAX_TOKENS",
    "COMPACT_SYSTEM_PROMPT",
    "DEFAULT_CONTEXT_WINDOW",
    "SIMPLE_TURN_MAX_CHARS",
    "SUMMARY_PREFIX",
    "ContextSize",
    "compacted",
    "context_size",
    "is_simple_turn",
    "transcript",
]

CHARS_PER_TOKEN: Final = 4  # the rule of thumb teaagent.budget estimates with
DEFAULT_CONTEXT_WINDOW: Final = 128_000  # tokens, when [models.NAME] context_window does not say
COMPACT_KEEP_MESSAGES: Final = 2  # the last exchange stays word for word after a compaction
COMPACT_MAX_TOKENS: Final = 1024  # a summary, not a second transcript
SIMPLE_TURN_MAX_CHARS: Final = 200  # a question in a sentence or two
SUMMARY_PREFIX: Final = "Summary of the earlier conversation:"
COMPACT_SYSTEM_PROMPT: Final = (
    "You compact a conversation between a user and a coding agent. Write a short summary that keeps "
    "every decision, file name, command, open question and unfinished task the agent needs to go "
    "on. Write only the summary."
)
# Words that ask for work in the workspace: such a turn is never routed to a cheaper model.
_WORK_WORDS: Final = frozenset(
    {
        "add",
        "build",
        "change",
        "commit",
        "create",
        "debug",
        "delete",
        "deploy",
        "edit",
        "fix",
        "implement",
        "install",
        "migrate",
        "move",
        "refactor",
        "remove",
        "rename",
        "rewrite",
        "run",
        "test",
        "update",
        "write",
    }
)
_WORD = re.compile(r"[a-z]+")
_CODE_LIKE = re.compile(r"`|[\w-]+/[\w.-]+|\b\w+\.(?:py|js|ts|go|rs|toml|json|md|c|h|sh|yml|yaml)\b")


def is_simple_turn(text: str) -> bool:
    """Whether a turn may go to a cheaper model: short, one line, no code or path, no request for work.

    Args:
        text: What the user typed.
    """
    stripped = text.strip()
    if not stripped or len(stripped) > SIMPLE_TURN_MAX_CHARS or "\n" in stripped:
        return False
    if _CODE_LIKE.search(stripped):
        return False
    return not (set(_WORD.findall(stripped.lower())) & _WORK_WORDS)


@dataclass(frozen=True)
class ContextSize:
    """What the next model call would carry, roughly.

    Attributes:
        messages: Session messages sent again.
        message_chars: Their characters.
        system_chars: The system prompt's characters.
        tool_chars: The tool descriptions' characters.
        window: The model's context window, in tokens.
    """

    messages: int
    message_chars: int
    system_chars: int
    tool_chars: int
    window: int

    @property
    def tokens(self) -> int:
        """The estimated tokens of the whole call."""
        return (self.message_chars + self.system_chars + self.tool_chars) // CHARS_PER_TOKEN

    @property
    def percent(self) -> float:
        """How full the window would be."""
        return 100.0 * self.tokens / self.window if self.window else 0.0


def context_size(
    messages: Sequence[ChatMessage], system_prompt: str, tool_chars: int, window: int | None
) -> ContextSize:
    """Estimate the next call of a session: its messages, the system prompt and the tools."""
    return ContextSize(
        messages=len(messages),
        message_chars=sum(len(message.content) for message in messages),
        system_chars=len(system_prompt),
        tool_chars=tool_chars,
        window=window or DEFAULT_CONTEXT_WINDOW,
    )


def transcript(messages: Sequence[ChatMessage]) -> str:
    """The messages as one text for the model that summarises them."""
    return "\n\n".join(f"{message.role.upper()}: {message.content}" for message in messages)


def compacted(messages: Sequence[ChatMessage], summary: str) -> list[ChatMessage]:
    """The session's messages after a compaction: the summary, then the last exchange as it was."""
    kept = list(messages[-COMPACT_KEEP_MESSAGES:])
    return [ChatMessage("system", f"{SUMMARY_PREFIX} {summary.strip()}"), *kept]
