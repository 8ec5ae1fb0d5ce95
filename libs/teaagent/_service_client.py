"""What the library's clients of a node's services share: the relay's and the approver's.

A client speaks its service's calls (:class:`Call`: what to send, how to name it in a sentence, how
to read its answer), synchronously (:class:`SyncServiceClient`, one ``httpx.Client``) or with
asyncio (:class:`AsyncServiceClient`, one pool of kept-alive connections,
:func:`teaagent._http.http_pool`). The node's own calls send its bearer token; a peer's calls send
none. Every failure is a :class:`~teaagent.errors.RelayError` (the approving path's error) in one
sentence that names the service and the call: the service refused it (its status and stable
``ErrorOut`` code), did not answer (in time), or answered with something that is not what its API
documents.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, Literal, Self, TypeVar
from urllib.parse import urlencode, urlsplit

from teaagent._http import NoAnswer, client_verify, http_pool
from teaagent._json import JSONDepthError, parse_json
from teaagent._urls import shown_url
from teaagent.errors import RelayError

if TYPE_CHECKING:
    # httpx (a tenth of a second, with the rich and pygments its command line brings) is imported
    # by the synchronous client that uses it, not by a service that only makes asyncio clients.
    import httpx

__all__ = [
    "DEFAULT_TIMEOUT",
    "HEALTH_CHECK",
    "ITEM_STATES",
    "MAX_ANSWER_BYTES",
    "MAX_WAIT_SECONDS",
    "AsyncServiceClient",
    "Call",
    "ItemState",
    "ListState",
    "ServiceClient",
    "SyncServiceClient",
    "Unexpected",
    "json_object",
    "long_poll",
]

DEFAULT_TIMEOUT: Final = 10.0  # seconds for one call; a service answers in milliseconds, long-polls excepted
# The largest answer taken: a listing of 1000 items, each a request under the relay's 64 KiB.
MAX_ANSWER_BYTES: Final = 1000 * 80 * 1024
MAX_WAIT_SECONDS: Final = 60.0  # the longest single long-poll asked for; longer waits are several polls
_WAIT_MARGIN: Final = 5.0  # a long-poll's HTTP timeout is its wait plus this, so the service answers first

# The states of a request as a node sees it, in the relay's inbox and in the approver's; a listing
# takes "all" as well.
ItemState = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]
ListState = Literal[ItemState, "all"]
ITEM_STATES: Final[tuple[ItemState, ...]] = (
    "pending",
    "approved",
    "denied",
    "expired",
    "withdrawn",
    "settled",
)

T = TypeVar("T")
Tr = TypeVar("Tr", "httpx.BaseTransport", "httpx.AsyncBaseTransport")  # a sync or an asyncio transport


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP call of a service's API: what to send, how to name it in a sentence, how to read it.

    Attributes:
        method: The HTTP method.
        path: The path, without the query string.
        what: The call in a sentence: ``the status of request ab12...``.
        parse: Reads the answer's JSON into what the client returns; it raises ValueError, KeyError
            or TypeError (:class:`Unexpected` with its own words) for an answer that is not that.
        body: The JSON body, or None.
        params: The query string's parameters, or None.
        timeout: Seconds for this call instead of the client's timeout (a long-poll's are longer).
        token: Whether the node's bearer token goes with it (a peer's calls send none).
    """

    method: str
    path: str
    what: str
    parse: Callable[[Any], T]
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    timeout: float | None = None
    token: bool = True


class Unexpected(ValueError):
    """An answer that is not what a call expects, in words that finish "answered <call> with ..."."""


def json_object(data: Any) -> dict[str, Any]:
    """The answer as a JSON object (a :attr:`Call.parse`).

    Raises:
        TypeError: It is not one.
    """
    if not isinstance(data, Mapping):
        raise TypeError("it is not a JSON object")
    return dict(data)


HEALTH_CHECK: Final[Call[dict[str, Any]]] = Call(
    "GET", "/health", "the health check", json_object, token=False
)


def long_poll(wait: float, timeout: float) -> tuple[float, float]:
    """A long-poll's wait, within 0 to ``MAX_WAIT_SECONDS``, and its HTTP timeout (the wait and more)."""
    wait = max(0.0, min(wait, MAX_WAIT_SECONDS))
    return wait, wait + max(timeout, _WAIT_MARGIN)


