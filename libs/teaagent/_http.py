"""HTTP plumbing shared by the library's clients and the services.

**One default SSL context.** httpx builds an SSL context for each client it makes (for
``http://`` URLs too), loading the CA bundle each time: about 30 ms of CPU per client, more than a
hundred of the calls it then makes. Gates, command-line calls and services make clients often, so
the default context is built once per process and shared (an ``SSLContext`` may serve many
connections and threads at once). The CA bundle and ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are read
when the first client is made.

**Pooled calls to one server** (:func:`http_pool`), for the hot paths of a node's services and their
clients (an approver's decisions to its relay, a relay's deliveries to its peers,
:class:`~teaagent.relay_client.AsyncRelayClient`'s calls): one ``aiohttp.ClientSession`` per server,
its ``TCPConnector`` sized to the calls it may have in flight, so that a busy client never closes
and reopens a connection. aiohttp and not httpx (the client the project's users asked for; another
library needs 1.5 times end to end): where a relay sends each delivery as its own call, to a peer
whose relay takes no batch, ``teaagent bench quorum`` measured three to four and a half times less
cluster CPU per quorum at concurrency 64 through aiohttp and two and a half to four times the
quorums (runs on 2026-12-06 and 12-07), and the asking side spends about half the CPU. httpx's pool
works through every call in flight at each call's start and end. With the deliveries batched the gap
was 0.95 to 1.37 times (seven runs on 2026-12-07), under the rule. Every run of ``bench quorum``
measures both again (``aiohttp_over_httpx_*``, the best judged against 1.5); docs/architecture.md
("HTTP clients") has the figures. Each call is bounded by its whole timeout (``asyncio.timeout``)
and fails only its own caller; a kept-alive connection the server closed meanwhile is replaced and
the call sent once more (only for receivers that are idempotent); an answer longer than its limit
fails the call without being read whole; a header value with CR, LF or NUL is refused before
anything is sent. A pool keeps no cookie: what a server sets (a peer's relay is untrusted transport)
is never sent back, and no call pays for the cookie jar's filtering (about a tenth of aiohttp's CPU
per call).

With a ``transport`` (tests: an app in the same process) the pool is httpx's, whose transports
those are. ``TEAAGENT_BENCH_HTTP_CLIENT=httpx`` (benches only) sends the same calls through httpx,
sized the same (``httpx.Limits``, HTTP/1.1, one client reused), so that ``teaagent bench quorum``
and ``bench relay`` compare the two in the same run.

**Loaded before a service starts** (:func:`load_client`). Importing aiohttp costs about a tenth of
a second of CPU (0.12 s on a 2-core host, its module-level SSL contexts included), and an import
holds the event loop: a service that imported it on its first outgoing call (an approver's first
decision, a relay's first delivery) kept every call in flight waiting that long. A command that
makes one call pays the same import either way, so the library still imports it where first used.
"""

from __future__ import annotations

import asyncio
import functools
import http.cookiejar
import importlib
import os
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

if TYPE_CHECKING:
    # Each imported where it is first used: aiohttp by the first pool made (by a service before it
    # starts: load_client), httpx (a tenth of a second, with the rich and pygments its command line
    # brings) by the default SSL context or an httpx pool. A relay serving its peers never loads httpx.
    import aiohttp
    import httpx

__all__ = [
    "BENCH_CLIENT_ENV",
    "MAX_RESPONSE_BYTES",
    "HTTPPool",
    "NoAnswer",
    "client_verify",
    "http_pool",
    "load_client",
]

MAX_RESPONSE_BYTES: Final = 1024 * 1024  # an answer of a node's service; anything larger is no such service


@functools.cache
def _default_context() -> ssl.SSLContext:
    import httpx

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


