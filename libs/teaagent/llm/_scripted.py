"""The ``scripted`` provider: an offline, deterministic model that replays a script of turns.

It needs no network and no key, so ``make demo``, the tests and anyone without an API key can run
the whole agent loop. Each model call (:meth:`ScriptedAdapter.complete`, :meth:`~ScriptedAdapter.stream`
or :meth:`~ScriptedAdapter.complete_streaming`) plays the next turn of the script.

A script is a JSON file: either a list of turns, or an object ``{"format": 1, "turns": [...]}``
(with an optional ``"description"``). A turn is an object with these keys, all optional::

    {
      "content": "Let me read it.",                      the reply's text
      "tool_calls": [                                    the tools the model calls
        {"tool_name": "fs.read", "arguments": {"path": "README.md"}, "call_id": "c1"}
      ],
      "stop_reason": "tool_use",                         default: tool_use with tool calls, else end_turn
      "input_tokens": 120, "output_tokens": 40,          default: about 4 characters per token
      "expect": ["# Hello"],                             text the conversation must hold by now
      "expect_tools": ["fs.read"],                       tools the request must offer
      "delay_seconds": 0.5                               how long the model "thinks" (latency)
    }

``expect`` catches wiring bugs: a turn that expects the text of a file the previous turn read
fails the call when that tool result never reached the model. A call of the agent loop past the
last turn fails too (:class:`~teaagent.errors.LLMError`), rather than inventing an answer, so a
loop that asks the model more often than the script says is caught. Unknown keys are refused, so a
typo cannot turn an expectation into a no-op.

A call that offers no tools (a compaction's summary, a side question, a health check) is not a step
of the agent loop. It plays the next turn when that turn calls no tool and expects none; otherwise
(the next turn is one of the loop's, or every turn was played) it gets an answer off the script,
which says that the scripted model plays a script and quotes the start of what it was asked, and
the script stays where it was.

Scripts that ship with teaagent (:data:`BUNDLED_SCRIPTS`, package data of ``teaagent.llm.scripts``)
are chosen by name wherever a script file is: :func:`load_script` takes either.

What a call costs comes from :func:`~teaagent.llm.price_for` (``scripted`` is free unless
``TEAAGENT_PRICES_FILE`` prices it, which is how tests exercise cost caps without a network).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

from teaagent._files import FileSentences, read_limited
from teaagent._json import JSONDepthError, parse_json
from teaagent.errors import ConfigError, LLMError
from teaagent.llm._pricing import price_for
from teaagent.llm._types import STOP_REASONS, LLMAdapter, LLMRequest, LLMResponse, LLMToolCall

__all__ = [
    "BUNDLED_SCRIPTS",
    "DEMO_SCRIPT",
    "MAX_SCRIPT_BYTES",
    "MAX_SCRIPT_TURNS",
    "SCRIPT_FORMAT",
    "ScriptedAdapter",
    "ScriptedToolCall",
    "ScriptedTurn",
    "load_script",
]

SCRIPT_FORMAT: Final = 1
MAX_SCRIPT_BYTES: Final = 4 * 1024 * 1024  # a conversation, not a data set
MAX_SCRIPT_TURNS: Final = 10_000  # far past any run budget (25 iterations by default)
MAX_DELAY_SECONDS: Final = 60.0  # a slow model, not a hung test
DEMO_SCRIPT: Final = "demo.json"
"""The script that ships with the package (``teaagent.llm.scripts``), played when none is given."""
BUNDLED_SCRIPTS: Final = ("demo", "quorum", "denied", "question")
"""The names of the scripts that ship with the package, each ``<name>.json`` in ``teaagent.llm.scripts``."""
_ASIDE_QUOTE_CHARS: Final = 300  # how much of an off-script call's last message its answer quotes
_CHARS_PER_TOKEN: Final = 4  # the rule of thumb teaagent.budget uses for its estimates too
_TURN_KEYS: Final = frozenset(
    {
        "content",
        "tool_calls",
        "stop_reason",
        "input_tokens",
        "output_tokens",
        "expect",
        "expect_tools",
        "delay_seconds",
    }
)
_CALL_KEYS: Final = frozenset({"tool_name", "arguments", "call_id"})
_DOCUMENT_KEYS: Final = frozenset({"format", "turns", "description"})
_WORDS = re.compile(r"\s*\S+\s*|\s+")


@dataclass(frozen=True)
class ScriptedToolCall:
    """One tool call of a scripted turn.

    Attributes:
        tool_name: The tool the model calls.
        arguments: Its arguments.
        call_id: The call's id; None to have one made up (``call_<turn>_<n>``).
    """

    tool_name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None


@dataclass(frozen=True)
class ScriptedTurn:
    """One reply of the scripted model.

    Attributes:
        content: The reply's text.
        tool_calls: The tools it calls, in order.
        stop_reason: One of :data:`~teaagent.llm.STOP_REASONS`; None for ``tool_use`` when the turn
            calls tools and ``end_turn`` otherwise.
        input_tokens: Prompt tokens to report; None to estimate them from the request.
        output_tokens: Generated tokens to report; None to estimate them from the reply.
        expect: Text that the conversation sent with this call must contain, each piece somewhere.
        expect_tools: Tool names that the call must offer the model.
        delay_seconds: How long the call takes before it answers.

    Raises:
        ValueError: A field is out of range.
    """

    content: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    expect: tuple[str, ...] = ()
    expect_tools: tuple[str, ...] = ()
    delay_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.stop_reason is not None and self.stop_reason not in STOP_REASONS:
            raise ValueError(
                f"A stop reason must be one of {', '.join(STOP_REASONS)}, not {self.stop_reason!r}."
            )
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be an int >= 0, not {value!r}.")
        delay = self.delay_seconds
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not 0 <= delay <= MAX_DELAY_SECONDS
        ):
            raise ValueError(
                f"delay_seconds must be a number from 0 to {MAX_DELAY_SECONDS:g}, not {delay!r}."
            )


def _fail(source: str, where: str, message: str) -> ConfigError:
    return ConfigError(f"The script {source}: {where} {message}")


def _string_list(source: str, where: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _fail(source, where, "must be a string or a list of strings.")
    return tuple(value)


def _parse_call(source: str, where: str, raw: object) -> ScriptedToolCall:
    if not isinstance(raw, dict):
        raise _fail(source, where, "must be an object with tool_name and arguments.")
    unknown = sorted(set(raw) - _CALL_KEYS)
    if unknown:
        raise _fail(source, where, f"has unknown keys: {', '.join(unknown)}.")
    name = raw.get("tool_name")
    if not isinstance(name, str) or not name:
        raise _fail(source, f"{where}.tool_name", "must be a non-empty string.")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        raise _fail(source, f"{where}.arguments", "must be an object.")
    call_id = raw.get("call_id")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise _fail(source, f"{where}.call_id", "must be a non-empty string.")
    return ScriptedToolCall(tool_name=name, arguments=arguments, call_id=call_id)


def _parse_turn(source: str, number: int, raw: object) -> ScriptedTurn:
    where = f"turn {number}"
    if not isinstance(raw, dict):
        raise _fail(source, where, "must be an object.")
    unknown = sorted(set(raw) - _TURN_KEYS)
    if unknown:
        raise _fail(source, where, f"has unknown keys: {', '.join(unknown)}.")
    content = raw.get("content", "")
    if not isinstance(content, str):
        raise _fail(source, f"{where}.content", "must be a string.")
    calls = raw.get("tool_calls", [])
    if not isinstance(calls, list):
        raise _fail(source, f"{where}.tool_calls", "must be a list.")
    try:
        return ScriptedTurn(
            content=content,
            tool_calls=tuple(
                _parse_call(source, f"{where}.tool_calls[{index}]", call) for index, call in enumerate(calls)
            ),
            stop_reason=raw.get("stop_reason"),
            input_tokens=raw.get("input_tokens"),
            output_tokens=raw.get("output_tokens"),
            expect=_string_list(source, f"{where}.expect", raw.get("expect", [])),
            expect_tools=_string_list(source, f"{where}.expect_tools", raw.get("expect_tools", [])),
            delay_seconds=raw.get("delay_seconds", 0.0),
        )
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise _fail(source, where, f"is invalid: {str(exc).rstrip('.')}.") from exc


def parse_script(document: object, *, source: str = "<script>") -> tuple[ScriptedTurn, ...]:
    """Check a decoded script and return its turns.

    Args:
        document: The decoded JSON: a list of turns, or ``{"format": 1, "turns": [...]}``.
        source: Where it came from, for messages.

    Returns:
        The turns, in order.

    Raises:
        ConfigError: The script is malformed; the message names the turn and the key.
    """
    if isinstance(document, dict):
        unknown = sorted(set(document) - _DOCUMENT_KEYS)
        if unknown:
            raise ConfigError(f"The script {source} has unknown keys: {', '.join(unknown)}.")
        if document.get("format", SCRIPT_FORMAT) != SCRIPT_FORMAT:
            raise ConfigError(f'The script {source} must say "format": {SCRIPT_FORMAT}.')
        turns = document.get("turns")
    else:
        turns = document
    if not isinstance(turns, list):
        raise ConfigError(f'The script {source} must be a list of turns or an object with a "turns" list.')
    if len(turns) > MAX_SCRIPT_TURNS:
        raise ConfigError(f"The script {source} has more than {MAX_SCRIPT_TURNS} turns.")
    return tuple(_parse_turn(source, number, raw) for number, raw in enumerate(turns, start=1))


def _request_text(request: LLMRequest) -> str:
    """The conversation as one text, for ``expect``: every message's content and tool calls."""
    parts: list[str] = []
    for message in request.messages:
        parts.append(message.content)
        for call in message.tool_calls or ():
            parts.append(f"{call.tool_name} {json.dumps(call.arguments, ensure_ascii=False)}")
    return "\n".join(parts)


