"""FastAPI routes whose JSON body is read depth-bounded: one route class for the three services.

FastAPI reads a body parameter with ``Request.json()`` (``json.loads``, which recurses once per
level of nesting, so a 60 KB body of ``[[[[...]]]]`` is a ``RecursionError`` and a 500). A route of
the class :class:`BoundedJSONRoute` hands its handler a request that reads the body with
:func:`teaagent._json.parse_json`, the way FastAPI's documentation changes how a route reads its
request (a custom ``APIRoute`` class): a body nested deeper than ``MAX_JSON_DEPTH`` is 400
``invalid``, never a 500. :func:`refuse_deep` is the same refusal for a route that reads the raw body.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from teaagent._json import JSONDepthError, check_json_depth, parse_json
from teaagent.service._errors import ApiError

__all__ = ["BoundedJSONRoute", "refuse_deep"]


def refuse_deep(raw: bytes) -> None:
    """Refuse a body nested deeper than ``MAX_JSON_DEPTH``, before any parser recurses into it.

    Raises:
        ApiError: 400 ``invalid``, the body nests arrays and objects too deep.
    """
    try:
        check_json_depth(raw, what="The request body")
    except JSONDepthError as exc:
        raise ApiError(400, "invalid", str(exc)) from exc


class _BoundedRequest(Request):
    async def json(self) -> Any:
        try:
            return parse_json(await self.body(), what="The request body")
        except JSONDepthError as exc:
            raise ApiError(400, "invalid", str(exc)) from exc


class BoundedJSONRoute(APIRoute):
    """A route whose JSON body is refused (400 ``invalid``) when nested deeper than ``MAX_JSON_DEPTH``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(_BoundedRequest(request.scope, request.receive))

        return bounded
