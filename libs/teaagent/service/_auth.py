"""The node's bearer token, checked by every service call of the node itself.

The token is the application's (``app.state.token``, set by its factory from
``NodeConfig.load_token()``). :data:`Authorized` is the FastAPI dependency of a route that needs it
(and documents the ``HTTPBearer`` scheme in the OpenAPI schema); :func:`check_token` is the same
check for a route that reads the request itself.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Final

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from teaagent.service._errors import ApiError

__all__ = ["UNAUTHORIZED", "Authorized", "bearer_token", "check_token", "require_token"]

#: The sentence of a call without the node's token, or with another one.
UNAUTHORIZED: Final = "This call needs the node's bearer token (Authorization: Bearer <token>)."

_bearer = HTTPBearer(
    auto_error=False, description="The node's token (`token` in node.toml, or data_dir/token)."
)


def bearer_token(connection: HTTPConnection) -> str:
    """The token of an ``Authorization: Bearer`` header (the scheme in any case), or ""."""
    scheme, _, credentials = connection.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else ""


def check_token(given: str, token: str) -> None:
    """Refuse a call whose bearer token is not the node's (compared in constant time).

    Raises:
        ApiError: 401 ``unauthorized``, with ``WWW-Authenticate: Bearer``: no token, or another one.
    """
    given_bytes = given.encode()
    if not given_bytes or not hmac.compare_digest(given_bytes, token.encode()):
        raise ApiError(401, "unauthorized", UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """The dependency of :data:`Authorized`: the call carries the application's token.

    Raises:
        ApiError: 401 ``unauthorized``.
    """
    check_token(credentials.credentials if credentials is not None else "", request.app.state.token)


#: A route parameter ``_auth: Authorized`` makes the route need the node's bearer token.
Authorized = Annotated[None, Depends(require_token)]
