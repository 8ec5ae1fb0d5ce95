"""The approver's routes: the operators' inbox (``/v1/requests``) and operations (health, metrics).

API deviations (from /tmp/brief/issue10.md, for the command line's authors):

- ``deny`` needs a ``reason`` that is not only blanks (422 ``invalid`` otherwise): the origin shows
  it to its user.
- ``bad origin signature``: ``approve``, ``deny``, ``decision`` and ``statement`` on a request whose
  origin signature does not verify answer 422 ``invalid`` (the relay refuses such requests before
  its inbox, so only a tampered store shows it).
- ``Item.rule.index`` and ``by = "rule N"`` count the rules from 1, in file order;
  ``by`` is ``operator`` for a decision made through this API (node key or an operator's key), and
  ``relay`` for a decision of this node that the relay holds but this approver never recorded.
- Every decision route answers 200 with the ``Decision`` that stands, also when it was recorded
  before (the same decision asked again); another decision than the recorded one is 409 ``conflict``.
  ``forwarded: false`` means the relay did not answer: the decision is recorded and audited, and
  the engine sends it again.
- A refusal by the relay of a signed decision (for good) is passed on with the relay's status
  (403, 404, 409 or 422) and its sentence.
- ``expect_tool_name`` and ``expect_payload_digest`` (optional, in the bodies of ``approve``, ``deny``
  and ``decision``, in the query of ``statement``) are what the operator confirmed; a request whose
  signed tool or digest differs is 409 ``changed`` and nothing is signed (PROTOCOL.md, "What an
  approving node decides on": a request swapped in under the id or prefix the operator typed).
- Non-JSON bodies are 400 ``invalid``; a body over 64 KiB is 413 ``too_large``; a wrong method 405
  ``method_not_allowed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from teaagent._reload import ReloadOut
from teaagent.approver_client import unconfirmed
from teaagent.approver_client._client import MAX_TOOL_PATTERN_CHARS
from teaagent.errors import RelayError
from teaagent.quorum import statement_bytes
from teaagent.relay_client import InboxItem
from teaagent.service import (
    METRICS_RESPONSES,
    Authorized,
    BoundedJSONRoute,
    Dependency,
    ReadyOut,
    check,
    error_responses,
    readiness,
    ready_responses,
    reloaded_trust,
    started,
    store_health,
)
from teaagent_approver._audit import AuditWriteError
from teaagent_approver._engine import Engine, Outcome, Proposal
from teaagent_approver._errors import ApiError, sentence
from teaagent_approver._items import Received, item_view
from teaagent_approver._ledger import DecisionKind, Record
from teaagent_approver._models import (
    AGENT_ID,
    MAX_REASON_CHARS,
    MAX_TOOL_NAME_CHARS,
    PAYLOAD_DIGEST,
    ApproveIn,
    DecisionIn,
    DecisionOut,
    DenyIn,
    HealthOut,
    ItemOut,
    ItemsOut,
    StatementOut,
)

__all__ = ["MAX_LISTED", "MAX_WAIT_SECONDS", "operations_router", "requests_router"]

MAX_LISTED = 1000  # one listing; the relay's own bound
MAX_WAIT_SECONDS = 60.0  # one long-poll; the relay's own bound
_TRANSIENT = frozenset({408, 425, 429, 500, 502, 503, 504})


async def _engine(request: Request) -> Engine:
    engine: Engine = started(request, "engine", "approver")
    return engine


EngineDep = Annotated[Engine, Depends(_engine)]
RequestId = Annotated[str, Path(pattern="^[0-9a-f]{32}$", description="32 lowercase hex characters.")]
Origin = Annotated[
    str | None, Query(pattern=AGENT_ID, description="The origin, when several sent a request of this id.")
]
ExpectToolName = Annotated[
    str | None,
    Query(
        max_length=MAX_TOOL_NAME_CHARS,
        description="The tool the operator confirmed: 409 `changed` when the signed request calls another.",
    ),
]
ExpectPayloadDigest = Annotated[
    str | None,
    Query(
        pattern=PAYLOAD_DIGEST,
        description="The payload digest the operator confirmed: 409 `changed` when the signed request's "
        "differs.",
    ),
]


def _relay_refusal(exc: RelayError, request_id: str, origin: str | None) -> ApiError:
    """The approver's answer when its relay refused or failed a look-up of one request."""
    if exc.status_code is None or exc.status_code in _TRANSIENT or exc.status_code == 401:
        return ApiError(
            503, "unavailable", sentence(f"this node's relay failed: {exc}"), headers={"Retry-After": "1"}
        )
    if exc.status_code == 404:
        where = f" from {origin}" if origin is not None else ""
        return ApiError(404, "not_found", f"No request {request_id}{where} is in this node's inbox.")
    if exc.status_code == 409:
        return ApiError(
            409,
            "ambiguous",
            f"Several origins sent a request {request_id}; name one with origin (--origin in teaagent "
            "approvals).",
        )
    return ApiError(422, "invalid", sentence(str(exc)))


