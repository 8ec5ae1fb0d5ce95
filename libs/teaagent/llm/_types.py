"""The provider-neutral shapes of a model call, and the interface every adapter implements."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MESSAGE_ROLES",
    "STOP_REASONS",
    "LLMAdapter",
    "LLMMessage",
    "LLMRequest",
    "LLMResponse",
    "LLMToolCall",
]

#: The roles a message may carry; ``"tool"`` carries a tool's result back to the model.
MESSAGE_ROLES = ("user", "assistant", "system", "tool")
#: Why a model stopped; an adapter maps its provider's reasons onto these three.
STOP_REASONS = ("end_turn", "tool_use", "max_tokens")


@dataclass
class LLMMessage:
    """One message of the conversation sent to a model.

    Beyond the plain ``user``/``assistant``/``system`` text turns, two keyword-only fields carry a
    tool round trip, which every adapter converts to its provider's wire format:

    * an ``assistant`` message whose ``tool_calls`` lists the calls the model asked for (its
      ``content`` is the text written beside them, often ``""``);
    * one ``tool`` message per call, with ``tool_call_id`` set to that call's
      :attr:`LLMToolCall.call_id` and ``content`` holding the tool's result as text.

    Attributes:
        role: One of :data:`MESSAGE_ROLES`.
        content: The message's text.
        tool_calls: On an ``assistant`` message, the tool calls the model made; None otherwise.
        tool_call_id: On a ``tool`` message, the id of the call it answers; None otherwise.

    Raises:
        ValueError: ``role`` is not one of :data:`MESSAGE_ROLES`, a ``tool`` message has no
            ``tool_call_id``, ``tool_call_id`` is set on another role, or ``tool_calls`` is set on a
            role other than ``assistant``.
    """

    role: str
    content: str
    tool_calls: list[LLMToolCall] | None = field(default=None, kw_only=True)
    tool_call_id: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.role not in MESSAGE_ROLES:
            raise ValueError(f"A message role must be one of {', '.join(MESSAGE_ROLES)}, not {self.role!r}.")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("A tool message must name the call it answers in tool_call_id.")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"Only a tool message may set tool_call_id, not a {self.role} message.")
        if self.role != "assistant" and self.tool_calls is not None:
            raise ValueError(f"Only an assistant message may set tool_calls, not a {self.role} message.")


@dataclass
class LLMRequest:
    """One call to a model.

    Attributes:
        messages: The conversation so far.
        model: The model name sent to the provider.
        max_tokens: The most tokens the reply may hold; None leaves it to the adapter's default.
        tools: Tool descriptions in the provider-neutral form ``{"name", "description", "input_schema"}``.
        tool_choice: ``"auto"``, ``"none"``, ``"required"`` or a tool name; None is the provider's default.
        temperature: Sampling temperature; 0 asks for the most repeatable reply.

    Raises:
        ValueError: ``max_tokens`` is below 1, or ``temperature`` is negative or not finite.
    """

    messages: list[LLMMessage]
    model: str
    max_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be None or an int >= 1, not {self.max_tokens!r}.")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, not {self.temperature!r}.")


@dataclass
class LLMToolCall:
    """A tool call the model asked for.

    Attributes:
        call_id: The provider's id for the call, echoed back with its result.
        tool_name: The registered tool's name.
        arguments: The arguments, as the model wrote them (validated later, against the tool's schema).
    """

    call_id: str
    tool_name: str
    arguments: dict[str, Any]


@dataclass
class LLMResponse:
    """A model's reply, with what it cost.

    Attributes:
        content: The text of the reply ("" when the model only called tools).
        stop_reason: One of :data:`STOP_REASONS`.
        tool_calls: The tool calls the model asked for, in order.
        input_tokens: Prompt tokens the provider counted.
        output_tokens: Tokens the model generated.
        cost_cents: What the call cost, in US cents.

    Raises:
        ValueError: ``stop_reason`` is unknown, a token count is negative, or ``cost_cents`` is
            negative or not finite.
    """

    content: str
    stop_reason: str
    tool_calls: list[LLMToolCall]
    input_tokens: int
    output_tokens: int
    cost_cents: float

    def __post_init__(self) -> None:
        if self.stop_reason not in STOP_REASONS:
            raise ValueError(
                f"A stop reason must be one of {', '.join(STOP_REASONS)}, not {self.stop_reason!r}."
            )
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, not {value!r}.")
        if not math.isfinite(self.cost_cents) or self.cost_cents < 0:
            raise ValueError(f"cost_cents must be a finite number >= 0, not {self.cost_cents!r}.")


class LLMAdapter(ABC):
    """The interface between the runner and one provider's API.

    An adapter converts the provider's errors at its boundary (``raise ... from exc``) and fills
    :attr:`LLMResponse.cost_cents` from the provider's token counts and :func:`price_for`.
    """

    @abstractmethod
    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Send ``request`` and return the whole reply.

        Args:
            request: The call to make.

        Returns:
            The reply, its token counts and its cost.
        """

    @abstractmethod
    async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
        """Send ``request`` and yield the reply's text as it arrives.

        Implement it as an async generator (``async def stream(...)`` that ``yield``s), as it is
        declared here: ``async for piece in adapter.stream(request)``.

        Args:
            request: The call to make.

        Yields:
            Pieces of the reply's text.

        Raises:
            NotImplementedError: Always, here: every adapter implements it.
        """
        raise NotImplementedError
        # Never reached: the yield makes this an async generator, the type every override has.
        yield ""  # type: ignore[unreachable]

    async def complete_streaming(self, request: LLMRequest, on_text: Callable[[str], object]) -> LLMResponse:
        """Send ``request``, hand the reply's text to ``on_text`` as it arrives, and return the whole reply.

        This is how a caller streams text and still gets the tool calls, token counts and cost of the
        reply. This default calls :meth:`complete` and hands the whole text over at once; an adapter
        that can stream overrides it.

        Args:
            request: The call to make.
            on_text: Called with each piece of text (never with ``""``).

        Returns:
            The reply, as :meth:`complete` returns it.
        """
        response = await self.complete(request)
        if response.content:
            on_text(response.content)
        return response
