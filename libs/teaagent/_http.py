"""HTTP plumbing shared by the library's clients and the services.

**One default SSL context.** httpx builds an SSL context for each client it makes (for
``http://`` URLs too), loading the CA bundle each time: about 30 ms of CPU per client, more than a
hundred of the calls it then makes. Gates, command-line calls and services make clients often, so
the default context is built once per process and shared (an ``SSLContext`` may serve many
connections and threads at once). The CA bundle and ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are read
when the first client is made.

**Pooled calls to one server** (:func:`http_pool`), for the hot paths of a node's services and
their clients (an approver's decisions to its relay, a relay's deliveries to its peers,
:class:`~teaagent.relay_client.AsyncRelayClient`'s calls): one ``httpx.AsyncClient`` per server,
HTTP/1.1, its pool sized to the calls it may have in flight (``httpx.Limits`` with as many
kept-alive connections as connections, so that a busy client never closes and reopens one). Each
call is bounded by its whole timeout (``asyncio.timeout`` around httpx's per-phase timeouts) and
fails only its own caller; a kept-alive connection the server closed meanwhile is replaced and the
call sent once more (only for receivers that are idempotent); an answer longer than its limit
fails the call without being read whole. docs/architecture.md ("HTTP clients") gives the figures
behind the choice: httpx used so against aiohttp's client and the hand-framed client it replaced.

``TEAAGENT_BENCH_HTTP_CLIENT=aiohttp`` (benches only; aiohttp is a ``dev`` extra) sends the same
calls through aiohttp's client instead, so that ``teaagent bench quorum`` can compare them
end to end in the same run.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
from collections.abc import Mapping
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import httpx

__all__ = ["BENCH_CLIENT_ENV", "MAX_RESPONSE_BYTES", "HTTPPool", "NoAnswer", "client_verify", "http_pool"]

MAX_RESPONSE_BYTES: Final = 1024 * 1024  # an answer of a node's service; anything larger is no such service
_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@functools.cache
def _default_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def client_verify(verify: ssl.SSLContext | bool = True) -> ssl.SSLContext | bool:
    """httpx's ``verify=`` for ``verify``: the process's one default context in place of True."""
    return _default_context() if verify is True else verify


class NoAnswer(Exception):
    """The server did not answer: unreachable, the connection broke, or ``timed_out``."""

    def __init__(self, detail: str, *, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.timed_out = timed_out


class HTTPPool(Protocol):
    """Calls to one server over a pool of kept-alive connections (see :func:`http_pool`)."""

    base_url: str

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """Send one call (``path`` with its query string); the answer's status and body.

        Raises:
            NoAnswer: The server did not answer (its ``timed_out`` says whether in time).
            ValueError: A header value holds CR or LF (nothing is sent).
        """
        ...  # pragma: no cover

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON); as :meth:`request`."""
        ...  # pragma: no cover

    async def aclose(self) -> None:
        """Close the pool's connections."""
        ...  # pragma: no cover


BENCH_CLIENT_ENV: Final = "TEAAGENT_BENCH_HTTP_CLIENT"  # benches only: "httpx" (the default) or "aiohttp"


def http_pool(
    base_url: str,
    *,
    headers: Mapping[str, str] | None = None,
    connections: int = 32,
    timeout: float = 10.0,
    verify: ssl.SSLContext | bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
    max_response_bytes: int = MAX_RESPONSE_BYTES,
    client: str | None = None,
) -> HTTPPool:
    """Calls to the server at ``base_url`` over at most ``connections`` kept-alive connections.

    ``headers`` go with every call (beside Content-Type and Accept: JSON); ``verify`` checks an
    ``https://`` server (True: the public CAs, through the process's one default context);
    ``timeout`` bounds each call whole (connection, sending, answer), unless the call gives its
    own; an answer longer than ``max_response_bytes`` fails the call. ``transport`` (tests: an
    app in the same process) is httpx's. ``client`` (benches only) names the client: ``httpx``,
    or ``aiohttp``; ``TEAAGENT_BENCH_HTTP_CLIENT`` when None, httpx when that is unset.

    Raises:
        ValueError: ``base_url`` is not an http or https URL with a host, a limit is not positive,
            or ``TEAAGENT_BENCH_HTTP_CLIENT`` names no client.
    """
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the URL {base_url!r} is not an http or https URL")
    if connections < 1 or timeout <= 0 or max_response_bytes < 1:
        raise ValueError("connections, timeout and max_response_bytes must be positive")
    variant = client or os.environ.get(BENCH_CLIENT_ENV) or "httpx"
    if transport is not None:
        variant = "httpx"
    options: dict[str, Any] = {
        "headers": headers,
        "connections": connections,
        "timeout": timeout,
        "verify": verify,
        "max_response_bytes": max_response_bytes,
    }
    if variant == "httpx":
        return _HttpxPool(base_url, transport=transport, **options)
    if variant == "aiohttp":
        return _AiohttpPool(base_url, **options)
    if variant == "kept":  # today's hand-framed client, while the benches compare it
        context = verify if isinstance(verify, ssl.SSLContext) else None
        return KeptAlive(
            base_url,
            headers=headers,
            connections=connections,
            timeout=timeout,
            ssl_context=context,
            max_response_bytes=max_response_bytes,
        )
    raise ValueError(f"{BENCH_CLIENT_ENV}={variant!r} names no HTTP client (httpx or aiohttp)")


