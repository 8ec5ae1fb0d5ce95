"""Every failure leaves the approver as ``ErrorOut {error, message}`` with a stable code.

======================  ======  ===============================================================
code                    status  meaning
======================  ======  ===============================================================
``invalid``             400     the body is not JSON, cannot be read, or nests deeper than ``MAX_JSON_DEPTH``
``invalid``             422     malformed: a parameter, a body, a statement that does not match
                                its request, a request whose origin signature does not verify
``unauthorized``        401     no bearer token, or the wrong one
``forbidden``           403     a key that may not sign for this node, a statement signed as
                                another node
``not_found``           404     no such request in this node's inbox, or no such route
``method_not_allowed``  405     the path exists, the method does not
``expired``             409     the request expired: this node signs nothing for it any more
``withdrawn``           409     its origin withdrew the request: this node signs nothing for it
``ambiguous``           409     several origins sent a request of this id: name the origin
``conflict``            409     this node already decided otherwise
``changed``             409     the request under this id is not the one the operator confirmed
                                (another tool or payload digest): nothing is signed
``too_large``           413     the body is larger than ``MAX_BODY_BYTES``
``reload_failed``       422     ``POST /v1/reload``: the files do not load; the old trust is kept
``unavailable``         503     the relay or Redis is down (or the service is starting)
``internal``            500     a bug; the message says no more than that
======================  ======  ===============================================================
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

from teaagent.errors import StoreError

__all__ = [
    "CODES_BY_STATUS",
    "ApiError",
    "ErrorOut",
    "error_response",
    "install_error_handlers",
    "sentence",
]

logger = logging.getLogger("teaagent.approver")

CODES_BY_STATUS: Final = {
    400: "invalid",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    422: "invalid",
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


def sentence(text: str) -> str:
    """Return ``text`` as one sentence: one line, capitalised, one final period, not too long."""
    text = " ".join(text.split())[:MAX_DETAIL_CHARS].rstrip(".")
    return (text[:1].upper() + text[1:] + ".") if text else "The request was refused."


def _validation_message(errors: Sequence[Any]) -> tuple[int, str]:
    """Return the status (400 not JSON, 422 wrong shape) and sentence of pydantic validation errors."""
    for error in errors:
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error") or error.get("msg", "")
            return 400, sentence(f"the request body is not valid JSON: {detail}")
    if not errors:
        return 422, "The request is invalid."
    first = errors[0]
    location = list(first.get("loc", ()))
    whole_body = location in ([], ["body"])
    if location[:1] in (["body"], ["query"], ["path"]):
        location = location[1:]
    if whole_body:
        if isinstance(first.get("input"), bytes | str):
            return 422, "The request body must be JSON, sent with Content-Type: application/json."
        return 422, sentence(
            f"the request body is not a JSON object of the expected shape: {first.get('msg', '')}"
        )
    where = ".".join(str(part) for part in location)
    return 422, sentence(f"{where}: {first.get('msg', 'is invalid')}")


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure of ``app`` an ``ErrorOut``; never a 500 for a client's mistake."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, exc.message, dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = _validation_message(exc.errors())
        return error_response(status, "invalid", message)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = CODES_BY_STATUS.get(exc.status_code, "internal" if exc.status_code >= 500 else "invalid")
        detail = exc.detail if isinstance(exc.detail, str) else "The request was refused."
        if exc.status_code == 404:
            detail = "There is no such resource on this approver."
        elif exc.status_code == 405:
            detail = "This path does not take that method."
        elif exc.status_code == 400:
            detail = "The request body could not be read as JSON."
        return error_response(exc.status_code, code, sentence(detail), dict(exc.headers or {}))

    @app.exception_handler(StoreError)
    async def _unavailable(_request: Request, exc: StoreError) -> JSONResponse:
        logger.warning("store unavailable: %s", exc)
        return error_response(503, "unavailable", sentence(str(exc)), {"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal", "The approver failed on this call; its log says why.")
