"""How a request enters the store with its queue entries, on one server's script and a cluster's steps.

Receiving a peer's request charges the origin's window, stores, lists, queues and marks it, within
the origin's cap; submitting an own request stores it and queues a delivery per peer.
"""

from __future__ import annotations

from typing import Any

import pytest
from store_support import APPROVAL, DOC, EXPIRES, NOW, PATHS, Run, accepted, new_id, round_trips

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.store import MAX_PENDING_PER_ORIGIN, DecisionToCount, Intake, Store
from teaagent.store._shapes import CLUSTER, ONE_SERVER
from teaagent.tools import ToolRateLimit

# Receiving a peer's request: charge, store, queue, mark -------------------------------------------


GENEROUS = ToolRateLimit(100)  # never refused in a test
INBOX_PAYLOAD = b'{"origin": "alpha", "request_id": "..."}'


async def received(
    store: Store,
    path: str,
    request_id: str,
    *,
    document: bytes = DOC,
    limit: ToolRateLimit = GENEROUS,
    expires_at: int = EXPIRES,
    queue_length: int | None = None,
    origin: str = "alpha",
    max_pending: int = MAX_PENDING_PER_ORIGIN,
    now: int = NOW,
) -> Any:
    """``InboxBook.receive`` from alpha: on one server (``script``), or as a cluster runs it (``steps``)."""
    store.inbox._shape = ONE_SERVER if path == "script" else CLUSTER
    queue = store.inbox_queue if queue_length is None else store.queue("inbox", max_length=queue_length)
    intake = Intake(store.rate_limiter, f"origin:{origin}", limit, queue, "approver", max_pending=max_pending)
    return await store.inbox.receive(
        origin, request_id, document, expires_at=expires_at, intake=intake, payload=INBOX_PAYLOAD, now=now
    )


async def inbox_queue_entries(store: Store) -> list[dict[bytes, bytes]]:
    entries: Any = await store.client.xrange(store.keys.queue("inbox").stream)
    return [fields for _id, fields in entries]


async def window_value(store: Store) -> bytes | None:
    value: Any = await store.client.get(store.keys.ratelimit("origin:alpha"))
    return value


