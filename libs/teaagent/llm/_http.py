"""What the HTTP adapters share: timeouts, retries, error conversion (wire forms: ``_wire``).

Retries: a call is sent up to :data:`MAX_ATTEMPTS` times. HTTP 429, any 5xx (Anthropic's 529
"overloaded" included) and connection failures or timeouts are retried after an exponential backoff
with jitter, or after the provider's ``Retry-After`` (seconds or an HTTP date; OpenAI's
``retry-after-ms`` too) capped at :data:`RETRY_AFTER_CAP_SECONDS`. Every other 4xx is final at once.
A stream is retried only until its status line arrives: once text may have reached the caller, a
broken stream is an :class:`~teaagent.errors.LLMError`, never a silent replay.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from abc import abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple, TypedDict

import httpx

from teaagent._urls import shown_url
from teaagent.errors import LLMAuthenticationError, LLMError, LLMRateLimitError, LLMResponseError
from teaagent.llm._pricing import ModelPrice, price_for
from teaagent.llm._providers import PROVIDER_CONFIGS
from teaagent.llm._types import LLMAdapter, LLMRequest, LLMResponse, LLMToolCall
from teaagent.llm._wire import (
    MAX_RESPONSE_BYTES,
    WIRE_TOOL_NAME_PATTERN,
    SSEEvent,
    ToolNameMap,
    iter_sse,
    json_event,
    parse_arguments,
    request_tool_names,
    token_count,
    tool_choice,
    tool_description,
    wire_tool_name,
    wire_tools,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "INITIAL_BACKOFF_SECONDS",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_SECONDS",
    "MAX_RESPONSE_BYTES",
    "READ_TIMEOUT_SECONDS",
    "RETRY_AFTER_CAP_SECONDS",
    "WIRE_TOOL_NAME_PATTERN",
    "HTTPAdapter",
    "HTTPOptions",
    "ParsedReply",
    "SSEEvent",
    "Sleep",
    "ToolNameMap",
    "iter_sse",
    "json_event",
    "parse_arguments",
    "parse_retry_after",
    "token_count",
    "tool_choice",
    "tool_description",
    "wire_tool_name",
    "wire_tools",
]

CONNECT_TIMEOUT_SECONDS: Final = 10.0  # a TCP and TLS handshake; longer means the host is not there
# A reply that is not streamed arrives in one piece once the whole generation is done: minutes, not seconds.
READ_TIMEOUT_SECONDS: Final = 300.0
WRITE_TIMEOUT_SECONDS: Final = 30.0  # the request body is a conversation, at most a few megabytes
POOL_TIMEOUT_SECONDS: Final = 10.0  # waiting for a free pooled connection
MAX_ATTEMPTS: Final = 4  # the first try and three retries: rides out a blip, gives up on an outage
INITIAL_BACKOFF_SECONDS: Final = 0.5  # the first retry's wait before jitter
MAX_BACKOFF_SECONDS: Final = 20.0  # exponential growth stops here
RETRY_AFTER_CAP_SECONDS: Final = 60.0  # a longer Retry-After (a daily quota) is not worth blocking a run on
MAX_ERROR_BODY_BYTES: Final = 64 * 1024  # an error explanation; a larger body is a proxy's page, ignored
MAX_ERROR_DETAIL_CHARS: Final = 300  # the provider's own explanation, kept to a readable length

_RATE_LIMITED = 429
_AUTH_STATUSES = frozenset({401, 403})
_CENTS_PER_DOLLAR = 100
_TOKENS_PER_PRICE_UNIT = 1000

#: How an adapter waits between attempts: ``asyncio.sleep``, or a fast stand-in in tests.
Sleep = Callable[[float], Awaitable[None]]


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Return how many seconds the provider asked to wait, capped at :data:`RETRY_AFTER_CAP_SECONDS`.

    Reads OpenAI's ``retry-after-ms`` first, then ``Retry-After`` as seconds or as an HTTP date.

    Args:
        headers: The response headers (case-insensitive, as httpx gives them).
        now: The current time, for a date; the clock when None.

    Returns:
        The wait in seconds, or None when no header gives a usable one.
    """
    milliseconds = _finite_non_negative(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return min(milliseconds / 1000, RETRY_AFTER_CAP_SECONDS)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _finite_non_negative(raw)
    if seconds is None:
        try:
            when = parsedate_to_datetime(raw.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    return min(seconds, RETRY_AFTER_CAP_SECONDS)


def _finite_non_negative(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class ParsedReply(NamedTuple):
    """What an adapter read from a provider's reply, before the cost is added."""

    content: str
    stop_reason: str
    tool_calls: list[LLMToolCall]
    input_tokens: int
    output_tokens: int


def _one_line(text: str) -> str:
    """Return ``text`` on one line, cut to :data:`MAX_ERROR_DETAIL_CHARS`, without its final full stop."""
    flat = " ".join(text.split()).rstrip(".")
    if len(flat) > MAX_ERROR_DETAIL_CHARS:
        flat = flat[:MAX_ERROR_DETAIL_CHARS].rstrip() + " [...]"
    return flat


def _error_detail(body: bytes) -> str:
    """Return the provider's explanation from an error body, or ``""`` when it gives none.

    OpenAI sends ``{"error": {"message": ...}}``, Anthropic ``{"type": "error", "error":
    {"type": ..., "message": ...}}``; compatible servers vary (``{"error": "..."}``,
    ``{"message": ...}``). A body that is not JSON (a proxy's HTML page) gives nothing.
    """
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return ""
    if not isinstance(document, dict):
        return ""
    error = document.get("error", document)
    if isinstance(error, str):
        return _one_line(error)
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return _one_line(error["message"])
    return ""


class HTTPOptions(TypedDict, total=False):
    """The keywords every HTTP adapter takes beside its model and its own (see :class:`HTTPAdapter`)."""

    api_key: str
    base_url: str
    provider: str
    api_key_env: str
    http_client: httpx.AsyncClient | None
    timeout: httpx.Timeout | None
    max_attempts: int
    sleep: Sleep


class HTTPAdapter(LLMAdapter):
    """An adapter that speaks to its provider over HTTPS with httpx; the base of the real providers.

    A subclass says how to build the request body and how to read a reply and a stream; this class
    sends, retries, converts errors, counts cost and keeps the API key out of messages and reprs.

    A subclass names its provider in :attr:`PROVIDER`, whose :data:`~teaagent.llm.PROVIDER_CONFIGS`
    entry gives ``provider``, ``base_url`` and ``api_key_env`` their defaults.

    Args:
        model: The model used when a request's ``model`` is empty.
        api_key: The API key; ``""`` (the default) sends none.
        base_url: The API's base URL, without a trailing slash.
        provider: The provider's name in :data:`~teaagent.llm.PROVIDER_CONFIGS` (for prices and messages).
        api_key_env: The variable the key came from, named when the provider refuses it.
        http_client: A client to send with (its owner closes it); by default the adapter makes its
            own, one per event loop, closed by :meth:`aclose`.
        timeout: Timeouts for each HTTP request; :data:`CONNECT_TIMEOUT_SECONDS` and
            :data:`READ_TIMEOUT_SECONDS` by default.
        max_attempts: How many times a call is sent before its failure is final.
        sleep: Waits between attempts (tests inject a fast one).

    Raises:
        ValueError: ``max_attempts`` is below 1, or no provider is named (neither ``provider`` nor
            :attr:`PROVIDER`).
    """

    #: The provider this class speaks to, the key of its defaults in ``PROVIDER_CONFIGS``.
    PROVIDER: ClassVar[str] = ""

    def __init__(self, *, model: str, **options: Unpack[HTTPOptions]) -> None:
        max_attempts = options.get("max_attempts", MAX_ATTEMPTS)
        if isinstance(max_attempts, bool) or max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, not {max_attempts!r}.")
        config = PROVIDER_CONFIGS.get(self.PROVIDER)
        self.provider = options.get("provider", self.PROVIDER)
        if not self.provider:
            raise ValueError(f"{type(self).__name__} names no provider.")
        self.model = model
        self.base_url = options.get("base_url", config.base_url if config else "").rstrip("/")
        self._api_key = options.get("api_key", "")
        self._api_key_env = options.get("api_key_env", config.api_key_env if config else "")
        self._client = options.get("http_client")
        self._owned: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        self._timeout = options.get("timeout") or httpx.Timeout(
            connect=CONNECT_TIMEOUT_SECONDS,
            read=READ_TIMEOUT_SECONDS,
            write=WRITE_TIMEOUT_SECONDS,
            pool=POOL_TIMEOUT_SECONDS,
        )
        self._max_attempts = max_attempts
        self._sleep = options.get("sleep", asyncio.sleep)

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return (
            f"{type(self).__name__}(provider={self.provider!r}, model={self.model!r}, "
            f"base_url={shown_url(self.base_url, path=True)!r}, api_key={key})"
        )

    # --- what a provider defines --------------------------------------------------------------

    @property
    @abstractmethod
    def endpoint(self) -> str:
        """The URL requests are posted to."""

    @abstractmethod
    def headers(self) -> dict[str, str]:
        """The request headers, the API key's header among them."""

    @abstractmethod
    def build_body(
        self, request: LLMRequest, names: ToolNameMap, *, model: str, stream: bool
    ) -> dict[str, Any]:
        """Return the JSON body that asks ``model`` for ``request``.

        Raises:
            ValueError: The request cannot be expressed: a tool description is malformed or its name
                cannot be sent, or ``tool_choice`` names no offered tool.
        """

    @abstractmethod
    def parse_reply(self, document: Any, names: ToolNameMap) -> ParsedReply:
        """Read a whole reply.

        Raises:
            LLMResponseError: The reply lacks what the provider's format promises.
        """

    @abstractmethod
    def parse_stream(
        self, events: AsyncIterator[SSEEvent], names: ToolNameMap
    ) -> AsyncIterator[str | ParsedReply]:
        """Yield each text delta of a stream, then the whole reply.

        Raises:
            LLMResponseError: An event is malformed, or the stream ends before the reply does.
            LLMError: The provider reports an error inside the stream.
        """

    # --- the LLMAdapter interface -------------------------------------------------------------

    async def complete(self, request: LLMRequest) -> LLMResponse:
        """Send ``request`` and return the whole reply, its token counts and its cost.

        Args:
            request: The call to make.

        Returns:
            The reply; tool names are the registered ones (``fs.read``), not the wire ones.

        Raises:
            ValueError: The request cannot be expressed for this provider (a malformed tool description,
                a tool name no provider accepts, a ``tool_choice`` naming a tool not offered).
            LLMAuthenticationError: The provider refused the API key (401) or the access (403).
            LLMRateLimitError: The provider still answered 429 after :data:`MAX_ATTEMPTS` attempts.
            LLMResponseError: The reply is malformed JSON or lacks what the provider's format promises.
            LLMError: The provider could not be reached, failed with 5xx on every attempt, or
                refused the request with another 4xx.
            ConfigError: ``TEAAGENT_PRICES_FILE`` is set and its file cannot be read or is malformed
                (found before anything is sent).
        """
        names, body, price = self._prepared(request, stream=False)
        _, raw = await self._send(body, whole=True)
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LLMResponseError(f"The {self.provider} provider answered with malformed JSON.") from exc
        return _response(price, self.parse_reply(document, names))

    async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
        """Send ``request`` with streaming on and yield the reply's text as it arrives.

        Tool calls and token counts of a streamed reply reach the caller through
        :meth:`complete_streaming`; this method yields text only.

        Args:
            request: The call to make.

        Yields:
            Pieces of the reply's text.

        Raises:
            ValueError: As :meth:`complete`.
            LLMAuthenticationError: As :meth:`complete`.
            LLMRateLimitError: As :meth:`complete`.
            LLMResponseError: An event is malformed, or the stream ends before the reply does.
            LLMError: As :meth:`complete`, or the provider reports an error inside the stream or the
                connection breaks during it (a started stream is never retried).
        """
        async for item in self._stream_items(request):
            if isinstance(item, str):
                yield item

    async def complete_streaming(self, request: LLMRequest, on_text: Callable[[str], object]) -> LLMResponse:
        """Stream ``request``, hand each piece of text to ``on_text``, and return the whole reply.

        Args:
            request: The call to make.
            on_text: Called with each piece of text as it arrives.

        Returns:
            The reply as :meth:`complete` returns it, tool calls and cost included.

        Raises:
            ValueError: As :meth:`complete`.
            LLMAuthenticationError: As :meth:`complete`.
            LLMRateLimitError: As :meth:`complete`.
            LLMResponseError: As :meth:`stream`.
            LLMError: As :meth:`stream`.
        """
        final: LLMResponse | None = None
        async for item in self._stream_items(request):
            if isinstance(item, str):
                on_text(item)
            else:
                final = item
        if final is None:  # pragma: no cover - _stream_items always ends with the response
            raise LLMResponseError(f"The {self.provider} provider's stream ended without a reply.")
        return final

    async def aclose(self) -> None:
        """Close the HTTP client the adapter made for itself (an injected client is left open)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            await owned[1].aclose()

    async def __aenter__(self) -> HTTPAdapter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- the machinery ------------------------------------------------------------------------

    def _prepared(
        self, request: LLMRequest, *, stream: bool
    ) -> tuple[ToolNameMap, dict[str, Any], ModelPrice]:
        """The call's tool names, its body, and its model's price.

        Priced before sending: a broken price file must stop the call, not follow a paid one.
        """
        names = ToolNameMap(request_tool_names(request))
        model = request.model or self.model
        body = self.build_body(request, names, model=model, stream=stream)
        return names, body, price_for(self.provider, model)

    async def _stream_items(self, request: LLMRequest) -> AsyncIterator[str | LLMResponse]:
        names, body, price = self._prepared(request, stream=True)
        response, _ = await self._send(body, whole=False)
        try:
            async for item in self.parse_stream(iter_sse(self._body_chunks(response)), names):
                if isinstance(item, str):
                    if item:
                        yield item
                else:
                    yield _response(price, item)
        finally:
            await response.aclose()

    async def _body_chunks(self, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_bytes():
                yield chunk
        except httpx.TransportError as exc:
            raise LLMError(
                self._redact(
                    f"The connection to the {self.provider} provider broke during its reply "
                    f"({type(exc).__name__})."
                )
            ) from exc

    def _http_client(self) -> httpx.AsyncClient:
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        # httpx's pooled connections belong to the loop that opened them: a new loop gets a new client.
        if self._owned is None or self._owned[0] is not loop:
            self._owned = (loop, httpx.AsyncClient(timeout=self._timeout))
        return self._owned[1]

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[redacted]") if self._api_key else text

    # --- what the providers' readers share ----------------------------------------------------

    def _malformed(self, what: str) -> LLMResponseError:
        """``The <provider> provider sent <what>.``: a reply that lacks what the format promises."""
        return LLMResponseError(f"The {self.provider} provider sent {what}.")

    def _unfinished(self) -> LLMResponseError:
        """A stream that ended before the event that finishes its reply."""
        return LLMResponseError(f"The {self.provider} provider's stream ended before its reply was finished.")

    def _reported(self, explanation: object, *, rate_limited: bool) -> LLMError:
        """The error a provider reported inside a stream, its explanation on one line, the key redacted."""
        detail = " ".join(str(explanation or "no explanation").split()).rstrip(".")
        text = self._redact(f"The {self.provider} provider reported an error during its reply: {detail}.")
        return LLMRateLimitError(text) if rate_limited else LLMError(text)

    def _usage_of(self, document: dict[str, Any]) -> dict[str, Any]:
        """A whole reply's ``usage`` object (``{}`` when it has none)."""
        usage = document.get("usage") or {}
        if not isinstance(usage, dict):
            raise self._malformed("usage that is not an object")
        return usage

    def _call(self, call_id: str, wire_name: str, arguments: object, names: ToolNameMap) -> LLMToolCall:
        """A tool call the model made, under the tool's own name, its arguments parsed."""
        tool_name = names.from_wire(wire_name)
        return LLMToolCall(
            call_id=call_id,
            tool_name=tool_name,
            arguments=parse_arguments(self.provider, tool_name, arguments),
        )

    async def _send(self, body: dict[str, Any], *, whole: bool) -> tuple[httpx.Response, bytes]:
        """Post ``body``, retrying as the module says, until a 2xx status arrives.

        With ``whole``, the body is read inside the attempt (a body cut off by the network is one
        more failed attempt) and returned with the closed response; without it, the response is
        returned open for the caller to stream and close, with ``b""``.
        """
        client = self._http_client()
        last: LLMError | None = None
        cause: BaseException | None = None
        for attempt in range(1, self._max_attempts + 1):
            attempts = f"{attempt} attempt{'s' if attempt > 1 else ''}"
            request = client.build_request(
                "POST", self.endpoint, json=body, headers=self.headers(), timeout=self._timeout
            )
            delay: float | None = None
            try:
                response = await client.send(request, stream=True)
            except httpx.TransportError as exc:
                cause = exc
                where = shown_url(self.base_url, path=True)
                message = f"Could not reach the {self.provider} provider at {where} after {attempts}"
                last = LLMError(self._redact(f"{message} ({type(exc).__name__})."))
            else:
                if response.is_success:
                    if not whole:
                        return response, b""
                    try:
                        return response, await self._whole_body(response)
                    except httpx.TransportError as exc:
                        cause = exc
                        message = f"The connection to the {self.provider} provider broke during its reply"
                        last = LLMError(self._redact(f"{message} after {attempts} ({type(exc).__name__})."))
                else:
                    cause = None
                    last = self._status_error(response.status_code, await _error_body(response), attempt)
                    if not _retryable(response.status_code):
                        raise last
                    delay = parse_retry_after(response.headers)
            if attempt == self._max_attempts:
                break
            await self._sleep(delay if delay is not None else _backoff(attempt))
        assert last is not None
        raise last from cause

    async def _whole_body(self, response: httpx.Response) -> bytes:
        try:
            return await _read_capped(response, MAX_RESPONSE_BYTES)
        except _TooLarge:
            raise LLMResponseError(
                f"The {self.provider} provider's reply is longer than {MAX_RESPONSE_BYTES} bytes."
            ) from None
        finally:
            await response.aclose()

    def _status_error(self, status: int, body: bytes, attempt: int) -> LLMError:
        detail = _error_detail(body)
        said = f": {detail}" if detail else ""
        attempts = f"{attempt} attempt{'s' if attempt > 1 else ''}"
        error: type[LLMError] = LLMError
        if status in _AUTH_STATUSES:
            error = LLMAuthenticationError
            if not self._api_key:
                hint = f"; set {self._api_key_env}" if self._api_key_env else ""
                message = f"The {self.provider} provider requires an API key (HTTP {status}){said}{hint}."
            else:
                what = "refused the API key" if status == 401 else "denied the API key access"
                source = f" from {self._api_key_env}" if self._api_key_env else ""
                message = f"The {self.provider} provider {what}{source} (HTTP {status}){said}."
        elif status == _RATE_LIMITED:
            error = LLMRateLimitError
            message = (
                f"The {self.provider} provider is still rate limiting after {attempts} (HTTP 429){said}."
            )
        elif status >= 500:
            message = f"The {self.provider} provider failed with HTTP {status} after {attempts}{said}."
        else:
            message = f"The {self.provider} provider refused the request with HTTP {status}{said}."
        return error(self._redact(message), status_code=status)


class _TooLarge(Exception):
    pass


async def _read_capped(response: httpx.Response, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limit:
            raise _TooLarge
        parts.append(chunk)
    return b"".join(parts)


def _response(price: ModelPrice, reply: ParsedReply) -> LLMResponse:
    # tokens x dollars-per-1000 x 100 cents-per-dollar; multiplying first keeps round figures exact.
    dollars_x_1000 = reply.input_tokens * price.input_per_1k + reply.output_tokens * price.output_per_1k
    return LLMResponse(
        content=reply.content,
        stop_reason=reply.stop_reason,
        tool_calls=reply.tool_calls,
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        cost_cents=dollars_x_1000 * _CENTS_PER_DOLLAR / _TOKENS_PER_PRICE_UNIT,
    )


async def _error_body(response: httpx.Response) -> bytes:
    """Return an error response's body for its explanation; one too large or cut off gives none."""
    try:
        return await _read_capped(response, MAX_ERROR_BODY_BYTES)
    except (httpx.TransportError, _TooLarge):
        return b""
    finally:
        await response.aclose()


def _retryable(status: int) -> bool:
    return status == _RATE_LIMITED or status >= 500


def _backoff(attempt: int) -> float:
    """Return the wait after failed attempt ``attempt``: doubling from the first, capped, half of it jittered.

    Jitter spreads the retries of many agents that failed together, so that they do not return together.
    """
    ceiling = min(MAX_BACKOFF_SECONDS, INITIAL_BACKOFF_SECONDS * 2.0 ** (attempt - 1))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 - spreading load, not a secret
