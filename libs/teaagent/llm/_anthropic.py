"""Anthropic's Messages API.

Wire format (``POST {base_url}/v1/messages``, headers ``x-api-key`` and ``anthropic-version``):

* the system prompt is the top-level ``system`` field, not a message; every ``system`` message of
  the conversation goes there, in order;
* an assistant turn that called tools carries ``tool_use`` blocks (``{"id", "name", "input"}``);
  the results go back in the next user turn as ``tool_result`` blocks (``{"tool_use_id",
  "content"}``), before any text, so consecutive tool results and user text are merged into one
  user turn;
* tools: ``{"name", "description", "input_schema"}``, names with ``.`` sent as ``_`` (Anthropic
  requires ``^[a-zA-Z0-9_-]{1,64}$``; see :mod:`teaagent.llm._http`);
* a reply: ``content`` blocks (``text``, ``tool_use``), ``stop_reason``, ``usage``;
* a stream: ``message_start`` (input tokens), ``content_block_start`` (a text block, or a
  ``tool_use`` block with its id and name), ``content_block_delta`` (``text_delta`` text or
  ``input_json_delta`` pieces of the tool input's JSON), ``content_block_stop``, ``message_delta``
  (``stop_reason`` and the cumulative ``usage``), ``message_stop``; ``ping`` and ``error`` events
  may come at any time.

Stop reasons: ``end_turn``, ``tool_use`` and ``max_tokens`` map to themselves,
``model_context_window_exceeded`` to ``max_tokens``; ``stop_sequence``, ``pause_turn`` and
``refusal`` end the turn. Input tokens include tokens written to and read from the prompt cache.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from teaagent.errors import LLMError
from teaagent.llm._http import HTTPAdapter, ParsedReply, json_event, token_count, tool_choice, wire_tools
from teaagent.llm._types import LLMRequest, LLMToolCall

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from teaagent.llm._http import HTTPOptions, SSEEvent, ToolNameMap

__all__ = ["ANTHROPIC_VERSION", "DEFAULT_MAX_TOKENS", "AnthropicAdapter"]

#: The Messages API version every request asks for.
ANTHROPIC_VERSION: Final = "2023-06-01"
#: Sent when a request leaves ``max_tokens`` to the adapter: Anthropic requires the field.
DEFAULT_MAX_TOKENS: Final = 8192  # room for a whole file written in one tool call

_STOP_REASONS: Final = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "model_context_window_exceeded": "max_tokens",
    "stop_sequence": "end_turn",
    "pause_turn": "end_turn",
    "refusal": "end_turn",
}
_CACHE_INPUT_KEYS: Final = ("cache_creation_input_tokens", "cache_read_input_tokens")


class AnthropicAdapter(HTTPAdapter):
    """Calls Anthropic's Messages API with httpx.

    Args:
        model: The model used when a request's ``model`` is empty.
        default_max_tokens: Sent when a request's ``max_tokens`` is None.
        options: The keywords of :class:`~teaagent.llm._http.HTTPAdapter`; ``api_key`` is sent as
            ``x-api-key``, ``/v1/messages`` is appended to ``base_url``; the defaults are the
            ``anthropic`` provider's (``https://api.anthropic.com``, ``ANTHROPIC_API_KEY``).

    Raises:
        ValueError: ``max_attempts`` or ``default_max_tokens`` is below 1.
    """

    PROVIDER = "anthropic"

    def __init__(
        self, *, model: str, default_max_tokens: int = DEFAULT_MAX_TOKENS, **options: Unpack[HTTPOptions]
    ) -> None:
        if isinstance(default_max_tokens, bool) or default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be an int >= 1, not {default_max_tokens!r}.")
        super().__init__(model=model, **options)
        self._default_max_tokens = default_max_tokens

    @property
    def endpoint(self) -> str:
        """``{base_url}/v1/messages``."""
        return f"{self.base_url}/v1/messages"

    def headers(self) -> dict[str, str]:
        """The API version, and the key when there is one."""
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def build_body(
        self, request: LLMRequest, names: ToolNameMap, *, model: str, stream: bool
    ) -> dict[str, Any]:
        """Return the Messages body for ``request``; errors as :meth:`HTTPAdapter.build_body`."""
        system: list[str] = []
        turns: list[dict[str, Any]] = []
        for message in request.messages:
            if message.role == "system":
                system.append(message.content)
                continue
            blocks: list[dict[str, Any]] = []
            if message.role == "tool":
                role = "user"
                blocks.append(
                    {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}
                )
            else:
                role = message.role
                # Anthropic refuses an empty text block; a turn of tool calls alone has none.
                if message.content:
                    blocks.append({"type": "text", "text": message.content})
                for call in message.tool_calls or []:
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": call.call_id,
                            "name": names.to_wire(call.tool_name),
                            "input": call.arguments,
                        }
                    )
            if not blocks:
                continue
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"].extend(blocks)
            else:
                turns.append({"role": role, "content": blocks})
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": request.max_tokens if request.max_tokens is not None else self._default_max_tokens,
            "messages": turns,
            "temperature": request.temperature,
        }
        if system:
            body["system"] = "\n\n".join(system)
        if request.tools:
            body["tools"] = [
                {"name": name, "description": description, "input_schema": schema}
                for name, description, schema in wire_tools(request, names)
            ]
        choice = tool_choice(request, names)
        if choice is not None:
            kind, value = choice
            if kind == "tool":
                body["tool_choice"] = {"type": "tool", "name": value}
            else:
                body["tool_choice"] = {"type": {"auto": "auto", "required": "any", "none": "none"}[value]}
        if stream:
            body["stream"] = True
        return body

    def parse_reply(self, document: Any, names: ToolNameMap) -> ParsedReply:
        """Read a ``message`` object.

        Raises:
            LLMResponseError: It lacks ``content``, a block is malformed, or a field has the wrong type.
        """
        if not isinstance(document, dict):
            raise self._malformed("a reply that is not a JSON object")
        blocks = document.get("content")
        if not isinstance(blocks, list):
            raise self._malformed("a reply without content blocks")
        text: list[str] = []
        calls: list[LLMToolCall] = []
        for block in blocks:
            if not isinstance(block, dict):
                raise self._malformed("a content block that is not an object")
            if block.get("type") == "text":
                if not isinstance(block.get("text"), str):
                    raise self._malformed("a text block without text")
                text.append(block["text"])
            elif block.get("type") == "tool_use":
                calls.append(self._tool_call(block.get("id"), block.get("name"), block.get("input"), names))
        input_tokens, output_tokens = self._usage(self._usage_of(document))
        return ParsedReply(
            content="".join(text),
            stop_reason=_stop_reason(document.get("stop_reason"), bool(calls)),
            tool_calls=calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    async def parse_stream(
        self, events: AsyncIterator[SSEEvent], names: ToolNameMap
    ) -> AsyncIterator[str | ParsedReply]:
        """Read a stream of Messages events.

        Raises:
            LLMResponseError: An event is malformed, or the stream ends before the ``message_delta``
                that carries the stop reason.
            LLMRateLimitError: The provider reports a rate limit inside the stream.
            LLMError: The provider reports another error inside the stream (such as ``overloaded_error``).
        """
        text: list[str] = []
        blocks: dict[int, _Block] = {}
        stop_reason: object = None
        usage: dict[str, Any] = {}
        async for event in events:
            data = json_event(self.provider, event)
            kind = data.get("type", event.event)
            if kind == "message_start":
                message = data.get("message")
                if not isinstance(message, dict):
                    raise self._malformed("a message_start event without a message")
                usage.update(message.get("usage") or {})
            elif kind == "content_block_start":
                block = data.get("content_block")
                index = data.get("index")
                if not isinstance(block, dict) or not isinstance(index, int):
                    raise self._malformed("a content_block_start event without an indexed block")
                blocks[index] = _Block(
                    kind=str(block.get("type")), call_id=block.get("id"), name=block.get("name"), start=block
                )
                if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"]:
                    text.append(block["text"])
                    yield block["text"]
            elif kind == "content_block_delta":
                delta = data.get("delta")
                if not isinstance(delta, dict):
                    raise self._malformed("a content_block_delta event without a delta")
                if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                    text.append(delta["text"])
                    yield delta["text"]
                elif delta.get("type") == "input_json_delta" and isinstance(delta.get("partial_json"), str):
                    target = blocks.get(data.get("index", -1))
                    if target is None:
                        raise self._malformed("an input_json_delta for a block that never started")
                    target.partial_json.append(delta["partial_json"])
            elif kind == "message_delta":
                delta = data.get("delta") or {}
                if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                    stop_reason = delta["stop_reason"]
                # message_delta's usage is cumulative: its counts replace those of message_start.
                if isinstance(data.get("usage"), dict):
                    usage.update({key: value for key, value in data["usage"].items() if value is not None})
            elif kind == "message_stop":
                break
            elif kind == "error":
                raise self._stream_error(data.get("error"))
        if stop_reason is None:
            raise self._unfinished()
        calls = [
            self._tool_call(block.call_id, block.name, block.input_value(), names)
            for _, block in sorted(blocks.items())
            if block.kind == "tool_use"
        ]
        input_tokens, output_tokens = self._usage(usage)
        yield ParsedReply(
            content="".join(text),
            stop_reason=_stop_reason(stop_reason, bool(calls)),
            tool_calls=calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )

    # --- helpers --------------------------------------------------------------------------------

    def _usage(self, usage: dict[str, Any]) -> tuple[int, int]:
        input_tokens = token_count(self.provider, usage, "input_tokens")
        input_tokens += sum(token_count(self.provider, usage, key) for key in _CACHE_INPUT_KEYS)
        return input_tokens, token_count(self.provider, usage, "output_tokens")

    def _tool_call(
        self, call_id: object, wire_name: object, arguments: object, names: ToolNameMap
    ) -> LLMToolCall:
        if not isinstance(call_id, str) or not call_id or not isinstance(wire_name, str) or not wire_name:
            raise self._malformed("a tool_use block without an id and a name")
        return self._call(call_id, wire_name, arguments, names)

    def _stream_error(self, error: object) -> LLMError:
        kind = error.get("type") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return self._reported(message or kind, rate_limited=kind == "rate_limit_error")


@dataclass
class _Block:
    kind: str
    call_id: object
    name: object
    start: dict[str, Any]
    partial_json: list[str] = field(default_factory=list)

    def input_value(self) -> object:
        # A tool_use block starts with "input": {} and its JSON arrives in pieces; no pieces keeps the start.
        return "".join(self.partial_json) if self.partial_json else self.start.get("input")


def _stop_reason(reason: object, has_tool_calls: bool) -> str:
    mapped = _STOP_REASONS.get(reason) if isinstance(reason, str) else None
    if mapped is None:
        return "tool_use" if has_tool_calls else "end_turn"
    return mapped
