"""The relay's routes, grouped by resource: own requests, the inbox, and operations (health, metrics)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from teaagent._reload import ReloadOut
from teaagent.errors import StoreError
from teaagent.service import (
    METRICS_RESPONSES,
    Authorized,
    BoundedJSONRoute,
    Dependency,
    ReadyOut,
    bearer_token,
    check,
    check_token,
    error_responses,
    readiness,
    ready_responses,
    refuse_deep,
    reloaded_trust,
    started,
    store_health,
)
from teaagent_relay._batched import peer_deliveries
from teaagent_relay._errors import ApiError, invalid_body
from teaagent_relay._models import (
    MAX_DECISION_BATCH,
    MAX_DELIVERY_BATCH,
    DeadLetterOut,
    DecisionBatchIn,
    DecisionBatchOut,
    DecisionReceiptOut,
    DeliveryBatchIn,
    DeliveryBatchOut,
    HealthOut,
    InboxAcceptedOut,
    InboxDecisionOut,
    InboxItemOut,
    RequestStatusOut,
    SettlementIn,
    SettlementReceiptOut,
    SignedDecisionIn,
    SignedRequestIn,
    SignedWithdrawalIn,
    WithdrawalReceiptOut,
)
from teaagent_relay._protocol import REQUEST_ID, check_path_request_id, sentence
from teaagent_relay._relay import MAX_WAIT_SECONDS, Relay

__all__ = [
    "count_decision",
    "deliveries_router",
    "inbox_router",
    "operations_router",
    "own_decision",
    "own_decisions",
    "requests_router",
]

MAX_LISTED = 1000  # one inbox listing; the store's own bound
_Model = TypeVar("_Model", bound=BaseModel)


async def _relay(request: Request) -> Relay:
    relay: Relay = started(request, "relay", "relay")
    return relay


RelayDep = Annotated[Relay, Depends(_relay)]
RequestId = Annotated[str, Path(pattern="^[0-9a-f]{32}$", description="32 lowercase hex characters.")]
Wait = Annotated[
    float,
    Query(
        ge=0, le=MAX_WAIT_SECONDS, description=f"Seconds to wait for a change, at most {MAX_WAIT_SECONDS:g}."
    ),
]
Counted = Annotated[
    int | None,
    Query(
        ge=0,
        le=9999,
        description="The counted approvals (or denials) the caller last saw; answer on a change.",
    ),
]


async def _read(request: Request, model: type[_Model]) -> _Model:
    raw = await request.body()
    refuse_deep(raw)
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_body(exc.errors()) from exc


requests_router = APIRouter(prefix="/v1/requests", tags=["requests"], route_class=BoundedJSONRoute)


@requests_router.post(
    "",
    status_code=201,
    response_model=RequestStatusOut,
    responses=error_responses(400, 401, 403, 409, 413, 422, 503),
    summary="Submit a signed request of this node's agent and fan it out to the peers",
)
async def submit_request(
    body: SignedRequestIn, relay: RelayDep, _auth: Authorized, response: Response
) -> Any:
    """Store the request (idempotent: 201 the first time, 200 after) and queue it for every peer.

    The signature must verify with this node's own configured key; the body is never trusted.
    """
    created, status = await relay.submit(body.request, body.signature)
    if not created:
        response.status_code = 200
    return status


@requests_router.get(
    "/{request_id}",
    response_model=RequestStatusOut,
    responses=error_responses(401, 404, 422, 503),
    summary="State, counted signers and, once approved, the quorum certificate",
)
async def get_request(request_id: RequestId, relay: RelayDep, _auth: Authorized) -> Any:
    """Return the request's counting state; an expired request is settled as expired here."""
    return await relay.status(request_id)


@requests_router.get(
    "/{request_id}/outcome",
    response_model=RequestStatusOut,
    responses=error_responses(401, 404, 422, 503),
    summary="Long-poll until the request is decided",
)
async def wait_outcome(
    request_id: RequestId,
    relay: RelayDep,
    _auth: Authorized,
    wait: Wait = 0.0,
    approvals: Counted = None,
    denials: Counted = None,
) -> Any:
    """Block (on the request's event stream, not by polling) until it is decided or ``wait`` passes.

    With ``approvals`` and ``denials`` (the counts the caller last saw), it also answers as soon as
    a decision changes them: a caller that shows progress holds one long-poll per change, not a
    request every half second. The state is still ``pending`` when the wait ran out first.
    """
    counted = None if approvals is None or denials is None else (approvals, denials)
    return await relay.wait(request_id, wait, counted)


