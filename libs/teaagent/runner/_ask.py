"""The runner's built-in ``ask_user`` tool: the model asks the user a question and waits for the answer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "ASK_USER_REFUSAL",
    "ASK_USER_SPEC",
    "ASK_USER_TOOL",
    "MAX_QUESTION_CHARS",
    "MAX_QUESTION_OPTIONS",
    "AskCallback",
    "Question",
    "answer_of",
    "question_of",
]

_log = logging.getLogger("teaagent.runner")

MAX_QUESTION_CHARS: Final = 2000  # a question for a person, not a document
MAX_QUESTION_OPTIONS: Final = 10
ASK_USER_TOOL: Final = "ask_user"
"""The built-in tool the model calls to ask the user a question."""
ASK_USER_SPEC: Final[dict[str, Any]] = {
    "name": ASK_USER_TOOL,
    "description": (
        "Ask the user a question and wait for the answer. Use it only when the task cannot go on "
        'without the user\'s decision. The result is {"answer": "..."}, or {"declined": true} when '
        "the user is not there or chose not to answer."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "question": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS},
            "options": {
                "type": "array",
                "items": {"type": "string"},
                "maxItems": MAX_QUESTION_OPTIONS,
                "description": "Answers to choose from, when the question has a few.",
            },
        },
        "required": ["question"],
        "additionalProperties": False,
    },
}


@dataclass(frozen=True, kw_only=True)
class Question:
    """A question the model asks the user (the ``ask_user`` tool).

    Attributes:
        call_id: The tool call that asks it.
        question: The question.
        options: Answers to choose from; empty for a free answer.
        run_id: The run that asks.
    """

    call_id: str
    question: str
    options: tuple[str, ...]
    run_id: str


AskCallback = Callable[[Question], "str | None"]
"""Answers a question: the answer's text, or None to decline. It may block; an exception declines."""


ASK_USER_REFUSAL: Final = (
    f"{ASK_USER_TOOL} takes a question of 1 to {MAX_QUESTION_CHARS} characters and at most "
    f"{MAX_QUESTION_OPTIONS} string options."
)


def question_of(arguments: object) -> tuple[str, tuple[str, ...]] | None:
    """The question and its options an ``ask_user`` call asks, or None when they are malformed."""
    if not isinstance(arguments, dict):
        return None  # no question in it: refused like any malformed question
    question = arguments.get("question")
    options = arguments.get("options", [])
    if (
        not isinstance(question, str)
        or not question.strip()
        or len(question) > MAX_QUESTION_CHARS
        or not isinstance(options, list)
        or len(options) > MAX_QUESTION_OPTIONS
        or not all(isinstance(option, str) for option in options)
    ):
        return None
    return question, tuple(options)


async def answer_of(ask: AskCallback | None, question: Question) -> str | None:
    """The user's answer through ``ask``, in a worker thread; None: no callback, declined, or failed."""
    if ask is None:
        return None
    try:
        raw = await asyncio.to_thread(ask, question)
    except Exception:
        _log.exception("the ask callback failed; the question is declined")
        return None
    return raw if isinstance(raw, str) else None
