"""``teaagent.service``: the toolkit of the three services, proven on a tiny app of its own.

The app uses every piece as a service does (an error table, the body limit, the token, the
metrics with a counter of its own, readiness, depth-bounded bodies, settings) and is served by
uvicorn on a real loopback socket; every answer is read back over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request, Response
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import SettingsConfigDict
from relay_support import ServedApp
from starlette.middleware.base import BaseHTTPMiddleware

from teaagent._http import client_verify
from teaagent.errors import ConfigError, RequestNotFoundError, StoreError
from teaagent.service import (
    UNAUTHORIZED,
    ApiError,
    Authorized,
    BodyLimitMiddleware,
    BoundedJSONRoute,
    Dependency,
    ErrorTable,
    MetricsMiddleware,
    ServiceMetrics,
    ServiceSettings,
    StoreSettings,
    check,
    install_toolkit,
    readiness,
    service_app,
    started,
)

TOKEN = "tiny-token-of-this-test"
LIMIT = 300
TABLE = ErrorTable(
    service="tiny service",
    codes_by_status={401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "too_large"},
    exceptions={RequestNotFoundError: (404, "gone"), StoreError: (503, "unavailable")},
    logger=logging.getLogger("teaagent.tiny"),
)


class Thing(BaseModel):
    name: str
    count: int = Field(ge=0)


def tiny_app(*, limit: int = LIMIT, table: ErrorTable = TABLE) -> FastAPI:
    """A service as small as can be, built from the toolkit the way the three services are."""
    metrics = ServiceMetrics("tiny")
    things = metrics.counter("things", "Things added, by whether they count.", "kind")
    app = FastAPI()
    install_toolkit(app, errors=table, metrics=metrics, token=TOKEN, body_limit=limit)
    router = APIRouter(route_class=BoundedJSONRoute)

    @router.post("/things")
    async def add(_auth: Authorized, thing: Thing) -> dict[str, Any]:
        things.labels("counted" if thing.count else "empty").inc()
        return thing.model_dump()

    @router.get("/refused")
    async def refused() -> None:
        raise ApiError(409, "conflict", "That thing exists.", headers={"X-Why": "test"})

    @router.get("/bug")
    async def bug() -> None:
        raise RuntimeError("a secret the client must not read")

    @router.get("/store")
    async def store(missing: bool = False) -> None:
        if missing:
            raise RequestNotFoundError("request 1234 is not in the store")
        raise StoreError("Redis at 127.0.0.1:1 does not answer")

    @router.get("/ready")
    async def ready(fail: bool = False) -> Response:
        async def store() -> str:
            if fail:
                raise ConnectionError("Redis does not answer")
            return "PING answered in 0.1 ms"

        worker = Dependency("off", "this process runs no worker")
        return await readiness("tiny service", {"store": check(store), "worker": worker})

    @router.get("/metrics")
    async def render(request: Request) -> Response:
        return metrics.response()

    @router.get("/engine")
    async def engine(request: Request) -> dict[str, str]:
        found: str = started(request, "engine", "tiny service")
        return {"engine": found}

    app.include_router(router)
    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with ServedApp(tiny_app(), name="tiny") as served:
        yield served.url


def call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    kwargs.setdefault("verify", client_verify())
    return httpx.request(method, url, timeout=10, **kwargs)


def error(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"error", "message"}, body  # the ErrorOut shape, nothing more
    return response.status_code, body["error"], body["message"]


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_call_without_the_token_or_with_another_is_401_unauthorized(url: str) -> None:
    for headers in ({}, {"Authorization": "Bearer not-it"}, {"Authorization": f"Basic {TOKEN}"}):
        response = call("POST", f"{url}/things", json={"name": "a", "count": 1}, headers=headers)
        assert error(response) == (401, "unauthorized", UNAUTHORIZED)
        assert response.headers["www-authenticate"] == "Bearer"
    answered = call(
        "POST", f"{url}/things", json={"name": "a", "count": 1}, headers={"Authorization": f"bearer {TOKEN}"}
    )
    assert answered.status_code == 200
    assert answered.json() == {"name": "a", "count": 1}


def test_an_unknown_path_is_404_and_a_wrong_method_405_with_the_tables_codes(url: str) -> None:
    assert error(call("GET", f"{url}/nowhere")) == (
        404,
        "not_found",
        "There is no such resource on this tiny service.",
    )
    assert error(call("DELETE", f"{url}/things")) == (
        405,
        "method_not_allowed",
        "This path does not take that method.",
    )


def test_a_body_of_the_wrong_shape_is_422_and_one_that_is_not_json_400(url: str) -> None:
    wrong = call("POST", f"{url}/things", json={"name": "a", "count": -1}, headers=AUTH)
    assert error(wrong) == (422, "invalid", "Count: Input should be greater than or equal to 0.")
    not_an_object = call("POST", f"{url}/things", json=[1], headers=AUTH)
    assert error(not_an_object)[:2] == (422, "invalid")
    assert error(not_an_object)[2].startswith("The request body is not a JSON object of the expected shape")
    not_json = call(
        "POST", f"{url}/things", content=b"{", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert error(not_json)[:2] == (400, "invalid")
    assert error(not_json)[2].startswith("The request body is not valid JSON")
    deep = call(
        "POST",
        f"{url}/things",
        content=b"[" * 100 + b"]" * 100,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert error(deep)[:2] == (400, "invalid")


def test_a_body_over_the_limit_is_413_and_the_sentence_names_the_limit(url: str) -> None:
    sentence = f"The request body is larger than the limit of {LIMIT} bytes."
    declared = call("POST", f"{url}/things", content=b"x" * (LIMIT + 1), headers=AUTH)
    assert error(declared) == (413, "too_large", sentence)

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"name": "'
        yield b"x" * LIMIT
        yield b'", "count": 1}'

    chunked = call(
        "POST", f"{url}/things", content=chunks(), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert error(chunked) == (413, "too_large", sentence)
    within = call("POST", f"{url}/things", json={"name": "x" * (LIMIT - 40), "count": 1}, headers=AUTH)
    assert within.status_code == 200


def test_the_413_answer_takes_its_code_from_the_table_and_its_limit_from_the_app() -> None:
    quiet = ErrorTable(service="other", codes_by_status={})  # a service whose 413 is "invalid" (the agent's)
    with ServedApp(tiny_app(limit=17, table=quiet), name="other") as served:
        response = call("POST", f"{served.url}/things", content=b"x" * 18, headers=AUTH)
    assert error(response) == (413, "invalid", "The request body is larger than the limit of 17 bytes.")


def test_an_api_error_keeps_its_status_code_sentence_and_headers(url: str) -> None:
    response = call("GET", f"{url}/refused")
    assert error(response) == (409, "conflict", "That thing exists.")
    assert response.headers["x-why"] == "test"


def test_a_bug_is_500_internal_and_says_nothing_of_it(url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="teaagent.tiny"):
        response = call("GET", f"{url}/bug")
    assert error(response) == (500, "internal", "The tiny service failed on this call; its log says why.")
    assert "secret" not in response.text


def test_the_library_errors_of_the_table_are_answered_with_their_status_and_code(url: str) -> None:
    down = call("GET", f"{url}/store")
    assert error(down) == (503, "unavailable", "Redis at 127.0.0.1:1 does not answer.")
    assert down.headers["retry-after"] == "1"  # a 503 is temporary
    # A subclass named before its base is answered as the subclass.
    assert error(call("GET", f"{url}/store", params={"missing": "1"})) == (
        404,
        "gone",
        "Request 1234 is not in the store.",
    )


def test_metrics_count_calls_refusals_by_code_and_the_services_own_counters(url: str) -> None:
    with ServedApp(tiny_app(), name="counted") as served:
        call("POST", f"{served.url}/things", json={"name": "a", "count": 2}, headers=AUTH)
        call("POST", f"{served.url}/things", json={"name": "a", "count": 2})
        call("POST", f"{served.url}/things", content=b"x" * (LIMIT + 1), headers=AUTH)
        response = call("GET", f"{served.url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'teaagent_tiny_http_requests_total{method="POST",route="/things",status="200"} 1.0' in text
    assert 'teaagent_tiny_http_requests_total{method="POST",route="/things",status="401"} 1.0' in text
    assert 'teaagent_tiny_refusals_total{code="unauthorized"} 1.0' in text
    assert 'teaagent_tiny_refusals_total{code="too_large"} 1.0' in text
    # The 413 refused before any route is read is the "unmatched" route's.
    assert 'teaagent_tiny_http_request_duration_seconds_count{route="/things"} 2.0' in text
    assert 'teaagent_tiny_things_total{kind="counted"} 1.0' in text


def test_readiness_is_200_with_every_dependency_or_503_naming_the_failing_one(url: str) -> None:
    ready = call("GET", f"{url}/ready")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "service": "tiny service",
        "dependencies": {
            "store": {"state": "ok", "detail": "PING answered in 0.1 ms"},
            "worker": {"state": "off", "detail": "this process runs no worker"},
        },
    }
    failing = call("GET", f"{url}/ready", params={"fail": "1"})
    assert failing.status_code == 503
    body = failing.json()
    assert body["error"] == "unavailable"
    assert body["message"] == "The tiny service is not ready: store (Redis does not answer)."
    assert body["dependencies"]["store"] == {"state": "failing", "detail": "Redis does not answer"}


def test_a_route_of_what_the_lifespan_starts_is_503_until_it_is_there() -> None:
    app = tiny_app()
    with ServedApp(app, name="starting") as served:
        starting = call("GET", f"{served.url}/engine")
        app.state.engine = "running"
        running = call("GET", f"{served.url}/engine")
    assert error(starting) == (
        503,
        "unavailable",
        "The tiny service is starting or stopping; try again in a moment.",
    )
    assert running.json() == {"engine": "running"}


def test_the_middlewares_are_pure_asgi() -> None:
    """No ``BaseHTTPMiddleware``: it would buffer bodies and hold event streams on the hot routes."""
    for kind in (BodyLimitMiddleware, MetricsMiddleware):
        assert not issubclass(kind, BaseHTTPMiddleware)


class TinySettings(StoreSettings):
    model_config = SettingsConfigDict(env_prefix="TEAAGENT_TINY_")

    knob: int = 1


def test_settings_read_the_shared_config_and_the_services_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAAGENT_CONFIG", "/etc/node.toml")
    monkeypatch.setenv("TEAAGENT_TINY_KNOB", "7")
    monkeypatch.setenv("TEAAGENT_TINY_REDIS_PREFIX", "ta:x")
    settings = TinySettings()
    assert (settings.config, settings.knob, settings.redis_prefix) == ("/etc/node.toml", 7, "ta:x")
    assert issubclass(TinySettings, ServiceSettings)
    with pytest.raises(ValidationError, match="unknown"):
        TinySettings(unknown=1)  # type: ignore[call-arg]


def test_a_malformed_store_prefix_is_a_config_error_naming_its_variable() -> None:
    from types import SimpleNamespace

    node: Any = SimpleNamespace(agent_id="alpha")
    assert TinySettings().store_prefix(node) == "ta:alpha"
    with pytest.raises(ConfigError, match=r"^TEAAGENT_TINY_REDIS_PREFIX is not usable: "):
        TinySettings(redis_prefix="a{b}").store_prefix(node)


def tiny_service(tmp_path: Path, metrics: ServiceMetrics, *, reloads_trust: bool) -> FastAPI:
    """The tiny service built by ``service_app``, as the three services are: one route, the token's."""
    from agent_support import write_node

    from teaagent.config import load_config

    config = load_config(write_node(tmp_path).config_path)
    router = APIRouter()

    @router.get("/hello")
    async def hello(_auth: Authorized) -> dict[str, str]:
        return {"hello": "world"}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.engine = "running"
        yield

    return service_app(
        FastAPI,
        "tiny",
        description="A tiny service.",
        lifespan=lifespan,
        settings=TinySettings(config=str(config.path)),
        config=config,
        errors=TABLE,
        metrics=metrics,
        body_limit=LIMIT,
        routers=(router,),
        reloads_trust=reloads_trust,
    )