@requests_router.post(
    "/{request_id}/withdrawal",
    response_model=RequestStatusOut,
    responses=error_responses(400, 401, 403, 404, 409, 413, 422, 503),
    summary="Withdraw one of this node's requests and tell every peer's relay",
)
async def withdraw_request(
    request_id: RequestId, body: SignedWithdrawalIn, relay: RelayDep, _auth: Authorized
) -> Any:
    """Mark the request ``withdrawn`` (final) and queue the signed withdrawal for every peer's relay.

    The withdrawal must verify with this node's own key (namespace ``teaagent-withdrawal``) and
    match the stored request. A repeat answers 200 again; a request already approved, denied or
    expired answers 409 ``already_decided`` naming that state.
    """
    return await relay.withdraw(request_id, body.statement, body.signature)


@requests_router.post(
    "/{request_id}/decisions",
    response_model=DecisionReceiptOut,
    responses=error_responses(400, 403, 404, 409, 413, 422, 503),
    summary="A peer's signed approval or denial of one of this node's requests",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SignedDecisionIn"}}},
        }
    },
)
async def post_decision(request_id: str, request: Request) -> Any:
    """Verify the decision by PROTOCOL.md's counting rules, then count it once.

    No token: the signature is the authentication. A repeat of a counted decision answers 200
    with ``counted: false``; a decision on an expired request answers 200 with state ``expired``.
    """
    return await count_decision(request)


async def count_decision(request: Request) -> Response:
    """The hot path of a relay, answered by ``_fast.RelayApp`` ahead of the documented route.

    FastAPI's dependency solving and generic body handling cost more than the verification itself
    on a small host; here the body is parsed and shape-checked by pydantic-core in one step and the
    receipt is returned as it is. The behaviour is the documented route's, which only delegates here.
    """
    relay = await _relay(request)
    request_id = request.path_params["request_id"]
    check_path_request_id(request_id)
    body = await _read(request, SignedDecisionIn)
    return JSONResponse(await relay.count(request_id, body.statement, body.signature))


inbox_router = APIRouter(prefix="/v1/inbox", tags=["inbox"], route_class=BoundedJSONRoute)


@inbox_router.post(
    "",
    status_code=201,
    response_model=InboxAcceptedOut,
    responses=error_responses(400, 403, 409, 413, 422, 429, 503),
    summary="A peer relay delivers a signed request for this node's approver",
)
async def receive_request(body: SignedRequestIn, relay: RelayDep, response: Response) -> Any:
    """Accept it when its origin is a configured peer, this node is among its peers and the
    origin's signature verifies with the origin's configured key and it has not expired (422
    ``expired``); rate-limited per origin, new requests only.

    No token: the signature is the authentication. 201 the first time, 200 for a repeat (charged
    to no window: a captured request posted again cannot shut its origin out).
    """
    created, accepted = await relay.receive(body.request, body.signature)
    if not created:
        response.status_code = 200
    return accepted


@inbox_router.get(
    "",
    response_model=list[InboxItemOut],
    responses=error_responses(401, 422, 503),
    summary="Requests received from peers (pending ones by default)",
)
async def list_inbox(
    relay: RelayDep,
    _auth: Authorized,
    state: Literal["pending", "approved", "denied", "expired", "withdrawn", "settled", "all"] = "pending",
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 100,
    wait: Wait = 0.0,
) -> Any:
    """List received requests in order of expiry; with ``wait``, block until there is one."""
    return await relay.inbox(None if state == "all" else state, limit, wait)


@inbox_router.get(
    "/{request_id}",
    response_model=InboxItemOut,
    responses=error_responses(401, 404, 409, 422, 503),
    summary="One received request",
)
async def get_inbox_item(
    request_id: RequestId,
    relay: RelayDep,
    _auth: Authorized,
    origin: Annotated[str | None, Query(pattern="^[a-z0-9][a-z0-9._-]{0,63}$")] = None,
) -> Any:
    """Return the request with its origin, tool call, reason and expiry, and this node's decision."""
    return await relay.inbox_item(request_id, origin)


@inbox_router.post(
    "/{request_id}/decision",
    response_model=InboxDecisionOut,
    responses=error_responses(400, 401, 403, 404, 409, 413, 422, 503),
    summary="This node's signed approval or denial, forwarded to the origin's relay",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SignedDecisionIn"}}},
        }
    },
)
async def decide(
    request_id: Annotated[str, Path(description="32 lowercase hex characters.")],
    request: Request,
    _auth: Authorized,
) -> Any:
    """Verify the decision with one of this node's keys, record it, and queue it for the origin.

    The answer is this node's own decision (``this_node``), never the request's outcome, which the
    origin's relay counts. Repeating the same decision is harmless (200, ``counted: false``); a
    different one is 409. Served by :func:`own_decision` (a hot route of ``_fast.RelayApp``).
    """
    return await own_decision(request)