def _tokens(chars: int) -> int:
    return -(-chars // _CHARS_PER_TOKEN)


class ScriptedAdapter(LLMAdapter):
    """An offline model that replays a script, one turn per call; safe to share between threads.

    Args:
        turns: The script's turns (:class:`ScriptedTurn`, or dicts in the file's format).
        model: The model name it reports, and prices with :func:`~teaagent.llm.price_for`.
        source: Where the script came from, for messages.

    Raises:
        ConfigError: A turn given as a dict is malformed.
        TypeError: A turn is neither a :class:`ScriptedTurn` nor a dict.
    """

    provider: Final = "scripted"

    def __init__(
        self,
        turns: Sequence[ScriptedTurn | Mapping[str, Any]],
        *,
        model: str = "scripted",
        source: str = "<script>",
    ) -> None:
        parsed: list[ScriptedTurn] = []
        for number, turn in enumerate(turns, start=1):
            if isinstance(turn, ScriptedTurn):
                parsed.append(turn)
            elif isinstance(turn, Mapping):
                parsed.append(_parse_turn(source, number, dict(turn)))
            else:
                raise TypeError(
                    f"A scripted turn must be a ScriptedTurn or a dict, not {type(turn).__name__}."
                )
        self._turns = tuple(parsed)
        self.model = model
        self.source = source
        self._position = 0
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: str | Path, *, model: str = "scripted") -> ScriptedAdapter:
        """Load a script from a JSON file.

        Args:
            path: The script file.
            model: The model name to report.

        Returns:
            The adapter, at its first turn.

        Raises:
            ConfigError: The file cannot be read, is too large, is not JSON, or is malformed.
        """
        path = Path(path)
        raw = read_limited(path, MAX_SCRIPT_BYTES, FileSentences.named("The script", path, MAX_SCRIPT_BYTES))
        return cls.from_json(raw, model=model, source=str(path))

    @classmethod
    def from_json(
        cls, text: str | bytes, *, model: str = "scripted", source: str = "<script>"
    ) -> ScriptedAdapter:
        """Load a script from its JSON text.

        Args:
            text: The script's JSON.
            model: The model name to report.
            source: Where it came from, for messages.

        Returns:
            The adapter, at its first turn.

        Raises:
            ConfigError: The text is not JSON or the script is malformed.
        """
        try:
            document = parse_json(text, what=f"The script {source}")
        except JSONDepthError as exc:
            raise ConfigError(str(exc)) from None
        except ValueError as exc:  # not JSON, not UTF-8, an integer too long to read
            raise ConfigError(f"The script {source} is not valid JSON: {exc}.") from None
        return cls(parse_script(document, source=source), model=model, source=source)

    @classmethod
    def demo(cls, *, model: str = "scripted") -> ScriptedAdapter:
        """The script played when none is given: list the workspace, then answer.

        Args:
            model: The model name to report.

        Returns:
            The adapter, at its first turn.
        """
        return cls.bundled("demo", model=model)

    @classmethod
    def bundled(cls, name: str, *, model: str = "scripted") -> ScriptedAdapter:
        """A script that ships with teaagent, by its name (one of :data:`BUNDLED_SCRIPTS`).

        Args:
            name: The script's name, without ``.json``.
            model: The model name to report.

        Returns:
            The adapter, at its first turn.

        Raises:
            ConfigError: No bundled script has that name.
        """
        if name not in BUNDLED_SCRIPTS:
            raise ConfigError(
                f"There is no bundled script {name!r}; the bundled scripts are {', '.join(BUNDLED_SCRIPTS)}."
            )
        text = resources.files("teaagent.llm.scripts").joinpath(f"{name}.json").read_bytes()
        return cls.from_json(text, model=model, source=f"{name} (bundled)")

    @property
    def turns(self) -> tuple[ScriptedTurn, ...]:
        """The whole script."""
        return self._turns

    @property
    def position(self) -> int:
        """How many turns have been played."""
        with self._lock:
            return self._position

    @property
    def remaining(self) -> int:
        """How many turns are left."""
        with self._lock:
            return len(self._turns) - self._position

    def reset(self) -> None:
        """Start the script again from its first turn."""
        with self._lock:
            self._position = 0

    def _aside(self, request: LLMRequest) -> ScriptedTurn:
        """The answer to a call that offers no tools and that the script has no turn for."""
        asked = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        asked = " ".join(asked.split())
        if len(asked) > _ASIDE_QUOTE_CHARS:
            asked = asked[: _ASIDE_QUOTE_CHARS - 1] + "…"
        return ScriptedTurn(
            content=(
                f"An offline answer of the scripted model, which plays the script {self.source} and "
                f"understands nothing: what it was asked begins «{asked}». A real provider (anthropic, "
                "openai, openai-compatible) answers it properly."
            )
        )

    async def _play(self, request: LLMRequest) -> tuple[int, ScriptedTurn]:
        """The next turn (see :meth:`_next_turn`), once its ``delay_seconds`` have passed."""
        number, turn = self._next_turn(request)
        if turn.delay_seconds:
            await asyncio.sleep(turn.delay_seconds)
        return number, turn

    def _next_turn(self, request: LLMRequest) -> tuple[int, ScriptedTurn]:
        with self._lock:
            number = self._position + 1
            if not request.tools and (
                number > len(self._turns)
                or self._turns[number - 1].tool_calls
                or self._turns[number - 1].expect_tools
            ):
                # Not a step of the agent loop (a summary, a side question): answered off the script.
                return 0, self._aside(request)
            if number > len(self._turns):
                played = len(self._turns)
                noun = "turn was" if played == 1 else "turns were"
                raise LLMError(f"The script {self.source} has no turn {number}: all {played} {noun} played.")
            turn = self._turns[number - 1]
            self._position = number
        if turn.expect:
            text = _request_text(request)
            for piece in turn.expect:
                if piece not in text:
                    raise LLMError(
                        f"Turn {number} of the script {self.source} expects the conversation to contain "
                        f"{piece!r}, but it does not."
                    )
        if turn.expect_tools:
            offered = {str(tool.get("name")) for tool in request.tools or ()}
            missing = [name for name in turn.expect_tools if name not in offered]
            if missing:
                raise LLMError(
                    f"Turn {number} of the script {self.source} expects the tools {', '.join(missing)} "
                    "to be offered, but they are not."
                )
        return number, turn

    def _response(self, number: int, turn: ScriptedTurn, request: LLMRequest) -> LLMResponse:
        calls = [
            LLMToolCall(
                call_id=call.call_id or f"call_{number}_{index}",
                tool_name=call.tool_name,
                arguments=json.loads(json.dumps(call.arguments)),  # each call gets its own copy
            )
            for index, call in enumerate(turn.tool_calls, start=1)
        ]
        if turn.input_tokens is not None:
            input_tokens = turn.input_tokens
        else:
            chars = sum(len(message.content) for message in request.messages)
            input_tokens = _tokens(chars + (len(json.dumps(request.tools)) if request.tools else 0))
        if turn.output_tokens is not None:
            output_tokens = turn.output_tokens
        else:
            written = len(turn.content) + sum(
                len(call.tool_name) + len(json.dumps(call.arguments)) for call in turn.tool_calls
            )
            output_tokens = _tokens(written)
        price = price_for(self.provider, request.model or self.model)
        cost = (input_tokens * price.input_per_1k + output_tokens * price.output_per_1k) * 100 / 1000
        return LLMResponse(
            content=turn.content,
            stop_reason=turn.stop_reason or ("tool_use" if calls else "end_turn"),
            tool_calls=calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_cents=cost,
        )

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Play the next turn and return it as the model's reply.

        Args:
            request: The call; ``expect`` and ``expect_tools`` are checked against it.

        Returns:
            The turn's text, tool calls, token counts and cost.

        Raises:
            LLMError: The script has no turn left, or the turn's expectations are not met.
            ConfigError: ``TEAAGENT_PRICES_FILE`` names a missing or malformed price file.
        """
        number, turn = await self._play(request)
        return self._response(number, turn, request)

    async def complete_streaming(self, request: LLMRequest, on_text: Callable[[str], object]) -> LLMResponse:
        """Play the next turn, handing its text to ``on_text`` word by word, and return the whole reply.

        Args:
            request: The call.
            on_text: Called with each piece of the reply's text, in order (never with ``""``).

        Returns:
            The reply, as :meth:`complete` returns it.

        Raises:
            LLMError: The script has no turn left, or the turn's expectations are not met.
        """
        number, turn = await self._play(request)
        for piece in _WORDS.findall(turn.content):
            on_text(piece)
        return self._response(number, turn, request)

    async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
        """Play the next turn and yield its text word by word (its tool calls are not part of a stream).

        Args:
            request: The call.

        Yields:
            Pieces of the reply's text, which joined together are the whole text.

        Raises:
            LLMError: The script has no turn left, or the turn's expectations are not met.
        """
        _, turn = await self._play(request)
        for piece in _WORDS.findall(turn.content):
            yield piece


def load_script(script: str | os.PathLike[str], *, model: str = "scripted") -> ScriptedAdapter:
    """A script by its bundled name (:data:`BUNDLED_SCRIPTS`) or its file.

    A value that is exactly a bundled name is that script; anything else is a file's path (write
    ``./quorum`` for a file that happens to be named like a bundled script).

    Args:
        script: A bundled script's name, or the path of a script file.
        model: The model name to report.

    Returns:
        The adapter, at its first turn.

    Raises:
        ConfigError: The file cannot be read or is malformed; for a missing file whose name looks
            like a script's name, the sentence lists the bundled names.
    """
    text = os.fspath(script)
    if text in BUNDLED_SCRIPTS:
        return ScriptedAdapter.bundled(text, model=model)
    path = Path(text)
    if not path.exists() and os.sep not in text and not path.suffix:
        raise ConfigError(
            f"There is no script file {text!r} and no bundled script of that name; the bundled "
            f"scripts are {', '.join(BUNDLED_SCRIPTS)}."
        )
    return ScriptedAdapter.from_file(path, model=model)
