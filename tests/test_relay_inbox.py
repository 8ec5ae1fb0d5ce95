"""The relay's inbox in-process: peers' requests, their refusals, and this node's decisions.

Every refusal of a peer's call gets its status and ``ErrorOut`` code, and stores nothing. The
worker that delivers this node's own requests to its peers is in ``test_relay_delivery.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from approver_support import WAIT
from relay_support import (
    MakeCluster,
    Node,
    approval,
    denial,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
    served,
    shell_request,
    signer,
)
from store_support import decided_in_inbox, documents_read, round_trips
from words_support import AGO, AN_HOUR_AHEAD, moment_re

from teaagent.errors import StoreError
from teaagent.quorum import approval_statement, sign_request, sign_withdrawal
from teaagent.store._shapes import CLUSTER, ONE_SERVER
from teaagent_relay import MAX_BODY_BYTES


async def nothing_stored(client: httpx.AsyncClient, origin: str, request_id: str) -> bool:
    relay = client.app.state.relay  # type: ignore[attr-defined]
    item = await relay.store.inbox.get(origin, request_id)
    queued = await relay.store.inbox_queue.stats()
    return item is None and queued.length == 0


# -- accepting peers' requests ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_peers_request_is_accepted_once_and_queued_for_the_approver(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request()
        first = await client.post("/v1/inbox", json=alpha.signed(request))
        again = await client.post("/v1/inbox", json=alpha.signed(request))
        listed = await client.get("/v1/inbox", headers=beta.headers)
        shown = await client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
        relay = client.app.state.relay  # type: ignore[attr-defined]
        queued = await relay.store.inbox_queue.claim("approver-test", 10, 0)

    assert (first.status_code, first.json()) == (
        201,
        {"request_id": request["request_id"], "origin": "alpha", "state": "pending", "created": True},
    )
    assert (again.status_code, again.json()["created"]) == (200, False)
    [item] = listed.json()
    assert item == shown.json()
    for name in (
        "request_id",
        "origin",
        "tool_name",
        "arguments",
        "reason",
        "expires_at",
        "created_at",
        "peers",
    ):
        assert item[name] == request[name], name
    assert item["state"] == "pending"
    assert item["decision"] is None
    assert item["request"] == request
    assert {json.loads(entry.payload)["request_id"] for entry in queued} == {request["request_id"]}
    assert {entry.target for entry in queued} == {"approver"}


@pytest.mark.anyio
async def test_an_unknown_origin_is_forbidden_and_nothing_is_stored(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request()
        request = shell_request(alpha.quorum(), "id", origin="mallory", run_id="r", call_id="c", reason="")
        response = await client.post(
            "/v1/inbox", json={"request": request, "signature": sign_request(request, signer("mallory"))}
        )
        stored = await nothing_stored(client, "mallory", request["request_id"])

    assert error(response) == (403, "forbidden", "'mallory' is not a configured peer of this node.")
    assert stored


@pytest.mark.anyio
async def test_a_bad_request_signature_is_refused_and_nothing_is_stored(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request()
        by_gamma = {"request": request, "signature": sign_request(request, signer("gamma"))}
        forged = await client.post("/v1/inbox", json=by_gamma)
        tampered = alpha.signed(request)
        tampered["request"] = dict(request, reason="a different reason")
        changed = await client.post("/v1/inbox", json=tampered)
        stored = await nothing_stored(client, "alpha", request["request_id"])

    for response in (forged, changed):
        status, code, message = error(response)
        assert (status, code) == (403, "bad_signature")
        assert message.startswith("The request signature does not verify with the key configured for alpha:")
    assert stored


@pytest.mark.anyio
async def test_a_request_that_does_not_name_this_node_is_forbidden(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", "delta", peers_of={"alpha": ["gamma", "delta"]})
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request()
        response = await client.post("/v1/inbox", json=alpha.signed(request))
        stored = await nothing_stored(client, "alpha", request["request_id"])

    assert error(response) == (
        403,
        "forbidden",
        f"This node (beta) is not among the peers of request {request['request_id']}.",
    )
    assert stored


@pytest.mark.anyio
async def test_a_malformed_request_or_body_is_invalid_and_nothing_is_stored(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request()
        signed = alpha.signed(request)
        signed["request"]["required_approvals"] = 9
        malformed = await client.post("/v1/inbox", json=signed)
        not_json = await client.post(
            "/v1/inbox", content=b'{"request": {', headers={"Content-Type": "application/json"}
        )
        not_an_object = await client.post("/v1/inbox", json=[1, 2])
        no_type = await client.post("/v1/inbox", content=json.dumps(alpha.signed(request)).encode())
        stored = await nothing_stored(client, "alpha", request["request_id"])

    assert error(malformed) == (
        422,
        "invalid",
        "The request's required_approvals is not an integer between 1 and 3.",
    )
    status, code, message = error(not_json)
    assert (status, code) == (400, "invalid")
    assert message.startswith("The request body is not valid JSON:")
    assert error(not_an_object) == (
        422,
        "invalid",
        "The request body is not a JSON object of the expected shape: Input should be a valid dictionary or "
        "object to extract fields from.",
    )
    assert error(no_type) == (
        422,
        "invalid",
        "The request body must be JSON, sent with Content-Type: application/json.",
    )
    assert stored


@pytest.mark.anyio
async def test_an_oversized_body_is_refused_before_and_while_reading(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request(arguments={"command": "x" * MAX_BODY_BYTES})
        body = json.dumps({"request": request, "signature": "x"}).encode()
        declared = await client.post("/v1/inbox", content=body, headers={"Content-Type": "application/json"})

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 4096):
                yield body[start : start + 4096]

        chunked = await client.post(
            "/v1/inbox", content=chunks(), headers={"Content-Type": "application/json"}
        )
        at_limit = await client.post(
            "/v1/inbox", content=b" " * MAX_BODY_BYTES, headers={"Content-Type": "application/json"}
        )
        stored = await nothing_stored(client, "alpha", request["request_id"])

    message = f"The request body is larger than the limit of {MAX_BODY_BYTES} bytes."
    assert error(declared) == (413, "too_large", message)
    assert "content-length" not in chunked.request.headers
    assert error(chunked) == (413, "too_large", message)
    assert error(at_limit)[:2] == (400, "invalid")  # exactly at the limit is read (and is not JSON)
    assert stored


@pytest.mark.anyio
async def test_a_request_from_the_future_is_refused_and_nothing_is_stored(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    late = alpha.request(now=time.time() + 3600)  # genuinely signed, by a clock an hour ahead
    skewed = alpha.request(now=time.time() + 30, call_id="call-2")  # within the allowed skew
    async with in_process(beta, deliver=False) as client:
        refused = await client.post("/v1/inbox", json=alpha.signed(late))
        stored = await nothing_stored(client, "alpha", late["request_id"])
        accepted = await client.post("/v1/inbox", json=alpha.signed(skewed))

    status, code, message = error(refused)
    assert (status, code) == (422, "invalid")
    assert re.fullmatch(
        f"Request {late['request_id']} was created at {moment_re(late['created_at'], AN_HOUR_AHEAD)}, "
        "more than 60 seconds ahead of this node's clock\\.",
        message,
    ), message
    assert stored
    assert accepted.status_code == 201


@pytest.mark.anyio
async def test_an_origin_past_its_rate_limit_gets_429_and_nothing_is_stored(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False, inbox_rate_limit=2, inbox_rate_window_seconds=30) as client:
        requests = [alpha.request(call_id=f"call-{n}") for n in range(3)]
        answers = [await client.post("/v1/inbox", json=alpha.signed(request)) for request in requests]
        relay = client.app.state.relay  # type: ignore[attr-defined]
        third = await relay.store.inbox.get("alpha", requests[2]["request_id"])
        forged = await client.post(
            "/v1/inbox",
            json={"request": requests[2], "signature": sign_request(requests[2], signer("gamma"))},
        )

    assert [answer.status_code for answer in answers] == [201, 201, 429]
    status, code, message = error(answers[2])
    assert (status, code) == (429, "rate_limited")
    assert message.startswith("alpha is over its limit of 2 requests per 30 seconds; retry in ")
    # Two requests emptied the bucket of 2; one comes back every 15 s.
    assert 1 <= int(answers[2].headers["Retry-After"]) <= 15
    assert third is None
    # A forged request is refused for its signature, before it could use up alpha's window.
    assert error(forged)[:2] == (403, "bad_signature")


@pytest.mark.parametrize("path", ["script", "steps"])
def test_an_origin_holding_its_share_of_the_inbox_gets_429_until_one_of_its_requests_is_settled(
    nodes: dict[str, Node], path: str
) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    full = (
        429,
        "origin_full",
        "alpha already holds 2 pending requests in this node's inbox, its limit of 2; one must be "
        "decided, withdrawn or expire first.",
    )
    # A window of 4 a day: alpha's refusals below would use it up if they were charged to it.
    limits = {"inbox_max_pending": 2, "inbox_rate_limit": 4, "inbox_rate_window_seconds": 3600}
    with served(beta, deliver=False, **limits) as relays:
        # the one-server script, or a cluster's steps
        relays["beta"].app.state.relay.store.inbox._shape = ONE_SERVER if path == "script" else CLUSTER
        with httpx.Client(base_url=beta.url, timeout=10) as client:

            def post(node: Node, request: dict[str, Any]) -> httpx.Response:
                return client.post("/v1/inbox", json=node.signed(request))

            first, second, third, fourth = (alpha.request(call_id=f"call-{n}") for n in range(4))
            taken = [post(alpha, request).status_code for request in (first, second)]
            refused = [error(post(alpha, third)) for _ in range(3)]
            gammas = gamma.request()
            from_gamma = post(gamma, gammas)
            decision = approval(first, "beta")
            decided = client.post(
                f"/v1/inbox/{first['request_id']}/decision", json=decision, headers=beta.headers
            )
            after_decision = post(alpha, third)
            again_full = error(post(alpha, fourth))
            withdrawn = client.post(
                f"/v1/inbox/{second['request_id']}/withdrawal", json=sign_withdrawal(second, alpha.key)
            )
            after_withdrawal = post(alpha, fourth)
            listed = client.get("/v1/inbox", headers=beta.headers).json()

    assert taken == [201, 201]
    assert refused == [full] * 3
    assert from_gamma.status_code == 201  # alpha's share holds no other origin back
    assert (decided.status_code, withdrawn.json()["withdrawn"]) == (200, True)
    assert after_decision.status_code == 201
    assert again_full == full
    assert after_withdrawal.status_code == 201  # the fourth of the window's four: nothing else charged
    assert {item["request_id"] for item in listed} == {
        third["request_id"],
        fourth["request_id"],
        gammas["request_id"],
    }


@pytest.mark.anyio
async def test_a_captured_request_posted_again_and_again_never_uses_up_its_origins_window(
    make_cluster: MakeCluster,
) -> None:
    # dev signatures only to have a second valid signature over the very same request.
    nodes = make_cluster("alpha", "beta", "gamma", allow_dev_signatures=True)
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False, inbox_rate_limit=2, inbox_rate_window_seconds=30) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        captured = alpha.signed(alpha.request())  # as it travelled to every peer
        first = await client.post("/v1/inbox", json=captured)
        replayed = [await client.post("/v1/inbox", json=captured) for _ in range(3 * 2)]  # 3x the window
        resigned = await client.post("/v1/inbox", json=dict(captured, signature="dev:alpha"))
        genuine = alpha.request(call_id="call-2")
        second = await client.post("/v1/inbox", json=alpha.signed(genuine))
        over = await client.post("/v1/inbox", json=alpha.signed(alpha.request(call_id="call-3")))
        still = await client.post("/v1/inbox", json=captured)  # a full window does not refuse a repeat
        shown = await client.get(f"/v1/inbox/{captured['request']['request_id']}", headers=beta.headers)
        queued = await relay.store.inbox_queue.entries()

    assert first.status_code == 201
    repeats = [*replayed, resigned, still]
    assert [response.status_code for response in repeats] == [200] * 8  # never 429
    assert {(response.json()["created"], response.json()["state"]) for response in repeats} == {
        (False, "pending")
    }
    assert second.status_code == 201  # the origin's genuine new request passes
    # The window of 2 holds exactly the two genuine requests: no repeat was charged to it.
    assert error(over)[:2] == (429, "rate_limited")
    assert shown.json()["signature"] == captured["signature"]  # the first copy stays
    # Nor does a repeat queue the request again (the queue would fill): one entry per request.
    assert sorted(entry.request_id for entry in queued) == sorted(
        [captured["request"]["request_id"], genuine["request_id"]]
    )


@pytest.mark.anyio
async def test_an_expired_request_is_refused_and_charges_nothing(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False, inbox_rate_limit=2, inbox_rate_window_seconds=30) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        expired = alpha.request(now=time.time() - alpha.timeout_seconds - 1)  # expired a second ago
        refused = [await client.post("/v1/inbox", json=alpha.signed(expired)) for _ in range(3 * 2)]
        stored = await nothing_stored(client, "alpha", expired["request_id"])
        window = await relay.store.client.exists(relay.store.keys.ratelimit("origin:alpha"))
        genuine = [
            await client.post("/v1/inbox", json=alpha.signed(alpha.request(call_id=f"call-{n}")))
            for n in range(3)
        ]

    assert expired["expires_at"] < time.time()
    for response in refused:
        status, code, message = error(response)
        assert (status, code) == (422, "expired")
        assert re.fullmatch(
            f"Request {expired['request_id']} expired at {moment_re(expired['expires_at'], AGO)}; "
            "this node no longer accepts it\\.",
            message,
        ), message
    assert stored
    assert window == 0  # the origin's window was never touched
    # So it still holds its full 2: both genuine requests pass, the third is the first refused.
    assert [response.status_code for response in genuine] == [201, 201, 429]


@pytest.mark.anyio
async def test_the_inbox_needs_the_nodes_token(nodes: dict[str, Node]) -> None:
    beta = nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        listing = await client.get("/v1/inbox", headers={"Authorization": "Bearer wrong-token-wrong-token"})
        item = await client.get(f"/v1/inbox/{'a' * 32}")
        decision = await client.post(
            f"/v1/inbox/{'a' * 32}/decision", json={"statement": {}, "signature": ""}
        )

    for response in (listing, item, decision):
        assert error(response)[:2] == (401, "unauthorized")


@pytest.mark.anyio
async def test_the_inbox_long_poll_returns_when_a_request_arrives(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        empty = await client.get("/v1/inbox", params={"wait": 0}, headers=beta.headers)
        request = alpha.request()

        async def arrive() -> None:
            await asyncio.sleep(0.3)
            await client.post("/v1/inbox", json=alpha.signed(request))

        waited, _ = await asyncio.gather(
            client.get("/v1/inbox", params={"wait": 20}, headers=beta.headers), arrive()
        )

    assert empty.json() == []
    assert [item["request_id"] for item in waited.json()] == [request["request_id"]]


@pytest.mark.anyio
async def test_a_pending_request_behind_ten_thousand_decided_ones_is_listed_and_wakes_the_long_poll(
    nodes: dict[str, Node],
) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        now = int(time.time())
        template = gamma.request()  # gamma's requests, approved here over a busy day

        def document(request_id: str) -> bytes:
            return json.dumps({"request": dict(template, request_id=request_id), "signature": "x"}).encode()

        # They expire within the minute, so all sort before alpha's request (two minutes).
        await decided_in_inbox(relay.store, "gamma", 10_000, expires_at=now + 60, now=now, document=document)
        empty = await client.get("/v1/inbox", params={"limit": 1}, headers=beta.headers)
        request = alpha.request()

        async def arrive() -> None:
            await asyncio.sleep(0.3)
            assert (await client.post("/v1/inbox", json=alpha.signed(request))).status_code == 201

        waited, _ = await asyncio.gather(
            client.get(
                "/v1/inbox", params={"state": "pending", "limit": 1, "wait": 20}, headers=beta.headers
            ),
            arrive(),
        )
        listed = await client.get("/v1/inbox", params={"state": "pending", "limit": 1}, headers=beta.headers)
        everything = await client.get("/v1/inbox", params={"state": "all", "limit": 2}, headers=beta.headers)

    assert empty.json() == []
    assert [item["request_id"] for item in waited.json()] == [request["request_id"]]
    assert [item["request_id"] for item in listed.json()] == [request["request_id"]]
    # Every state: the pending one first, whatever sorts before it.
    assert [(item["origin"], item["state"]) for item in everything.json()] == [
        ("alpha", "pending"),
        ("gamma", "approved"),
    ]


@pytest.mark.anyio
async def test_an_unknown_inbox_item_is_not_found(nodes: dict[str, Node]) -> None:
    beta = nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        missing = await client.get(f"/v1/inbox/{'a' * 32}", headers=beta.headers)
        stranger = await client.get(
            f"/v1/inbox/{'a' * 32}", params={"origin": "mallory"}, headers=beta.headers
        )

    assert error(missing) == (404, "not_found", f"No request {'a' * 32} is in this node's inbox.")
    assert error(stranger) == (
        404,
        "not_found",
        f"No request {'a' * 32} from mallory is in this node's inbox.",
    )


# -- this node's decisions ---------------------------------------------------------------------------


async def received(client: httpx.AsyncClient, origin: Node) -> dict[str, Any]:
    request = origin.request()
    assert (await client.post("/v1/inbox", json=origin.signed(request))).status_code == 201
    return request


async def approve_here(client: httpx.AsyncClient, node: Node, request: dict[str, Any]) -> None:
    """This node's approver approves ``request`` through the relay's API."""
    path = f"/v1/inbox/{request['request_id']}/decision"
    assert (await client.post(path, json=approval(request, node.name), headers=node.headers)).is_success


@pytest.mark.anyio
async def test_the_inbox_queue_keeps_only_requests_still_waiting_for_the_approver(
    nodes: dict[str, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        decided, withdrawn, waiting = [await received(client, alpha) for _ in range(3)]
        await approve_here(client, beta, decided)
        await relay.store.inbox.withdraw("alpha", withdrawn["request_id"], withdrawal=b'{"withdrawn": 1}')
        queue = relay.store.inbox_queue
        before = [entry.request_id for entry in await queue.entries()]
        await relay.store.inbox.get_many([("alpha", waiting["request_id"])])  # its script loaded
        with round_trips(monkeypatch) as trips:
            swept = await relay.sweep_inbox_queue()
        after = [entry.request_id for entry in await queue.entries()]
        expired = await relay.sweep_inbox_queue(now=waiting["expires_at"] + 1)
        stats = await queue.stats()
        sent = [entry.request_id for entry in await relay.deliveries.entries()]

    # The decided one left with its decision; the sweep takes out what else waits for nobody.
    assert before == [withdrawn["request_id"], waiting["request_id"]]
    assert (swept, after) == (1, [waiting["request_id"]])  # the withdrawn one no longer waits
    assert trips == [1, 2, 4]  # the page, its two items read together, the removal (MULTI)
    assert expired == 1  # nor does one past its expiry
    assert (stats.length, stats.pending) == (0, 0)
    assert sent == [decided["request_id"]]  # its decision went once: no sweep sends it again


@pytest.mark.usefixtures("one_entry_per_sweep")
@pytest.mark.anyio
async def test_requests_waiting_at_the_head_of_the_inbox_queue_do_not_hide_the_ones_behind(
    nodes: dict[str, Node],
) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        waiting, withdrawn = await received(client, alpha), await received(client, alpha)
        await relay.store.inbox.withdraw("alpha", withdrawn["request_id"], withdrawal=b'{"withdrawn": 1}')
        sweeps = [await relay.sweep_inbox_queue() for _ in range(3)]
        left = [entry.request_id for entry in await relay.store.inbox_queue.entries()]

    assert sweeps == [0, 1, 0]  # the first looks at the waiting one, the next goes on past it
    assert left == [waiting["request_id"]]


@pytest.fixture
def one_entry_per_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    import teaagent_relay._inbox

    monkeypatch.setattr(teaagent_relay._inbox, "INBOX_SWEEP_BATCH", 1)


@pytest.mark.usefixtures("one_entry_per_sweep")
@pytest.mark.anyio
async def test_the_relays_housekeeping_sweeps_page_after_page_while_it_finds_full_ones(
    nodes: dict[str, Node],
) -> None:
    """More than a page waits for nobody when the relay starts: its housekeeping takes all of it
    out at once, not a page a minute (``SWEEP_EVERY_SECONDS``), which a busy node outran."""
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        closed = [await received(client, alpha) for _ in range(3)]
        waiting = await received(client, alpha)
        for request in closed:
            await relay.store.inbox.withdraw("alpha", request["request_id"], withdrawal=b'{"withdrawn": 1}')
    async with in_process(beta) as client:  # its delivery worker, and so its housekeeping, runs
        queue = client.app.state.relay.store.inbox_queue  # type: ignore[attr-defined]
        deadline = time.monotonic() + WAIT
        while (left := [entry.request_id for entry in await queue.entries()]) != [
            waiting["request_id"]
        ] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    assert left == [waiting["request_id"]]


@pytest.mark.anyio
async def test_a_decision_recorded_but_never_queued_is_sent_by_the_inbox_sweep(
    nodes: dict[str, Node],
) -> None:
    """A relay that dies between recording this node's decision and queueing it loses nothing."""
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        relay.store.inbox._shape = CLUSTER  # on one server the record and the queueing are one script
        request = await received(client, alpha)

        async def crash(*args: Any, **kwargs: Any) -> list[str]:
            raise StoreError("Redis at redis://127.0.0.1:1/0 is unreachable: the test cut it")

        enqueue = relay.deliveries.enqueue_many  # the relay queues its decisions many at once
        relay.deliveries.enqueue_many = crash  # the step after recording fails, as a kill -9 would stop it
        path = f"/v1/inbox/{request['request_id']}/decision"
        failed = await client.post(path, json=approval(request, "beta"), headers=beta.headers)
        relay.deliveries.enqueue_many = enqueue
        shown = await client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
        before = await relay.deliveries.entries()
        swept = await relay.sweep_inbox_queue()
        after = await relay.deliveries.entries()

    assert error(failed)[:2] == (503, "unavailable")
    assert shown.json()["state"] == "approved"  # recorded here...
    assert before == []  # ...but not queued
    assert swept == 1
    assert [(entry.target, entry.request_id) for entry in after] == [("alpha", request["request_id"])]
    assert json.loads(after[0].payload)["body"]["statement"]["signer"] == "beta"


