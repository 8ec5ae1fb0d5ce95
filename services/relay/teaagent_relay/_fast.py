"""The relay's hot routes: ordinary routes of its one router, ahead of the documented ones.

Every quorum passes through the same few calls: the agent's submission and its outcome long-poll,
the peers' deliveries into the inbox, the approver's listing and its decisions, and the decisions
sent back to the origin. On a small host FastAPI's dependency solving and response validation
cost as much as the calls' own work (the signature checks and the Redis round trips), so each of
these calls has a Starlette ``Route`` at the head of the app's router (:func:`hot_routes`) whose
endpoint reads it directly: through the same middlewares (metrics, body limit), with the same
token check, body check and answer, and the same ``ErrorOut`` for every failure
(``ERRORS.response_of``, :mod:`teaagent_relay._errors`). The documented FastAPI route of the same method
and path stays in the router and in the OpenAPI schema; the hot route hands it every call it does
not read exactly as it does.

A call is taken here only when it is one these handlers read exactly as the documented route
does: its method and path, a JSON body (``Content-Type: application/json``) and query
parameters that are present at most once and valid. Anything else (another content type, a
query parameter out of range, a request id that is not 32 hex characters) goes on to the
documented FastAPI route, so that its refusal is the documented one. The tests hold both paths to
the same answers, and the OpenAPI schema to listing every hot route. One order
differs on purpose: the token is checked before the body is read, so a call without the token
and with a malformed body is 401 here where FastAPI, which reads the body first, says 400.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.routing import APIRoute, APIRouter
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from teaagent._json import parse_json
from teaagent.service import bearer_token, check_token, refuse_deep
from teaagent_relay._batched import peer_deliveries
from teaagent_relay._errors import ERRORS, invalid_body
from teaagent_relay._models import SignedRequestIn
from teaagent_relay._relay import MAX_WAIT_SECONDS
from teaagent_relay._routes import (
    MAX_LISTED,
    _relay,
    count_decision,
    own_decision,
    own_decisions,
)

__all__ = ["ROUTES", "RelayApp", "hot_routes"]

Endpoint = Callable[..., Awaitable[Response]]
_STATES: Final = frozenset({"pending", "approved", "denied", "expired", "withdrawn", "settled", "all"})
_HEX32: Final = "[0-9a-f]{32}"


async def submit(request: Request) -> Response:
    """``POST /v1/requests``, as ``submit_request`` answers it."""
    relay = await _relay(request)
    check_token(bearer_token(request), relay.token)
    body = await _read_request(request)
    created, status = await relay.submit(body.request, body.signature)
    return JSONResponse(status, status_code=201 if created else 200)


async def outcome(
    request: Request, wait: float = 0.0, approvals: int | None = None, denials: int | None = None
) -> Response:
    """``GET /v1/requests/{id}/outcome``, as ``wait_outcome`` answers it."""
    relay = await _relay(request)
    check_token(bearer_token(request), relay.token)
    counted = None if approvals is None or denials is None else (approvals, denials)
    return JSONResponse(await relay.wait(request.path_params["request_id"], wait, counted))


async def receive(request: Request) -> Response:
    """``POST /v1/inbox``, as ``receive_request`` answers it (no token: the signature is the proof)."""
    relay = await _relay(request)
    body = await _read_request(request)
    created, accepted = await relay.receive(body.request, body.signature)
    return JSONResponse(accepted, status_code=201 if created else 200)


async def inbox(request: Request, state: str = "pending", limit: int = 100, wait: float = 0.0) -> Response:
    """``GET /v1/inbox``, as ``list_inbox`` answers it."""
    relay = await _relay(request)
    check_token(bearer_token(request), relay.token)
    return JSONResponse(await relay.inbox(None if state == "all" else state, limit, wait))  # type: ignore[arg-type]


async def _read_request(request: Request) -> SignedRequestIn:
    """The body as the documented routes read it, refused with their sentences.

    pydantic-core parses and checks it in one step, once its depth is known to be within
    ``MAX_JSON_DEPTH``; only a refused body is read again the way FastAPI reads it (``json.loads``,
    then the model), whose error wording the routes document.
    """
    raw = await request.body()
    refuse_deep(raw)
    try:
        return SignedRequestIn.model_validate_json(raw)
    except ValidationError:
        pass
    try:
        data = parse_json(raw)
    except ValueError as exc:
        why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        errors: list[Any] = [{"type": "json_invalid", "loc": ("body",), "ctx": {"error": why}}]
    else:
        try:
            # As FastAPI validates a body (attributes allowed: its wording for a non-object).
            return SignedRequestIn.model_validate(data, from_attributes=True)  # pragma: no cover
        except ValidationError as exc:
            errors = exc.errors()
    raise invalid_body(errors)


def _wait(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and 0 <= seconds <= MAX_WAIT_SECONDS else None


def _limit(value: str) -> int | None:
    if not (value.isascii() and value.isdigit()):
        return None
    number = int(value)
    return number if 1 <= number <= MAX_LISTED else None


def _state(value: str) -> str | None:
    return value if value in _STATES else None


def _count(value: str) -> int | None:
    if not (value.isascii() and value.isdigit() and len(value) <= 4):
        return None
    return int(value)


_READERS: Final[dict[str, Callable[[str], Any]]] = {
    "wait": _wait,
    "limit": _limit,
    "state": _state,
    "approvals": _count,
    "denials": _count,
}


@dataclass(frozen=True)
class _Route:
    """One hot route; ``path`` is its template, the label the metrics count it under."""

    method: str
    path: str
    pattern: re.Pattern[str]
    endpoint: Endpoint
    query: frozenset[str] = frozenset()  # the parameters it reads (any other sends the call on)
    json_body: bool = False  # only a body declared as JSON is taken here

    def parameters(self, query: bytes) -> dict[str, Any] | None:
        """The endpoint's keyword arguments from the query string, or None: not one to take here."""
        if not query:
            return {}
        try:
            pairs = parse_qsl(query.decode("ascii"), keep_blank_values=True, strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            return None
        found: dict[str, Any] = {}
        for name, value in pairs:
            if name not in self.query or name in found:
                return None
            parsed = _READERS[name](value)
            if parsed is None:
                return None
            found[name] = parsed
        return found


def _route(method: str, path: str, endpoint: Endpoint, *, request_id: str = _HEX32, **extra: Any) -> _Route:
    regex = re.escape(path).replace(re.escape("{request_id}"), f"(?P<request_id>{request_id})")
    return _Route(method, path, re.compile(regex), endpoint, **extra)


# The decisions' routes took any id segment before (their handlers refuse a malformed one with
# their own sentence), so they still do; the others leave a malformed id to the documented route.
ROUTES: Final = (
    _route("POST", "/v1/requests", submit, json_body=True),
    _route(
        "GET",
        "/v1/requests/{request_id}/outcome",
        outcome,
        query=frozenset({"wait", "approvals", "denials"}),
    ),
    _route("POST", "/v1/requests/{request_id}/decisions", count_decision, request_id="[^/]+"),
    _route("POST", "/v1/inbox", receive, json_body=True),
    _route("GET", "/v1/inbox", inbox, query=frozenset({"state", "limit", "wait"})),
    _route("POST", "/v1/inbox/decisions", own_decisions),
    _route("POST", "/v1/inbox/{request_id}/decision", own_decision, request_id="[^/]+"),
    _route("POST", "/v1/deliveries", peer_deliveries),
)


def _json_declared(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media_type = value.split(b";", 1)[0].strip().lower()
            return bool(media_type == b"application/json")
    return False


class RelayApp(FastAPI):
    """The relay's FastAPI application: one router, :data:`ROUTES` at its head (:func:`hot_routes`).

    ``hot_routes`` (False) makes every hot route hand its calls to the documented route at once:
    the tests compare the two.
    """

    hot_routes: bool = True


class _HotEndpoint:
    """One hot route's ASGI endpoint: the call answered here, or handed to the documented route."""

    def __init__(self, spec: _Route, documented: BaseRoute) -> None:
        self.spec = spec
        self.documented = documented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        taken = _take(self.spec, scope) if getattr(scope.get("app"), "hot_routes", True) else None
        if taken is None:
            await self.documented.handle(scope, receive, send)
            return
        params, request_id = taken
        scope["path_params"] = {} if request_id is None else {"request_id": request_id}
        scope["teaagent.hot"] = True  # the tests' proof that this route answered
        # The metrics label the call by its route's template, as the documented route's.
        scope["route"] = self.documented
        spec = self.spec
        try:
            response = await spec.endpoint(Request(scope, receive), **params)
        except Exception as exc:
            response = ERRORS.response_of(exc, spec.method, scope.get("path", ""))
        await response(scope, receive, send)


def hot_routes(*routers: APIRouter) -> list[Route]:
    """:data:`ROUTES` as Starlette routes, each with its documented FastAPI route to hand calls to.

    Put ahead of the app's other routes (``app.router.routes``), they take the calls they read
    exactly as the documented route does and hand every other to it; the OpenAPI schema is the
    documented routes' (these are not in it: they have the same paths and methods).

    Raises:
        LookupError: A hot route has no documented route of the same method and path in ``routers``.
    """
    made: list[Route] = []
    for spec in ROUTES:
        documented = next(
            (
                route
                for router in routers
                for route in router.routes
                if isinstance(route, APIRoute)
                and route.path == spec.path
                and spec.method in (route.methods or ())
            ),
            None,
        )
        if documented is None:
            raise LookupError(f"{spec.method} {spec.path} has no documented route")
        made.append(
            Route(
                spec.path,
                _HotEndpoint(spec, documented),
                methods=[spec.method],
                name=f"hot {spec.method} {spec.path}",
                include_in_schema=False,
            )
        )
    return made


def _take(spec: _Route, scope: Scope) -> tuple[dict[str, Any], str | None] | None:
    """The endpoint's keyword arguments and request id, or None: the documented route answers."""
    if scope.get("method") != spec.method:  # HEAD, which Starlette routes to a GET route
        return None
    found = spec.pattern.fullmatch(scope.get("path", ""))
    if found is None:
        return None
    if spec.json_body and not _json_declared(scope):
        return None
    params = spec.parameters(scope.get("query_string", b""))
    if params is None:
        return None
    return params, found.groupdict().get("request_id")