async def own_decision(request: Request) -> Response:
    """The approver's hot path, a hot route of ``_fast.RelayApp`` ahead of the documented one (as
    :func:`count_decision`): the same token check, body check and answer, without FastAPI's
    dependency solving and response validation."""
    relay = await _relay(request)
    check_token(bearer_token(request), relay.token)
    request_id = request.path_params["request_id"]
    check_path_request_id(request_id)
    body = await _read(request, SignedDecisionIn)
    return JSONResponse(await relay.decide(request_id, body.statement, body.signature))


@inbox_router.post(
    "/decisions",
    response_model=DecisionBatchOut,
    responses=error_responses(400, 401, 413, 422, 503),
    summary=f"Up to {MAX_DECISION_BATCH} of this node's signed decisions at once, each as the route above",
)
async def decide_many(_body: DecisionBatchIn, request: Request, _auth: Authorized) -> Any:
    """Each decision is verified, recorded and queued exactly as ``POST /v1/inbox/{id}/decision``
    does it alone (the id is its statement's ``request_id``), and answered in ``results`` with
    the status it alone would have had: one refused decision refuses no other. Served by
    :func:`own_decisions` (a hot route of ``_fast.RelayApp``)."""
    return await own_decisions(request)


async def own_decisions(request: Request) -> Response:
    """The approver's batches: concurrent decisions share each Redis round trip (see ``Relay``)."""
    relay = await _relay(request)
    check_token(bearer_token(request), relay.token)
    batch = await _read(request, DecisionBatchIn)

    async def one(item: SignedDecisionIn) -> dict[str, Any]:
        request_id = item.statement.get("request_id")
        try:
            if not isinstance(request_id, str) or not REQUEST_ID.fullmatch(request_id):
                raise ApiError(
                    422, "invalid", "The statement's request_id is not 32 lowercase hex characters."
                )
            return {"status": 200, "decision": await relay.decide(request_id, item.statement, item.signature)}
        except ApiError as exc:
            return {"status": exc.status_code, "error": exc.code, "message": exc.message}
        except StoreError as exc:
            return {"status": 503, "error": "unavailable", "message": sentence(str(exc))}

    return JSONResponse({"results": await asyncio.gather(*(one(item) for item in batch.decisions))})


@inbox_router.post(
    "/{request_id}/withdrawal",
    response_model=WithdrawalReceiptOut,
    responses=error_responses(400, 403, 404, 413, 422, 503),
    summary="A peer relay delivers its origin's signed withdrawal of a request in this inbox",
)
async def receive_withdrawal(request_id: RequestId, body: SignedWithdrawalIn, relay: RelayDep) -> Any:
    """Mark the inbox item ``withdrawn``: it leaves the pending listing, and this node's decision
    on it is refused (409 ``withdrawn``).

    No token: the signature is the authentication, verified with the key configured for the
    origin. An item this node decided (or that expired) first keeps that state (200, ``withdrawn``
    false).
    """
    return await relay.receive_withdrawal(request_id, body.statement, body.signature)


@inbox_router.post(
    "/{request_id}/settled",
    response_model=SettlementReceiptOut,
    responses=error_responses(400, 403, 404, 413, 422, 503),
    summary="A peer relay delivers the evidence of its request's outcome (approved or denied) there",
)
async def receive_settlement(request_id: RequestId, body: SettlementIn, relay: RelayDep) -> Any:
    """Mark the inbox item ``settled``: it leaves the pending listing, and this node's decision on
    it is refused (409 ``settled``).

    No token: the evidence is the authentication. ``certificate`` must be the quorum certificate of
    exactly that request, ``denials`` signed denials that deny it, each verified here under this
    node's own configuration and the origin's keys; anything else is refused (422 ``unverified``)
    and the item stays as it was. An item this node decided keeps its decision.
    """
    if (body.certificate is None) == (body.denials is None):
        raise ApiError(422, "invalid", "A settlement carries exactly one of certificate and denials.")
    return await relay.receive_settlement(request_id, body.model_dump(exclude_none=True))


deliveries_router = APIRouter(prefix="/v1/deliveries", tags=["deliveries"], route_class=BoundedJSONRoute)


@deliveries_router.post(
    "",
    response_model=DeliveryBatchOut,
    responses=error_responses(400, 413, 422, 503),
    summary=f"A peer relay delivers up to {MAX_DELIVERY_BATCH} deliveries at once, each as its own call",
)
async def receive_deliveries(_body: DeliveryBatchIn, request: Request) -> Any:
    """Each delivery (``path`` and ``body``, as the sending relay queued it) is taken as the call
    ``POST path`` with that body, by the same code and checks, and answered in ``results`` with the
    status and answer that call alone would have had: one refused delivery refuses no other. The
    paths are those peers' relays post to (``/v1/inbox``, ``/v1/requests/{id}/decisions``,
    ``/v1/inbox/{id}/withdrawal``, ``/v1/inbox/{id}/settled``); any other is answered 404 in its
    result. No token: each delivery is signed, and verified by its own route. Served by
    ``_batched.peer_deliveries`` (a hot route of ``_fast.RelayApp``)."""
    return await peer_deliveries(request)


