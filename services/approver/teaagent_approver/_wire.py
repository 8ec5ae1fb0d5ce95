"""Signed decisions to the node's relay: ``POST /v1/inbox/{id}/decision`` over kept-alive HTTP/1.1.

The engine sends one decision per request it decides, so this call is the approver's hot path.
httpx costs more CPU per call than the relay spends answering it (its pool, anyio and header
models), so decisions go out on plain asyncio streams: one request written in one piece, the
answer read by its ``Content-Length`` (or chunks). Everything else (listings, look-ups) uses
:class:`teaagent.relay_client.AsyncRelayClient`. Failures are :class:`~teaagent.errors.RelayError`
exactly as that client raises them: the relay's status and ``ErrorOut`` code, or no status when it
did not answer. A connection the relay closed while idle is replaced and the call sent once more
(a decision sent twice is counted once: the relay answers the repeat ``counted: false``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from teaagent._batch import Coalescer
from teaagent.errors import RelayError

__all__ = ["DecisionPoster"]

MAX_RESPONSE_BYTES: Final = 1024 * 1024  # a batch's receipts or an ErrorOut; anything larger is no relay
MAX_BATCH: Final = 64  # decisions per POST /v1/inbox/decisions: the relay's own bound
MAX_BATCH_BYTES: Final = 60 * 1024  # under the relay's 64 KiB body limit, with room for the wrapping
_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Unanswered(Exception):
    """The connection failed before any byte of an answer arrived (it may be resent)."""


class DecisionPoster:
    """Posts this node's signed decisions to its relay over at most ``connections`` connections."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        connections: int = 32,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Connect nothing yet.

        ``ssl_context`` verifies an ``https://`` relay (``NodeConfig.tls.client_verify()``); the
        public CAs when None.

        Raises:
            ValueError: ``base_url`` is not an http or https URL with a host, or a limit is not positive.
        """
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the relay URL {base_url!r} is not an http or https URL")
        if connections < 1 or timeout <= 0:
            raise ValueError("connections and timeout must be positive")
        self.base_url = base_url.rstrip("/")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = (ssl_context or ssl.create_default_context()) if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._head = (
            f"Host: {host}:{self._port}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n"
        ).encode("latin-1")
        self._timeout = timeout
        # Last in, first out: the warmest connection is used again, the others idle out.
        self._slots: asyncio.LifoQueue[_Connection | None] = asyncio.LifoQueue()
        for _ in range(connections):
            self._slots.put_nowait(None)
        self._batches: Coalescer[tuple[str, bytes], Any] = Coalescer(
            self._post_many, "teaagent-approver-decisions", max_batch=MAX_BATCH
        )

    async def post(self, request_id: str, statement: Mapping[str, Any], signature: str) -> Any:
        """Hand one signed decision to the relay; return its JSON answer (``InboxDecisionOut``).

        Concurrent calls go out together (``POST /v1/inbox/decisions``, up to ``MAX_BATCH`` and
        ``MAX_BATCH_BYTES`` a request); each is answered as its own ``POST
        /v1/inbox/{id}/decision`` would have been.

        Raises:
            RelayError: The relay refused it (its status and code) or did not answer (no status).
        """
        body = json.dumps(
            {"statement": dict(statement), "signature": signature}, separators=(",", ":")
        ).encode()
        return await self._batches.call((request_id, body))

    async def _post_many(self, items: list[tuple[str, bytes]]) -> list[Any]:
        """The coalescer's send: the batch in as few requests as the body limit allows, at once."""
        chunks: list[list[tuple[str, bytes]]] = [[]]
        size = 0
        for item in items:
            if chunks[-1] and size + len(item[1]) + 1 > MAX_BATCH_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += len(item[1]) + 1
        answers = await asyncio.gather(*(self._post_chunk(chunk) for chunk in chunks))
        return [answer for chunk in answers for answer in chunk]

    async def _post_chunk(self, chunk: list[tuple[str, bytes]]) -> list[Any]:
        if len(chunk) == 1:
            request_id, body = chunk[0]
            what = f"the decision on request {request_id}"
            try:
                status, answer = await self._send(f"/v1/inbox/{request_id}/decision", body, what)
                return [_answer(status, answer, self.base_url, what)]
            except RelayError as exc:
                return [exc]
        what = f"{len(chunk)} decisions"
        body = b'{"decisions":[' + b",".join(item[1] for item in chunk) + b"]}"
        try:
            status, answer = await self._send("/v1/inbox/decisions", body, what)
            data = _answer(status, answer, self.base_url, what)
        except RelayError as exc:
            return [exc] * len(chunk)
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list) or len(results) != len(chunk):
            count = len(results) if isinstance(results, list) else "no"
            error = RelayError(f"The relay at {self.base_url} answered {what} with {count} results.")
            return [error] * len(chunk)
        return [
            _result(result, request_id, self.base_url)
            for (request_id, _body), result in zip(chunk, results, strict=True)
        ]

    async def _send(self, path: str, body: bytes, what: str) -> tuple[int, bytes]:
        """One POST over a kept-alive connection; the status and the body of the answer.

        Raises:
            RelayError: The relay did not answer (no status).
        """
        message = (
            f"POST {self._prefix}{path} HTTP/1.1\r\n".encode("latin-1")
            + self._head
            + f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1")
            + body
        )
        slot = await self._slots.get()
        try:
            try:
                status, answer, slot = await asyncio.wait_for(self._exchange(slot, message), self._timeout)
            except _Unanswered:
                if slot is None:
                    raise
                # A kept-alive connection the relay closed meanwhile: once more on a fresh one.
                slot = None
                status, answer, slot = await asyncio.wait_for(self._exchange(None, message), self._timeout)
        except (_Unanswered, OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
            slot = None  # closed by the exchange
            if isinstance(exc, TimeoutError):
                raise RelayError(f"The relay at {self.base_url} did not answer {what} in time.") from exc
            detail = str(exc).strip().rstrip(".") or type(exc).__name__
            raise RelayError(f"The relay at {self.base_url} is unreachable ({what}): {detail}.") from exc
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
            self._drop(connection)
            raise

    async def _over(self, connection: _Connection, message: bytes) -> tuple[int, bytes, _Connection | None]:
        reader, writer = connection
        try:
            writer.write(message)
            await writer.drain()
            status_line = await reader.readline()
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise _Unanswered(str(exc) or type(exc).__name__) from exc
        if not status_line:
            raise _Unanswered("the connection was closed")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError("the answer is not HTTP/1.1")
        status = int(parts[1])
        length: int | None = None
        chunked, keep = False, True
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value
            elif name == b"connection":
                keep = value != b"close"
        if chunked:
            body = await _read_chunks(reader)
        elif length is not None:
            if length > MAX_RESPONSE_BYTES:
                raise ValueError("the answer is too large")
            body = await reader.readexactly(length)
        else:
            body, keep = await reader.read(MAX_RESPONSE_BYTES), False
        if not keep:
            self._drop(connection)
            return status, body, None
        return status, body, connection

    @staticmethod
    def _drop(connection: _Connection | None) -> None:
        if connection is not None:
            connection[1].close()

    async def aclose(self) -> None:
        """Close the idle connections."""
        while not self._slots.empty():
            self._drop(self._slots.get_nowait())


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(body)
        if len(body) + size > MAX_RESPONSE_BYTES:
            raise ValueError("the answer is too large")
        body += await reader.readexactly(size)
        await reader.readline()


def _answer(status: int, body: bytes, base_url: str, what: str) -> Any:
    """The JSON of a 2xx answer; a RelayError with the relay's code and sentence otherwise."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if 200 <= status < 300:
        if data is None:
            raise RelayError(
                f"The relay at {base_url} answered {what} with something that is not JSON.",
                status_code=status,
            )
        return data
    code: str | None = None
    message = "no reason given"
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        code, message = data["error"], str(data.get("message", message))
    message = message.strip().rstrip(".")
    raise RelayError(
        f"The relay at {base_url} refused {what} ({status} {code or 'error'}): {message}.",
        status_code=status,
        code=code,
    )


def _result(result: Any, request_id: str, base_url: str) -> Any:
    """One decision's answer within a batch: its ``InboxDecisionOut``, or its refusal as a RelayError."""
    what = f"the decision on request {request_id}"
    if not isinstance(result, dict) or not isinstance(result.get("status"), int):
        return RelayError(f"The relay at {base_url} answered {what} with something that is not a result.")
    status = result["status"]
    if status == 200 and isinstance(result.get("decision"), dict):
        return result["decision"]
    code = result.get("error") if isinstance(result.get("error"), str) else None
    message = str(result.get("message") or "no reason given").strip().rstrip(".")
    return RelayError(
        f"The relay at {base_url} refused {what} ({status} {code or 'error'}): {message}.",
        status_code=status,
        code=code,
    )
