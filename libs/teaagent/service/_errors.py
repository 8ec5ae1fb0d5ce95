"""Every failure of a service leaves it as ``ErrorOut {error, message}`` with a stable code.

A service names its codes in an :class:`ErrorTable` (the status each refusal of the framework is
answered with, and the library errors it answers with a status of their own); its routes raise
:class:`ApiError` with a status, a code and a sentence. :func:`install_error_handlers` makes
every other failure an ``ErrorOut`` too: a body that is not JSON 400, one of the wrong shape
422, an unknown path 404, a wrong method 405, a library error its table names, a client that closed
the connection before its body was read 499 ``disconnected`` (answered to nobody, counted), and
anything else 500 ``internal`` (logged: it is a bug), never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

__all__ = [
    "CLIENT_CLOSED",
    "CODES_BY_STATUS",
    "MAX_DETAIL_CHARS",
    "ApiError",
    "ErrorOut",
    "ErrorTable",
    "error_response",
    "error_responses",
    "install_error_handlers",
    "sentence",
    "started",
    "validation_message",
]

#: The status of a call whose client closed the connection before its body was read (nginx's "client
#: closed request"): counted in the metrics as such, answered to nobody.
CLIENT_CLOSED: Final = 499

#: The codes of the framework's refusals that the relay and the approver share (a table's default).
CODES_BY_STATUS: Final[Mapping[int, str]] = {
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
# The parts of a validation error's location that name where, not what: dropped from the sentence.
_PLACES: Final = (["body"], ["query"], ["path"], ["header"])


class ErrorOut(BaseModel):
    """A failure, in a shape a client can branch on.

    Attributes:
        error: A stable code (the service's table lists them).
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


@dataclass(frozen=True, slots=True)
class ErrorTable:
    """How one service answers the failures its routes do not raise as :class:`ApiError` themselves.

    Attributes:
        service: The service as the sentences name it (``relay``: "There is no such resource on
            this relay.").
        codes_by_status: The code of a framework refusal by its status (404, 405, 413, ...); a
            status it does not name is ``internal`` from 500 up, else ``invalid``.
            :data:`CODES_BY_STATUS` by default.
        exceptions: Library errors answered with a status and code of their own, their message
            as the sentence (checked in order: name a subclass before its base). A 503 among
            them is temporary: answered with ``Retry-After: 1`` and logged as a warning.
        logger: Where the bugs (500) and the temporary failures (503) are logged.
    """

    service: str
    codes_by_status: Mapping[int, str] = field(default_factory=lambda: CODES_BY_STATUS)
    exceptions: Mapping[type[Exception], tuple[int, str]] = field(default_factory=dict)
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("teaagent"))

    def code_of(self, status: int) -> str:
        """The code of a refusal of the framework with this status."""
        return self.codes_by_status.get(status, "internal" if status >= 500 else "invalid")

    def response_of(self, exc: Exception, method: str, path: str) -> JSONResponse:
        """Return the ``ErrorOut`` response of an exception a route raised (logged when it is a bug)."""
        if isinstance(exc, ApiError):
            return error_response(exc.status_code, exc.code, exc.message, dict(exc.headers or {}))
        if isinstance(exc, ClientDisconnect) or isinstance(exc.__cause__, ClientDisconnect):
            # The caller went away (it timed out, or stopped) before its body was read: no bug of
            # this service's, and nobody to answer. FastAPI's own read of a body raises a 400 from it.
            self.logger.debug("the client of %s %s went away before its body was read", method, path)
            return error_response(
                CLIENT_CLOSED, "disconnected", "The client closed the connection before its request was read."
            )
        if isinstance(exc, StarletteHTTPException):
            status = exc.status_code
            detail = exc.detail if isinstance(exc.detail, str) else "The request was refused."
            if status == 404:
                detail = f"There is no such resource on this {self.service}."
            elif status == 405:
                detail = "This path does not take that method."
            elif status == 400:  # FastAPI's own: a body its content type's parser could not read
                detail = "The request body could not be read as the JSON or the form its content type names."
            return error_response(status, self.code_of(status), sentence(detail), dict(exc.headers or {}))
        for kind, (status, code) in self.exceptions.items():
            if isinstance(exc, kind):
                if status != 503:
                    return error_response(status, code, sentence(str(exc)))
                self.logger.warning("%s: %s", code, exc)
                return error_response(status, code, sentence(str(exc)), {"Retry-After": "1"})
        self.logger.error("internal error on %s %s", method, path, exc_info=exc)
        return error_response(500, "internal", f"The {self.service} failed on this call; its log says why.")


def started(request: Request, attribute: str, service: str, *, code: str = "unavailable") -> Any:
    """What the application's lifespan put at ``app.state.<attribute>`` (its engine, its relay).

    Raises:
        ApiError: 503 (``code``): the service is starting or stopping, it is not there.
    """
    found = getattr(request.app.state, attribute, None)
    if found is None:
        raise ApiError(503, code, f"The {service} is starting or stopping; try again in a moment.")
    return found


def error_response(
    status_code: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Return the ``ErrorOut`` response of one failure."""
    return JSONResponse(status_code=status_code, content={"error": code, "message": message}, headers=headers)


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route that answers these statuses with an ``ErrorOut``."""
    return {status: {"model": ErrorOut} for status in statuses}


def sentence(text: str) -> str:
    """Return ``text`` as one sentence: one line, capitalised, one final period, not too long."""
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
    if location[:1] in _PLACES:
        location = location[1:]
    if whole_body:
        if isinstance(first.get("input"), bytes | str) and first.get("type") != "missing":
            return 422, "The request body must be JSON, sent with Content-Type: application/json."
        return 422, sentence(
            f"the request body is not a JSON object of the expected shape: {first.get('msg', '')}"
        )
    return 422, sentence(f"{'.'.join(location)}: {first.get('msg', 'is invalid')}")


def install_error_handlers(app: FastAPI, table: ErrorTable) -> None:
    """Make every failure of ``app`` an ``ErrorOut`` as ``table`` says; never a 500 for a client's mistake."""

    async def _invalid(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        status, message = validation_message(exc.errors())
        return error_response(status, "invalid", message)

    async def _any(request: Request, exc: Exception) -> JSONResponse:
        return table.response_of(exc, request.method, request.url.path)

    app.add_exception_handler(RequestValidationError, _invalid)
    kinds: list[type[Exception]] = [StarletteHTTPException, *table.exceptions, Exception]
    for kind in kinds:
        app.add_exception_handler(kind, _any)
