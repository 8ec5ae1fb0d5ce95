"""JSON nested deeper than ``MAX_JSON_DEPTH`` at every edge of a node, over real sockets.

Every JSON route of the relay (its hot routes and the documented ones), the approver and the agent
service refuses such a body with 400 ``invalid`` and one sentence, and goes on serving; the
relay's delivery worker gives a delivery up once when a peer answers such JSON, and the relay
client refuses such an answer in one sentence. A call whose arguments nest to their own limit
still travels the whole way (delivered, listed, approved, certified), and one level more is refused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import rfc8785
from agent_support import write_node
from relay_support import (
    MakeCluster,
    Node,
    ServedApp,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    free_port,
    served,
    undelivered,
    wait_until,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from teaagent._json import MAX_ARGUMENTS_DEPTH, MAX_JSON_DEPTH
from teaagent.approver_client import ApproverClient
from teaagent.errors import RelayError
from teaagent.quorum import REQUEST_NAMESPACE, sign_request, verify_certificate
from teaagent.relay_client import AsyncRelayClient, RelayClient
from teaagent.signing import sshsig_sign

DEEP = b"[" * 30_000 + b"]" * 30_000  # 60 KB: under every body limit
ONE_TOO_DEEP = b'{"statement": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
REFUSED = f"The request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep."
RID = "0" * 32
JSON = {"Content-Type": "application/json"}


def json_routes(app: Any) -> list[tuple[str, str]]:
    """Every (method, path) of the app's OpenAPI document that takes a JSON body, its path filled in."""
    found = []
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                found.append((method.upper(), re.sub(r"\{(request_id|[a-z_]+)\}", _fill, path)))
    return found


def _fill(found: re.Match[str]) -> str:
    return RID if found.group(1) == "request_id" else "current"


def refusals(url: str, routes: list[tuple[str, str]], headers: dict[str, str]) -> dict[str, Any]:
    """Each route's answer to a 60 KB body of 30,000 levels and to one level too deep."""
    answers = {}
    with httpx.Client(base_url=url, headers={**headers, **JSON}, timeout=30) as client:
        for method, path in routes:
            for name, body in (("30,000 levels", DEEP), ("one level too deep", ONE_TOO_DEEP)):
                answers[f"{method} {path}, {name}"] = error(client.request(method, path, content=body))
    return answers


def test_every_json_route_of_a_relay_refuses_a_nested_body_in_one_sentence_and_serves_on(
    nodes: dict[str, Node],
) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    with served(beta, deliver=False) as relays:
        app = relays["beta"].app
        routes = json_routes(app)
        assert {
            ("POST", "/v1/inbox"),
            ("POST", "/v1/requests"),
            ("POST", f"/v1/inbox/{RID}/decision"),
            ("POST", "/v1/inbox/decisions"),
            ("POST", f"/v1/requests/{RID}/decisions"),
        } <= set(routes)
        hot = refusals(beta.url, routes, beta.headers)
        app.hot_routes = False  # the documented FastAPI routes
        try:
            documented = refusals(beta.url, routes, beta.headers)
        finally:
            app.hot_routes = True
        request = alpha.request()
        accepted = httpx.post(f"{beta.url}/v1/inbox", json=alpha.signed(request), timeout=10)
        health = httpx.get(f"{beta.url}/health", timeout=10)

    assert len(hot) == len(documented) == 2 * len(routes) >= 14
    for call, answer in {**hot, **documented}.items():
        assert answer == (400, "invalid", REFUSED), call
    assert (accepted.status_code, accepted.json()["state"]) == (201, "pending")
    assert health.status_code == 200


def test_every_json_route_of_an_approver_refuses_a_nested_body_in_one_sentence_and_serves_on(
    nodes: dict[str, Node],
) -> None:
    from teaagent_approver import create_app

    beta = nodes["beta"]
    app = create_app(beta.approver_settings())
    with served(beta), ServedApp(app, name="approver beta") as approver:
        routes = json_routes(app)
        assert {
            ("POST", f"/v1/requests/{RID}/approve"),
            ("POST", f"/v1/requests/{RID}/deny"),
            ("POST", f"/v1/requests/{RID}/decision"),
        } <= set(routes)
        answers = refusals(approver.url, routes, beta.headers)
        with ApproverClient(approver.url, token=beta.token) as client:
            health = client.health()
            listed = client.list_requests()

    assert len(answers) == 2 * len(routes)
    for call, answer in answers.items():
        assert answer == (400, "invalid", REFUSED), call
    assert health["status"] == "ok"
    assert listed == []


def test_every_json_route_of_the_agent_service_refuses_a_nested_body_in_one_sentence_and_serves_on(
    tmp_path: Path,
) -> None:
    from teaagent_agent import create_app

    node = write_node(tmp_path)
    app = create_app(node.settings())
    with ServedApp(app, name="agent") as agent:
        routes = json_routes(app)
        assert ("POST", "/runs") in routes
        assert len(routes) >= 10
        answers = refusals(agent.url, routes, node.headers)
        created = httpx.post(f"{agent.url}/sessions", json={}, headers=node.headers, timeout=10)
        health = httpx.get(f"{agent.url}/health", timeout=10)

    for call, answer in answers.items():
        assert answer == (400, "invalid", REFUSED), call
    assert created.status_code in (200, 201), created.text
    assert health.status_code == 200


# -- answers read from a peer ----------------------------------------------------------------------


