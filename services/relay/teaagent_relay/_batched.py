"""Several deliveries of a peer's relay in one call: ``POST /v1/deliveries``.

A relay's delivery worker sends each queued delivery (``{"path", "body"}``: the call it stands
for) to the peer's relay named by its target. Under load, one HTTP call each costs both relays
more than the work the call carries (parsing, routing and answering it; the client's side of it),
so the deliveries to one peer that are due at the same moment go together here, and each is
answered as its own call would be.

Each delivery is answered as the call it stands for (``POST`` to its path with its body as JSON)
would be, status and body. The two that carry a quorum's load, a peer's request for the inbox and
a peer's decision on an own request, are read here from the batch's parsed body and handed to the
same ``Relay`` method as their hot routes (``_fast.py``), with the same checks in the same order
and the same ``ErrorOut`` for every failure (``ERRORS.response_of``). Any other (a withdrawal, a
settlement) is served by this application itself, in this process, as that very call: through
its middlewares and its route. Only the paths peers' relays post to are taken
(:data:`PEER_PATHS`); a delivery carries no header of the batch (no token: the calls it may stand
for take none), so a batch reaches nothing its deliveries alone could not. The deliveries of one
batch run concurrently: their Redis calls share round trips as concurrent calls do. The tests hold
each delivery's answer to its own call's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any, Final, TypeVar

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Scope

from teaagent._json import MAX_JSON_DEPTH, JSONDepthError, check_json_depth
from teaagent.service import INNER_CALL, started
from teaagent_relay._errors import ERRORS, ApiError, invalid_body
from teaagent_relay._models import DeliveryBatchIn, SignedDecisionIn, SignedRequestIn
from teaagent_relay._protocol import check_path_request_id
from teaagent_relay._relay import Relay

__all__ = ["BATCH_DEPTH", "PEER_PATHS", "peer_deliveries"]

_Signed = TypeVar("_Signed", SignedDecisionIn, SignedRequestIn)

logger = logging.getLogger("teaagent.relay")

#: The calls a batch's deliveries may stand for: those a peer's relay posts (none takes a token).
PEER_PATHS: Final = re.compile(
    r"/v1/inbox|/v1/inbox/[^/]+/(?:withdrawal|settled)|/v1/requests/[^/]+/decisions"
)
#: A batch nests its deliveries' bodies three levels down (object, list, delivery): each body may
#: still nest as deep as its own call takes.
BATCH_DEPTH: Final = MAX_JSON_DEPTH + 3
_DECISIONS: Final = re.compile(r"/v1/requests/([^/]+)/decisions")
_INBOX_ROUTE: Final = "/v1/inbox"
_DECISIONS_ROUTE: Final = "/v1/requests/{request_id}/decisions"
_JSON: Final = (b"content-type", b"application/json")
# The keys of an HTTP call's scope that its server sets, copied from the batch's to each delivery's.
_SERVER_KEYS: Final = ("asgi", "http_version", "server", "client", "scheme", "root_path", "state")


async def peer_deliveries(request: Request) -> Response:
    """``POST /v1/deliveries``: each delivery served as its own call, answered in ``results``.

    Raises:
        ApiError: 503 the relay is not started; 400 or 422 the body is not a batch of deliveries.
    """
    relay: Relay = started(request, "relay", "relay")
    raw = await request.body()
    try:
        check_json_depth(raw, limit=BATCH_DEPTH, what="The request body")
    except JSONDepthError as exc:
        raise ApiError(400, "invalid", str(exc)) from exc
    try:
        batch = DeliveryBatchIn.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_body(exc.errors()) from exc
    app: ASGIApp = request.app
    answers = await asyncio.gather(
        *(_answer(relay, app, request.scope, item.path, item.body) for item in batch.deliveries)
    )
    for route, status, _body in answers:
        relay.metrics.count_batched(route, status)
    results = b",".join(b'{"status":%d,"body":%s}' % (status, answer) for _route, status, answer in answers)
    return Response(b'{"results":[' + results + b"]}", media_type="application/json")


async def _answer(
    relay: Relay, app: ASGIApp, outer: Scope, path: str, body: dict[str, Any]
) -> tuple[str, int, bytes]:
    """Answer one delivery as its call ``POST path`` with ``body``: the template of the route that
    answers that call (``unmatched`` when none does), its status and its JSON answer."""
    found = _DECISIONS.fullmatch(path)
    if found is None and path != _INBOX_ROUTE:
        return await _serve(app, outer, path, body)
    route = _INBOX_ROUTE if found is None else _DECISIONS_ROUTE
    try:
        if found is None:  # as _fast.receive reads it
            signed = _validated(SignedRequestIn, body)
            created, answer = await relay.receive(signed.request, signed.signature)
            status = 201 if created else 200
        else:  # as _routes.count_decision reads it: the id, then the body
            check_path_request_id(found[1])
            decision = _validated(SignedDecisionIn, body)
            status, answer = 200, await relay.count(found[1], decision.statement, decision.signature)
    except Exception as exc:
        refusal = ERRORS.response_of(exc, "POST", path)
        return route, refusal.status_code, bytes(refusal.body)
    # As Starlette's JSONResponse writes it.
    return (
        route,
        status,
        json.dumps(answer, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode(),
    )


def _validated(model: type[_Signed], body: dict[str, Any]) -> _Signed:
    """``body`` as the call's route reads it, refused with its sentence.

    Raises:
        ApiError: 422 ``invalid``, not the document the call takes.
    """
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        raise invalid_body(exc.errors()) from exc


async def _serve(app: ASGIApp, outer: Scope, path: str, body: dict[str, Any]) -> tuple[str, int, bytes]:
    """Serve one delivery as the call ``POST path`` with ``body``, by this application; the template
    of the route that served it (``unmatched`` when none did), its status and its JSON answer."""
    if not PEER_PATHS.fullmatch(path):
        return (
            "unmatched",
            404,
            json.dumps(
                {
                    "error": "not_found",
                    "message": f"A delivery's path must be one peers' relays post to, not {path[:100]!r}.",
                }
            ).encode(),
        )
    try:
        data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    except ValueError:
        return (
            "unmatched",
            422,
            json.dumps(
                {"error": "invalid", "message": "A delivery's body holds a number that is not finite."}
            ).encode(),
        )
    scope: dict[str, Any] = {key: outer[key] for key in _SERVER_KEYS if key in outer}
    if "state" in scope:
        scope["state"] = dict(scope["state"])  # each call has its own copy, as the server gives it
    scope.update(
        type="http",
        method="POST",
        path=path,
        raw_path=path.encode(),
        query_string=b"",
        headers=[_JSON, (b"content-length", str(len(data)).encode())],
    )
    scope[INNER_CALL] = True  # counted by the batch (relay_batched_deliveries_total), not as a call
    status = 500
    chunks: list[bytes] = []
    json_answer = False
    answered = asyncio.Event()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await answered.wait()  # asked again only to learn of a disconnect: none until answered
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, json_answer
        if message["type"] == "http.response.start":
            status = message["status"]
            json_answer = any(
                name == b"content-type" and value.split(b";")[0].strip() == b"application/json"
                for name, value in message.get("headers", ())
            )
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    try:
        await app(scope, receive, send)
    except Exception:  # answered 500 by the error middleware already; logged here, as uvicorn would
        logger.exception("delivery to %s in a batch failed", path)
    finally:
        answered.set()
    answer = b"".join(chunks)
    if not json_answer or not answer:
        answer = json.dumps(answer.decode("utf-8", "replace")).encode()
    return getattr(scope.get("route"), "path", None) or "unmatched", status, answer