_CLOSED_IDLE: Final = "Server disconnected without sending a response"  # httpcore's words
_JSON_HEADERS: Final = {"Content-Type": "application/json", "Accept": "application/json"}


def _check_headers(headers: Mapping[str, str] | None) -> None:
    for name, value in (headers or {}).items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"the header {name.strip()!r} holds CR, LF or NUL: not sent")


class _HttpxPool:
    """:func:`http_pool` through one ``httpx.AsyncClient``, its pool sized to ``connections``."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None,
        connections: int,
        timeout: float,
        verify: ssl.SSLContext | bool,
        max_response_bytes: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        _check_headers(headers)
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._max = max_response_bytes
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers={**_JSON_HEADERS, **(headers or {})},
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
            timeout=timeout,
            verify=client_verify(verify),
            transport=transport,
            http1=True,
            http2=False,
        )

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        _check_headers(headers)
        seconds = self._timeout if timeout is None else timeout
        try:
            # The whole call within its timeout: httpx's own bound each phase (the pool, the
            # connection, each read), so that one call could wait several times as long.
            async with asyncio.timeout(seconds):
                try:
                    return await self._exchange(method, path, body, headers, seconds)
                except httpx.RemoteProtocolError as exc:
                    if not str(exc).startswith(_CLOSED_IDLE):
                        raise
                    # A kept-alive connection the server closed while idle, before any byte of
                    # an answer: once more, on a fresh one.
                    return await self._exchange(method, path, body, headers, seconds)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise NoAnswer("no answer in time", timed_out=True) from exc
        except httpx.LocalProtocolError as exc:
            raise ValueError(f"the call was not sent: {exc}") from exc
        except httpx.HTTPError as exc:
            raise NoAnswer(str(exc).strip().rstrip(".") or type(exc).__name__) from exc

    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None, seconds: float
    ) -> tuple[int, bytes]:
        request = self._client.build_request(method, path, content=body, headers=headers, timeout=seconds)
        response = await self._client.send(request, stream=True)
        try:
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > self._max:
                raise NoAnswer("the answer is too large")
            content = bytearray()
            async for chunk in response.aiter_bytes():
                content += chunk
                if len(content) > self._max:
                    raise NoAnswer("the answer is too large")
        finally:
            await response.aclose()
        return response.status_code, bytes(content)

    async def aclose(self) -> None:
        await self._client.aclose()


class _AiohttpPool:
    """:func:`http_pool` through one ``aiohttp.ClientSession`` (benches only: a ``dev`` extra)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None,
        connections: int,
        timeout: float,
        verify: ssl.SSLContext | bool,
        max_response_bytes: int,
    ) -> None:
        _check_headers(headers)
        self.base_url = base_url.rstrip("/")
        self._headers = {**_JSON_HEADERS, **(headers or {})}
        self._connections = connections
        self._timeout = timeout
        self._ssl: ssl.SSLContext | bool = client_verify(verify)
        self._max = max_response_bytes
        self._session: Any = None  # made on the first call, inside the event loop

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        import aiohttp

        _check_headers(headers)
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._connections, limit_per_host=self._connections, ssl=self._ssl
                ),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None),
            )
        seconds = self._timeout if timeout is None else timeout
        try:
            async with (
                asyncio.timeout(seconds),
                self._session.request(method, self.base_url + path, data=body, headers=headers) as response,
            ):
                content = await response.content.read(self._max + 1)
                if len(content) > self._max:
                    raise NoAnswer("the answer is too large")
                return response.status, content
        except TimeoutError as exc:
            raise NoAnswer("no answer in time", timed_out=True) from exc
        except aiohttp.ClientError as exc:
            raise NoAnswer(str(exc).strip().rstrip(".") or type(exc).__name__) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Unanswered(Exception):
    """The connection failed before any byte of an answer arrived (it may be resent)."""