@deliveries_router.get(
    "/dead",
    response_model=list[DeadLetterOut],
    responses=error_responses(401, 422, 503),
    summary="Deliveries to peer relays that were given up, oldest first",
)
async def list_dead_letters(
    relay: RelayDep,
    _auth: Authorized,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 100,
    after: Annotated[
        str | None,
        # [0-9], not \d: the validator's \d takes every script's digits, which Redis does not.
        Query(
            pattern=r"^[0-9]{1,20}-[0-9]{1,20}$",
            description="Page on: only the dead letters after this entry_id.",
        ),
    ] = None,
) -> Any:
    """What never reached a peer and why: a refusal that retrying cannot fix, too many failed
    attempts, or a request that expired first. Kept until trimmed (the newest 10,000 stay)."""
    if after is not None and any(int(part) >= 2**64 for part in after.split("-")):
        raise ApiError(
            422,
            "invalid",
            f"after={after} is not a dead letter's entry_id: both its numbers are below 2**64.",
        )
    letters = await relay.deliveries.dead_letters(limit, after=after)
    return [
        DeadLetterOut(
            entry_id=letter.entry_id,
            target=letter.delivery.target,
            request_id=letter.delivery.request_id,
            path=_queued_path(letter.delivery.payload),
            attempts=letter.delivery.attempts,
            error=letter.error,
            enqueued_at=letter.delivery.enqueued_at,
            expires_at=letter.delivery.expires_at,
            dead_at=letter.dead_at,
        )
        for letter in letters
    ]


def _queued_path(payload: bytes) -> str | None:
    try:
        path = json.loads(payload)["path"]
    except (ValueError, KeyError, TypeError):
        return None
    return path if isinstance(path, str) else None


operations_router = APIRouter(tags=["operations"], route_class=BoundedJSONRoute)


@operations_router.get(
    "/health",
    response_model=HealthOut,
    responses=error_responses(503),
    summary="Liveness (readiness: /ready)",
)
async def health(relay: RelayDep) -> Any:
    """Answer 200 when the relay and its Redis answer, 503 ``unavailable`` otherwise."""
    return await store_health("relay", relay.agent_id, relay.store)


@operations_router.get(
    "/ready",
    response_model=ReadyOut,
    responses=ready_responses(),
    summary="Readiness: the store answers and the delivery worker runs",
)
async def ready(relay: RelayDep, request: Request) -> Response:
    """Answer 200 when the relay's Redis answers a PING and its delivery worker task runs (``off``
    when this process delivers nothing), else 503 ``unavailable`` naming what is not ready."""

    async def store() -> str:
        return f"PING answered in {await relay.store.ping() * 1000:.1f} ms"

    async def worker() -> Dependency:
        task: asyncio.Task[None] | None = getattr(request.app.state, "delivery_task", None)
        if task is None:
            return Dependency("off", "this process delivers nothing (TEAAGENT_RELAY_DELIVER=false)")
        if not task.done():
            return Dependency("ok", "running")
        error = None if task.cancelled() else task.exception()
        return Dependency("failing", f"the delivery worker stopped ({error or 'cancelled'})")

    return await readiness("relay", {"store": check(store), "worker": worker()})


@operations_router.post(
    "/v1/reload",
    response_model=ReloadOut,
    responses=error_responses(401, 422),
    summary="Read the peers, the operators and the allowed_signers files again (as SIGHUP does)",
)
async def reload_trust(_auth: Authorized, request: Request) -> Any:
    """Read node.toml's ``[peers]`` and ``[quorum]``, ``[approver] operators`` and every
    ``allowed_signers`` file again, and verify with them from now on. 422 ``reload_failed`` when
    they do not load: the relay keeps the trust it had (and counts the failure in
    ``teaagent_relay_trust_reloads``). Other settings apply at a restart (``restart`` names them)."""
    return await reloaded_trust(request, "relay")


@operations_router.get(
    "/metrics",
    response_class=Response,
    responses=METRICS_RESPONSES,
    summary="Prometheus metrics",
)
async def metrics(relay: RelayDep) -> Response:
    """Counters of calls, requests, deliveries, retries, decisions and outcomes; latency; queue sizes."""
    for queue in (relay.deliveries, relay.store.inbox_queue):
        try:
            stats = await queue.stats()
        except StoreError:
            continue  # the counters still render; the gauges keep their last values
        for kind in ("length", "pending", "scheduled", "dead"):
            relay.metrics.queue.labels(queue.name, kind).set(getattr(stats, kind))
    return relay.metrics.response()
