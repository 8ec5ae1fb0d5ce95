"""The relay's hot routes (``teaagent_relay._fast``) answer exactly as the documented FastAPI routes.

Each call below is made twice on the same relay and state: once taken by the hot route, once with
``hot_routes`` off, so that FastAPI's documented route answers it. Both answers must be the same
status and the same JSON. A call the hot route does not read exactly as the documented one (a
query parameter out of range, another content type) must be answered by the documented route,
which a middleware sees; the calls the hot routes take must not be. Every hot route is one of
the app's one router, and in its OpenAPI schema.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import httpx
import pytest
from relay_support import (
    Node,
    Served,
    approval,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
    wait_until,
)
from starlette.types import ASGIApp, Receive, Scope, Send


class _Seen:
    """Counts the calls that the documented routes answer (those no hot route took)."""

    def __init__(self, app: ASGIApp, *, paths: list[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http" and not scope.get("teaagent.hot"):
            self.paths.append(f"{scope['method']} {scope['path']}")


def fastapi_calls(client: httpx.AsyncClient) -> list[str]:
    """The calls the relay's documented routes will answer, as "METHOD path" (before its first call)."""
    seen: list[str] = []
    client.app.add_middleware(_Seen, paths=seen)  # type: ignore[attr-defined]
    return seen


