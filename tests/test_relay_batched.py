"""Several deliveries of a peer's relay in one call (``POST /v1/deliveries``), and the delivery
worker that sends them so.

Each delivery of a batch must be answered exactly as its own call would be (status and JSON), by
the same route; a batch must reach nothing its deliveries alone could not (no token route, no
header of the batch); and a batch is refused as a whole only when it is not a batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from relay_support import (
    MakeCluster,
    Node,
    approval,
    decisions_path,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from teaagent._json import MAX_JSON_DEPTH
from teaagent_relay import MAX_BODY_BYTES
from teaagent_relay._worker import DeliveryWorker


def results(response: httpx.Response) -> list[tuple[int, Any]]:
    assert response.status_code == 200, response.text
    return [(item["status"], item["body"]) for item in response.json()["results"]]


async def alone(client: httpx.AsyncClient, path: str, body: Any) -> tuple[int, Any]:
    response = await client.post(path, json=body)
    return response.status_code, response.json()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.anyio
async def test_each_delivery_is_answered_as_its_own_call_would_be(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    forged = {**alpha.signed(request), "signature": alpha.signed(alpha.request(call_id="x"))["signature"]}
    unknown = alpha.request(call_id="never sent")
    deep = {"request": nested(MAX_JSON_DEPTH - 1), "signature": "x"}  # as deep as a body may be
    async with in_process(beta, deliver=False) as client:
        first = results(
            await client.post(
                "/v1/deliveries",
                json={
                    "deliveries": [
                        {"path": "/v1/inbox", "body": alpha.signed(request)},
                        {"path": "/v1/inbox", "body": forged},
                        {"path": "/v1/inbox", "body": {"request": {}}},
                        {"path": "/v1/inbox", "body": deep},
                        {"path": f"/v1/inbox/{unknown['request_id']}/settled", "body": {"origin": "alpha"}},
                    ]
                },
            )
        )
        singles = [
            await alone(client, "/v1/inbox", forged),
            await alone(client, "/v1/inbox", {"request": {}}),
            await alone(client, "/v1/inbox", deep),
            await alone(client, f"/v1/inbox/{unknown['request_id']}/settled", {"origin": "alpha"}),
        ]
        again = await alone(client, "/v1/inbox", alpha.signed(request))
        repeat = results(
            await client.post(
                "/v1/deliveries", json={"deliveries": [{"path": "/v1/inbox", "body": alpha.signed(request)}]}
            )
        )
        stored = await client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
        metrics = client.app.state.relay.metrics.render()  # type: ignore[attr-defined]

    assert first[0][0] == 201
    assert first[0][1]["request_id"] == request["request_id"]
    assert [status for status, _ in first[1:]] == [403, 422, 422, 422]
    assert first[1:] == singles  # the same status and the same JSON as each call alone
    assert again[0] == 200
    assert repeat == [again]
    assert stored.status_code == 200
    assert stored.json()["origin"] == "alpha"
    # The settlement in the batch went through the app's own route, counted by the batch only: the
    # HTTP calls of that route are the one made alone.
    settled = "route=/v1/inbox/{request_id}/settled"
    assert (
        _samples(metrics, "teaagent_relay_http_requests_total")[("method=POST", settled, "status=422")] == 1
    )
    assert _samples(metrics, "teaagent_relay_batched_deliveries_total")[(settled, "status=422")] == 1


@pytest.mark.anyio
async def test_decisions_in_a_batch_count_at_the_origin_as_they_would_alone(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    request = alpha.request()
    async with in_process(alpha, deliver=False) as client:
        await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        answered = results(
            await client.post(
                "/v1/deliveries",
                json={
                    "deliveries": [
                        {"path": decisions_path(request), "body": approval(request, "beta")},
                        {"path": decisions_path(request), "body": approval(request, "beta")},
                        {"path": decisions_path(request), "body": approval(request, "mallory")},
                    ]
                },
            )
        )
        outcome = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert [status for status, _ in answered] == [200, 200, 403]
    counted = sorted(body["counted"] for _status, body in answered[:2])
    assert counted == [False, True]  # beta's approval counted once, however often it came
    assert answered[2][1]["error"] == "forbidden"
    assert [d["statement"]["signer"] for d in outcome.json()["approvals"]] == ["beta"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path",
    [
        "/v1/requests",  # the own agent's submission: takes the node's token
        "/v1/inbox/decisions",  # the own approver's decisions: takes the token
        "/v1/inbox/{id}/decision",
        "/v1/reload",
        "/v1/deliveries",  # no batch in a batch
        "/v1/inbox?state=all",
        "/v1/inbox/",
        "http://127.0.0.1:1/v1/inbox",
    ],
)
async def test_a_delivery_reaches_only_the_calls_peers_relays_make(nodes: dict[str, Node], path: str) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    target = path.replace("{id}", request["request_id"])
    async with in_process(beta, deliver=False) as client:
        # The batch carries the node's own token: its deliveries do not.
        answered = results(
            await client.post(
                "/v1/deliveries",
                json={"deliveries": [{"path": target, "body": alpha.signed(request)}]},
                headers=beta.headers,
            )
        )
        listed = await client.get("/v1/inbox?state=all", headers=beta.headers)

    assert answered[0][0] == 404
    assert answered[0][1]["error"] == "not_found"
    assert listed.json() == []


@pytest.mark.anyio
async def test_a_batch_is_refused_whole_only_when_it_is_not_a_batch(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    one = {"path": "/v1/inbox", "body": alpha.signed(alpha.request())}
    async with in_process(beta, deliver=False) as client:
        empty = await client.post("/v1/deliveries", json={"deliveries": []})
        too_many = await client.post("/v1/deliveries", json={"deliveries": [one] * 65})
        not_json = await client.post(
            "/v1/deliveries", content=b'{"deliveries": [', headers={"Content-Type": "application/json"}
        )
        extra = await client.post("/v1/deliveries", json={"deliveries": [{**one, "headers": {}}]})
        too_deep = await client.post(
            "/v1/deliveries",
            json={"deliveries": [{"path": "/v1/inbox", "body": {"request": nested(MAX_JSON_DEPTH + 1)}}]},
        )
        too_large = await client.post(
            "/v1/deliveries",
            json={"deliveries": [{"path": "/v1/inbox", "body": {"pad": "x" * MAX_BODY_BYTES}}]},
        )

    assert error(empty)[:2] == (422, "invalid")
    assert error(too_many)[:2] == (422, "invalid")
    assert error(not_json)[:2] == (400, "invalid")
    assert error(extra)[:2] == (422, "invalid")
    assert error(too_deep)[:2] == (400, "invalid")
    assert error(too_large)[:2] == (413, "too_large")


@pytest.mark.anyio
async def test_the_documented_route_answers_a_batch_as_the_hot_route_does(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    batches = {
        "stored, then a repeat": {"deliveries": [{"path": "/v1/inbox", "body": alpha.signed(request)}]},
        "not a path of peers": {"deliveries": [{"path": "/v1/requests", "body": alpha.signed(request)}]},
        "empty": {"deliveries": []},
    }
    answers: dict[str, list[tuple[int, Any]]] = {}
    async with in_process(beta, deliver=False) as client:
        app = client.app  # type: ignore[attr-defined]
        await client.post("/v1/inbox", json=alpha.signed(request))
        for name, batch in batches.items():
            for hot in (True, False):
                app.hot_routes = hot
                try:
                    response = await client.post("/v1/deliveries", json=batch)
                finally:
                    app.hot_routes = True
                answers.setdefault(name, []).append((response.status_code, response.json()))

    for name, (hot, documented) in answers.items():
        assert hot == documented, name
    assert answers["stored, then a repeat"][0][1]["results"][0]["status"] == 200
    assert answers["not a path of peers"][0][1]["results"][0]["status"] == 404
    assert answers["empty"][0][0] == 422


# -- the delivery worker's side ------------------------------------------------------------------


class _Peer(httpx.AsyncBaseTransport):
    """A peer's relay app behind httpx, recording each call's path; ``batches`` answers the batch
    route instead of the app when set: ``(status, body)``."""

    def __init__(self, app: ASGIApp, batches: tuple[int, bytes] | None = None) -> None:
        self.paths: list[str] = []
        self.batches = batches
        self.inner = httpx.ASGITransport(app=self._app)
        self.app = app

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/deliveries" and self.batches is not None:
            status, body = self.batches
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await self.inner.handle_async_request(request)


@dataclass
class _Pair:
    """alpha's relay and beta's, in-process; ``peer`` is beta's behind httpx, and ``worker`` alpha's
    delivery worker to it (not running: each ``round`` runs it once)."""

    alpha: Node
    beta: Node
    alpha_client: httpx.AsyncClient
    beta_client: httpx.AsyncClient
    peer: _Peer
    worker: DeliveryWorker

    async def round(self, count: int, *, tag: str = "call", **fields: Any) -> list[str]:
        """alpha's relay takes ``count`` new requests and the worker delivers them in one round; their ids."""
        ids = []
        for index in range(count):
            request = self.alpha.request(call_id=f"{tag}-{index}", **fields)
            submitted = await self.alpha_client.post(
                "/v1/requests", json=self.alpha.signed(request), headers=self.alpha.headers
            )
            assert submitted.status_code == 201, submitted.text
            ids.append(request["request_id"])
        assert await self.worker.run_once(block_ms=0) == count
        return ids

    @property
    def relay(self) -> Any:
        return self.alpha_client.app.state.relay  # type: ignore[attr-defined]

    async def received(self) -> list[str]:
        """The ids of the requests in beta's inbox, sorted."""
        listed = await self.beta_client.get("/v1/inbox?state=all", headers=self.beta.headers)
        return sorted(item["request_id"] for item in listed.json())


