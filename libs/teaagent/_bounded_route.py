"""FastAPI routes whose JSON body is read depth-bounded: one class for the three services.

FastAPI reads a body parameter with ``Request.json()`` (``json.loads``, which recurses once per
level of nesting, so a 60 KB body of ``[[[[...]]]]`` is a ``RecursionError`` and a 500). A route of
the class :func:`bounded_json_route` makes hands its handler a request that reads the body with
:func:`teaagent._json.parse_json`, the way FastAPI's documentation changes how a route reads its
request (a custom ``APIRoute`` class); each service says how a refusal is answered (its own
``ErrorOut`` error).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from teaagent._json import JSONDepthError, parse_json

__all__ = ["bounded_json_route"]


def bounded_json_route(refuse: Callable[[JSONDepthError], Exception]) -> type[APIRoute]:
    """Return an ``APIRoute`` class whose JSON bodies nested deeper than ``MAX_JSON_DEPTH`` are refused.

    Args:
        refuse: Turns the refusal into the service's own error (its 400 ``invalid``), raised in
            place of the parser's.
    """

    class _BoundedRequest(Request):
        async def json(self) -> Any:
            try:
                return parse_json(await self.body(), what="The request body")
            except JSONDepthError as exc:
                raise refuse(exc) from exc

    class BoundedJSONRoute(APIRoute):
        """A route whose JSON body is refused when nested deeper than ``MAX_JSON_DEPTH``."""

        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def bounded(request: Request) -> Response:
                return await handler(_BoundedRequest(request.scope, request.receive))

            return bounded

    return BoundedJSONRoute
