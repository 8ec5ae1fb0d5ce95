"""One call that gives a service's application the whole toolkit."""

from __future__ import annotations

from fastapi import FastAPI

from teaagent.service._errors import ErrorTable, install_error_handlers
from teaagent.service._limits import BodyLimitMiddleware
from teaagent.service._metrics import MetricsMiddleware, ServiceMetrics

__all__ = ["install_toolkit"]


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