async def both(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> tuple[Any, Any]:
    """The call's (status, JSON) taken by the hot route, then by the documented route."""
    app = client.app  # type: ignore[attr-defined]
    answers = []
    for hot in (True, False):
        app.hot_routes = hot
        try:
            response = await client.request(method, path, **kwargs)
        finally:
            app.hot_routes = True
        answers.append((response.status_code, response.json(), response.headers.get("www-authenticate")))
    return answers[0], answers[1]


def assert_taken(
    pairs: dict[str, Any], hot_seen: list[str], declined: dict[str, Any], seen: list[str]
) -> None:
    """The hot routes answered their calls (the documented routes only each pair's second call);
    the calls they declined, the documented routes answered both times."""
    assert len(hot_seen) == len(pairs)
    assert len(seen) == 2 * len(declined)


@pytest.mark.anyio
async def test_the_origins_hot_calls_answer_as_the_documented_routes(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        seen = fastapi_calls(client)
        request = alpha.request()
        rid = request["request_id"]
        first = await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        counted = await client.post(f"/v1/requests/{rid}/decisions", json=approval(request, "beta"))
        assert (first.status_code, counted.json()["counted"]) == (201, True)
        pairs = {
            "repeat": await both(
                client, "POST", "/v1/requests", json=alpha.signed(request), headers=alpha.headers
            ),
            "no token": await both(client, "POST", "/v1/requests", json=alpha.signed(request)),
            "forged": await both(
                client,
                "POST",
                "/v1/requests",
                json={
                    **alpha.signed(request),
                    "signature": alpha.signed(alpha.request(call_id="x"))["signature"],
                },
                headers=alpha.headers,
            ),
            "not an object": await both(client, "POST", "/v1/requests", json=[1], headers=alpha.headers),
            "not JSON": await both(
                client,
                "POST",
                "/v1/requests",
                content=b'{"request": {',
                headers={**alpha.headers, "Content-Type": "application/json"},
            ),
            "outcome": await both(client, "GET", f"/v1/requests/{rid}/outcome", headers=alpha.headers),
            "outcome, no wait": await both(
                client, "GET", f"/v1/requests/{rid}/outcome?wait=0", headers=alpha.headers
            ),
            "outcome, unknown": await both(
                client, "GET", f"/v1/requests/{'0' * 32}/outcome?wait=0", headers=alpha.headers
            ),
            "outcome, no token": await both(client, "GET", f"/v1/requests/{rid}/outcome"),
            "beta's approval again": await both(
                client, "POST", f"/v1/requests/{rid}/decisions", json=approval(request, "beta")
            ),
            "decision on a bad id": await both(
                client, "POST", "/v1/requests/nothex/decisions", json=approval(request, "beta")
            ),
        }
        hot_seen = [path for path in seen if "/v1/" in path]
        seen.clear()
        declined = {
            "a wait out of range": await both(
                client, "GET", f"/v1/requests/{rid}/outcome?wait=-1", headers=alpha.headers
            ),
            "a parameter twice": await both(
                client, "GET", f"/v1/requests/{rid}/outcome?wait=0&wait=1", headers=alpha.headers
            ),
            "a bad id": await both(client, "GET", "/v1/requests/XYZ/outcome", headers=alpha.headers),
            "no content type": await both(
                client, "POST", "/v1/requests", content=b"{}", headers={**alpha.headers, "Content-Type": ""}
            ),
        }

    for name, (hot, documented) in {**pairs, **declined}.items():
        assert hot == documented, name
    assert pairs["repeat"][0][0] == 200
    assert pairs["no token"][0][0] == 401
    assert pairs["forged"][0][0] == 403
    assert pairs["not an object"][0][0] == 422
    assert pairs["not JSON"][0][0] == 400
    assert pairs["outcome"][0][1]["request_id"] == rid
    assert pairs["outcome, unknown"][0][0] == 404
    assert pairs["beta's approval again"][0][:2] == (200, {**counted.json(), "counted": False})
    assert pairs["decision on a bad id"][0][0] == 422
    assert declined["a wait out of range"][0][0] == 422
    assert declined["no content type"][0][0] == 422
    assert_taken(pairs, hot_seen, declined, seen)


@pytest.mark.anyio
async def test_a_peers_hot_calls_answer_as_the_documented_routes(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        seen = fastapi_calls(client)
        request = alpha.request()
        first = await client.post("/v1/inbox", json=alpha.signed(request))
        own = approval(request, "beta")
        decided = await client.post(
            f"/v1/inbox/{request['request_id']}/decision", json=own, headers=beta.headers
        )
        assert (first.status_code, decided.json()["counted"]) == (201, True)
        pairs = {
            "own decision again": await both(
                client, "POST", f"/v1/inbox/{request['request_id']}/decision", json=own, headers=beta.headers
            ),
            "own decision on a bad id": await both(
                client, "POST", "/v1/inbox/nothex/decision", json=own, headers=beta.headers
            ),
            "own decision, no token": await both(
                client, "POST", f"/v1/inbox/{request['request_id']}/decision", json=own
            ),
            "own decisions in a batch": await both(
                client, "POST", "/v1/inbox/decisions", json={"decisions": [own, own]}, headers=beta.headers
            ),
            "repeat": await both(client, "POST", "/v1/inbox", json=alpha.signed(request)),
            "not an object": await both(client, "POST", "/v1/inbox", json=[1, 2]),
            "forged": await both(
                client,
                "POST",
                "/v1/inbox",
                json={
                    **alpha.signed(request),
                    "signature": alpha.signed(alpha.request(call_id="y"))["signature"],
                },
            ),
            "listing": await both(client, "GET", "/v1/inbox", headers=beta.headers),
            "listing, all": await both(
                client, "GET", "/v1/inbox?state=all&limit=5&wait=0", headers=beta.headers
            ),
            "listing, no token": await both(client, "GET", "/v1/inbox"),
        }
        hot_seen = [path for path in seen if "/v1/" in path]
        seen.clear()
        declined = {
            "an unknown state": await both(client, "GET", "/v1/inbox?state=maybe", headers=beta.headers),
            "a limit of 0": await both(client, "GET", "/v1/inbox?limit=0", headers=beta.headers),
            "an unknown parameter": await both(client, "GET", "/v1/inbox?colour=red", headers=beta.headers),
        }

    for name, (hot, documented) in {**pairs, **declined}.items():
        assert hot == documented, name
    assert pairs["repeat"][0][0] == 200
    assert pairs["forged"][0][0] == 403
    assert pairs["listing"][0][1] == []  # decided: no longer pending
    [listed] = pairs["listing, all"][0][1]
    assert (listed["request_id"], listed["state"]) == (request["request_id"], "approved")
    assert pairs["listing, no token"][0][0] == 401
    assert pairs["own decision again"][0][:2] == (200, {**decided.json(), "counted": False})
    assert pairs["own decision on a bad id"][0][0] == 422
    assert pairs["own decision, no token"][0][0] == 401
    assert [item["status"] for item in pairs["own decisions in a batch"][0][1]["results"]] == [200, 200]
    assert declined["an unknown state"][0][0] == 422
    assert declined["an unknown parameter"][0][0] == 200  # ignored, as FastAPI ignores it
    assert_taken(pairs, hot_seen, declined, seen)


def test_every_hot_route_is_a_route_of_the_one_router_and_in_the_openapi_schema(tmp_path: Any) -> None:
    from fastapi.routing import APIRoute
    from starlette.routing import Route

    from teaagent_relay._fast import ROUTES, RelayApp, hot_routes
    from teaagent_relay._routes import deliveries_router, inbox_router, requests_router

    made = hot_routes(requests_router, inbox_router, deliveries_router)
    app = RelayApp()
    app.include_router(requests_router)
    app.include_router(inbox_router)
    app.include_router(deliveries_router)
    app.router.routes[:0] = made
    schema = app.openapi()["paths"]

    assert "__call__" not in RelayApp.__dict__  # no dispatch of its own beside the router
    assert [route.path for route in made] == [spec.path for spec in ROUTES]
    assert all(spec.method in (route.methods or ()) for route, spec in zip(made, ROUTES, strict=True))
    assert all(isinstance(route, Route) for route in app.router.routes[: len(ROUTES)])
    for route, spec in zip(made, ROUTES, strict=True):
        operation = schema[spec.path][spec.method.lower()]
        assert operation["responses"], spec.path
        # Each hands what it does not take to the documented route of the same method and path.
        documented = route.endpoint.documented  # type: ignore[attr-defined]
        assert isinstance(documented, APIRoute)
        assert (documented.path, documented.methods) == (spec.path, {spec.method})


@pytest.mark.parametrize("hot", [True, False], ids=["hot route", "documented route"])
def test_a_client_gone_before_its_body_was_read_is_499_on_both_paths_and_logged_as_no_bug(
    nodes: dict[str, Node], hot: bool, caplog: pytest.LogCaptureFixture
) -> None:
    beta = nodes["beta"]
    with caplog.at_level(logging.DEBUG, logger="teaagent.relay"), Served(beta, deliver=False) as relay:
        relay.app.hot_routes = hot
        with socket.create_connection(("127.0.0.1", beta.port), timeout=10) as raw:
            raw.sendall(
                b"POST /v1/inbox/decisions HTTP/1.1\r\nHost: beta\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {beta.token}\r\nContent-Length: 200\r\n\r\n".encode()
                + b'{"decisions": [{"statement"'
            )  # then gone, as an approver that timed out: the body never ends
        # The documented route's body is read by FastAPI before its route is known: "unmatched".
        route = "/v1/inbox/decisions" if hot else "unmatched"
        counted = f'teaagent_relay_http_requests_total{{method="POST",route="{route}",status="499"}} 1.0'
        assert wait_until(lambda: counted in httpx.get(f"{beta.url}/metrics", timeout=10).text, timeout=20)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []
    assert any("went away before its body was read" in record.getMessage() for record in caplog.records)
