"""The agent service's routes, grouped by resource: runs, sessions, models and settings, usage and the rest.

Every route but ``GET /health``, ``GET /ready`` and ``GET /metrics`` needs the node's bearer token.
``session`` (a query parameter of the run routes) names the session a call is about; it is the
current session when left out.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from teaagent.service import (
    METRICS_RESPONSES,
    Authorized,
    BoundedJSONRoute,
    Dependency,
    ReadyOut,
    check,
    readiness,
    ready_responses,
    started,
)
from teaagent_agent._errors import ApiError, ErrorOut
from teaagent_agent._probes import redis_ping, relay_ping
from teaagent_agent._runs import ActiveRun, RunChannel
from teaagent_agent._schemas import (
    AnswerOut,
    ApprovalAnswer,
    CancelledOut,
    CompactionOut,
    CompactRequest,
    ContextOut,
    CurrentSessionOut,
    DoctorOut,
    DoctorRequest,
    HealthOut,
    HistoryOut,
    MentionsOut,
    ModelCreate,
    ModelOut,
    ModelsOut,
    ModelUpdate,
    PluginsOut,
    PromptRequest,
    QuestionAnswer,
    RenameRequest,
    ResolvedOut,
    ResumableOut,
    ResumeRequest,
    RunStateOut,
    SelfCompactionOut,
    SelfCompactionUpdate,
    SessionCreate,
    SessionOut,
    SessionsOut,
    SessionStatsListOut,
    SettingsOut,
    SettingsUpdate,
    SideQuestionRequest,
    SteeredOut,
    SteerIn,
    WorkspaceUsageOut,
)
from teaagent_agent._service import AgentService

__all__ = [
    "models_router",
    "operations_router",
    "runs_router",
    "sessions_router",
    "usage_router",
]

MAX_MENTIONS: Final = 200
_SSE: Final = {
    "description": (
        "Server-sent events: one frame per step of the run (see the service's description), the "
        "`result` frame (a `ResultOut`) last."
    ),
    "content": {"text/event-stream": {"schema": {"type": "string"}}},
}


async def _service(request: Request) -> AgentService:
    service: AgentService = started(request, "service", "agent service", code="internal")
    return service


ServiceDep = Annotated[AgentService, Depends(_service)]
SessionQuery = Annotated[
    str | None,
    Query(max_length=64, description="The session; the current one when left out (or `current`)."),
]
SessionPath = Annotated[
    str, Path(max_length=64, description="A session id, or `current` for the current session.")
]
ModelName = Annotated[str, Path(max_length=64, description="A model's name, as GET /models lists it.")]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorOut} for status in (401, 422, *statuses)}


def _stream(channel: RunChannel, after: int) -> StreamingResponse:
    return StreamingResponse(
        channel.follow(after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _run(service: AgentService, session: str | None) -> ActiveRun | None:
    run = service.run_of(session)
    return run if run is not None and run.running else None


# -- operations ----------------------------------------------------------------------------------

operations_router = APIRouter(tags=["operations"], route_class=BoundedJSONRoute)


@operations_router.get(
    "/health", response_model=HealthOut, summary="Liveness, and what the service has to work with"
)
async def health(service: ServiceDep) -> Any:
    """Answer without the token: whether a model can run, the current session, whether a run is going."""
    return service.health()


@operations_router.get(
    "/ready",
    response_model=ReadyOut,
    responses=ready_responses(),
    summary="Readiness: the node's Redis (rate limits) and relay (quorum) answer",
)
async def ready(service: ServiceDep) -> Response:
    """Answer without the token: 200 when the node's Redis answers a PING (``off`` without
    ``[agent.rate_limits]``) and its relay answers an authenticated listing with the node's token
    (``off`` with the quorum disabled), else 503 ``unavailable`` naming what is not ready."""
    node = service.node

    async def store() -> str:
        return await redis_ping(node)

    async def relay() -> str:
        return await relay_ping(node, service.token)

    off_store = Dependency("off", "no [agent.rate_limits]: tool calls are not counted in Redis")
    off_relay = Dependency("off", "the quorum is disabled: no call goes to the relay")
    return await readiness(
        "agent service",
        {
            "store": check(store) if node.agent.rate_limits else off_store,
            "relay": check(relay) if node.quorum.enabled else off_relay,
        },
    )


@operations_router.get(
    "/metrics",
    response_class=Response,
    responses=METRICS_RESPONSES,
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response:
    """Answer without the token (as the relay's and the approver's): calls by route, method and
    status, and their latency."""
    response: Response = request.app.state.metrics.response()
    return response


# -- runs ----------------------------------------------------------------------------------------

runs_router = APIRouter(prefix="/runs", tags=["runs"], route_class=BoundedJSONRoute)


@runs_router.post(
    "",
    responses={200: _SSE, **_errors(400, 404, 409, 423)},
    response_class=StreamingResponse,
    summary="Run a prompt in the session, streamed as server-sent events",
)
async def post_run(
    body: PromptRequest, service: ServiceDep, _auth: Authorized, session: SessionQuery = None
) -> Any:
    """Start the run and stream it. The run is the service's: a client that goes away leaves it
    running (``GET /runs/events`` reads it again; ``POST /runs/cancel`` stops it)."""
    run = await service.start_run(session, body, text=body.text, images=body.images, mentions=body.mentions)
    return _stream(run.channel, 0)


@runs_router.post(
    "/resume",
    responses={200: _SSE, **_errors(400, 404, 409, 423)},
    response_class=StreamingResponse,
    summary="Run the interrupted prompt of the session again, streamed",
)
async def resume_run(
    body: ResumeRequest, service: ServiceDep, _auth: Authorized, session: SessionQuery = None
) -> Any:
    """Continue where ``GET /runs/resumable`` says the conversation was interrupted."""
    run = await service.start_run(session, body, text=None)
    return _stream(run.channel, 0)


@runs_router.get(
    "/events",
    responses={200: _SSE, **_errors(404)},
    response_class=StreamingResponse,
    summary="Read the session's run stream again, from the frame after Last-Event-ID",
)
async def run_events(
    service: ServiceDep,
    _auth: Authorized,
    session: SessionQuery = None,
    last_event_id: Annotated[int | None, Header(ge=0, le=10**9)] = None,
    after: Annotated[
        int | None, Query(ge=0, le=10**9, description="Frames to skip (Last-Event-ID wins).")
    ] = None,
) -> Any:
    """The run going in the session, or its last run (whose stream ends with its ``result``)."""
    run = service.run_of(session)
    if run is None:
        raise ApiError(404, "not_found", "This session has no run to read.")
    return _stream(run.channel, last_event_id if last_event_id is not None else (after or 0))


@runs_router.get(
    "/state",
    response_model=RunStateOut,
    responses=_errors(),
    summary="Whether a run goes, and what it waits on",
)
async def run_state(service: ServiceDep, _auth: Authorized, session: SessionQuery = None) -> Any:
    """What a reconnecting client needs: the approval, question or quorum the run waits on."""
    return service.state(session)


@runs_router.get(
    "/resumable",
    response_model=ResumableOut,
    responses=_errors(409),
    summary="Whether the session was interrupted",
)
async def run_resumable(service: ServiceDep, _auth: Authorized, session: SessionQuery = None) -> Any:
    """Resumable when the last message of the session is a prompt that got no answer."""
    return service.resumable(session)


@runs_router.post(
    "/approvals",
    response_model=ResolvedOut,
    responses=_errors(),
    summary="Answer an approval the run waits on",
)
async def answer_approval(
    body: ApprovalAnswer, service: ServiceDep, _auth: Authorized, session: SessionQuery = None
) -> Any:
    """``resolved`` is false when no approval of that ``call_id`` waits (answered, timed out, none)."""
    run = _run(service, session)
    return ResolvedOut(
        resolved=run is not None and run.answer_approval(body.call_id, body.approve, body.remember)
    )


@runs_router.post(
    "/questions", response_model=ResolvedOut, responses=_errors(), summary="Answer a question the model asked"
)
async def answer_question(
    body: QuestionAnswer, service: ServiceDep, _auth: Authorized, session: SessionQuery = None
) -> Any:
    """``answer: null`` declines the question; ``resolved`` is false when none of that id waits."""
    run = _run(service, session)
    return ResolvedOut(resolved=run is not None and run.answer_question(body.call_id, body.answer))


@runs_router.post(
    "/steer", response_model=SteeredOut, responses=_errors(), summary="Add a message to the run in progress"
)
async def steer(body: SteerIn, service: ServiceDep, _auth: Authorized, session: SessionQuery = None) -> Any:
    """The message joins the conversation before the run's next model call."""
    run = _run(service, session)
    return SteeredOut(steered=run is not None and run.steer(body.text))


