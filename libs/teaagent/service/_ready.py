"""Readiness (``GET /ready``) for the three services: each dependency checked, one answer.

``/health`` says the process answers (liveness); ``/ready`` says whether it can do its work now:
each dependency the service names (its store, its relay, a background task) is checked at once,
each within ``CHECK_SECONDS``, and the answer is 200 with the document of their states, or 503
``unavailable`` with one sentence naming what is not ready and the same document. A dependency a
service does not use (no rate limits, no quorum, the engine off) is ``off``, which is ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

__all__ = [
    "CHECK_SECONDS",
    "Dependency",
    "DependencyOut",
    "NotReadyOut",
    "ReadyOut",
    "check",
    "readiness",
    "ready_responses",
]

CHECK_SECONDS: Final = 2.0  # one probe's check of one dependency; a probe every few seconds must not pile up
MAX_DETAIL_CHARS: Final = 200  # a dependency's detail is a clause of the sentence, not a traceback

State = Literal["ok", "failing", "off"]


@dataclass(frozen=True, slots=True)
class Dependency:
    """One dependency's state and a short clause about it (``answers in 0.3 ms``, the error)."""

    state: State
    detail: str


class DependencyOut(BaseModel):
    """One dependency of the service and its state."""

    state: State = Field(description="ok (ready), failing (not ready), off (not used by this process).")
    detail: str = Field(description="A short clause: how it answered, or why it failed.")


class ReadyOut(BaseModel):
    """The service is ready: every dependency it uses answers."""

    status: Literal["ready"]
    service: str
    dependencies: dict[str, DependencyOut]


class NotReadyOut(BaseModel):
    """The service is not ready (503): an ``ErrorOut`` with the dependencies' states."""

    error: Literal["unavailable"]
    message: str
    dependencies: dict[str, DependencyOut]


def ready_responses() -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a ``/ready`` route (its 503)."""
    return {503: {"model": NotReadyOut, "description": "A dependency is not ready."}}


def _clause(text: str) -> str:
    text = " ".join(text.split()).rstrip(".")
    return text[:MAX_DETAIL_CHARS] or "it failed"


async def check(probe: Callable[[], Awaitable[str]]) -> Dependency:
    """Run one dependency's probe within ``CHECK_SECONDS``: ok with its clause, else failing with why."""
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            return Dependency("ok", _clause(await probe()))
    except TimeoutError:
        return Dependency("failing", f"no answer in {CHECK_SECONDS:g} s")
    except Exception as exc:  # any failure of a dependency is "not ready", named
        return Dependency("failing", _clause(str(exc) or type(exc).__name__))


async def _known(dependency: Dependency) -> Dependency:
    return dependency


def _awaitable(found: Awaitable[Dependency] | Dependency) -> Awaitable[Dependency]:
    return _known(found) if isinstance(found, Dependency) else found


async def readiness(service: str, checks: Mapping[str, Awaitable[Dependency] | Dependency]) -> JSONResponse:
    """Run the checks concurrently and answer ``/ready``.

    Args:
        service: The service's name, as the sentence names it (``relay``).
        checks: Each dependency's name and its check (see :func:`check`), or its state when it
            is known without one (``off``).

    Returns:
        200 with a ``ReadyOut``, or 503 with a ``NotReadyOut`` naming every failing dependency.
    """
    results = dict(zip(checks, await asyncio.gather(*map(_awaitable, checks.values())), strict=True))
    dependencies = {name: {"state": r.state, "detail": r.detail} for name, r in results.items()}
    failing = [f"{name} ({r.detail})" for name, r in results.items() if r.state == "failing"]
    if not failing:
        return JSONResponse({"status": "ready", "service": service, "dependencies": dependencies})
    message = f"The {service} is not ready: {'; '.join(failing)}."
    return JSONResponse(
        status_code=503, content={"error": "unavailable", "message": message, "dependencies": dependencies}
    )
