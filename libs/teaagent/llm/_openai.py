"""OpenAI's Chat Completions API, and every server that speaks it (Ollama, vLLM, LM Studio, OpenRouter).

Wire format (``POST {base_url}/chat/completions``):

* messages: ``system``/``user`` text; an assistant turn that called tools carries ``tool_calls``
  (``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``); each result goes
  back as ``{"role": "tool", "tool_call_id", "content"}``.
* tools: ``{"type": "function", "function": {"name", "description", "parameters"}}``, names with
  ``.`` sent as ``_`` (see :mod:`teaagent.llm._http`).
* a reply: ``choices[0].message`` and ``finish_reason``, ``usage.prompt_tokens`` and
  ``usage.completion_tokens``.
* a stream (``stream: true``, ``stream_options.include_usage``): ``data:`` chunks whose
  ``choices[0].delta`` holds text and tool-call fragments keyed by ``index`` (the first fragment of
  a call has its id and name, the rest pieces of its JSON arguments), a chunk with the
  ``finish_reason``, a last chunk with empty ``choices`` and the ``usage``, then ``data: [DONE]``.

Stop reasons: ``length`` is ``max_tokens``; a reply with tool calls is ``tool_use`` (``tool_calls``,
and ``stop`` from servers such as older Ollama that report tool calls so); anything else
(``stop``, ``content_filter``) is ``end_turn``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

from teaagent.errors import LLMError
from teaagent.llm._http import HTTPAdapter, ParsedReply, json_event, token_count, tool_choice, wire_tools
from teaagent.llm._types import LLMMessage, LLMRequest, LLMToolCall

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from teaagent.llm._http import HTTPOptions, SSEEvent, ToolNameMap

__all__ = ["OpenAIAdapter", "OpenAICompatibleAdapter"]

_STREAM_DONE: Final = "[DONE]"


class OpenAIAdapter(HTTPAdapter):
    """Calls OpenAI's Chat Completions API with httpx.

    Args:
        model: The model used when a request's ``model`` is empty.
        max_tokens_field: The body field that carries ``max_tokens``: OpenAI's current
            ``max_completion_tokens`` (its reasoning models refuse ``max_tokens``), or ``max_tokens``
            for servers that only know the older name; :attr:`MAX_TOKENS_FIELD` when None.
        stream_usage: Ask for token counts at the end of a stream (``stream_options.include_usage``).
        options: The keywords of :class:`~teaagent.llm._http.HTTPAdapter`; ``api_key`` is sent as
            ``Authorization: Bearer`` (``""`` sends no header); the defaults are the ``openai``
            provider's (``https://api.openai.com/v1``, ``OPENAI_API_KEY``).

    Raises:
        ValueError: ``max_attempts`` is below 1.
    """

    PROVIDER = "openai"
    #: The body field that carries ``max_tokens`` unless the constructor names another.
    MAX_TOKENS_FIELD: ClassVar[str] = "max_completion_tokens"

    def __init__(
        self,
        *,
        model: str,
        max_tokens_field: str | None = None,
        stream_usage: bool = True,
        **options: Unpack[HTTPOptions],
    ) -> None:
        super().__init__(model=model, **options)
        self._max_tokens_field = self.MAX_TOKENS_FIELD if max_tokens_field is None else max_tokens_field
        self._stream_usage = stream_usage

    @property
    def endpoint(self) -> str:
        """``{base_url}/chat/completions``."""
        return f"{self.base_url}/chat/completions"

    def headers(self) -> dict[str, str]:
        """The bearer token, when there is a key."""
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def build_body(
        self, request: LLMRequest, names: ToolNameMap, *, model: str, stream: bool
    ) -> dict[str, Any]:
        """Return the Chat Completions body for ``request``; errors as :meth:`HTTPAdapter.build_body`."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [_wire_message(message, names) for message in request.messages],
            "temperature": request.temperature,
        }
        if request.max_tokens is not None:
            body[self._max_tokens_field] = request.max_tokens
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": name, "description": description, "parameters": schema},
                }
                for name, description, schema in wire_tools(request, names)
            ]
        choice = tool_choice(request, names)
        if choice is not None:
            kind, value = choice
            body["tool_choice"] = (
                value if kind == "mode" else {"type": "function", "function": {"name": value}}
            )
        if stream:
            body["stream"] = True
            if self._stream_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def parse_reply(self, document: Any, names: ToolNameMap) -> ParsedReply:
        """Read a ``chat.completion`` object.

        Raises:
            LLMResponseError: It lacks ``choices[0].message``, or a field has the wrong type.
        """
        if not isinstance(document, dict):
            raise self._malformed("a reply that is not a JSON object")
        choices = document.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._malformed("a reply without choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise self._malformed("a reply without a message")
        content = message.get("content")
        if content is None:
            # A refusal arrives instead of content; it is what the model said.
            content = message.get("refusal") or ""
        if not isinstance(content, str):
            raise self._malformed("a message whose content is not text")
        calls: list[LLMToolCall] = []
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise self._malformed("tool_calls that are not a list")
        for index, raw in enumerate(raw_calls):
            function = raw.get("function") if isinstance(raw, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise self._malformed("a tool call without a function name")
            call_id = raw.get("id")
            calls.append(self._tool_call(call_id, index, function["name"], function.get("arguments"), names))
        usage = self._usage_of(document)
        stop = _stop_reason(choices[0].get("finish_reason"), bool(calls))
        return ParsedReply(
            content=content,
            stop_reason=stop,
            tool_calls=calls,
            input_tokens=token_count(self.provider, usage, "prompt_tokens"),
            output_tokens=token_count(self.provider, usage, "completion_tokens"),
        )

    async def parse_stream(
        self, events: AsyncIterator[SSEEvent], names: ToolNameMap
    ) -> AsyncIterator[str | ParsedReply]:
        """Read a stream of ``chat.completion.chunk`` events.

        Raises:
            LLMResponseError: A chunk is malformed, or the stream ends before a ``finish_reason``.
            LLMRateLimitError: The provider reports a rate limit inside the stream.
            LLMError: The provider reports another error inside the stream.
        """
        text: list[str] = []
        partial: dict[int, _PartialCall] = {}
        finish: str | None = None
        usage: dict[str, Any] = {}
        async for event in events:
            if event.data.strip() == _STREAM_DONE:
                break
            chunk = json_event(self.provider, event)
            if chunk.get("error") is not None:
                raise self._stream_error(chunk["error"])
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            choices = chunk.get("choices") or []
            if not isinstance(choices, list):
                raise self._malformed("a chunk whose choices are not a list")
            for choice in choices:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                if not isinstance(delta, dict):
                    raise self._malformed("a chunk whose delta is not an object")
                piece = delta.get("content")
                if isinstance(piece, str) and piece:
                    text.append(piece)
                    yield piece
                self._merge_tool_calls(partial, delta.get("tool_calls") or [])
                if isinstance(choice.get("finish_reason"), str):
                    finish = choice["finish_reason"]
        if finish is None:
            raise self._unfinished()
        calls = [
            self._tool_call(part.call_id, index, part.name, part.arguments_value(), names)
            for index, part in sorted(partial.items())
        ]
        yield ParsedReply(
            content="".join(text),
            stop_reason=_stop_reason(finish, bool(calls)),
            tool_calls=calls,
            input_tokens=token_count(self.provider, usage, "prompt_tokens"),
            output_tokens=token_count(self.provider, usage, "completion_tokens"),
        )

    # --- helpers --------------------------------------------------------------------------------

    def _merge_tool_calls(self, partial: dict[int, _PartialCall], fragments: object) -> None:
        if not isinstance(fragments, list):
            raise self._malformed("a chunk whose tool_calls are not a list")
        for fragment in fragments:
            if not isinstance(fragment, dict):
                raise self._malformed("a tool-call fragment that is not an object")
            index = fragment.get("index")
            if isinstance(index, bool) or not isinstance(index, int):
                # A server that leaves out the index sends each call whole: a fragment with an id starts one.
                index = len(partial) if fragment.get("id") or not partial else max(partial)
            call = partial.setdefault(index, _PartialCall())
            if isinstance(fragment.get("id"), str) and not call.call_id:
                call.call_id = fragment["id"]
            function = fragment.get("function") or {}
            if not isinstance(function, dict):
                raise self._malformed("a tool-call fragment whose function is not an object")
            # Some servers repeat the name in every fragment: it is set once, never concatenated.
            if isinstance(function.get("name"), str) and function["name"] and not call.name:
                call.name = function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments.append(arguments)
            elif isinstance(arguments, dict):
                call.whole = arguments

    def _tool_call(
        self, call_id: object, index: int, wire_name: str, arguments: object, names: ToolNameMap
    ) -> LLMToolCall:
        if not wire_name:
            raise self._malformed("a tool call without a function name")
        # Some compatible servers send no id; the result must still name the call it answers.
        return self._call(
            call_id if isinstance(call_id, str) and call_id else f"call_{index}", wire_name, arguments, names
        )

    def _stream_error(self, error: object) -> LLMError:
        message = error.get("message") if isinstance(error, dict) else error
        code = error.get("code") or error.get("type") if isinstance(error, dict) else None
        return self._reported(message, rate_limited=code in ("rate_limit_exceeded", "rate_limit_error"))


class OpenAICompatibleAdapter(OpenAIAdapter):
    """Calls a server that speaks OpenAI's Chat Completions API: Ollama, vLLM, LM Studio, OpenRouter.

    The key is optional (a local server takes none) and ``max_tokens`` is sent under its older name,
    which such servers know.

    Its keywords are :class:`OpenAIAdapter`'s; the defaults are the ``openai-compatible``
    provider's (``http://127.0.0.1:11434/v1``, an optional ``OPENAI_COMPATIBLE_API_KEY``), and
    ``max_tokens`` goes under ``max_tokens``.
    """

    PROVIDER = "openai-compatible"
    MAX_TOKENS_FIELD = "max_tokens"


@dataclass
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    whole: dict[str, Any] | None = None  # a server that sends the arguments as an object, not JSON text

    def arguments_value(self) -> object:
        return self.whole if self.whole is not None else "".join(self.arguments)


def _stop_reason(finish_reason: object, has_tool_calls: bool) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if has_tool_calls:
        return "tool_use"
    return "end_turn"


def _wire_message(message: LLMMessage, names: ToolNameMap) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            # OpenAI's own transcripts carry null, not "", beside tool calls.
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {
                        "name": names.to_wire(call.tool_name),
                        "arguments": _json_text(call.arguments),
                    },
                }
                for call in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def _json_text(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