@runs_router.post(
    "/cancel", response_model=CancelledOut, responses=_errors(), summary="Stop the run in progress"
)
async def cancel(service: ServiceDep, _auth: Authorized, session: SessionQuery = None) -> Any:
    """A model call is abandoned, waits are answered no, a quorum wait ends; ``stop`` is ``cancelled``."""
    run = _run(service, session)
    return CancelledOut(cancelled=run is not None and run.stop(why="cancel"))


# -- sessions ------------------------------------------------------------------------------------

sessions_router = APIRouter(prefix="/sessions", tags=["sessions"], route_class=BoundedJSONRoute)


@sessions_router.get(
    "", response_model=SessionsOut, responses=_errors(), summary="The stored sessions, most recent first"
)
async def list_sessions(service: ServiceDep, _auth: Authorized) -> Any:
    return service.list_sessions()


@sessions_router.post(
    "",
    status_code=201,
    response_model=SessionOut,
    responses=_errors(400),
    summary="Start a session; it becomes current",
)
async def create_session(service: ServiceDep, _auth: Authorized, body: SessionCreate | None = None) -> Any:
    return service.create_session(body.title if body is not None else None)


@sessions_router.get(
    "/current",
    response_model=CurrentSessionOut,
    responses=_errors(404, 409),
    summary="The session the next prompt continues",
)
async def current_session(service: ServiceDep, _auth: Authorized) -> Any:
    return service.current_out()