class KeptAlive:
    """POSTs to one HTTP/1.1 server over at most ``connections`` kept-alive connections."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        connections: int = 32,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        """Connect nothing yet.

        ``headers`` go with every call (beside Host, Content-Type, Accept and Content-Length);
        ``ssl_context`` verifies an ``https://`` server: the public CAs (the process's default
        context) when None; an answer longer than ``max_response_bytes`` fails the call.

        Raises:
            ValueError: ``base_url`` is not an http or https URL with a host, or a limit is not positive.
        """
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the URL {base_url!r} is not an http or https URL")
        if connections < 1 or timeout <= 0 or max_response_bytes < 1:
            raise ValueError("connections, timeout and max_response_bytes must be positive")
        self._max = max_response_bytes
        self.base_url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = (ssl_context or _default_context()) if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        lines = [f"Host: {host}:{self._port}", "Content-Type: application/json", "Accept: application/json"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self._head = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._timeout = timeout
        # Last in, first out: the warmest connection is used again, the others idle out.
        self._slots: asyncio.LifoQueue[_Connection | None] = asyncio.LifoQueue()
        for _ in range(connections):
            self._slots.put_nowait(None)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path`` under the base URL; return the answer's status and body.

        Raises:
            NoAnswer: The server did not answer (its ``timed_out`` says whether in time).
        """
        return await self.request("POST", path, body)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, bytes]:
        """Send one call (``path`` with its query string) and return the answer's status and body.

        ``headers`` go with this call only; ``timeout`` replaces the client's for it.

        Raises:
            NoAnswer: The server did not answer (its ``timed_out`` says whether in time).
        """
        head = f"{method} {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1") + self._head
        if headers:
            head += "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")
        if body is not None:
            message = head + f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        else:
            message = head + b"\r\n"
        seconds = self._timeout if timeout is None else timeout
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs its awaitable in a task of
        # its own, a task and a timer for each wait of each call.
        try:
            # Every connection busy (long-polls, say) for the whole timeout: no answer in time.
            async with asyncio.timeout(seconds):
                slot = await self._slots.get()
        except TimeoutError as exc:
            raise NoAnswer("no connection was free in time", timed_out=True) from exc
        try:
            try:
                async with asyncio.timeout(seconds):
                    status, answer, slot = await self._exchange(slot, message)
            except _Unanswered:
                if slot is None:
                    raise
                # A kept-alive connection the server closed meanwhile: once more on a fresh one.
                slot = None
                async with asyncio.timeout(seconds):
                    status, answer, slot = await self._exchange(None, message)
        except (_Unanswered, OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
            slot = None  # closed by the exchange
            if isinstance(exc, TimeoutError):
                raise NoAnswer("no answer in time", timed_out=True) from exc
            raise NoAnswer(str(exc).strip().rstrip(".") or type(exc).__name__) from exc
        except BaseException:
            slot = None
            raise
        finally:
            self._slots.put_nowait(slot)
        return status, answer

    async def _exchange(
        self, slot: _Connection | None, message: bytes
    ) -> tuple[int, bytes, _Connection | None]:
        """Send one request and read its answer; the connection is closed on any failure.

        Raises:
            _Unanswered: The connection failed before the answer's first line.
            ValueError: The answer is not HTTP/1.1, or too large.
            OSError: Connecting failed.
            asyncio.IncompleteReadError: The answer was cut short.
        """
        try:
            connection = slot or await asyncio.open_connection(self._host, self._port, ssl=self._ssl)
        except OSError as exc:
            raise _Unanswered(str(exc) or type(exc).__name__) from exc
        try:
            return await self._over(connection, message)
        except BaseException:
            _drop(connection)
            raise

    async def _over(self, connection: _Connection, message: bytes) -> tuple[int, bytes, _Connection | None]:
        reader, writer = connection
        try:
            writer.write(message)
            await writer.drain()
            # The status line and the headers in one read (HTTP/1.1 ends each line with CRLF).
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:  # an answer begun and cut short: not one to send again
                raise ValueError("the answer's head was cut short") from exc
            raise _Unanswered("the connection was closed") from exc
        except asyncio.LimitOverrunError as exc:
            raise ValueError("the answer's head is too large") from exc
        except OSError as exc:
            raise _Unanswered(str(exc) or type(exc).__name__) from exc
        status_line, *lines = head[:-4].split(b"\r\n")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError("the answer is not HTTP/1.1")
        status = int(parts[1])
        length: int | None = None
        chunked, keep = False, True
        for line in lines:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                keep = value != b"close"
        if chunked:
            body = await _read_chunks(reader, self._max)
        elif length is not None:
            if length > self._max:
                raise ValueError("the answer is too large")
            body = await reader.readexactly(length)
        else:
            body, keep = await reader.read(self._max), False
        if not keep:
            _drop(connection)
            return status, body, None
        return status, body, connection

    async def aclose(self) -> None:
        """Close the idle connections."""
        while not self._slots.empty():
            _drop(self._slots.get_nowait())


def _drop(connection: _Connection | None) -> None:
    if connection is not None:
        connection[1].close()


async def _read_chunks(reader: asyncio.StreamReader, limit: int) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(body)
        if len(body) + size > limit:
            raise ValueError("the answer is too large")
        body += await reader.readexactly(size)
        await reader.readline()
