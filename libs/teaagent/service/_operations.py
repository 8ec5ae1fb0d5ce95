"""What the relay's and the approver's operations routes share: liveness and the trust's reload."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

import teaagent
from teaagent._reload import ReloadOut, TrustReloader
from teaagent.errors import StoreError
from teaagent.service._errors import ApiError, error_response, sentence
from teaagent.store import Store

__all__ = ["reloaded_trust", "store_health"]


async def store_health(
    service: str, agent_id: str, store: Store, **extra: Any
) -> dict[str, Any] | JSONResponse:
    """The answer of ``GET /health`` of a service with a store: its Redis answers (200), or 503.

    Args:
        service: The service's name (``relay``).
        agent_id: The node's.
        store: The node's store, pinged.
        extra: More fields of the service's ``HealthOut``.
    """
    try:
        seconds = await store.ping()
    except StoreError as exc:
        return error_response(503, "unavailable", sentence(str(exc)))
    return {
        "status": "ok",
        "service": service,
        "version": teaagent.__version__,
        "agent_id": agent_id,
        "redis_ms": round(seconds * 1000, 3),
        **extra,
    }


async def reloaded_trust(request: Request, service: str) -> ReloadOut:
    """Read the application's trust again (``app.state.trust``), as ``POST /v1/reload`` does.

    Raises:
        ApiError: 422 ``reload_failed``: the files do not load; the service keeps the trust it had.
    """
    reloader: TrustReloader = request.app.state.trust
    outcome = await reloader.reload("POST /v1/reload")
    if outcome.problem is not None:
        raise ApiError(422, "reload_failed", f"The {service} kept its trust: {outcome.problem}")
    return ReloadOut(**{k: v for k, v in outcome.to_dict().items() if k != "problem"})