BENCH_CLIENT_ENV: Final = "TEAAGENT_BENCH_HTTP_CLIENT"  # benches only: "aiohttp" (the default) or "httpx"


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
    app in the same process) is httpx's, and makes the pool httpx's. ``client`` (benches only)
    names the client: ``aiohttp`` or ``httpx``; ``TEAAGENT_BENCH_HTTP_CLIENT`` when None,
    aiohttp when that is unset.

    Raises:
        ValueError: ``base_url`` is not an http or https URL with a host, a limit is not positive,
            or ``TEAAGENT_BENCH_HTTP_CLIENT`` names no client.
    """
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the URL {base_url!r} is not an http or https URL")
    if connections < 1 or timeout <= 0 or max_response_bytes < 1:
        raise ValueError("connections, timeout and max_response_bytes must be positive")
    variant = client or _client_named()
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
    raise ValueError(f"{BENCH_CLIENT_ENV}={variant!r} names no HTTP client (httpx or aiohttp)")


def _client_named() -> str:
    """The client a pool is made of when not told: ``TEAAGENT_BENCH_HTTP_CLIENT``, else aiohttp."""
    return os.environ.get(BENCH_CLIENT_ENV) or "aiohttp"


def load_client() -> None:
    """Import the client library that :func:`http_pool` makes pools of, before any pool is needed.

    aiohttp, or httpx under ``TEAAGENT_BENCH_HTTP_CLIENT=httpx``. A service calls this before it
    starts (``teaagent.cli._serve.serve_app``), so that its first outgoing call does not hold
    every call in flight for the import (module docstring). A variable that names no client imports
    aiohttp here: the pool that would be made refuses it with its own sentence.
    """
    importlib.import_module("httpx" if _client_named() == "httpx" else "aiohttp")


_CLOSED_IDLE: Final = "Server disconnected without sending a response"  # httpcore's words
_JSON_HEADERS: Final = {"Content-Type": "application/json", "Accept": "application/json"}


def _check_headers(headers: Mapping[str, str] | None) -> None:
    for name, value in (headers or {}).items():
        if any(c in name or c in value for c in "\r\n\0"):
            raise ValueError(f"the header {name.strip()!r} holds CR, LF or NUL: not sent")


def _no_answer(exc: Exception) -> NoAnswer:
    """A client library's failure as :class:`NoAnswer`: its own words, else its name."""
    return NoAnswer(str(exc).strip().rstrip(".") or type(exc).__name__)


async def _bounded(declared: int | None, chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """An answer's body, read whole, or NoAnswer as soon as it is (or says it is) over ``limit``."""
    if declared is not None and declared > limit:
        raise NoAnswer("the answer is too large")
    content = bytearray()
    async for chunk in chunks:
        content += chunk
        if len(content) > limit:
            raise NoAnswer("the answer is too large")
    return bytes(content)


class HTTPPool:
    """Calls to one server over a pool of kept-alive connections (see :func:`http_pool`).

    Each call is bounded whole by its timeout; a kept-alive connection the server closed while
    idle, before any byte of an answer, is tried once more on a fresh one. A pool (httpx's,
    aiohttp's) says how one try goes and which of its library's exceptions mean what.
    """

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
        self._verify = verify
        self._max = max_response_bytes

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON); as :meth:`request`."""
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
        """Send one call (``path`` with its query string); the answer's status and body.

        Raises:
            NoAnswer: The server did not answer (its ``timed_out`` says whether in time).
            ValueError: A header value holds CR or LF (nothing is sent).
        """
        _check_headers(headers)
        seconds = self._timeout if timeout is None else timeout
        try:
            # The whole call within its timeout, whatever phase it is in.
            async with asyncio.timeout(seconds):
                try:
                    return await self._exchange(method, path, body, headers, seconds)
                except Exception as exc:
                    if not self._closed_while_idle(exc):
                        raise
                    return await self._exchange(method, path, body, headers, seconds)
        except TimeoutError as exc:
            raise NoAnswer("no answer in time", timed_out=True) from exc
        except Exception as exc:
            failure = self._failure(exc)
            if failure is None:
                raise
            raise failure from exc

    async def aclose(self) -> None:
        """Close the pool's connections."""
        raise NotImplementedError

    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None, seconds: float
    ) -> tuple[int, bytes]:
        """One try of the call: its status and its body, read whole (at most ``max_response_bytes``)."""
        raise NotImplementedError

    def _closed_while_idle(self, exc: Exception) -> bool:
        """Whether ``exc`` says a kept-alive connection was closed before any byte of an answer."""
        raise NotImplementedError

    def _failure(self, exc: Exception) -> Exception | None:
        """What ``exc``, one of the library's, is to the caller (NoAnswer, ValueError); None: itself."""
        raise NotImplementedError


