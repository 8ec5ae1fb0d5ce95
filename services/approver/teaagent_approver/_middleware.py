"""Two pure ASGI middlewares: the body size limit and the per-route metrics."""

from __future__ import annotations

import json
import time
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teaagent_approver._errors import ApiError
from teaagent_approver._metrics import ApproverMetrics

__all__ = ["MAX_BODY_BYTES", "BodyLimitMiddleware", "MetricsMiddleware"]

MAX_BODY_BYTES: Final = 64 * 1024  # a statement and its signature, not a file upload
_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


async def _send_error(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": code, "message": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Refuse bodies above ``limit`` bytes: by ``Content-Length`` before reading, else while reading."""

    def __init__(self, app: ASGIApp, *, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"The request body is larger than the limit of {self.limit} bytes."
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    await _send_error(send, 400, "invalid", "The Content-Length header is not a number.")
                    return
                if int(value) > self.limit:
                    await _send_error(send, 413, "too_large", too_large)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # An ApiError, so that the route's error handler answers 413 when the read was in it.
                    raise ApiError(413, "too_large", too_large)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except ApiError as error:
            if started or error.code != "too_large":
                raise
            await _send_error(send, 413, "too_large", too_large)


class MetricsMiddleware:
    """Count every HTTP call by route template, method and status, and time it; count each refusal
    (a 4xx or 5xx answer) by its ``ErrorOut`` code."""

    def __init__(self, app: ASGIApp, *, metrics: ApproverMetrics) -> None:
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
