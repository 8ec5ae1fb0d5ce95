"""Calls coalesced into batches: the Coalescer, the store's batch calls, the relay's own decisions.

The relay answers its approver's decisions many at once; the reads, the records and the queued
deliveries of concurrent decisions each share one Redis round trip. These tests check that a batch
answers each call exactly as the call alone would be answered, and that it really is one batch.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest
from relay_support import (
    Node,
    approval,
    denial,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
    served,
)

from teaagent._batch import Coalescer
from teaagent.errors import RequestNotFoundError, StoreError
from teaagent.store import DecisionToCount, Store

T = TypeVar("T")
NOW = 1_764_570_000
EXPIRES = NOW + 120
DOC = b'{"request":{"request_id":"...","tool_name":"shell.run"},"signature":"AAAA"}'


# -- the Coalescer ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_calls_of_one_moment_share_one_send_and_each_gets_its_own_answer() -> None:
    sent: list[list[int]] = []

    async def send(items: list[int]) -> list[int | Exception]:
        sent.append(items)
        await asyncio.sleep(0.01)  # a round trip in flight: later calls queue for the next batch
        return [ValueError(f"odd {item}") if item % 2 else item * 10 for item in items]

    async def main() -> list[Any]:
        batches: Coalescer[int, int] = Coalescer(send, "test", max_batch=4)
        first = await asyncio.gather(*(batches.call(n) for n in range(6)), return_exceptions=True)
        later = await batches.call(8)
        return [*first, later]

    answers = await main()

    assert sent == [[0, 1, 2, 3], [4, 5], [8]]  # max_batch 4, then the rest, then a lone call at once
    assert answers[0::2] == [0, 20, 40, 80]
    assert [str(answer) for answer in answers[1:6:2]] == ["odd 1", "odd 3", "odd 5"]
    assert all(isinstance(answer, ValueError) for answer in answers[1:6:2])


@pytest.mark.anyio
async def test_a_failed_send_reaches_every_caller_of_its_batch_as_the_wrapped_error() -> None:
    calls = 0

    async def send(items: list[str]) -> list[str | Exception]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("the server went away")
        return [item.upper() for item in items]

    async def main() -> tuple[list[Any], str]:
        batches: Coalescer[str, str] = Coalescer(send, "test", wrap=lambda exc: StoreError(f"failed: {exc}"))
        failed = await asyncio.gather(*(batches.call(word) for word in ("a", "b")), return_exceptions=True)
        return failed, await batches.call("c")

    failed, after = await main()

    assert [type(answer) for answer in failed] == [StoreError, StoreError]
    assert str(failed[0]) == "failed: the server went away"
    assert after == "C"  # the next batch goes out as usual


@pytest.mark.anyio
async def test_with_two_in_flight_a_full_batch_goes_out_while_the_first_is_answered() -> None:
    out: list[list[int]] = []
    most = 0
    release = asyncio.Event()

    async def send(items: list[int]) -> list[int | Exception]:
        nonlocal most
        out.append(items)
        most = max(most, len(out) - len(answered))
        await release.wait()
        answered.append(items)
        return [item + 100 for item in items]

    answered: list[list[int]] = []

    async def main() -> tuple[list[int], list[list[int]]]:
        batches: Coalescer[int, int] = Coalescer(send, "test", max_batch=4, in_flight=2)
        calls = [asyncio.ensure_future(batches.call(n)) for n in range(10)]
        deadline = asyncio.get_running_loop().time() + 30
        while len(out) < 2:  # the first batch, and the full second one beside it
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        sent_before_release = [list(batch) for batch in out]
        release.set()
        return list(await asyncio.gather(*calls)), sent_before_release

    answers, before = await main()

    assert before == [[0, 1, 2, 3], [4, 5, 6, 7]]  # two out at once, never a third
    assert most == 2
    assert out[2:] == [[8, 9]]
    assert answers == [n + 100 for n in range(10)]


@pytest.mark.anyio
async def test_a_partial_batch_waits_for_the_one_in_flight() -> None:
    out: list[list[int]] = []
    release = asyncio.Event()

    async def send(items: list[int]) -> list[int | Exception]:
        out.append(items)
        await release.wait()
        return list(items)

    async def main() -> list[int]:
        batches: Coalescer[int, int] = Coalescer(send, "test", max_batch=4, in_flight=2)
        first = [asyncio.ensure_future(batches.call(n)) for n in range(4)]
        deadline = asyncio.get_running_loop().time() + 30
        while not out:  # the first batch is out
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.001)
        later = [asyncio.ensure_future(batches.call(n)) for n in (4, 5)]  # less than a batch
        for _ in range(20):  # turns of the loop, in which a second sender would have sent them
            await asyncio.sleep(0)
        assert out == [[0, 1, 2, 3]]  # no second sender for two calls: they join the next batch
        release.set()
        return list(await asyncio.gather(*first, *later))

    assert await main() == [0, 1, 2, 3, 4, 5]
    assert out == [[0, 1, 2, 3], [4, 5]]


def test_a_coalescer_refuses_an_empty_batch_size() -> None:
    async def send(items: list[int]) -> list[int | Exception]:
        return list(items)

    with pytest.raises(ValueError, match="max_batch must be at least 1"):
        Coalescer(send, "test", max_batch=0)
    with pytest.raises(ValueError, match="in_flight must be at least 1"):
        Coalescer(send, "test", in_flight=0)


# -- the store's batch calls -----------------------------------------------------------------------


def test_inbox_get_many_answers_each_ref_as_get_does(in_store: Callable[..., Any]) -> None:
    async def scenario(store: Store) -> tuple[list[Any], list[Any]]:
        ids = [secrets.token_hex(16) for _ in range(3)]
        for request_id in ids[:2]:
            await store.inbox.accept("alpha", request_id, DOC, expires_at=EXPIRES, now=NOW)
        refs = [("alpha", ids[0]), ("alpha", ids[2]), ("gamma", ids[1]), ("alpha", ids[1])]
        one_by_one = [await store.inbox.get(origin, request_id) for origin, request_id in refs]
        return await store.inbox.get_many(refs), one_by_one

    many, one_by_one = in_store(scenario)

    assert many == one_by_one
    assert [item is not None for item in many] == [True, False, False, True]
    assert many[0].document == DOC
    assert many[0].origin == "alpha"
    assert many[0].state == "pending"


def test_inbox_record_decisions_records_each_as_record_decision_does(in_store: Callable[..., Any]) -> None:
    async def scenario(store: Store) -> tuple[list[Any], list[Any]]:
        ids = [secrets.token_hex(16) for _ in range(3)]
        for request_id in ids[:2]:
            await store.inbox.accept("alpha", request_id, DOC, expires_at=EXPIRES, now=NOW)
        answers = await store.inbox.record_decisions(
            [
                ("alpha", DecisionToCount(ids[0], "approval", "beta", b"a", NOW)),
                ("alpha", DecisionToCount(ids[1], "denial", "beta", b"d", NOW)),
                ("alpha", DecisionToCount(ids[0], "approval", "beta", b"a", NOW)),  # a repeat
                ("alpha", DecisionToCount(ids[2], "approval", "beta", b"a", NOW)),  # never received
                ("alpha", DecisionToCount(ids[0], "maybe", "beta", b"a", NOW)),  # type: ignore[arg-type]
            ]
        )
        stored = [await store.inbox.get("alpha", request_id) for request_id in ids[:2]]
        pending = await store.inbox.list_requests(state="pending", now=NOW)
        return answers, [stored, pending]

    answers, (stored, pending) = in_store(scenario)

    assert [(answer.state, answer.counted) for answer in answers[:3]] == [
        ("approved", True),
        ("denied", True),
        ("approved", False),
    ]
    assert isinstance(answers[3], RequestNotFoundError)
    assert "from alpha" in str(answers[3])
    assert isinstance(answers[4], ValueError)
    assert [item.state for item in stored] == ["approved", "denied"]
    assert pending == []  # both settled items left the pending listing


def test_enqueue_many_appends_in_order_as_enqueue_does(in_store: Callable[..., Any]) -> None:
    async def scenario(store: Store) -> tuple[list[Any], list[Any], Any]:
        queue = store.queue("deliveries")
        ids = [secrets.token_hex(16) for _ in range(3)]
        answers = await queue.enqueue_many(
            [
                (peer, request_id, f'{{"n":{n}}}'.encode(), EXPIRES)
                for n, (peer, request_id) in enumerate(zip(("alpha", "gamma", "alpha"), ids, strict=True))
            ],
            now=NOW,
        )
        claimed = await queue.claim("w1", 10, 0, now=NOW)
        with pytest.raises(ValueError, match="32 lowercase hex"):
            await queue.enqueue_many([("alpha", "nope", b"{}", EXPIRES)], now=NOW)
        return answers, claimed, await queue.enqueue_many([])

    answers, claimed, empty = in_store(scenario)

    assert [delivery.entry_id for delivery in claimed] == answers
    assert [(delivery.target, json.loads(delivery.payload)["n"]) for delivery in claimed] == [
        ("alpha", 0),
        ("gamma", 1),
        ("alpha", 2),
    ]
    assert empty == []


# -- the relay's own decisions, many at once -------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_own_decisions_are_each_recorded_and_queued_once(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        requests = [alpha.request() for _ in range(24)]
        for request in requests:
            assert (await client.post("/v1/inbox", json=alpha.signed(request))).status_code == 201
        sends = 0
        enqueue_many = relay.deliveries.enqueue_many

        async def counted(entries: Any, **kwargs: Any) -> Any:
            nonlocal sends
            sends += 1
            return await enqueue_many(entries, **kwargs)

        relay.deliveries.enqueue_many = counted

        # Signed once: a repeat is the same document (signed a second later, it would be another).
        decisions = [
            approval(request, "beta") if index % 3 else denial(request, "beta", "not today")
            for index, request in enumerate(requests)
        ]

        async def post(index: int, request: dict[str, Any]) -> httpx.Response:
            path = f"/v1/inbox/{request['request_id']}/decision"
            return await client.post(path, json=decisions[index], headers=beta.headers)

        answers = await asyncio.gather(*(post(index, request) for index, request in enumerate(requests)))
        repeats = await asyncio.gather(*(post(index, request) for index, request in enumerate(requests[:4])))
        contrary = await client.post(
            f"/v1/inbox/{requests[1]['request_id']}/decision",
            json=denial(requests[1], "beta", "changed my mind"),
            headers=beta.headers,
        )
        queued = await relay.deliveries.entries()

    assert [answer.status_code for answer in answers] == [200] * 24
    assert [answer.json()["this_node"] for answer in answers] == [
        "approved" if index % 3 else "denied" for index in range(24)
    ]
    assert all(answer.json()["counted"] for answer in answers)
    assert [(answer.status_code, answer.json()["counted"]) for answer in repeats] == [(200, False)] * 4
    assert error(contrary)[:2] == (409, "conflict")
    # Every decision queued for the origin (the repeats again: the origin counts a signer once),
    # and the 24 concurrent ones in fewer round trips than decisions.
    assert sorted(entry.request_id for entry in queued) == sorted(
        [request["request_id"] for request in requests] + [request["request_id"] for request in requests[:4]]
    )
    assert {entry.target for entry in queued} == {"alpha"}
    assert sends < 24


@pytest.mark.anyio
async def test_the_own_decision_route_keeps_the_token_and_the_body_checks(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        request = alpha.request()
        assert (await client.post("/v1/inbox", json=alpha.signed(request))).status_code == 201
        path = f"/v1/inbox/{request['request_id']}/decision"
        body = approval(request, "beta")
        token = beta.headers["Authorization"].partition(" ")[2]
        none = await client.post(path, json=body)
        wrong = await client.post(path, json=body, headers={"Authorization": "Bearer not-the-token-at-all"})
        basic = await client.post(path, json=body, headers={"Authorization": f"Basic {token}"})
        bad_id = await client.post("/v1/inbox/NOT-AN-ID/decision", json=body, headers=beta.headers)
        bad_body = await client.post(path, content=b"{", headers=beta.headers)
        lower = await client.post(path, json=body, headers={"Authorization": f"bearer {token}"})

    for answer in (none, wrong, basic):
        assert error(answer)[:2] == (401, "unauthorized")
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert error(bad_id)[:2] == (422, "invalid")
    assert error(bad_body)[0] in (400, 422)
    assert lower.status_code == 200
    assert lower.json()["this_node"] == "approved"


@pytest.mark.anyio
async def test_a_batch_answers_each_decision_with_the_status_it_alone_would_have(
    nodes: dict[str, Node],
) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(beta, deliver=False) as client:
        requests = [alpha.request() for _ in range(3)]
        for request in requests[:2]:
            assert (await client.post("/v1/inbox", json=alpha.signed(request))).status_code == 201
        forged = approval(requests[1], "gamma")  # gamma's key, claiming nothing of beta's
        forged["statement"]["signer"] = "beta"
        bad_id = approval(requests[0], "beta")
        bad_id["statement"]["request_id"] = "NOT-AN-ID"
        batch = [approval(requests[0], "beta"), forged, approval(requests[2], "beta"), bad_id]
        answer = await client.post("/v1/inbox/decisions", json={"decisions": batch}, headers=beta.headers)
        alone = await client.post(
            f"/v1/inbox/{requests[1]['request_id']}/decision", json=forged, headers=beta.headers
        )
        empty = await client.post("/v1/inbox/decisions", json={"decisions": []}, headers=beta.headers)
        too_many = await client.post(
            "/v1/inbox/decisions", json={"decisions": [batch[0]] * 65}, headers=beta.headers
        )
        no_token = await client.post("/v1/inbox/decisions", json={"decisions": batch[:1]})

    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [result["status"] for result in results] == [200, alone.status_code, 404, 422]
    assert results[0]["decision"]["this_node"] == "approved"
    assert (results[1]["error"], results[1]["message"]) == error(alone)[1:]
    assert results[2]["error"] == "not_found"
    assert results[3]["error"] == "invalid"
    assert error(empty)[:2] == (422, "invalid")
    assert error(too_many)[:2] == (422, "invalid")
    assert error(no_token)[:2] == (401, "unauthorized")


@pytest.mark.anyio
async def test_the_approvers_poster_sends_concurrent_decisions_in_one_request_and_answers_each(
    nodes: dict[str, Node],
) -> None:
    from teaagent.errors import RelayError
    from teaagent_approver._wire import DecisionPoster

    alpha, beta = nodes["alpha"], nodes["beta"]
    requests = [alpha.request() for _ in range(5)]

    async def main() -> tuple[list[Any], list[Any], dict[str, float]]:
        poster = DecisionPoster(f"http://127.0.0.1:{beta.port}", token=beta.token)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{beta.port}") as client:
                for request in requests[:4]:
                    assert (await client.post("/v1/inbox", json=alpha.signed(request))).status_code == 201
                decisions = [approval(request, "beta") for request in requests]
                decisions[2] = denial(requests[2], "beta", "no")
                answers = await asyncio.gather(
                    *(
                        poster.post(request["request_id"], body["statement"], body["signature"])
                        for request, body in zip(requests, decisions, strict=True)
                    ),
                    return_exceptions=True,
                )
                lone = [
                    await poster.post(
                        requests[0]["request_id"], decisions[0]["statement"], decisions[0]["signature"]
                    )
                ]
                metrics = (await client.get("/metrics")).text
        finally:
            await poster.aclose()
        counts = {
            route: sum(
                float(line.rpartition(" ")[2])
                for line in metrics.splitlines()
                if line.startswith("teaagent_relay_http_requests_total") and f'route="{route}"' in line
            )
            for route in ("/v1/inbox/decisions", "/v1/inbox/{request_id}/decision")
        }
        return answers, lone, counts

    with served(beta, deliver=False):
        answers, lone, counts = await main()

    assert [answer["this_node"] for answer in answers[:4]] == ["approved", "approved", "denied", "approved"]
    assert isinstance(answers[4], RelayError)
    assert (answers[4].status_code, answers[4].code) == (404, "not_found")
    assert str(answers[4]).startswith(
        f"The relay at http://127.0.0.1:{beta.port} refused the decision on request"
    )
    assert lone[0]["counted"] is False  # a lone call goes out alone, on the single route
    assert counts == {"/v1/inbox/decisions": 1.0, "/v1/inbox/{request_id}/decision": 1.0}
