"""The HTTP adapters' wire forms: tool names as the providers accept them, SSE framing, tool calls.

Tool names: the registry allows dots (``fs.read``) but OpenAI and Anthropic both require tool names
matching ``^[a-zA-Z0-9_-]{1,64}$``. On the wire every ``.`` becomes ``_`` (``fs.read`` is sent as
``fs_read``); :class:`ToolNameMap`, built from the request's own tools, maps the names the model
answers with back, so the round trip is exact. Two tools that would share a wire name (``fs.read``
and ``fs_read``) are refused rather than confused.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from teaagent.errors import LLMResponseError
from teaagent.llm._types import LLMRequest

__all__ = [
    "MAX_RESPONSE_BYTES",
    "WIRE_TOOL_NAME_PATTERN",
    "SSEEvent",
    "ToolNameMap",
    "iter_sse",
    "json_event",
    "parse_arguments",
    "request_tool_names",
    "token_count",
    "tool_choice",
    "tool_description",
    "wire_tool_name",
    "wire_tools",
]

#: What OpenAI and Anthropic accept as a tool name.
WIRE_TOOL_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024  # a model's reply, not a download


def wire_tool_name(name: str) -> str:
    """Return the name a tool is sent under: ``name`` with every ``.`` replaced by ``_``.

    Args:
        name: A registered tool name such as ``fs.read``.

    Returns:
        The wire name, such as ``fs_read``.

    Raises:
        ValueError: The result is not a valid provider tool name (longer than 64 characters, or
            holding characters other than letters, digits, ``_`` and ``-``).
    """
    wire = name.replace(".", "_")
    if WIRE_TOOL_NAME_PATTERN.fullmatch(wire) is None:
        raise ValueError(
            f"The tool name {name!r} cannot be sent to a model: providers accept 1 to 64 letters, "
            "digits, '_', '-' (and teaagent maps '.' to '_')."
        )
    return wire


class ToolNameMap:
    """The reversible mapping between a request's tool names and their wire names.

    Args:
        names: The names of the tools offered to the model.

    Raises:
        ValueError: A name cannot be sent (see :func:`wire_tool_name`), or two names share a wire name.
    """

    def __init__(self, names: Iterable[str]) -> None:
        self._from_wire: dict[str, str] = {}
        for name in names:
            wire = wire_tool_name(name)
            other = self._from_wire.get(wire)
            if other is not None and other != name:
                raise ValueError(
                    f"The tools {other!r} and {name!r} would both reach the model as {wire!r}; rename one."
                )
            self._from_wire[wire] = name

    def to_wire(self, name: str) -> str:
        """Return the wire name of ``name`` (see :func:`wire_tool_name`)."""
        return wire_tool_name(name)

    def from_wire(self, wire: str) -> str:
        """Return the registered name behind ``wire``; a name no offered tool has comes back unchanged.

        An unknown name is passed through so that the tool registry, not the adapter, reports a
        model that called a tool it was never offered.
        """
        return self._from_wire.get(wire, wire)


@dataclass(frozen=True)
class SSEEvent:
    """One server-sent event.

    Attributes:
        event: The ``event:`` field; ``"message"`` when the server sent none.
        data: The ``data:`` lines joined with newlines.
    """

    event: str
    data: str


async def iter_sse(
    chunks: AsyncIterator[bytes], *, limit: int = MAX_RESPONSE_BYTES
) -> AsyncIterator[SSEEvent]:
    """Split a byte stream into server-sent events (the WHATWG framing: fields, blank-line ends).

    Args:
        chunks: The response body as it arrives.
        limit: The most bytes read before giving up.

    Yields:
        Each event that carries data; comments and data-less events are skipped.

    Raises:
        LLMResponseError: The stream is longer than ``limit`` bytes or is not UTF-8.
    """
    buffer = b""
    total = 0
    event = ""
    data: list[str] = []
    async for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise LLMResponseError(f"The provider's event stream is longer than {limit} bytes.")
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            try:
                line = raw.rstrip(b"\r").decode("utf-8")
            except UnicodeDecodeError as exc:
                raise LLMResponseError("The provider's event stream is not valid UTF-8.") from exc
            if line == "":
                if data:
                    yield SSEEvent(event=event or "message", data="\n".join(data))
                event, data = "", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
    # A server that closes right after its last event, without the blank line, still meant it.
    tail = buffer.rstrip(b"\r").decode("utf-8", errors="replace")
    if tail.startswith("data:"):
        data.append(tail[5:].removeprefix(" "))
    if data:
        yield SSEEvent(event=event or "message", data="\n".join(data))


def request_tool_names(request: LLMRequest) -> list[str]:
    names: list[str] = []
    for index, tool in enumerate(request.tools or []):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str):
            raise ValueError(f"tools[{index}] must be a dict with a string 'name'.")
        names.append(name)
    return names


def tool_choice(request: LLMRequest, names: ToolNameMap) -> tuple[str, str] | None:
    """Return the request's ``tool_choice`` checked against its tools; None when there is nothing to send.

    Returns ``("mode", "auto" | "none" | "required")`` or ``("tool", wire_name)``. ``"auto"`` and
    ``"none"`` mean nothing without tools and are dropped.

    Raises:
        ValueError: ``tool_choice`` is ``"required"`` or a name while no tool is offered, or names a
            tool that is not offered.
    """
    choice = request.tool_choice
    if choice is None or (not request.tools and choice in ("auto", "none")):
        return None
    if choice in ("auto", "none", "required") and request.tools:
        return ("mode", choice)
    if not request.tools:
        raise ValueError(f"tool_choice {choice!r} needs tools, and the request offers none.")
    if choice not in request_tool_names(request):
        raise ValueError(
            f"tool_choice must be 'auto', 'none', 'required' or the name of an offered tool, not {choice!r}."
        )
    return ("tool", names.to_wire(choice))


def wire_tools(request: LLMRequest, names: ToolNameMap) -> list[tuple[str, str, dict[str, Any]]]:
    """The request's tools as ``(wire name, description, input schema)``, in order (:func:`tool_description`).

    Raises:
        ValueError: A tool description is malformed.
    """
    return [
        (names.to_wire(name), description, schema)
        for name, description, schema in (
            tool_description(tool, index) for index, tool in enumerate(request.tools or ())
        )
    ]


def tool_description(tool: dict[str, Any], index: int) -> tuple[str, str, dict[str, Any]]:
    """Return ``(name, description, input_schema)`` of a provider-neutral tool description.

    Raises:
        ValueError: The description lacks a string name or an object input_schema, or its
            description is not a string.
    """
    name = tool.get("name")
    description = tool.get("description", "")
    schema = tool.get("input_schema", {"type": "object", "properties": {}})
    if not isinstance(name, str):
        raise ValueError(f"tools[{index}] must have a string 'name'.")
    if not isinstance(description, str):
        raise ValueError(f"tools[{index}] ({name}) must have a string 'description'.")
    if not isinstance(schema, dict):
        raise ValueError(f"tools[{index}] ({name}) must have an object 'input_schema'.")
    return name, description, schema


def parse_arguments(provider: str, tool_name: str, raw: object) -> dict[str, Any]:
    """Return a tool call's arguments as a dict; JSON text is decoded, ``""`` means no arguments.

    Raises:
        LLMResponseError: The arguments are not a JSON object.
    """
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
    raise LLMResponseError(
        f"The {provider} provider gave the tool call {tool_name} arguments that are not a JSON object."
    )


def token_count(provider: str, usage: Mapping[str, Any], key: str) -> int:
    """Return ``usage[key]`` as a token count; a missing count is 0.

    Raises:
        LLMResponseError: The count is present but not an int >= 0.
    """
    value = usage.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LLMResponseError(f"The {provider} provider reported {key} as {value!r}, not a count.")
    return value


def json_event(provider: str, event: SSEEvent) -> dict[str, Any]:
    """Decode one event's data as a JSON object.

    Raises:
        LLMResponseError: The data is not a JSON object.
    """
    try:
        document = json.loads(event.data)
    except json.JSONDecodeError as exc:
        raise LLMResponseError(f"The {provider} provider sent a stream event that is not JSON.") from exc
    if not isinstance(document, dict):
        raise LLMResponseError(f"The {provider} provider sent a stream event that is not a JSON object.")
    return document
