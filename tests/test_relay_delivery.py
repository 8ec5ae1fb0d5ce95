"""The relay's delivery worker in-process: this node's own requests delivered to its peers' relays,
retried, and never held up by a peer that hangs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from relay_support import (
    MakeCluster,
    Node,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
    refusing_port,
)

from teaagent._tasks import cancel_and_wait
from teaagent_relay._worker import DeliveryWorker

# -- the delivery worker ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def submitted_by(
    alpha: Node, beta: Node, **options: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, dict[str, Any]]]:
    """alpha's and beta's relays in-process, no worker running, and a request alpha's relay holds."""
    async with (
        in_process(beta, deliver=False) as beta_client,
        in_process(alpha, deliver=False, **options) as alpha_client,
    ):
        request = alpha.request()
        await alpha_client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        yield alpha_client, beta_client, request


@pytest.mark.anyio
async def test_the_worker_delivers_a_request_to_the_peer_relay(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with submitted_by(alpha, beta) as (alpha_client, beta_client, request):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        to_beta = httpx.ASGITransport(app=beta_client.app)  # type: ignore[attr-defined]
        worker = DeliveryWorker(relay, min_idle_seconds=10, transport=to_beta)
        try:
            handled = await worker.run_once(block_ms=0)
        finally:
            await worker.aclose()
        stats = await relay.deliveries.stats()
        item = await beta_client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
        metrics = relay.metrics.render().decode()

    assert handled == 1
    assert (stats.length, stats.pending, stats.scheduled, stats.dead) == (0, 0, 0, 0)
    assert item.json()["origin"] == "alpha"
    assert 'teaagent_relay_deliveries_total{result="ok"} 1.0' in metrics


@pytest.mark.anyio
async def test_the_worker_dead_letters_a_permanent_refusal(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", required=1, peers_of={"beta": ["gamma"]})
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with submitted_by(alpha, beta) as (alpha_client, beta_client, request):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        worker = DeliveryWorker(
            relay,
            min_idle_seconds=10,
            transport=httpx.ASGITransport(app=beta_client.app),  # type: ignore[attr-defined]
        )
        try:
            await worker.run_once(block_ms=0)
        finally:
            await worker.aclose()
        dead = await relay.deliveries.dead_letters()
        stats = await relay.deliveries.stats()
        listed = await alpha_client.get("/v1/deliveries/dead", headers=alpha.headers)
        one = await alpha_client.get("/v1/deliveries/dead?limit=1", headers=alpha.headers)
        rest = await alpha_client.get(
            "/v1/deliveries/dead", params={"after": one.json()[0]["entry_id"]}, headers=alpha.headers
        )
        bad_cursor = await alpha_client.get("/v1/deliveries/dead?after=yesterday", headers=alpha.headers)
        # Cursors Redis would refuse (a number past 64 bits, another script's digits): the client's
        # mistake, 422, never Redis's refusal passed on as a 503.
        bad_cursors = [
            await alpha_client.get("/v1/deliveries/dead", params={"after": cursor}, headers=alpha.headers)
            for cursor in ("99999999999999999999-0", "0-18446744073709551616", "\u0663-0")
        ]
        anonymous = await alpha_client.get("/v1/deliveries/dead")

    assert {letter.delivery.target for letter in dead} == {"beta", "gamma"}
    for letter in dead:
        assert "answered 403 forbidden: 'alpha' is not a configured peer of this node" in letter.error
    assert (stats.length, stats.pending, stats.dead) == (0, 0, 2)
    # Operators see the same dead letters over the API, with the node's token only.
    assert listed.status_code == 200
    assert [
        (item["target"], item["request_id"], item["path"], item["attempts"]) for item in listed.json()
    ] == [(letter.delivery.target, request["request_id"], "/v1/inbox", 1) for letter in dead]
    assert all(item["error"] == letter.error for item, letter in zip(listed.json(), dead, strict=True))
    assert len(one.json()) == 1
    assert [item["entry_id"] for item in one.json() + rest.json()] == [
        item["entry_id"] for item in listed.json()
    ]
    assert error(bad_cursor)[:2] == (422, "invalid")
    assert [error(answer)[:2] for answer in bad_cursors] == [(422, "invalid")] * 3
    assert error(bad_cursors[0])[2] == (
        "after=99999999999999999999-0 is not a dead letter's entry_id: both its numbers are below 2**64."
    )
    assert error(anonymous)[:2] == (401, "unauthorized")


@pytest.mark.anyio
async def test_the_relay_retries_a_delivery_until_the_request_expires_not_a_fixed_count(
    make_cluster: MakeCluster,
) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as alpha_client:
        request = alpha.request()
        await alpha_client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        now = time.time()
        actions = []
        for _ in range(40):  # beta stays down; the default queue bound (12 attempts) is long past
            [delivery] = await relay.deliveries.claim("w1", 1, 0, now=now)
            result = await relay.deliveries.retry_later(delivery, "connection refused", now=now)
            actions.append(result.action)
            now = result.not_before or now
            if now > request["expires_at"] - 60:
                break
    assert set(actions) == {"retry"}
    assert len(actions) > 12


@pytest.mark.anyio
async def test_the_running_worker_removes_consumers_left_by_dead_processes(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as alpha_client:
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        await relay.deliveries.claim("host-1234", 1, 0)  # a relay process that has since exited
        # An inbox entry whose request is not stored (expired and removed): the worker sweeps it.
        await relay.store.inbox_queue.enqueue(
            "approver", "c" * 32, b'{"origin": "beta"}', int(time.time()) + 60
        )
        stream = relay.store.keys.queue(relay.deliveries.name).stream
        await asyncio.sleep(0.2)
        worker = DeliveryWorker(
            relay, consumer="host-5678", min_idle_seconds=10, consumer_retention_seconds=0.1
        )
        task = asyncio.create_task(worker.run())
        try:
            # Until the housekeeping has pruned and then swept (each a few round trips), or 10 s.
            for _ in range(200):
                names = {c["name"] for c in await relay.store.client.xinfo_consumers(stream, "workers")}
                swept = await relay.store.inbox_queue.entries()
                if names == {b"host-5678"} and not swept:
                    break
                await asyncio.sleep(0.05)
        finally:
            await cancel_and_wait(task)  # one cancel() can be lost in redis-py on Python 3.11
            await worker.aclose()

    assert names == {b"host-5678"}
    assert swept == []


@pytest.mark.anyio
async def test_the_worker_retries_an_unreachable_peer_later(make_cluster: MakeCluster) -> None:
    with refusing_port() as down:  # beta is down: its port refuses every connection
        nodes = make_cluster("alpha", "beta", required=1, ports={"beta": down})
        alpha = nodes["alpha"]
        async with in_process(alpha, deliver=False) as client:
            request = alpha.request()
            await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
            relay = client.app.state.relay  # type: ignore[attr-defined]
            worker = DeliveryWorker(relay, min_idle_seconds=10)
            try:
                await worker.run_once(block_ms=0)
            finally:
                await worker.aclose()
            scheduled = await relay.deliveries.scheduled()
            metrics = relay.metrics.render().decode()

    [(not_before, delivery)] = scheduled
    assert delivery.target == "beta"
    assert delivery.attempts == 1
    assert "relay at http://127.0.0.1:" in (delivery.last_error or "")
    assert "is unreachable" in (delivery.last_error or "")
    assert not_before > 0
    assert "teaagent_relay_delivery_retries_total 1.0" in metrics


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_delivery_claimed_by_a_crashed_relay_is_taken_over(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with submitted_by(alpha, beta, delivery_min_idle_seconds=1) as (alpha_client, beta_client, request):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        [taken] = await relay.deliveries.claim("host-1234", 10, 0)  # a relay that dies holding it
        worker = DeliveryWorker(
            relay,
            min_idle_seconds=1,
            transport=httpx.ASGITransport(app=beta_client.app),  # type: ignore[attr-defined]
        )
        try:
            too_soon = await worker.run_once(block_ms=0)
            await asyncio.sleep(1.1)
            taken_over = await worker.run_once(block_ms=0)
        finally:
            await worker.aclose()
        item = await beta_client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
        stats = await relay.deliveries.stats()

    assert taken.target == "beta"
    assert (too_soon, taken_over) == (0, 1)
    assert item.status_code == 200
    assert (stats.length, stats.pending) == (0, 0)


class _HoldingOne(httpx.AsyncBaseTransport):
    """Routes to ``inner``, except that calls to ``port`` never answer (a peer that hangs)."""

    def __init__(self, port: int, inner: httpx.AsyncBaseTransport) -> None:
        self.port = port
        self.inner = inner
        self.hanging = 0  # calls to the hanging peer waiting now
        self.ended = 0  # of those, how many ended (cancelled, or timed out)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.port != self.port:
            return await self.inner.handle_async_request(request)
        self.hanging += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.hanging -= 1
            self.ended += 1
        raise AssertionError("unreachable")


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_peer_that_hangs_holds_up_no_delivery_to_the_others(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", required=1)
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    async with (
        in_process(gamma, deliver=False) as gamma_client,
        in_process(alpha, deliver=False) as alpha_client,
    ):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        routes = _HoldingOne(beta.port, httpx.ASGITransport(app=gamma_client.app))  # type: ignore[attr-defined]
        worker = DeliveryWorker(relay, min_idle_seconds=120, transport=routes)
        running = asyncio.get_running_loop().create_task(worker.run())
        seen: list[str] = []
        try:
            for call in ("call-1", "call-2"):
                request = alpha.request(call_id=call)
                submitted = await alpha_client.post(
                    "/v1/requests", json=alpha.signed(request), headers=alpha.headers
                )
                assert submitted.status_code == 201, submitted.text
                deadline = time.monotonic() + 30
                while request["request_id"] not in seen:
                    assert time.monotonic() < deadline, f"gamma never received {call}: {seen}"
                    await asyncio.sleep(0.02)
                    listed = await gamma_client.get("/v1/inbox", headers=gamma.headers)
                    seen = [item["request"]["request_id"] for item in listed.json()]
            hanging, ended = routes.hanging, routes.ended
        finally:
            await cancel_and_wait(running)
            await worker.aclose()

    # Both requests reached gamma while the first POST to beta still hung: it held up no claim.
    # The second delivery to beta waits behind that call, for the next batch to beta: a peer that
    # hangs holds up its own deliveries only.
    assert len(seen) == 2
    assert (hanging, ended) == (1, 0)