@pytest.mark.anyio
async def test_a_contrary_decision_is_refused_and_never_queued(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        request = await received(client, alpha)
        path = f"/v1/inbox/{request['request_id']}/decision"
        first = await client.post(path, json=approval(request, "beta"), headers=beta.headers)
        contrary = await client.post(path, json=denial(request, "beta"), headers=beta.headers)
        queued = await relay.deliveries.entries()

    assert first.status_code == 200
    assert error(contrary)[:2] == (409, "conflict")
    assert [json.loads(entry.payload)["body"]["statement"]["type"] for entry in queued] == [
        "teaagent.approval"
    ]


@pytest.mark.anyio
async def test_this_nodes_decision_is_recorded_and_queued_for_the_origin(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = await received(client, alpha)
        path = f"/v1/inbox/{request['request_id']}/decision"
        document = approval(request, "beta")
        first = await client.post(path, json=document, headers=beta.headers)
        again = await client.post(path, json=document, headers=beta.headers)
        turned = await client.post(path, json=denial(request, "beta"), headers=beta.headers)
        shown = await client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
        pending = await client.get("/v1/inbox", headers=beta.headers)
        relay = client.app.state.relay  # type: ignore[attr-defined]
        queued = await relay.deliveries.claim("test", 10, 0)

    # This node's vote, named as such: no "state" that could read as the request's outcome.
    assert first.json() | {"request_id": "-"} == {
        "request_id": "-",
        "origin": "alpha",
        "signer": "beta",
        "kind": "approval",
        "this_node": "approved",
        "counted": True,
        "note": "This node's decision, sent to alpha; the request's outcome is counted there.",
    }
    assert (again.status_code, again.json()["counted"]) == (200, False)
    assert error(turned) == (
        409,
        "conflict",
        f"This node already approved request {request['request_id']} with another decision.",
    )
    assert shown.json()["state"] == "approved"
    assert shown.json()["decision"]["statement"] == document["statement"]
    assert pending.json() == []
    # The first decision and its harmless repeat are both queued for alpha's relay.
    assert [entry.target for entry in queued] == ["alpha", "alpha"]
    payload = json.loads(queued[0].payload)
    assert payload["path"] == f"/v1/requests/{request['request_id']}/decisions"
    assert payload["body"]["statement"] == document["statement"]


@pytest.mark.anyio
async def test_this_nodes_decision_must_be_signed_by_this_node(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = await received(client, alpha)
        path = f"/v1/inbox/{request['request_id']}/decision"
        as_gamma = await client.post(path, json=approval(request, "gamma"), headers=beta.headers)
        by_gamma_key = approval(request, "gamma")
        by_gamma_key["statement"] = approval_statement(
            request, "beta", by_gamma_key["statement"]["signed_at"]
        )
        forged = await client.post(path, json=by_gamma_key, headers=beta.headers)
        other_request = dict(approval(request, "beta"))
        other_request["statement"] = dict(other_request["statement"], tool_name="fs.delete")
        mismatch = await client.post(path, json=other_request, headers=beta.headers)
        unknown = await client.post(
            f"/v1/inbox/{'b' * 32}/decision", json=approval(request, "beta"), headers=beta.headers
        )
        item = await client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)

    assert error(as_gamma) == (
        403,
        "forbidden",
        "The statement is signed as 'gamma', not as this node (beta).",
    )
    status, code, message = error(forged)
    assert (status, code) == (403, "bad_signature")
    assert message.startswith("The approval does not verify with this node's own key:")
    assert error(mismatch) == (
        422,
        "invalid",
        f"The statement's tool_name does not match request {request['request_id']}.",
    )
    assert error(unknown) == (404, "not_found", f"No request {'b' * 32} from alpha is in this node's inbox.")
    assert item.json()["state"] == "pending"


# -- a decision on a request this relay took in -------------------------------------------------------


@pytest.mark.anyio
async def test_a_decision_on_a_request_this_relay_took_in_reads_no_stored_request(
    nodes: dict[str, Node], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approver's decision comes back moments after the request came in: the relay checks it
    against the request it verified then, and reads only when it did not take the request in
    itself (here, a relay started again on the same store). Recorded and queued for the origin,
    it is then one round trip to Redis."""
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        kept, earlier = await received(client, alpha), await received(client, alpha)
        path = f"/v1/inbox/{kept['request_id']}/decision"

        async def decide() -> tuple[httpx.Response, list[int]]:
            with round_trips(monkeypatch) as trips:
                answer = await client.post(path, json=approval(kept, "beta"), headers=beta.headers)
            return answer, trips

        reads, (first, trips) = await documents_read(redis_url, decide)
    async with in_process(beta, deliver=False) as client:
        path = f"/v1/inbox/{earlier['request_id']}/decision"
        reads_after_start, second = await documents_read(
            redis_url, lambda: client.post(path, json=approval(earlier, "beta"), headers=beta.headers)
        )
        relay = client.app.state.relay  # type: ignore[attr-defined]
        queued = await relay.deliveries.claim("test", 10, 0)

    assert (first.status_code, first.json()["counted"]) == (200, True)
    assert reads == 0
    assert trips == [1]  # one EVALSHA: record_send
    assert (second.status_code, second.json()["counted"]) == (200, True)
    assert reads_after_start == 1
    assert sorted(entry.request_id for entry in queued) == sorted([kept["request_id"], earlier["request_id"]])


@pytest.mark.anyio
async def test_a_kept_request_closed_or_gone_behind_this_relays_back_is_refused_as_after_a_read(
    nodes: dict[str, Node],
) -> None:
    """Another process withdrew one kept request and removed another from the store: the
    decision on each is refused with what a read would have found, and nothing is queued."""
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        withdrawn, gone = await received(client, alpha), await received(client, alpha)
        await relay.store.inbox.withdraw("alpha", withdrawn["request_id"], withdrawal=b'{"withdrawn": 1}')
        keys = relay.store.keys.inbox_item("alpha", gone["request_id"])
        await relay.store.client.delete(keys.doc, keys.outcome, keys.decisions, keys.events)
        answers = [
            await client.post(
                f"/v1/inbox/{request['request_id']}/decision",
                json=approval(request, "beta"),
                headers=beta.headers,
            )
            for request in (withdrawn, gone)
        ]
        queued = await relay.deliveries.entries()

    assert error(answers[0]) == (
        409,
        "withdrawn",
        f"Request {withdrawn['request_id']} was withdrawn by its origin alpha; no decision on it counts "
        "any more.",
    )
    assert error(answers[1]) == (
        404,
        "not_found",
        f"No request {gone['request_id']} from alpha is in this node's inbox.",
    )
    assert queued == []


@pytest.mark.anyio
async def test_a_decision_is_checked_against_the_stored_request_never_a_clashing_one(
    nodes: dict[str, Node],
) -> None:
    """A second document under a stored request's id is refused, and a decision over it stays
    refused: what the relay keeps for decisions is what the store took in."""
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        stored = await received(client, alpha)
        clash = dict(stored, expires_at=stored["expires_at"] + 60)  # a statement field: not its digest
        refused = await client.post("/v1/inbox", json=alpha.signed(clash))
        path = f"/v1/inbox/{stored['request_id']}/decision"
        over_clash = await client.post(path, json=approval(clash, "beta"), headers=beta.headers)
        over_stored = await client.post(path, json=approval(stored, "beta"), headers=beta.headers)

    assert error(refused) == (
        409,
        "conflict",
        f"Request {stored['request_id']} from alpha is already stored with a different document.",
    )
    assert error(over_clash) == (
        422,
        "invalid",
        f"The statement's expires_at does not match request {stored['request_id']}.",
    )
    assert (over_stored.status_code, over_stored.json()["counted"]) == (200, True)
