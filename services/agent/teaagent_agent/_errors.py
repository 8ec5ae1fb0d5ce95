"""Every failure leaves the agent service as ``ErrorOut {error, message}`` with a stable code.

================  ======  ====================================================================
code              status  meaning
================  ======  ====================================================================
``invalid``       400     the body is not JSON, cannot be read, or nests deeper than ``MAX_JSON_DEPTH``
``invalid``       422     the JSON is not what the call takes, or breaks a rule of the call
``invalid``       409     the call contradicts the state (a model that exists, no model to run)
``invalid``       405     the path exists, the method does not
``invalid``       413     the body is larger than ``MAX_BODY_BYTES``
``unauthorized``  401     no bearer token, or the wrong one (every route but ``/health``)
``not_found``     404     no such route, session, model, run or pending answer
``busy``          409     the session already has a run going
``locked``        423     another process holds the workspace (``teaagent.mcp_server``)
``timeout``       504     a model did not answer within the time the call allowed
``run``           502     the model failed (its provider refused, or went away)
``internal``      500     a bug; the message says no more than that
================  ======  ====================================================================

A run that has started streams its own ending instead (the ``result`` frame, and an ``error``
frame before it when the run timed out); these codes are for the calls that never started one.
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

__all__ = [
    "CODES",
    "ApiError",
    "ErrorOut",
    "error_response",
    "install_error_handlers",
    "validation_message",
]

logger = logging.getLogger("teaagent.agent")

#: The stable codes and the status each one is answered with (``invalid`` has several).
CODES: Final = {
    "invalid": 422,
    "unauthorized": 401,
    "not_found": 404,
    "busy": 409,
    "locked": 423,
    "timeout": 504,
    "run": 502,
    "internal": 500,
}
MAX_DETAIL_CHARS: Final = 300  # a validation message quotes the client's input; keep it a sentence


class ErrorOut(BaseModel):
    """A failure, in a shape a client can branch on.

    Attributes:
        error: A stable code: ``not_found``, ``busy``, ``locked``, ``invalid``, ``timeout``, ``run``,
            ``internal`` (and ``unauthorized`` without the node's token).
        message: The sentence a person reads.
    """

    error: str
    message: str


class ApiError(StarletteHTTPException):
    """A refusal with its stable code and sentence; the status is the code's unless given."""

    def __init__(
        self, code: str, message: str, *, status: int | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status_code=status or CODES[code], detail=message, headers=headers)
        self.code = code
        self.message = message


def error_response(
    status_code: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Return the ``ErrorOut`` response of one failure."""
    return JSONResponse(status_code=status_code, content={"error": code, "message": message}, headers=headers)


def sentence(text: str) -> str:
    """``text`` as one sentence: one line, bounded, a capital first and a full stop last."""
    text = " ".join(text.split())[:MAX_DETAIL_CHARS].rstrip(".")
    return (text[:1].upper() + text[1:] + ".") if text else "The request was refused."


def validation_message(errors: Sequence[Any]) -> tuple[int, str]:
    """Return the status (400 not JSON, 422 wrong shape) and sentence of pydantic validation errors."""
    for error in errors:
        if error.get("type") == "json_invalid":
            detail = (error.get("ctx") or {}).get("error") or error.get("msg", "")
            return 400, sentence(f"the request body is not valid JSON: {detail}")
    if not errors:
        return 422, "The request is invalid."
    first = errors[0]
    location = [str(part) for part in first.get("loc", ())]
    whole_body = location in ([], ["body"])
    if location[:1] in (["body"], ["query"], ["path"], ["header"]):
        location = location[1:]
    if whole_body:
        if isinstance(first.get("input"), bytes | str) and first.get("type") != "missing":
            return 422, "The request body must be JSON, sent with Content-Type: application/json."
        return 422, sentence(
            f"the request body is not a JSON object of the expected shape: {first.get('msg', '')}"
        )
    where = ".".join(location)
    return 422, sentence(f"{where}: {first.get('msg', 'is invalid')}")


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure of ``app`` an ``ErrorOut``; never a 500 for a client's mistake."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, exc.message, dict(exc.headers or {}))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        status, message = validation_message(exc.errors())
        return error_response(status, "invalid", message)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        if status == 404:
            return error_response(404, "not_found", "There is no such resource on this agent service.")
        if status == 405:
            return error_response(
                405, "invalid", "This path does not take that method.", dict(exc.headers or {})
            )
        if status == 401:
            return error_response(401, "unauthorized", sentence(str(exc.detail)), dict(exc.headers or {}))
        code = "internal" if status >= 500 else "invalid"
        detail = exc.detail if isinstance(exc.detail, str) else "The request was refused."
        if status == 400:
            detail = "The request body could not be read as JSON."
        return error_response(status, code, sentence(detail), dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        logger.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal", "The agent service failed on this call; its log says why.")