@pytest.mark.anyio
async def test_service_app_builds_the_app_of_a_service_with_the_toolkit_its_routers_and_its_trust(
    tmp_path: Path,
) -> None:
    import teaagent
    from teaagent._reload import TrustReloader

    metrics = ServiceMetrics("tiny")
    metrics.trust_metrics()
    app = tiny_service(tmp_path, metrics, reloads_trust=True)
    config = app.state.config
    # The node's token, as its configuration sets it (agent_support writes it).
    assert (app.state.settings.config, config.agent_id, app.state.token) == (
        str(config.path),
        "alpha",
        config.load_token(),
    )
    assert isinstance(app.state.stopping, asyncio.Event)
    assert not app.state.stopping.is_set()
    assert isinstance(app.state.trust, TrustReloader)
    assert app.state.trust.trust.config is config
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tiny.test") as client:
            refused = await client.get("/hello")
            hello = await client.get("/hello", headers={"Authorization": f"Bearer {config.load_token()}"})
            other = await client.get("/hello", headers=AUTH)  # this file's token, not the node's
            document = (await client.get("/openapi.json")).json()
            unknown = await client.get("/nowhere")
    assert app.state.engine == "running"
    assert error(refused) == (401, "unauthorized", UNAUTHORIZED)
    assert hello.json() == {"hello": "world"}
    assert error(other) == (401, "unauthorized", UNAUTHORIZED)
    assert error(unknown)[:2] == (404, "not_found")
    assert document["info"] == {
        "title": "teaagent tiny",
        "version": teaagent.__version__,
        "description": "A tiny service.",
    }
    exposition = metrics.render().decode()
    assert "teaagent_tiny_trust_generation 1.0" in exposition
    assert 'teaagent_tiny_refusals_total{code="unauthorized"} 2.0' in exposition


def test_service_app_without_reloads_trust_leaves_the_trust_to_the_service(tmp_path: Path) -> None:
    app = tiny_service(tmp_path, ServiceMetrics("tiny"), reloads_trust=False)  # no trust metrics needed
    assert not hasattr(app.state, "trust")