@contextlib.asynccontextmanager
async def _pair(make_cluster: MakeCluster, batches: tuple[int, bytes] | None = None) -> AsyncIterator[_Pair]:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with (
        in_process(beta, deliver=False) as beta_client,
        in_process(alpha, deliver=False) as alpha_client,
    ):
        peer = _Peer(beta_client.app, batches)  # type: ignore[attr-defined]
        worker = DeliveryWorker(
            alpha_client.app.state.relay,  # type: ignore[attr-defined]
            min_idle_seconds=10,
            transport=peer,
            batches=alpha.settings().delivery_batches,  # as the relay's app reads it
        )
        try:
            yield _Pair(alpha, beta, alpha_client, beta_client, peer, worker)
        finally:
            await worker.aclose()


def _samples(metrics: bytes, name: str) -> dict[tuple[str, ...], float]:
    """The samples of ``name`` in a Prometheus text, by their labels (``name=value``, sorted)."""
    return {
        tuple(f"{label}={value}" for label, value in sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(metrics.decode())
        for sample in family.samples
        if sample.name == name
    }


@pytest.mark.anyio
async def test_the_worker_sends_a_peer_the_deliveries_of_one_moment_in_one_call(
    make_cluster: MakeCluster,
) -> None:
    async with _pair(make_cluster) as pair:
        ids = await pair.round(5)
        metrics = pair.beta_client.app.state.relay.metrics.render()  # type: ignore[attr-defined]
        received = await pair.received()
        stats = await pair.relay.deliveries.stats()
        statuses = [
            (await pair.alpha_client.get(f"/v1/requests/{rid}", headers=pair.alpha.headers)).json()
            for rid in ids
        ]

    assert pair.peer.paths == ["/v1/deliveries"]  # five deliveries, one call
    assert received == sorted(ids)
    assert (stats.length, stats.pending, stats.scheduled, stats.dead) == (0, 0, 0, 0)
    # The batch is one HTTP call; its deliveries are counted by the route that took each.
    assert _samples(metrics, "teaagent_relay_batched_deliveries_total") == {
        ("route=/v1/inbox", "status=201"): 5.0
    }
    calls = _samples(metrics, "teaagent_relay_http_requests_total")
    assert calls == {("method=POST", "route=/v1/deliveries", "status=200"): 1.0}
    # Each noted on its request as its own call's delivery is.
    assert [status["deliveries"]["beta"]["state"] for status in statuses] == ["delivered"] * 5


@pytest.mark.anyio
async def test_a_peer_without_the_batch_route_gets_each_delivery_as_its_own_call(
    make_cluster: MakeCluster,
) -> None:
    async with _pair(make_cluster, batches=(404, b'{"error":"not_found","message":"No."}')) as pair:
        ids = await pair.round(3, tag="first") + await pair.round(3, tag="second")
        received = await pair.received()

    # The first batch was refused as unknown: its three went alone, and so did the next three.
    assert pair.peer.paths == ["/v1/deliveries"] + ["/v1/inbox"] * 6
    assert received == sorted(ids)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "retried"),
    [
        ((503, b'{"error":"unavailable","message":"Redis is down."}'), True),
        ((429, b'{"error":"rate_limited","message":"Later."}'), True),
        ((200, b'{"results":[{"status":201,"body":{}}]}'), False),  # one result for three
        ((200, b"not JSON"), False),
        ((422, b'{"error":"invalid","message":"No."}'), False),
    ],
    ids=["503", "429", "too few results", "not JSON", "422"],
)
async def test_a_batch_not_answered_for_each_delivery_is_retried_or_sent_again_alone(
    make_cluster: MakeCluster, answer: tuple[int, bytes], retried: bool
) -> None:
    async with _pair(make_cluster, batches=answer) as pair:
        ids = await pair.round(3)
        received = await pair.received()
        stats = await pair.relay.deliveries.stats()

    if retried:  # a temporary refusal of the batch is each delivery's: each tried again later
        assert pair.peer.paths == ["/v1/deliveries"]
        assert received == []
        assert (stats.scheduled, stats.dead) == (3, 0)
    else:  # an answer that says nothing of each delivery: each sent again as its own call
        assert pair.peer.paths == ["/v1/deliveries"] + ["/v1/inbox"] * 3
        assert received == sorted(ids)
        assert (stats.length, stats.scheduled, stats.dead) == (0, 0, 0)


@pytest.mark.anyio
async def test_with_batches_off_each_delivery_is_its_own_call(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_RELAY_DELIVERY_BATCHES", "0")  # read by alpha's settings
    async with _pair(make_cluster) as pair:
        ids = await pair.round(3)
        received = await pair.received()

    assert pair.peer.paths == ["/v1/inbox"] * 3
    assert received == sorted(ids)


@pytest.mark.anyio
async def test_a_batch_holds_no_more_than_the_peers_body_limit(make_cluster: MakeCluster) -> None:
    big = "x" * (MAX_BODY_BYTES // 5)  # four such deliveries fit one body, five do not
    async with _pair(make_cluster) as pair:
        ids = await pair.round(6, arguments={"command": big})
        received = await pair.received()

    assert pair.peer.paths == ["/v1/deliveries", "/v1/deliveries"]  # four, then two
    assert received == sorted(ids)
