"""Two pure ASGI middlewares: the body size limit and the per-route metrics.

Pure ASGI (not Starlette's ``BaseHTTPMiddleware``) because both sit on the hot path of every
decision and must not buffer or copy the body.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teaagent_relay._errors import ApiError
from teaagent_relay._metrics import RelayMetrics

__all__ = ["MAX_BODY_BYTES", "BodyLimitMiddleware", "MetricsMiddleware"]

MAX_BODY_BYTES: Final = 64 * 1024  # a signed tool call or decision, not a file upload
# Label values must stay few: any other method a client sends is counted as OTHER.
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _too_large() -> ApiError:
    return ApiError(413, "too_large", f"The request body is larger than the limit of {MAX_BODY_BYTES} bytes.")


async def _send_error(send: Send, error: ApiError) -> None:
    body = json.dumps({"error": error.code, "message": error.message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Refuse bodies above ``limit`` bytes: by ``Content-Length`` before reading, else while reading.

    A declared length above the limit is answered at once (the body is never read); a chunked
    body is counted as it arrives and the read fails with 413 once the count passes the limit.
    """

    def __init__(self, app: ASGIApp, *, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    await _send_error(
                        send, ApiError(400, "invalid", "The Content-Length header is not a number.")
                    )
                    return
                if int(value) > self.limit:
                    await _send_error(send, _too_large())
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _too_large()
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
            if started or error.code != "too_large":
                raise
            await _send_error(send, error)


class MetricsMiddleware:
    """Count every HTTP call by route template, method and status, and time it; count each refusal
    (a 4xx or 5xx answer) by its ``ErrorOut`` code."""

    def __init__(self, app: ASGIApp, *, metrics: RelayMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        refused = False

        async def watched_send(message: Message) -> None:
            nonlocal status, refused
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and not refused:
                refused = True  # an ErrorOut is one small JSON body: its first chunk holds the code
                self.metrics.refusals.labels(_error_code(message.get("body", b""))).inc()
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            key = (template, method if method in _METHODS else "OTHER", status)
            children = self._children.get(key)
            if children is None:
                # labels() checks and locks on every call; the few label sets in use are kept here.
                children = self._children[key] = (
                    self.metrics.http_requests.labels(template, key[1], str(status)),
                    self.metrics.latency.labels(template),
                )
            children[0].inc()
            children[1].observe(time.perf_counter() - started)


def _error_code(body: bytes) -> str:
    """The ``error`` of an ``ErrorOut`` body, or ``other`` for a body that is not one."""
    try:
        code = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return "other"
    return code if isinstance(code, str) and code.isidentifier() else "other"
