"""The body size limit of a service: a pure ASGI middleware.

Pure ASGI (not Starlette's ``BaseHTTPMiddleware``) because it sits on the hot path of every call
and must neither buffer nor copy the body, nor hold an event stream back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teaagent.service._errors import ApiError, ErrorTable

__all__ = ["BodyLimitMiddleware", "send_error"]


async def send_error(
    send: Send, status: int, code: str, message: str, *, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer an ASGI call with an ``ErrorOut``, from a middleware (no route, no handler).

    ``headers`` go after the content type and length (``(b"www-authenticate", b"Bearer")``).
    """
    body = json.dumps({"error": code, "message": message}).encode()
    length = (b"content-length", str(len(body)).encode())
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), length, *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Refuse bodies above ``limit`` bytes: by ``Content-Length`` before reading, else while reading.

    A declared length above the limit is answered at once (the body is never read); a chunked
    body is counted as it arrives and the read fails with 413 once the count passes the limit:
    an :class:`ApiError`, so that the route's error handler answers when the read was in it, and
    this middleware when it was not. The sentence names the limit; the code is the table's for 413.
    """

    def __init__(self, app: ASGIApp, *, limit: int, errors: ErrorTable) -> None:
        self.app = app
        self.limit = limit
        self.code = errors.code_of(413)
        self.too_large = f"The request body is larger than the limit of {limit} bytes."
        self.not_a_number = "The Content-Length header is not a number."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    await send_error(send, 400, "invalid", self.not_a_number)
                    return
                if int(value) > self.limit:
                    await send_error(send, 413, self.code, self.too_large)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise ApiError(413, self.code, self.too_large)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except ApiError as error:
            # The route's own handler answers when the read happened inside it; this is the fallback.
            if started or error.status_code != 413 or error.message != self.too_large:
                raise
            await send_error(send, 413, self.code, self.too_large)