async def _find(engine: Engine, request_id: str, origin: str | None) -> Received:
    """The item the relay files under this id, verified (:meth:`Engine.receive`).

    Raises:
        ApiError: The relay failed or does not know it; the request does not verify, is filed
            under another id or origin than its own, or the relay describes it otherwise.
    """
    try:
        item = await engine.relay.get_inbox_item(request_id, origin=origin)
    except RelayError as exc:
        raise _relay_refusal(exc, request_id, origin) from exc
    if item.request_id != request_id or (origin is not None and item.origin != origin):
        engine.metrics.refused_items.labels("relay_disagrees").inc()
        raise ApiError(
            502,
            "relay_disagrees",
            f"This node's relay answered request {item.request_id} of {item.origin} when asked for "
            f"{request_id}; this node neither shows nor signs it.",
        )
    return engine.receive(item)


def _check_expected(item: Received, tool_name: str | None, payload_digest: str | None) -> None:
    """Refuse to decide on another request than the one the operator confirmed.

    Compared with the signed request itself, never with the relay's copy of its fields: an origin
    may withdraw what an operator read and send another request under the same prefix, and a relay
    may show one thing and hold another.

    Raises:
        ApiError: 409 ``changed`` when the request's tool or payload digest is not the expected one.
    """
    request = item.request
    differs = unconfirmed(
        {"tool_name": request.tool_name, "payload_digest": request.payload_digest},
        tool_name=tool_name,
        payload_digest=payload_digest,
    )
    if differs:
        raise ApiError(
            409,
            "changed",
            f"Request {request.request_id} of {request.origin} is not the request the operator confirmed: "
            f"its signed {' and '.join(differs)} {'differ' if len(differs) > 1 else 'differs'}; this node "
            "signs nothing for it.",
        )


def _decision_out(item: Received, outcome: Outcome) -> dict[str, Any]:
    record = outcome.record
    return {
        "request_id": item.request.request_id,
        "origin": item.request.origin,
        "decision": record.kind,
        "reason": record.reason,
        "this_node": "approved" if record.kind == "approval" else "denied",
        "by": record.by,
        "key_fingerprint": record.key_fingerprint,
        "forwarded": outcome.forwarded,
        "note": (
            f"This node's decision; the request's outcome is counted by its origin, {item.request.origin}."
        ),
    }


def _decided_otherwise(record: Record, request_id: str) -> ApiError:
    """409 ``conflict``: this node recorded the other decision on the request first."""
    done = "approved" if record.kind == "approval" else "denied"
    return ApiError(
        409,
        "conflict",
        f"This node already {done} request {request_id} ({record.by}); "
        "it never signs another decision on it.",
    )


async def _decide(engine: Engine, item: Received, proposal: Proposal) -> dict[str, Any]:
    try:
        outcome = await engine.settle(item, proposal)
    except AuditWriteError as exc:
        raise ApiError(503, "unavailable", sentence(str(exc))) from exc
    if outcome.record.kind != proposal.kind:
        raise _decided_otherwise(outcome.record, item.request.request_id)
    return _decision_out(item, outcome)


async def _node_key_decides(
    engine: Engine, request_id: str, body: ApproveIn | DenyIn, kind: DecisionKind
) -> dict[str, Any]:
    """An operator's approval or denial through this API, signed with the node key."""
    item = await _find(engine, request_id, body.origin)
    _check_expected(item, body.expect_tool_name, body.expect_payload_digest)
    return await _decide(engine, item, Proposal(kind=kind, reason=body.reason, by="operator"))


