"""Every failure leaves the relay as ``ErrorOut {error, message}`` with a stable code.

======================  ======  ===============================================================
code                    status  meaning
======================  ======  ===============================================================
``invalid``             400     the body is not JSON, cannot be read, or nests deeper than ``MAX_JSON_DEPTH``
``invalid``             422     the JSON is not the document the call takes, or breaks a rule
``expired``             422     a peer's request that expired before it arrived (never stored)
``unauthorized``        401     no bearer token, or the wrong one (calls of the node itself)
``forbidden``           403     unknown origin, not our request, a signer that may not sign it
``bad_signature``       403     a document's signature does not verify with the configured key
``not_found``           404     no such request (never arrived, or expired and removed)
``method_not_allowed``  405     the path exists, the method does not
``conflict``            409     another document holds that id, or the signer decided otherwise
``already_decided``     409     a withdrawal of a request approved, denied or expired first
``withdrawn``           409     a decision on a request its origin withdrew
``reload_failed``       422     ``POST /v1/reload``: the files do not load; the old trust is kept
``too_large``           413     the body is larger than ``MAX_BODY_BYTES``
``rate_limited``        429     the origin's window is full; ``Retry-After`` says when to retry
``origin_full``         429     the origin already holds its cap of pending requests in this inbox
``unavailable``         503     Redis is unreachable
``internal``            500     a bug; the message says no more than that
======================  ======  ===============================================================

``bad_signature`` is 403, not 422: the document is well formed, its sender is not who it claims to
be. A delivering relay treats every 4xx but 408, 425 and 429 as permanent (dead letter), and 5xx
as temporary (retry); an answer nested deeper than ``MAX_JSON_DEPTH`` is permanent whatever its
status (no relay sends one).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError

__all__ = [
    "CODES_BY_STATUS",
    "ApiError",
    "ErrorOut",
    "error_response",
    "install_error_handlers",
    "response_of",
    "validation_message",
]

logger = logging.getLogger("teaagent.relay")

CODES_BY_STATUS: Final = {
    400: "invalid",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    422: "invalid",
    429: "rate_limited",
    503: "unavailable",
}
MAX_DETAIL_CHARS: Final = 300  # a validation message quotes the client's input; keep it a sentence


class ErrorOut(BaseModel):
    """A failure, in a shape a client can branch on.

    Attributes:
        error: A stable code (see the table in this module).
        message: One sentence a person reads.
    """

    error: str
    message: str


class ApiError(StarletteHTTPException):
    """A refusal with its status, stable code and sentence (an HTTPException so FastAPI passes it on)."""

    def __init__(
        self, status_code: int, code: str, message: str, *, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.code = code
        self.message = message


def error_response(
    status_code: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Return the ``ErrorOut`` response of one failure."""
    return JSONResponse(status_code=status_code, content={"error": code, "message": message}, headers=headers)


def _sentence(text: str) -> str:
    text = " ".join(text.split())[:MAX_DETAIL_CHARS].rstrip(".")
    return (text[:1].upper() + text[1:] + ".") if text else "The request was refused."


def validation_message(errors: Sequence[Any]) -> tuple[int, str]:
    """Return the status (400 not JSON, 422 wrong shape) and sentence of pydantic validation errors."""
    for error in errors:
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error") or error.get("msg", "")
            return 400, _sentence(f"the request body is not valid JSON: {detail}")
    if not errors:
        return 422, "The request is invalid."
    first = errors[0]
    location = list(first.get("loc", ()))
    whole_body = location in ([], ["body"])
    if location[:1] == ["body"]:
        location = location[1:]
    if whole_body:
        if isinstance(first.get("input"), bytes | str):
            return 422, "The request body must be JSON, sent with Content-Type: application/json."
        return 422, _sentence(
            f"the request body is not a JSON object of the expected shape: {first.get('msg', '')}"
        )
    where = ".".join(str(part) for part in location)
    return 422, _sentence(f"{where}: {first.get('msg', 'is invalid')}")


def response_of(exc: Exception, method: str, path: str) -> JSONResponse:
    """Return the ``ErrorOut`` response of an exception a route raised (logged when it is a bug)."""
    if isinstance(exc, ApiError):
        return error_response(exc.status_code, exc.code, exc.message, dict(exc.headers or {}))
    if isinstance(exc, StarletteHTTPException):
        code = CODES_BY_STATUS.get(exc.status_code, "internal" if exc.status_code >= 500 else "invalid")
        detail = exc.detail if isinstance(exc.detail, str) else "The request was refused."
        if exc.status_code == 404:
            detail = "There is no such resource on this relay."
        elif exc.status_code == 400:
            detail = "The request body could not be read as JSON."
        return error_response(exc.status_code, code, _sentence(detail), dict(exc.headers or {}))
    if isinstance(exc, RequestNotFoundError):
        return error_response(404, "not_found", _sentence(str(exc)))
    if isinstance(exc, RequestConflictError):
        return error_response(409, "conflict", _sentence(str(exc)))
    if isinstance(exc, StoreError):
        logger.warning("store unavailable: %s", exc)
        return error_response(503, "unavailable", _sentence(str(exc)), {"Retry-After": "1"})
    logger.error("internal error on %s %s", method, path, exc_info=exc)
    return error_response(500, "internal", "The relay failed on this call; its log says why.")


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure of ``app`` an ``ErrorOut``; never a 500 for a client's mistake."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = validation_message(exc.errors())
        return error_response(status, "invalid", message)

    async def _any(request: Request, exc: Exception) -> JSONResponse:
        return response_of(exc, request.method, request.url.path)

    for kind in (
        ApiError,
        StarletteHTTPException,
        RequestNotFoundError,
        RequestConflictError,
        StoreError,
        Exception,
    ):
        app.add_exception_handler(kind, _any)