class _HttpxPool(HTTPPool):
    """:func:`http_pool` through one ``httpx.AsyncClient``, its pool sized to ``connections``."""

    def __init__(
        self, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None, **options: Any
    ) -> None:
        import httpx

        super().__init__(base_url, **options)
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            limits=httpx.Limits(
                max_connections=self._connections, max_keepalive_connections=self._connections
            ),
            timeout=self._timeout,
            verify=client_verify(self._verify),
            transport=transport,
            http1=True,
            http2=False,
            cookies=_no_cookies(),
        )

    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None, seconds: float
    ) -> tuple[int, bytes]:
        request = self._client.build_request(method, path, content=body, headers=headers, timeout=seconds)
        response = await self._client.send(request, stream=True)
        try:
            declared = response.headers.get("content-length")
            length = int(declared) if declared is not None and declared.isdigit() else None
            content = await _bounded(length, response.aiter_bytes(), self._max)
        finally:
            await response.aclose()
        return response.status_code, content

    def _closed_while_idle(self, exc: Exception) -> bool:
        import httpx

        return isinstance(exc, httpx.RemoteProtocolError) and str(exc).startswith(_CLOSED_IDLE)

    def _failure(self, exc: Exception) -> Exception | None:
        import httpx

        # httpx bounds each phase (the pool, the connection, each read) by the timeout too.
        if isinstance(exc, httpx.TimeoutException):
            return NoAnswer("no answer in time", timed_out=True)
        if isinstance(exc, httpx.LocalProtocolError):
            return ValueError(f"the call was not sent: {exc}")
        if isinstance(exc, httpx.HTTPError):
            return _no_answer(exc)
        return None

    async def aclose(self) -> None:
        await self._client.aclose()


def _no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar for httpx that keeps none: its policy accepts no domain."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


def _env_proxy(base_url: str) -> str | None:
    """The proxy ``HTTP_PROXY``/``HTTPS_PROXY`` name for ``base_url`` (credentials in its URL, which
    aiohttp sends as Proxy-Authorization), unless ``NO_PROXY`` spares its host: the standard
    library's reading of them, as aiohttp's and httpx's own."""
    parts = urlsplit(base_url)
    named = urllib.request.getproxies().get(parts.scheme)
    if not named or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return named


class _AiohttpPool(HTTPPool):
    """:func:`http_pool` through one ``aiohttp.ClientSession``, its connector sized to ``connections``."""

    # Made on the first call, inside its event loop (a session belongs to one loop).
    _session: aiohttp.ClientSession | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    _proxy: str | None = None

    def _session_here(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._proxy = _env_proxy(self.base_url)
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._connections,
                    limit_per_host=self._connections,
                    ssl=client_verify(self._verify) if self.base_url.startswith("https:") else False,
                ),
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=None),  # each call's own, below
                # The environment's proxy is read once per pool (_env_proxy), as httpx reads it once
                # per client: aiohttp's trust_env would read it, and ~/.netrc, in a thread on every
                # call (about a tenth of a busy service's CPU).
                trust_env=False,
                auto_decompress=True,
                cookie_jar=aiohttp.DummyCookieJar(),  # no cookie kept or sent (module docstring)
            )
            self._loop = loop
        return self._session

    async def _exchange(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None, seconds: float
    ) -> tuple[int, bytes]:
        session = self._session_here()
        async with session.request(
            method, self.base_url + path, data=body, headers=headers, allow_redirects=False, proxy=self._proxy
        ) as response:
            content = await _bounded(response.content_length, response.content.iter_any(), self._max)
            return response.status, content

    def _closed_while_idle(self, exc: Exception) -> bool:
        import aiohttp

        return isinstance(exc, aiohttp.ServerDisconnectedError)

    def _failure(self, exc: Exception) -> Exception | None:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return _no_answer(exc)
        return None

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None