async def _listing(
    engine: Engine, request: Request, state: Literal["pending", "all"], wait: float, limit: int = MAX_LISTED
) -> list[InboxItem]:
    """The relay's listing of ``limit`` items; a long-poll ends early when this service is stopping.

    Raises:
        RelayError: The relay failed.
    """
    stopping: asyncio.Event | None = getattr(request.app.state, "stopping", None)
    if wait <= 0 or stopping is None:
        return await engine.relay.list_inbox(state, limit=limit, wait=wait)
    polled = asyncio.ensure_future(engine.relay.list_inbox(state, limit=limit, wait=wait))
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({polled, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if polled.done():
        return polled.result()
    polled.cancel()
    return await engine.relay.list_inbox(state, limit=limit, wait=0.0)


requests_router = APIRouter(prefix="/v1/requests", tags=["requests"], route_class=BoundedJSONRoute)


@requests_router.get(
    "",
    response_model=ItemsOut,
    responses=error_responses(401, 422, 503),
    summary="The requests that reached this node, pending ones first",
)
async def list_requests(
    request: Request,
    engine: EngineDep,
    _auth: Authorized,
    state: Literal["pending", "approved", "denied", "expired", "withdrawn", "settled", "all"] = "pending",
    origin: Origin = None,
    tool: Annotated[
        str | None,
        Query(max_length=MAX_TOOL_PATTERN_CHARS, description="An fnmatch pattern on the tool name."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LISTED)] = 100,
    wait: Annotated[
        float, Query(ge=0, le=MAX_WAIT_SECONDS, description="Seconds to wait for a pending request.")
    ] = 0.0,
) -> Any:
    """List received requests as this node sees them; with ``wait``, block until one is pending."""
    # The relay lists pending requests first, in order of expiry: unfiltered, its first ``limit``
    # are this page, and a listing reads as many, whatever the inbox holds. A filter (origin,
    # tool, a decided state) picks among the relay's whole bound.
    paged = origin is None and tool is None and state in ("pending", "all")
    try:
        items = await _listing(
            engine, request, "pending" if state == "pending" else "all", wait, limit if paged else MAX_LISTED
        )
    except RelayError as exc:
        raise ApiError(
            503, "unavailable", sentence(f"this node's relay failed: {exc}"), headers={"Retry-After": "1"}
        ) from exc
    received: list[Received] = []
    for item in items:
        with contextlib.suppress(ApiError):  # refused: logged and counted, never shown
            received.append(engine.receive(item))
    if origin is not None:
        received = [item for item in received if item.request.origin == origin]
    if tool is not None:
        received = [item for item in received if fnmatchcase(item.request.tool_name, tool)]
    found = await engine.ledger.read([item.ref for item in received])
    now = time.time()
    views = [
        item_view(item, record, engine.node.approver.rules, now)
        for item, (record, _signature) in zip(received, found, strict=True)
    ]
    if state != "all":
        views = [view for view in views if view["state"] == state]
    views.sort(key=lambda view: view["state"] != "pending")  # stable: the relay's order otherwise
    return {"items": views[:limit]}


@requests_router.get(
    "/{request_id}",
    response_model=ItemOut,
    responses=error_responses(401, 404, 409, 422, 503),
    summary="One received request, with this node's decision and the rule that matches",
)
async def get_request(
    request_id: RequestId, engine: EngineDep, _auth: Authorized, origin: Origin = None
) -> Any:
    """Return the request as this node sees it (409 when several origins used the id and none is named)."""
    item = await _find(engine, request_id, origin)
    [(record, _signature)] = await engine.ledger.read([item.ref])
    return item_view(item, record, engine.node.approver.rules, time.time())


@requests_router.get(
    "/{request_id}/statement",
    response_model=StatementOut,
    responses=error_responses(401, 404, 409, 422, 503),
    summary="The statement to sign elsewhere (ssh-keygen -Y sign), dated now",
)
async def get_statement(
    request_id: RequestId,
    engine: EngineDep,
    _auth: Authorized,
    kind: Literal["approval", "denial"] = "approval",
    reason: Annotated[str, Query(max_length=MAX_REASON_CHARS)] = "",
    origin: Origin = None,
    expect_tool_name: ExpectToolName = None,
    expect_payload_digest: ExpectPayloadDigest = None,
) -> Any:
    """Return this node's approval (or denial) statement and its canonical bytes, to sign with
    ``ssh-keygen -Y sign -n teaagent-approval`` (``teaagent-denial`` for a denial) and bring back
    through ``POST /v1/requests/{id}/decision``."""
    item = await _find(engine, request_id, origin)
    _check_expected(item, expect_tool_name, expect_payload_digest)
    now = time.time()
    engine.check_signable(item, now)
    [(record, _signature)] = await engine.ledger.read([item.ref])
    if record is not None and record.kind != kind:
        raise _decided_otherwise(record, request_id)
    statement = engine.statement_for(item.request, kind, reason, int(now))
    return {"statement": statement, "bytes": statement_bytes(statement).decode("utf-8")}


@requests_router.post(
    "/{request_id}/approve",
    response_model=DecisionOut,
    responses=error_responses(400, 401, 404, 409, 413, 422, 503),
    summary="Approve with the node key",
)
async def approve(request_id: RequestId, body: ApproveIn, engine: EngineDep, _auth: Authorized) -> Any:
    """Record, sign (node key), audit and forward this node's approval. The same call again
    answers the recorded decision; a denial recorded before is 409 ``conflict``."""
    return await _node_key_decides(engine, request_id, body, "approval")


@requests_router.post(
    "/{request_id}/deny",
    response_model=DecisionOut,
    responses=error_responses(400, 401, 404, 409, 413, 422, 503),
    summary="Deny with the node key",
)
async def deny(request_id: RequestId, body: DenyIn, engine: EngineDep, _auth: Authorized) -> Any:
    """Record, sign (node key), audit and forward this node's denial with its reason."""
    return await _node_key_decides(engine, request_id, body, "denial")


@requests_router.post(
    "/{request_id}/decision",
    response_model=DecisionOut,
    responses=error_responses(400, 401, 403, 404, 409, 413, 422, 503),
    summary="A decision signed elsewhere (an operator's own key)",
)
async def submit_decision(
    request_id: RequestId, body: DecisionIn, engine: EngineDep, _auth: Authorized
) -> Any:
    """Check the statement against the request (every field, signer = this node) and the signature
    against the keys that may sign for this node, then record, audit and forward it."""
    statement = body.statement
    if statement.get("request_id") != request_id:
        raise ApiError(422, "invalid", f"The statement's request_id is not {request_id}.")
    origin = statement.get("origin")
    if not isinstance(origin, str) or not origin:
        raise ApiError(422, "invalid", "The statement's origin is not an agent id.")
    item = await _find(engine, request_id, origin)
    engine.check_signable(item, time.time())
    proposal = engine.check_signed_elsewhere(item, statement, body.signature)
    # After the statement's own check: one that does not match its request stays 422 invalid.
    _check_expected(item, body.expect_tool_name, body.expect_payload_digest)
    return await _decide(engine, item, proposal)


operations_router = APIRouter(tags=["operations"], route_class=BoundedJSONRoute)


@operations_router.post(
    "/v1/reload",
    response_model=ReloadOut,
    responses=error_responses(401, 422),
    summary="Read the peers, the operators and the allowed_signers files again (as SIGHUP does)",
)
async def reload_trust(_auth: Authorized, request: Request) -> Any:
    """Read node.toml's ``[peers]`` and ``[quorum]``, ``[approver] operators`` and every
    ``allowed_signers`` file again, and verify and sign with them from now on. 422
    ``reload_failed`` when they do not load: the approver keeps the trust it had (and counts the
    failure in ``teaagent_approver_trust_reloads``). Other settings (its rules among them) apply
    at a restart (``restart`` names them)."""
    return await reloaded_trust(request, "approver")


@operations_router.get(
    "/health",
    response_model=HealthOut,
    responses=error_responses(503),
    summary="Liveness (readiness: /ready)",
)
async def health(engine: EngineDep) -> Any:
    """Answer 200 when the approver and its Redis answer, 503 ``unavailable`` otherwise."""
    return await store_health("approver", engine.agent_id, engine.store, engine=engine.settings.engine)


@operations_router.get(
    "/ready",
    response_model=ReadyOut,
    responses=ready_responses(),
    summary="Readiness: the store and the relay answer, and the engine's last round succeeded",
)
async def ready(engine: EngineDep) -> Response:
    """Answer 200 when the approver's Redis answers a PING, its relay answers an authenticated
    listing of one inbox item (the token included), and the engine's last finished round did not
    fail (``off`` when this process applies no rules); else 503 ``unavailable`` naming what is not
    ready."""

    async def store() -> str:
        return f"PING answered in {await engine.store.ping() * 1000:.1f} ms"

    async def relay() -> str:
        await engine.relay.list_inbox("pending", limit=1, wait=0)
        return f"{engine.relay.base_url} answers with this node's token"

    async def rounds() -> Dependency:
        if not engine.settings.engine:
            return Dependency("off", "this process applies no rules (TEAAGENT_APPROVER_ENGINE=false)")
        if engine.last_round_error is not None:
            return Dependency("failing", engine.last_round_error)
        return Dependency("ok", "no round failed since the last one that succeeded")

    return await readiness("approver", {"store": check(store), "relay": check(relay), "engine": rounds()})


@operations_router.get(
    "/metrics",
    response_class=Response,
    responses=METRICS_RESPONSES,
    summary="Prometheus metrics",
)
async def metrics(engine: EngineDep) -> Response:
    """Counters of calls, decisions, signatures, forwards, skipped items, takeovers; latency."""
    return engine.metrics.response()