@sessions_router.post(
    "/{session_id}/switch",
    response_model=CurrentSessionOut,
    responses=_errors(404, 409),
    summary="Make a session current",
)
async def switch_session(session_id: SessionPath, service: ServiceDep, _auth: Authorized) -> Any:
    return service.switch(session_id)


@sessions_router.patch(
    "/{session_id}", response_model=SessionOut, responses=_errors(400, 404, 409), summary="Rename a session"
)
async def rename_session(
    session_id: SessionPath, body: RenameRequest, service: ServiceDep, _auth: Authorized
) -> Any:
    return service.rename(session_id, body.title)


@sessions_router.delete(
    "/{session_id}", status_code=204, responses=_errors(404, 409), summary="Delete a session"
)
async def delete_session(session_id: SessionPath, service: ServiceDep, _auth: Authorized) -> Response:
    service.delete_session(session_id)
    return Response(status_code=204)


@sessions_router.get(
    "/{session_id}/history",
    response_model=HistoryOut,
    responses=_errors(404, 409),
    summary="A session's messages, oldest first",
)
async def history(session_id: SessionPath, service: ServiceDep, _auth: Authorized) -> Any:
    return service.history(session_id)


@sessions_router.post(
    "/{session_id}/compact",
    response_model=CompactionOut,
    responses=_errors(400, 404, 409, 502, 504),
    summary="Fold the older messages into a summary the model writes",
)
async def compact(
    session_id: SessionPath, service: ServiceDep, _auth: Authorized, body: CompactRequest | None = None
) -> Any:
    """The newest ``keep`` messages stay; ``applied`` is false when there is nothing older."""
    body = body or CompactRequest()
    return await service.compact(session_id, body.keep, body.timeout)


@sessions_router.get(
    "/{session_id}/self-compaction",
    response_model=SelfCompactionOut,
    responses=_errors(404, 409),
    summary="Whether the session compacts itself",
)
async def get_self_compaction(session_id: SessionPath, service: ServiceDep, _auth: Authorized) -> Any:
    return service.self_compaction(session_id)


@sessions_router.put(
    "/{session_id}/self-compaction",
    response_model=SelfCompactionOut,
    responses=_errors(400, 404, 409),
    summary="Choose whether the session compacts itself",
)
async def put_self_compaction(
    session_id: SessionPath, body: SelfCompactionUpdate, service: ServiceDep, _auth: Authorized
) -> Any:
    return service.set_self_compaction(session_id, body.choice)


@sessions_router.get(
    "/{session_id}/context",
    response_model=ContextOut,
    responses=_errors(404, 409),
    summary="What fills the model's window",
)
async def context(session_id: SessionPath, service: ServiceDep, _auth: Authorized) -> Any:
    return service.context(session_id)