class ServiceClient(Generic[Tr]):
    """A client of one service at ``base_url``: its sentences, whichever way its calls go (``Tr``:
    the httpx transport, sync or asyncio, that tests may put in place of the network)."""

    service: ClassVar[str]  # "relay", "approver": how sentences name it

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        start_command: str | None = None,
        transport: Tr | None = None,
        limits: httpx.Limits | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Connect nothing yet; calls open pooled connections as needed.

        Args:
            base_url: The service's base URL, ``http://127.0.0.1:<port>``.
            token: The node's bearer token, sent with the node's own calls (not a peer's).
            timeout: Seconds for one call (a long-poll adds its wait).
            start_command: The command that starts the service, named when nobody answers.
            transport: An httpx transport instead of the network (tests of the client alone).
            limits: Its ``max_connections`` sizes the pool (an asyncio client keeps every one
                alive; 100 by default).
            verify: Checks an ``https://`` service's certificate: True for the public CAs, or a
                context trusting a private CA (``NodeConfig.tls.client_verify()``).

        Raises:
            ValueError: ``base_url`` is not an http or https URL, or ``timeout`` is not positive.
        """
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the {self.service} URL {shown_url(base_url)!r} is not an http or https URL")
        self.base_url = base_url.rstrip("/")
        self.shown = shown_url(self.base_url, path=True)  # what messages name: no credential
        self._token = token
        self._timeout = timeout
        self._start_command = start_command
        self._connect(transport, limits, verify)

    def _connect(
        self, transport: Tr | None, limits: httpx.Limits | None, verify: ssl.SSLContext | bool
    ) -> None:
        """Make the client's pool (it opens connections only when calls need them)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.shown!r})"

    def _headers(self, call: Call[Any]) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {self._token}"} if call.token and self._token else None

    def _timeout_of(self, call: Call[Any]) -> float:
        return call.timeout if call.timeout is not None else self._timeout

    def _no_answer(self, call: Call[Any], exc: httpx.HTTPError | NoAnswer) -> RelayError:
        """The sentence of a call that got no answer: in time, or at all."""
        detail = str(exc).strip().rstrip(".") or type(exc).__name__
        timed_out = exc.timed_out if isinstance(exc, NoAnswer) else _httpx_timeout(exc)
        if timed_out:
            return RelayError(
                f"The {self.service} at {self.shown} did not answer {call.what} in time: {detail}."
            )
        return self._unreachable(call, detail)

    def _unreachable(self, call: Call[Any], detail: str) -> RelayError:
        """The sentence of a call nobody answered."""
        hint = f"; start it with `{self._start_command}`" if self._start_command else ""
        return RelayError(f"The {self.service} at {self.shown} is unreachable ({call.what}): {detail}{hint}.")

    def _not_json(self, status: int, call: Call[Any], exc: ValueError) -> RelayError:
        """The sentence of a 2xx answer that is not JSON (or nests too deep)."""
        if isinstance(exc, JSONDepthError):
            return RelayError(
                f"The {self.service} at {self.shown} answered {call.what} with JSON nested more than "
                f"{exc.limit} levels deep.",
                status_code=status,
            )
        return RelayError(
            f"The {self.service} at {self.shown} answered {call.what} with something that is not JSON.",
            status_code=status,
        )

    def _read(self, status: int, content: bytes, reason: str, call: Call[T]) -> T:
        """The parsed answer of a 2xx; a refusal, or an answer that is not the documented one, raises."""
        if not 200 <= status < 300:
            raise self._refusal(status, content, reason, call)
        try:
            data = parse_json(content)
        except ValueError as exc:
            raise self._not_json(status, call, exc) from exc
        try:
            return call.parse(data)
        except (ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, Unexpected):
                detail = str(exc)
            elif isinstance(exc, KeyError):
                detail = f"something that is not what its API documents: it has no field {exc.args[0]!r}"
            else:
                detail = f"something that is not what its API documents: {str(exc).rstrip('.')}"
            raise RelayError(
                f"The {self.service} at {self.shown} answered {call.what} with {detail}.",
                status_code=status,
            ) from None

    def _refusal(self, status: int, content: bytes, reason: str, call: Call[Any]) -> RelayError:
        """Any answer but a 2xx: the service's refusal, with its ``ErrorOut`` code and message."""
        code: str | None = None
        message = reason or "no reason given"
        try:
            body = parse_json(content)
            if isinstance(body, dict) and isinstance(body.get("error"), str):
                code, message = body["error"], str(body.get("message", message))
        except ValueError:
            pass
        message = " ".join(message.split()).rstrip(".")
        return RelayError(
            f"The {self.service} at {self.shown} refused {call.what} ({status} {code or 'error'}): "
            f"{message}.",
            status_code=status,
            code=code,
        )


def _httpx_timeout(exc: httpx.HTTPError) -> bool:
    import httpx

    return isinstance(exc, httpx.TimeoutException)


class SyncServiceClient(ServiceClient["httpx.BaseTransport"]):
    """A synchronous client: its calls go out through one ``httpx.Client`` and its pool."""

    def _connect(
        self,
        transport: httpx.BaseTransport | None,
        limits: httpx.Limits | None,
        verify: ssl.SSLContext | bool,
    ) -> None:
        import httpx

        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=self._timeout,
            transport=transport,
            verify=client_verify(verify),
            limits=limits
            or httpx.Limits(max_connections=100, max_keepalive_connections=20),  # httpx's default
        )

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        import httpx

        try:
            response = self._client.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params,
                headers=self._headers(call),
                timeout=self._timeout_of(call),
            )
        except httpx.HTTPError as exc:
            raise self._no_answer(call, exc) from exc
        return self._read(response.status_code, response.content, response.reason_phrase, call)


class AsyncServiceClient(ServiceClient["httpx.AsyncBaseTransport"]):
    """An asyncio client: its calls go out through one pool of kept-alive connections.

    aiohttp's client, or httpx's with a ``transport`` (tests: an app in the same process), as many
    connections as ``limits`` allows (100 by default: a client shared by many callers never closes
    and reopens one); see :func:`teaagent._http.http_pool`.
    """

    def _connect(
        self,
        transport: httpx.AsyncBaseTransport | None,
        limits: httpx.Limits | None,
        verify: ssl.SSLContext | bool,
    ) -> None:
        self._http = http_pool(
            self.base_url,
            connections=(limits.max_connections if limits is not None else None) or 100,
            timeout=self._timeout,
            verify=verify,
            transport=transport,
            max_response_bytes=MAX_ANSWER_BYTES,
        )

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        path = f"{call.path}?{urlencode(call.params)}" if call.params else call.path
        body = json.dumps(call.body).encode() if call.body is not None else None
        try:
            status, content = await self._http.request(
                call.method, path, body, headers=self._headers(call), timeout=self._timeout_of(call)
            )
        except NoAnswer as exc:
            raise self._no_answer(call, exc) from exc
        except ValueError as exc:  # a token with CR or LF: never sent
            raise RelayError(f"The call to the {self.service} at {self.shown} was not sent: {exc}.") from exc
        return self._read(status, content, _reason(status), call)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""