class NestedPeer(ServedApp):
    """A peer's relay stand-in: it answers every call with ``status`` and 30,000 levels of JSON."""

    def __init__(self, status: int, port: int | None = None) -> None:
        self.status = status
        self.calls: list[str] = []
        super().__init__(
            Starlette(routes=[Route("/{path:path}", self._answer, methods=["GET", "POST"])]),
            port=port,
            name="nested peer",
        )

    async def _answer(self, request: Request) -> Response:
        self.calls.append(f"{request.method} {request.url.path}")
        return Response(DEEP, self.status, media_type="application/json")


@pytest.mark.parametrize("status", [400, 503], ids=["a refusal", "a failure"])
def test_a_delivery_a_peer_answers_with_nested_json_is_given_up_once_not_retried(
    redis_url: str, status: int, make_cluster: MakeCluster
) -> None:
    port = free_port()
    nodes = make_cluster("alpha", "beta", ports={"beta": port})
    alpha = nodes["alpha"]
    request = alpha.request()
    with NestedPeer(status, port=port) as peer, served(alpha):
        with RelayClient(alpha.url, token=alpha.token) as client:
            client.submit_request(request, sign_request(request, alpha.key))

            def dead() -> list[Any]:
                answer = httpx.get(f"{alpha.url}/v1/deliveries/dead", headers=alpha.headers, timeout=10)
                return list(answer.json())

            letters = wait_until(dead)
            state = client.get_request(request["request_id"]).deliveries["beta"]
        left = undelivered(redis_url, alpha)

    expected = (
        f"beta's relay at http://127.0.0.1:{port}/v1/inbox answered {status} with JSON nested more than "
        f"{MAX_JSON_DEPTH} levels deep"
    )
    assert [(letter["target"], letter["path"], letter["error"]) for letter in letters] == [
        ("beta", "/v1/inbox", f"{expected}; gave up after 1 attempts")
    ]
    assert peer.calls == ["POST /v1/inbox"]  # once: nothing left queued or scheduled to try again
    assert left == 0
    assert (state.state, state.error) == ("given_up", expected)


@pytest.fixture(name="nested_relay")
def fixture_nested_relay() -> Iterator[NestedPeer]:
    with NestedPeer(200) as peer:
        yield peer


@pytest.mark.anyio
async def test_the_relay_clients_refuse_an_answer_nested_too_deep_in_one_sentence(
    nested_relay: NestedPeer,
) -> None:
    url = nested_relay.url
    refused = (
        f"The relay at {url} answered the status of request {RID} with JSON nested more than "
        f"{MAX_JSON_DEPTH} levels deep."
    )
    with RelayClient(url, token="t") as client, pytest.raises(RelayError) as kept:
        client.get_request(RID)
    async with AsyncRelayClient(url, token="t") as client:
        with pytest.raises(RelayError) as streamed:
            await client.get_request(RID)
    nested_relay.status = 404
    with RelayClient(url, token="t") as client, pytest.raises(RelayError) as missing:
        client.get_request(RID)

    assert (str(kept.value), kept.value.status_code) == (refused, 200)
    assert (str(streamed.value), streamed.value.status_code) == (refused, 200)
    not_found = f"The relay at {url} refused the status of request {RID} (404 error): Not Found."
    assert str(missing.value) == not_found


# -- arguments at their limit ----------------------------------------------------------------------


def arguments(depth: int) -> dict[str, Any]:
    """Objects ``depth`` levels deep, a float at the bottom (so that rfc8785 writes them)."""
    value: dict[str, Any] = {"ratio": 0.25}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def test_a_call_whose_arguments_nest_to_their_limit_is_delivered_listed_approved_and_certified(
    make_cluster: MakeCluster,
) -> None:
    from teaagent_approver import create_app

    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    deepest = arguments(MAX_ARGUMENTS_DEPTH)
    request = alpha.request(arguments=deepest)
    rid = request["request_id"]
    app = create_app(beta.approver_settings())
    with served(alpha, beta), ServedApp(app, port=beta.approver_port, name="approver beta"):
        with RelayClient(alpha.url, token=alpha.token) as own:
            own.submit_request(request, sign_request(request, alpha.key))
            with ApproverClient(beta.approver_url, token=beta.token) as approvals:
                [item] = approvals.list_requests(wait=20)  # {"items": [{"request": {"arguments"...
                decided = approvals.approve(rid)
            outcome = own.wait_outcome(rid, 20)  # {"certificate": {"request": {"arguments"...
        # One level deeper, with the digest and signature it would have: refused by beta's relay.
        deeper = dict(alpha.request(call_id="deeper"), arguments=arguments(MAX_ARGUMENTS_DEPTH + 1))
        call = rfc8785.dumps({"arguments": deeper["arguments"], "tool_name": deeper["tool_name"]})
        deeper["payload_digest"] = "sha256:" + hashlib.sha256(call).hexdigest()
        signature = sshsig_sign(rfc8785.dumps(deeper), alpha.key, REQUEST_NAMESPACE)  # as before the bound
        refused = httpx.post(
            f"{beta.url}/v1/inbox", json={"request": deeper, "signature": signature}, timeout=10
        )

    assert item.arguments == deepest
    assert decided.decision == "approval"
    assert outcome.state == "approved"
    assert outcome.certificate is not None
    assert outcome.certificate["request"]["arguments"] == deepest
    verify_certificate(outcome.certificate, alpha.quorum())
    assert error(refused) == (
        422,
        "invalid",
        f"The request's arguments nest arrays and objects more than {MAX_ARGUMENTS_DEPTH} levels deep.",
    )