# -- models and settings -------------------------------------------------------------------------

models_router = APIRouter(tags=["models"], route_class=BoundedJSONRoute)


@models_router.get("/models", response_model=ModelsOut, responses=_errors(), summary="The configured models")
async def list_models(service: ServiceDep, _auth: Authorized) -> Any:
    return service.models_out()


@models_router.post(
    "/models",
    status_code=201,
    response_model=ModelOut,
    responses=_errors(400, 409),
    summary="Add a [models] table to node.toml",
)
async def add_model(body: ModelCreate, service: ServiceDep, _auth: Authorized) -> Any:
    """Written atomically, and only once the whole new file loads."""
    return service.add_model(body)


@models_router.patch(
    "/models/{name}",
    response_model=ModelOut,
    responses=_errors(400, 404, 409),
    summary="Change a model's table",
)
async def update_model(name: ModelName, body: ModelUpdate, service: ServiceDep, _auth: Authorized) -> Any:
    return service.update_model(name, body)


@models_router.delete(
    "/models/{name}", status_code=204, responses=_errors(404, 409), summary="Remove a model's table"
)
async def remove_model(name: ModelName, service: ServiceDep, _auth: Authorized) -> Response:
    service.remove_model(name)
    return Response(status_code=204)


@models_router.get(
    "/settings", response_model=SettingsOut, responses=_errors(), summary="What a run starts with"
)
async def get_settings(service: ServiceDep, _auth: Authorized) -> Any:
    return service.settings_out()


@models_router.patch(
    "/settings",
    response_model=SettingsOut,
    responses=_errors(400, 404),
    summary="Change what a run starts with",
)
async def update_settings(body: SettingsUpdate, service: ServiceDep, _auth: Authorized) -> Any:
    return service.update_settings(body)


@models_router.post(
    "/doctor", response_model=DoctorOut, responses=_errors(400), summary="Ask each model a tiny question"
)
async def doctor(service: ServiceDep, _auth: Authorized, body: DoctorRequest | None = None) -> Any:
    """Every model at once, each within ``timeout``; the offline scripted model always passes."""
    return await service.doctor((body or DoctorRequest()).timeout)


# -- usage, plugins, mentions, side questions -----------------------------------------------------

usage_router = APIRouter(tags=["usage"], route_class=BoundedJSONRoute)


@usage_router.get(
    "/usage", response_model=WorkspaceUsageOut, responses=_errors(), summary="What the workspace's runs spent"
)
async def usage(service: ServiceDep, _auth: Authorized) -> Any:
    """By session, by model and by UTC day, from the run logs."""
    return service.usage()


@usage_router.get(
    "/usage/sessions",
    response_model=SessionStatsListOut,
    responses=_errors(),
    summary="The totals of some sessions",
)
async def session_stats(
    service: ServiceDep,
    _auth: Authorized,
    ids: Annotated[
        list[str] | None, Query(max_length=100, description="Session ids; every session when left out.")
    ] = None,
) -> Any:
    return service.stats(ids or [])


@usage_router.get(
    "/plugins", response_model=PluginsOut, responses=_errors(), summary="The plugins this service loaded"
)
async def plugins(_service: ServiceDep, _auth: Authorized) -> Any:
    """This service loads no plugins: the node's tools are its workspace tools."""
    return PluginsOut(loaded=[], failures=[])


@usage_router.get(
    "/mentions",
    response_model=MentionsOut,
    responses=_errors(),
    summary="The workspace's files matching a prefix",
)
async def mentions(
    service: ServiceDep,
    _auth: Authorized,
    prefix: Annotated[str, Query(max_length=4096, description="What was typed after @.")] = "",
    limit: Annotated[int, Query(ge=1, le=MAX_MENTIONS)] = 50,
) -> Any:
    return service.mentions(prefix, limit)


@usage_router.post(
    "/side-question",
    response_model=AnswerOut,
    responses=_errors(400, 409, 502, 504),
    summary="Ask the model on the side: the session's history is read, never written",
)
async def side_question(body: SideQuestionRequest, service: ServiceDep, _auth: Authorized) -> Any:
    return AnswerOut(answer=await service.side_question(body.question, body.timeout))
