"""A service's application: built with the whole toolkit in one call, or given it afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from fastapi import APIRouter, FastAPI

import teaagent
from teaagent._reload import trust_reloader
from teaagent.config import NodeConfig
from teaagent.service._errors import ErrorTable, install_error_handlers
from teaagent.service._limits import BodyLimitMiddleware
from teaagent.service._metrics import MetricsMiddleware, ServiceMetrics

__all__ = ["install_toolkit", "service_app"]

_App = TypeVar("_App", bound=FastAPI)


def install_toolkit(
    app: FastAPI, *, errors: ErrorTable, metrics: ServiceMetrics, token: str, body_limit: int
) -> None:
    """Make every failure of ``app`` an ``ErrorOut``, check the node's token, count and time its
    calls, and refuse bodies above ``body_limit`` bytes.

    The token is ``app.state.token`` (what :data:`~teaagent.service.Authorized` checks), the
    metrics ``app.state.metrics``. The metrics middleware is the outermost: it sees every call,
    the body limit's refusals included, and the body limit refuses before any route reads.
    """
    app.state.token = token
    app.state.metrics = metrics
    install_error_handlers(app, errors)
    app.add_middleware(BodyLimitMiddleware, limit=body_limit, errors=errors)
    app.add_middleware(MetricsMiddleware, metrics=metrics)


def service_app(
    app_class: type[_App],
    service: str,
    *,
    description: str,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]],
    settings: object,
    config: NodeConfig,
    errors: ErrorTable,
    metrics: ServiceMetrics,
    body_limit: int,
    routers: Sequence[APIRouter],
    reloads_trust: bool = False,
    **options: Any,
) -> _App:
    """A service's application, ``teaagent <service>`` at the library's version, with the toolkit
    (:func:`install_toolkit`) and its routers, in order.

    The bearer token its routes check is the node's (``config.load_token()``), read here: an
    unusable token file fails before the server starts. ``app.state`` also holds ``settings``,
    the node's ``config`` and ``stopping`` (an event the command
    that serves it sets when a stop signal comes: long-polls answer at once). With
    ``reloads_trust``, ``app.state.trust`` is the trust's reloader (read again on SIGHUP and on
    ``POST /v1/reload``: peers, operators, allowed_signers), counted in the metrics'
    :meth:`~ServiceMetrics.trust_metrics`.

    Args:
        app_class: FastAPI, or a subclass of it.
        service: The service's name (``relay``).
        description: The OpenAPI document's description.
        lifespan: What the application starts and stops.
        settings: The service's settings.
        config: The node's configuration.
        errors: The service's table of error codes.
        metrics: The service's metrics.
        body_limit: The largest body, in bytes.
        routers: The service's routers.
        reloads_trust: Whether the service reloads the node's trust.
        options: More arguments of ``app_class``.

    Raises:
        ConfigError: The node's token file cannot be read or created.
    """
    app = app_class(
        title=f"teaagent {service}",
        version=teaagent.__version__,
        description=description,
        lifespan=lifespan,
        **options,
    )
    app.state.settings = settings
    app.state.config = config
    app.state.stopping = asyncio.Event()
    if reloads_trust:
        app.state.trust = trust_reloader(
            config,
            f"the {service} of {config.agent_id}",
            metrics.trust_reloads,
            metrics.trust_generation,
        )
    install_toolkit(app, errors=errors, metrics=metrics, token=config.load_token(), body_limit=body_limit)
    for router in routers:
        app.include_router(router)
    return app
