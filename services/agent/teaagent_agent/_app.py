"""The agent service's application factory: routes, errors, the body limit, and the service's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

from fastapi import FastAPI

from teaagent.config import load_config
from teaagent.service import service_app
from teaagent_agent._errors import ERRORS
from teaagent_agent._metrics import AgentMetrics
from teaagent_agent._routes import (
    models_router,
    operations_router,
    runs_router,
    sessions_router,
    usage_router,
)
from teaagent_agent._runs import __doc__ as FRAMES_DOC
from teaagent_agent._service import AgentService
from teaagent_agent._settings import Settings

__all__ = ["MAX_BODY_BYTES", "create_app"]

logger = logging.getLogger("teaagent.agent")

MAX_BODY_BYTES: Final = 4 * 1024 * 1024  # a prompt with a pasted file and a few pictures, not an upload

_FRAMES = (FRAMES_DOC or "").split("The frames,", 1)[-1]
DESCRIPTION = f"""\
A teaagent node's agent, over HTTP: runs streamed as server-sent events, approvals and questions
answered by POST, steering, cancel and resume, sessions, models, settings, usage. A high-risk
tool call goes through the peers' quorum whatever the run's approvals say, and its progress is
streamed.

Every call but `GET /health`, `GET /ready`, `GET /metrics` and this document (`/openapi.json`,
its pages `/docs` and `/redoc`) carries the node's bearer token, as on the relay and the approver.
Bodies are limited to {MAX_BODY_BYTES} bytes. Every failure is an `ErrorOut`
`{{"error": code, "message": sentence}}` with a stable code: `not_found`, `busy`, `locked`,
`invalid`, `timeout`, `run`, `internal` (`unauthorized` without the token).

The frames,{_FRAMES}"""


def _lifespan(service: AgentService) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.service = service
        # Set by ``teaagent agent serve`` on SIGTERM or Ctrl-C, before it waits for the requests in
        # flight: the runs stop then, so their streams end with their result instead of holding it.
        stopping = asyncio.Event()
        app.state.stopping = stopping

        async def stop_runs() -> None:
            await stopping.wait()
            await service.aclose()

        watcher = asyncio.create_task(stop_runs(), name="teaagent-agent-stop")
        logger.info("agent of %s serving the workspace %s", service.node.agent_id, service.node.workspace)
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await service.aclose()

    return lifespan


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the agent service's application.

    The node configuration and the token are read here, so a broken file fails before the server
    starts. Runs are stopped (and wait a while to record their end) when the application stops.

    Args:
        settings: The service settings; read from the environment when None.

    Returns:
        The FastAPI application.

    Raises:
        ConfigError: The node configuration is missing or wrong, its token file cannot be read or
            created, or the workspace is not a folder.
    """
    settings = settings or Settings()
    node = load_config(settings.config)
    service = AgentService(settings=settings, node=node)
    # /openapi.json, /docs and /redoc without the token, as the relay and the approver serve them:
    # the document describes the routes, and every route but the probes still needs the token.
    app = service_app(
        FastAPI,
        "agent",
        description=DESCRIPTION,
        lifespan=_lifespan(service),
        settings=settings,
        config=node,
        errors=ERRORS,
        metrics=AgentMetrics(),
        body_limit=MAX_BODY_BYTES,
        routers=(operations_router, runs_router, sessions_router, models_router, usage_router),
    )
    # Set before the lifespan too, so that an app driven without one (ASGI transport) still answers.
    app.state.service = service
    return app