@PATHS
def test_receive_charges_the_window_stores_lists_queues_and_marks_a_new_request(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        result = await received(store, path, request_id)
        assert not result.stored_before
        assert (result.decision.allowed, result.decision.remaining) == (True, 99)
        assert (result.accepted.created, result.accepted.state) == (True, "pending")
        assert result.accepted.stored == await store.inbox.get("alpha", request_id) is not None
        stored = await store.inbox.get("alpha", request_id)
        assert (stored.document, stored.state, stored.queued) == (DOC, "pending", True)
        assert [item.request_id for item in await store.inbox.list_requests(state="pending", now=NOW)] == [
            request_id
        ]
        [entry] = await inbox_queue_entries(store)
        assert (entry[b"target"], entry[b"request_id"], entry[b"payload"]) == (
            b"approver",
            request_id.encode(),
            INBOX_PAYLOAD,
        )
        assert (
            result.entry_id
            == (
                await store.client.hget(store.keys.inbox_item("alpha", request_id).outcome, "queued")
            ).decode()
        )
        assert await window_value(store) is not None

    in_store(scenario)


@PATHS
def test_receive_of_a_stored_request_charges_nothing_and_writes_nothing(in_store: Run, path: str) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        await received(store, path, request_id)
        window, queued = await window_value(store), await inbox_queue_entries(store)
        for document in (DOC, b"another document under the same id"):
            again = await received(store, path, request_id, document=document)
            assert (again.stored_before, again.decision, again.accepted, again.entry_id) == (
                True,
                None,
                None,
                None,
            )
        assert await window_value(store) == window
        assert await inbox_queue_entries(store) == queued
        stored = await store.inbox.get("alpha", request_id)
        assert stored is not None
        assert stored.document == DOC

    in_store(scenario)


@PATHS
def test_receive_refused_by_the_window_stores_lists_and_queues_nothing(in_store: Run, path: str) -> None:
    async def scenario(store: Store) -> None:
        first, second = new_id(), new_id()
        assert (await received(store, path, first, limit=ToolRateLimit(1, 60.0))).decision.allowed
        window = await window_value(store)
        refused = await received(store, path, second, limit=ToolRateLimit(1, 60.0))
        assert not refused.stored_before
        assert not refused.decision.allowed
        assert refused.decision.retry_after > 0
        assert (refused.accepted, refused.entry_id) == (None, None)
        assert await store.inbox.get("alpha", second) is None
        assert await store.client.zscore(store.keys.inbox_index(), f"alpha/{second}") is None
        assert [entry[b"request_id"] for entry in await inbox_queue_entries(store)] == [first.encode()]
        assert await window_value(store) == window  # a refused call changes nothing

    in_store(scenario)


def test_receive_in_steps_retried_after_a_failed_store_step_charges_the_window_once(in_store: Run) -> None:
    # A cluster's steps: a store step that fails after the charge (here the index is no sorted set,
    # as a restarting master fails it) makes the origin deliver again; the repeat is not charged.
    async def scenario(store: Store) -> list[bool]:
        retried = new_id()
        limit = ToolRateLimit(2, 3600.0)
        await store.client.set(store.keys.inbox_index(), b"not a sorted set")
        with pytest.raises(StoreError):
            await received(store, "steps", retried, limit=limit)
        await store.client.delete(store.keys.inbox_index())
        again = await received(store, "steps", retried, limit=limit)
        assert again.accepted.created
        others = [await received(store, "steps", new_id(), limit=limit) for _ in range(2)]
        return [result.decision.allowed for result in (again, *others)]

    assert in_store(scenario) == [True, True, False]  # the window's two calls: the retried one and one more


@PATHS
def test_receive_of_a_request_expired_on_arrival_stores_it_settled_and_queues_nothing(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        result = await received(store, path, request_id, expires_at=NOW - 1)
        assert (result.accepted.created, result.accepted.state, result.entry_id) == (True, "expired", None)
        stored = await store.inbox.get("alpha", request_id)
        assert (stored.state, stored.queued) == ("expired", False)
        member = f"alpha/{request_id}"
        assert await store.client.zscore(store.keys.inbox_index(), member) is not None
        assert await store.client.zscore(store.keys.inbox_pending(), member) is None
        assert await inbox_queue_entries(store) == []

    in_store(scenario)


@PATHS
def test_receive_into_a_full_queue_fails_and_leaves_the_request_stored_unmarked(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        await received(store, path, new_id(), queue_length=1)
        request_id = new_id()
        with pytest.raises(StoreError, match="queue inbox already holds 1 entries"):
            await received(store, path, request_id, queue_length=1)
        stored = await store.inbox.get("alpha", request_id)
        assert (stored.state, stored.queued) == ("pending", False)  # the origin's repeat queues it

    in_store(scenario)


async def held(store: Store, origin: str = "alpha") -> list[str]:
    """The refs an origin holds in the inbox, as its held set lists them."""
    return [member.decode() for member in await store.client.zrange(store.keys.inbox_held(origin), 0, -1)]


@PATHS
def test_an_origin_holding_its_cap_is_refused_charging_nothing_and_regains_room_as_its_requests_settle(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        soon, first, second = new_id(), new_id(), new_id()
        cap = {"max_pending": 3}
        await received(store, path, soon, expires_at=NOW + 10, **cap)
        for request_id in (first, second):
            assert (await received(store, path, request_id, **cap)).accepted.created
        assert sorted(await held(store)) == sorted(f"alpha/{r}" for r in (soon, first, second))
        assert 0 < await store.client.pttl(store.keys.inbox_held("alpha")) <= (EXPIRES - NOW + 1) * 1000

        # Full: refused with what it holds, and nothing charged, listed, stored or queued.
        window, queued = await window_value(store), await inbox_queue_entries(store)
        third = new_id()
        refused = await received(store, path, third, **cap)
        assert (refused.full, refused.held, refused.stored_before) == (True, 3, False)
        assert (refused.decision, refused.accepted, refused.entry_id) == (None, None, None)
        assert await window_value(store) == window
        assert await inbox_queue_entries(store) == queued
        assert await store.inbox.get("alpha", third) is None
        assert await store.client.zscore(store.keys.inbox_index(), f"alpha/{third}") is None
        assert len(await held(store)) == 3

        # Another origin is not held back by alpha's share.
        from_gamma = await received(store, path, new_id(), origin="gamma", **cap)
        assert (from_gamma.full, from_gamma.accepted.created) == (False, True)

        # Decided (this node's decision, as the relay records it): room for one more.
        decision = DecisionToCount(first, "approval", "beta", APPROVAL, NOW)
        [result] = await store.inbox.record_decisions([("alpha", decision)])
        assert result.decided
        assert (await received(store, path, third, **cap)).accepted.created
        assert (await received(store, path, new_id(), **cap)).full

        # Withdrawn by its origin: room for one more.
        withdrawal = await store.inbox.withdraw("alpha", second, withdrawal=b'{"withdrawn": 1}', now=NOW)
        assert withdrawal.withdrawn
        fourth = new_id()
        assert (await received(store, path, fourth, **cap)).accepted.created
        assert (await received(store, path, new_id(), **cap)).full

        # Expired, settled by nobody: its ref counts for nothing once past its expiry.
        assert (await received(store, path, new_id(), now=NOW + 10, **cap)).full
        assert (await received(store, path, new_id(), now=NOW + 11, **cap)).accepted.created
        assert f"alpha/{soon}" not in await held(store)
        assert len(await held(store)) == 3

    in_store(scenario)


@PATHS
def test_a_request_refused_by_its_origins_window_or_accepted_expired_is_not_held(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        first, second, late = new_id(), new_id(), new_id()
        once = ToolRateLimit(1, 60.0)
        assert (await received(store, path, first, limit=once, max_pending=2)).decision.allowed
        assert not (await received(store, path, second, limit=once, max_pending=2)).decision.allowed
        assert (await received(store, path, late, expires_at=NOW - 1, origin="gamma")).accepted.state == (
            "expired"
        )
        assert await held(store) == [f"alpha/{first}"]
        assert await held(store, "gamma") == []

    in_store(scenario)


def test_receive_on_one_server_is_one_round_trip(in_store: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(store: Store) -> list[int]:
        await received(store, "script", new_id())  # the script is loaded, a connection open
        with round_trips(monkeypatch) as trips:
            await received(store, "script", new_id())
        return trips

    # One EVALSHA: the look, the window, the index, the request, the queue entry and its mark.
    assert in_store(scenario) == [1]


def test_receive_on_one_server_looks_for_the_item_once(in_store: Run) -> None:
    async def scenario(store: Store) -> tuple[int, bool]:
        before = await store.client.info("commandstats")
        request_id = new_id()
        await received(store, "script", request_id)
        after = await store.client.info("commandstats")
        stored = await store.inbox.get("alpha", request_id)
        looks = after["cmdstat_exists"]["calls"] - before.get("cmdstat_exists", {}).get("calls", 0)
        return looks, stored is not None and stored.queued

    # Whether it is stored already: the mark that follows the item's accept needs no look of its own.
    assert in_store(scenario) == (1, True)


def test_receive_loads_its_script_when_the_server_lost_it(in_store: Run) -> None:
    async def scenario(store: Store) -> tuple[bool, bool]:
        await store.client.script_flush()  # a restarted or flushed server
        request_id = new_id()
        result = await received(store, "script", request_id)
        stored = await store.inbox.get("alpha", request_id)
        return result.accepted.created, stored is not None and stored.queued

    assert in_store(scenario) == (True, True)


# Submitting an own request: store it, queue a delivery per peer -----------------------------------

DELIVERIES = [
    ("beta", b'{"path": "/v1/inbox", "to": "beta"}'),
    ("gamma", b'{"path": "/v1/inbox", "to": "gamma"}'),
]


async def submitted(
    store: Store,
    path: str,
    request_id: str,
    *,
    document: bytes = DOC,
    expires_at: int = EXPIRES,
    queue_length: int | None = None,
) -> Any:
    """``RequestBook.submit``: on one server (``script``), or as a cluster runs it (``steps``)."""
    store.requests._shape = ONE_SERVER if path == "script" else CLUSTER
    queue = store.deliveries if queue_length is None else store.queue("deliveries", max_length=queue_length)
    return await store.requests.submit(
        request_id,
        document,
        required_approvals=2,
        peers=2,
        expires_at=expires_at,
        queue=queue,
        deliveries=DELIVERIES,
        now=NOW,
    )


async def delivery_entries(store: Store) -> list[tuple[bytes, bytes, bytes]]:
    entries: Any = await store.client.xrange(store.keys.queue("deliveries").stream)
    return [(fields[b"target"], fields[b"request_id"], fields[b"payload"]) for _id, fields in entries]


@PATHS
def test_submit_stores_lists_and_queues_a_delivery_per_peer_and_again_for_a_repeat(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        first = await submitted(store, path, request_id)
        assert (first.created, first.state) == (True, "pending")
        assert first.stored == await store.requests.get(request_id)
        assert [item.request_id for item in await store.requests.list_requests(now=NOW)] == [request_id]
        once = [(peer.encode(), request_id.encode(), payload) for peer, payload in DELIVERIES]
        assert await delivery_entries(store) == once
        again = await submitted(store, path, request_id)  # a client retrying after a crash
        assert (again.created, again.state, again.stored) == (False, "pending", None)
        assert await delivery_entries(store) == once + once

    in_store(scenario)


@PATHS
def test_submit_of_another_document_under_a_stored_id_is_a_conflict_and_queues_nothing(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        await submitted(store, path, request_id)
        with pytest.raises(RequestConflictError, match=f"request {request_id} already exists"):
            await submitted(store, path, request_id, document=b"another document")
        assert len(await delivery_entries(store)) == len(DELIVERIES)
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert stored.document == DOC

    in_store(scenario)


@PATHS
def test_submit_of_a_request_expired_already_stores_it_settled_and_queues_nothing(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        result = await submitted(store, path, request_id, expires_at=NOW - 1)
        assert (result.created, result.state) == (True, "expired")
        assert await delivery_entries(store) == []
        assert await store.client.zscore(store.keys.request_index(), request_id) is not None
        assert await store.client.zscore(store.keys.request_pending(), request_id) is None

    in_store(scenario)


@PATHS
def test_submit_into_a_full_queue_fails_and_leaves_the_request_stored(in_store: Run, path: str) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        with pytest.raises(StoreError, match="queue deliveries already holds 1 entries"):
            await submitted(store, path, request_id, queue_length=1)
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert stored.state == "pending"

    in_store(scenario)


def test_submit_on_one_server_is_one_round_trip_and_loads_its_script_when_the_server_lost_it(
    in_store: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(store: Store) -> list[int]:
        await store.client.script_flush()  # a restarted or flushed server
        lost = await submitted(store, "script", new_id())
        assert (lost.created, lost.state) == (True, "pending")
        with round_trips(monkeypatch) as trips:
            await submitted(store, "script", new_id())
        assert len(await delivery_entries(store)) == 2 * len(DELIVERIES)
        return trips

    # One EVALSHA: the index, the request and both deliveries.
    assert in_store(scenario) == [1]


# Recording a decision: a settled request leaves the pending and held sets ------------------------


@PATHS
def test_a_lone_decision_that_settles_an_item_takes_it_out_of_the_sets_in_its_own_call_on_one_server(
    in_store: Run, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(store: Store) -> list[list[int]]:
        items = [new_id() for _ in range(6)]
        for request_id in items:
            await received(store, path, request_id)

        async def decided(request_ids: list[str]) -> list[int]:
            batch = [("alpha", DecisionToCount(r, "approval", "beta", APPROVAL, NOW)) for r in request_ids]
            with round_trips(monkeypatch) as trips:
                results = await store.inbox.record_decisions(batch)
            assert [(result.state, result.decided) for result in results] == [("approved", True)] * len(batch)
            return trips

        await decided(items[:1])  # the scripts loaded, a connection open
        await decided(items[1:3])
        # Alone; in a batch (the sets after, in one command for all); the single call's method.
        seen = [await decided(items[3:4]), await decided(items[4:6])]
        with round_trips(monkeypatch) as trips:
            late = await store.inbox.record_decision(
                "alpha", items[0], kind="denial", signer="beta", decision=APPROVAL, now=NOW
            )
            assert (late.state, late.counted, late.decided) == ("approved", False, False)
        seen.append(trips)
        assert await held(store) == []
        assert await store.client.zcard(store.keys.inbox_pending()) == 0
        assert await store.inbox.list_requests(state="pending", now=NOW) == []
        # A request of this node's own, 2 of 3: the first approval leaves it pending and listed.
        store.requests._shape = ONE_SERVER if path == "script" else CLUSTER
        request_id = await accepted(store)
        for signer, pending in (("beta", 1), ("gamma", 0)):
            await store.requests.record_decision(
                request_id, kind="approval", signer=signer, decision=APPROVAL, now=NOW
            )
            assert await store.client.zcard(store.keys.request_pending()) == pending
        return seen

    # One call: on one server the script alone; on a cluster the sets after, in one more round trip.
    alone = [1] if path == "script" else [1, 2]
    assert in_store(scenario) == [alone, [2, 2], [1]]


# This node's own decision, recorded and queued for the origin -------------------------------------


TO_ALPHA = b'{"path": "/v1/requests/.../decisions"}'


def own_decisions(*items: tuple[str, str]) -> list[tuple[str, DecisionToCount, tuple[str, bytes, int]]]:
    """This node's (beta's) decisions, ``(kind, request id)`` each, with their delivery to alpha."""
    return [
        ("alpha", DecisionToCount(request_id, kind, "beta", APPROVAL, NOW), ("alpha", TO_ALPHA, EXPIRES))  # type: ignore[arg-type]
        for kind, request_id in items
    ]


async def approver_entries(store: Store) -> list[bytes]:
    """The request ids of the approver's queue (the inbox queue), in order."""
    return [fields[b"request_id"] for fields in await inbox_queue_entries(store)]


@PATHS
def test_this_nodes_decision_is_queued_for_its_origin_only_when_it_counted(
    in_store: Run, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(store: Store) -> list[int]:
        first, second, withdrawn, waiting = new_id(), new_id(), new_id(), new_id()
        for request_id in (first, second, withdrawn, waiting):
            await received(store, path, request_id)
        await store.inbox.withdraw("alpha", withdrawn, withdrawal=b'{"withdrawn": 1}', now=NOW)
        queue, inbox = store.queue("deliveries"), store.inbox_queue
        await store.inbox.record_and_queue(own_decisions(("approval", new_id())), queue, inbox)  # loaded
        with round_trips(monkeypatch) as trips:
            answers = await store.inbox.record_and_queue(
                own_decisions(("approval", first), ("denial", second)), queue, inbox
            )
        repeats = await store.inbox.record_and_queue(
            own_decisions(
                ("approval", first), ("denial", first), ("approval", withdrawn), ("approval", new_id())
            ),
            queue,
            inbox,
        )
        counted = [(answer.result.state, answer.result.counted, bool(answer.entry_id)) for answer in answers]
        assert counted == [("approved", True, True), ("denied", True, True)]
        assert [(answer.result.state, answer.result.counted, answer.entry_id) for answer in repeats[:3]] == [
            ("approved", False, None),  # the same decision again: its caller queues a repeat
            ("approved", False, None),  # a contrary one never leaves
            ("withdrawn", False, None),
        ]
        assert isinstance(repeats[3], RequestNotFoundError)
        assert await delivery_entries(store) == [
            (b"alpha", first.encode(), TO_ALPHA),
            (b"alpha", second.encode(), TO_ALPHA),
        ]
        assert await held(store) == [f"alpha/{waiting}"]  # the others settled: out of its held set
        assert [item.request_id for item in await store.inbox.list_requests(state="pending", now=NOW)] == [
            waiting
        ]
        # Decided and queued for alpha: out of the approver's queue (the withdrawn one is the sweep's).
        assert await approver_entries(store) == [withdrawn.encode(), waiting.encode()]
        return trips

    # On one server a record_send each, one round trip; on a cluster the records, the sets after
    # them, the deliveries, then the approver's entries (where they are, then out: XACK, XDEL).
    assert in_store(scenario) == ([2] if path == "script" else [2, 2, 2, 2, 4])


@PATHS
def test_a_decision_that_finds_the_queue_full_is_recorded_and_its_caller_told(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        await received(store, path, request_id)
        queue = store.queue("deliveries", max_length=1)
        await queue.enqueue("gamma", new_id(), b"{}", EXPIRES)
        [answer] = await store.inbox.record_and_queue(
            own_decisions(("approval", request_id)), queue, store.inbox_queue
        )
        assert isinstance(answer, StoreError)
        assert "already holds 1 entries" in str(answer)
        stored = await store.inbox.get("alpha", request_id)
        assert stored is not None
        assert stored.state == "approved"
        assert len(await delivery_entries(store)) == 1
        # Not queued: its entry stays for the inbox sweep, which sends the decision again.
        assert await approver_entries(store) == [request_id.encode()]

    in_store(scenario)


@PATHS
def test_a_decision_whose_delivery_the_queue_would_refuse_is_not_recorded_either(
    in_store: Run, path: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        await received(store, path, request_id)
        bad = [
            ("alpha", DecisionToCount(request_id, "approval", "beta", APPROVAL, NOW), ("", TO_ALPHA, EXPIRES))
        ]
        with pytest.raises(ValueError, match="target must be"):
            await store.inbox.record_and_queue(bad, store.queue("deliveries"), store.inbox_queue)  # type: ignore[arg-type]
        stored = await store.inbox.get("alpha", request_id)
        assert stored is not None
        assert stored.state == "pending"
        assert await delivery_entries(store) == []

    in_store(scenario)
