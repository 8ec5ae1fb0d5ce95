"""The inbox on a real Redis: peers' requests kept per origin and listed; requests withdrawn by
their origin, in the inbox and in the origin's own book."""

from __future__ import annotations

import asyncio
import time

import pytest
from store_support import (
    APPROVAL,
    DOC,
    EXPIRES,
    NOW,
    Run,
    accepted,
    decided_in_inbox,
    events,
    new_id,
    outcome_events,
    round_trips,
)

from teaagent.errors import RequestConflictError, RequestNotFoundError
from teaagent.store import DecisionResult, DecisionToCount, Store

# Listing and the inbox -----------------------------------------------------------------------------


def test_listing_pending_skips_decided_and_expired_requests(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        soon = await accepted(store, required=1, peers=2, expires_at=NOW + 10)
        later = await accepted(store, required=1, peers=2, expires_at=NOW + 20)
        decided = await accepted(store, required=1, peers=2, expires_at=NOW + 30)
        await store.requests.record_decision(decided, kind="approval", signer="beta", decision=b"x", now=NOW)
        pending = await store.requests.list_requests(now=NOW)
        assert [item.request_id for item in pending] == [soon, later]  # in order of expiry
        listed = await store.requests.list_requests(state=None, now=NOW)
        assert [item.request_id for item in listed] == [soon, later, decided]  # no pending one twice
        assert [item.request_id for item in await store.requests.list_requests(now=NOW + 15)] == [later]
        everything = await store.requests.list_requests(state=None, now=NOW + 15)
        # The pending one first (PROTOCOL.md), then the others by expiry: soon expired at NOW + 10.
        assert [item.request_id for item in everything] == [later, soon, decided]
        approved = await store.requests.list_requests(state="approved", now=NOW)
        assert [item.request_id for item in approved] == [decided]
        with pytest.raises(ValueError, match="limit must be between 1 and 1000"):
            await store.requests.list_requests(limit=0)

    in_store(scenario)


def test_inbox_items_are_kept_per_origin_and_settled_by_this_nodes_decision(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        from_alpha = await store.inbox.accept("alpha", request_id, b"alpha's", expires_at=EXPIRES, now=NOW)
        # Another peer reusing the id is another item, not a conflict that would block alpha's request.
        from_gamma = await store.inbox.accept("gamma", request_id, b"gamma's", expires_at=EXPIRES, now=NOW)
        assert from_alpha.created
        assert from_gamma.created
        waiting = await store.inbox.list_requests(now=NOW)
        assert sorted((item.origin, item.document) for item in waiting) == [
            ("alpha", b"alpha's"),
            ("gamma", b"gamma's"),
        ]
        decided = await store.inbox.record_decision(
            "alpha", request_id, kind="approval", signer="beta", decision=b"signed", now=NOW
        )
        assert (decided.state, decided.decided) == ("approved", True)
        assert [item.origin for item in await store.inbox.list_requests(now=NOW)] == ["gamma"]
        item = await store.inbox.get("alpha", request_id)
        assert item is not None
        assert (item.origin, item.approvals) == ("alpha", {"beta": b"signed"})
        with pytest.raises(RequestConflictError, match=f"request {request_id} from alpha already exists"):
            await store.inbox.accept("alpha", request_id, b"changed", expires_at=EXPIRES, now=NOW)
        with pytest.raises(RequestNotFoundError, match=f"request {request_id} from delta is not stored here"):
            await store.inbox.record_decision(
                "delta", request_id, kind="denial", signer="beta", decision=b"x"
            )
        assert await store.requests.get(request_id) is None  # own requests are another namespace

    in_store(scenario)


async def hgetall_calls(store: Store) -> int:
    return int((await store.client.info("commandstats")).get("cmdstat_hgetall", {}).get("calls", 0))


async def commands_sent(store: Store) -> tuple[int, int]:
    """Documents read (GET calls) and commands processed so far, by the server's own count."""
    stats = await store.client.info("all")
    return stats.get("cmdstat_get", {}).get("calls", 0), stats["total_commands_processed"]


def test_reading_inbox_items_is_one_script_call_each_in_one_round_trip(
    in_store: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(store: Store) -> None:
        pending, decided, missing = new_id(), new_id(), new_id()
        for request_id in (pending, decided):
            await store.inbox.accept("alpha", request_id, DOC, expires_at=EXPIRES, now=NOW)
        await store.inbox.record_decision(
            "alpha", decided, kind="approval", signer="beta", decision=APPROVAL, now=NOW
        )
        refs = [("alpha", pending), ("alpha", decided), ("alpha", missing)]
        await store.client.script_flush()  # a restarted server: the reads load their script again
        assert [item and item.state for item in await store.inbox.get_many(refs)] == [
            "pending",
            "approved",
            None,
        ]
        hgetall_before = await hgetall_calls(store)
        with round_trips(monkeypatch) as trips:
            items = await store.inbox.get_many(refs)
        # One read_request call per item (its document, outcome and decisions at one instant); in
        # it, the pending item's decisions are not read (it has none), the missing one's nothing.
        assert trips == [3]
        assert await hgetall_calls(store) - hgetall_before == 1 + 2
        assert items == [await store.inbox.get(origin, request_id) for origin, request_id in refs]
        assert items[1] is not None
        assert items[1].approvals == {"beta": APPROVAL}

    in_store(scenario)


def test_a_pending_item_behind_ten_thousand_decided_ones_is_listed_reading_one_document(
    in_store: Run,
) -> None:
    async def scenario(store: Store) -> None:
        decided = await decided_in_inbox(store, "gamma", 10_000, expires_at=EXPIRES, now=NOW)
        waiting = new_id()
        await store.inbox.accept("alpha", waiting, DOC, expires_at=EXPIRES + 60, now=NOW)
        gets_before, commands_before = await commands_sent(store)
        pending = await store.inbox.list_requests(limit=1, now=NOW)
        gets_after, commands_after = await commands_sent(store)
        assert [(item.origin, item.request_id) for item in pending] == [("alpha", waiting)]
        # The bound: the pending set holds no decided item, so limit=1 reads one document, whatever
        # sorts before it: 2 purges, 1 range, the read_request call (EVALSHA, and in it GET and 2
        # HGETALL), and one INFO.
        assert gets_after - gets_before == 1
        assert commands_after - commands_before <= 8
        # Every state: the pending one first, then the rest in order of expiry.
        everything = await store.inbox.list_requests(state=None, limit=3, now=NOW)
        assert [item.request_id for item in everything] == [waiting, *sorted(decided)[:2]]
        assert [item.state for item in everything] == ["pending", "approved", "approved"]
        assert await store.client.zcard(store.keys.inbox_pending()) == 1

    in_store(scenario)


def test_settled_members_left_in_the_pending_set_by_a_crash_are_skipped_and_removed(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        decided = await decided_in_inbox(store, "gamma", 50, expires_at=EXPIRES, now=NOW)
        # A relay that died between settling each of them and removing it from the pending set.
        pending_key = store.keys.inbox_pending()
        await store.client.zadd(pending_key, {f"gamma/{request_id}": EXPIRES for request_id in decided})
        await store.client.expire(pending_key, 3600)
        waiting = new_id()
        await store.inbox.accept("alpha", waiting, DOC, expires_at=EXPIRES + 60, now=NOW)
        listed = await store.inbox.list_requests(limit=1, now=NOW)
        assert [item.request_id for item in listed] == [waiting]  # paged on past all 50
        assert await store.client.zrange(pending_key, 0, -1) == [f"alpha/{waiting}".encode()]
        gets_before, _commands = await commands_sent(store)
        assert [item.request_id for item in await store.inbox.list_requests(limit=1, now=NOW)] == [waiting]
        assert (await commands_sent(store))[0] - gets_before == 1  # met once, then never read again

    in_store(scenario)


def test_every_way_of_settling_a_request_takes_it_out_of_the_pending_set(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        pending_key = store.keys.request_pending()

        async def members() -> set[str]:
            return {member.decode() for member in await store.client.zrange(pending_key, 0, -1)}

        by_one, by_batch, by_expiry, by_wait, waiting = [
            await accepted(store, required=1, peers=1, expires_at=int(time.time()) + 60) for _ in range(5)
        ]
        assert await members() == {by_one, by_batch, by_expiry, by_wait, waiting}
        # The set lives as long as the index does (the latest expiry plus the retention).
        ttl, index_ttl = (
            await store.client.pttl(pending_key),
            await store.client.pttl(store.keys.request_index()),
        )
        assert ttl > 60_000
        assert abs(ttl - index_ttl) < 1000
        await store.requests.record_decision(by_one, kind="approval", signer="beta", decision=b"x")
        [answer] = await store.requests.record_decisions([DecisionToCount(by_batch, "denial", "beta", b"n")])
        assert isinstance(answer, DecisionResult)
        assert answer.decided
        later = int(time.time()) + 61
        await store.requests.settle_expiry(by_expiry, now=later)
        await store.requests.wait_outcome(by_wait, 1, clock=lambda: later)
        assert await members() == {waiting}
        # Accepted already expired, or a settled request accepted again: never pending.
        expired = new_id()
        await store.requests.accept(expired, DOC, required_approvals=1, peers=1, expires_at=NOW - 1, now=NOW)
        again = await store.requests.accept(
            by_one, DOC, required_approvals=1, peers=1, expires_at=int(time.time()) + 60
        )
        assert (again.created, again.state) == (False, "approved")
        assert await members() == {waiting}

    in_store(scenario)


def test_a_pending_set_member_whose_request_is_not_stored_yet_is_passed_over_not_removed(
    in_store: Run,
) -> None:
    async def scenario(store: Store) -> None:
        # The sets are written before the request's script runs: one may be seen half-way.
        on_its_way = new_id()
        await store.client.zadd(store.keys.request_pending(), {on_its_way: EXPIRES - 1})
        await store.client.expire(store.keys.request_pending(), 3600)
        waiting = await accepted(store)
        assert [item.request_id for item in await store.requests.list_requests(limit=1, now=NOW)] == [waiting]
        assert await store.client.zscore(store.keys.request_pending(), on_its_way) == EXPIRES - 1
        # Past its expiry it leaves, like any expired member.
        await store.requests.list_requests(now=EXPIRES)
        assert await store.client.zscore(store.keys.request_pending(), on_its_way) is None

    in_store(scenario)


def test_an_inbox_item_is_marked_queued_once_stored_and_an_unknown_one_gets_no_key(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        await store.inbox.accept("alpha", request_id, DOC, expires_at=EXPIRES, now=NOW)
        before = await store.inbox.get("alpha", request_id)
        assert before is not None
        assert not before.queued
        assert await store.inbox.mark_queued("alpha", request_id, "1-0")
        after = await store.inbox.get("alpha", request_id)
        assert after is not None
        assert after.queued
        unknown = new_id()
        assert not await store.inbox.mark_queued("alpha", unknown, "1-0")
        assert await store.client.exists(store.keys.inbox_item("alpha", unknown).outcome) == 0

    in_store(scenario)


# Withdrawal ----------------------------------------------------------------------------------------

WITHDRAWAL = b'{"statement":{"type":"teaagent.withdrawal"},"signature":"AAAA"}'


def test_a_withdrawal_is_final_wakes_the_waiter_leaves_the_pending_set_and_repeats_harmlessly(
    in_store: Run,
) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=2, peers=2, expires_at=int(time.time()) + 60)
        await store.requests.record_decision(request_id, kind="approval", signer="beta", decision=b"yes")
        waiter = asyncio.create_task(store.requests.wait_outcome(request_id, 10))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        first = await store.requests.withdraw(request_id, withdrawal=WITHDRAWAL)
        assert (first.state, first.withdrawn) == ("withdrawn", True)
        stored = await asyncio.wait_for(waiter, 5)
        assert (stored.state, stored.withdrawal, stored.decided) == ("withdrawn", WITHDRAWAL, True)
        assert stored.decided_at is not None
        # A repeat changes nothing; a decision after it is not counted and the state stays.
        again = await store.requests.withdraw(request_id, withdrawal=b'{"other":1}')
        assert (again.state, again.withdrawn) == ("withdrawn", False)
        late = await store.requests.record_decision(
            request_id, kind="approval", signer="gamma", decision=b"y"
        )
        assert (late.state, late.counted, late.decided, late.approvals) == ("withdrawn", False, False, 1)
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.state, stored.withdrawal, set(stored.approvals)) == ("withdrawn", WITHDRAWAL, {"beta"})
        assert len(outcome_events(await events(store, request_id))) == 1
        assert await store.client.zscore(store.keys.request_pending(), request_id) is None
        assert await store.requests.list_requests(state="pending") == []
        assert [item.request_id for item in await store.requests.list_requests(state="withdrawn")] == [
            request_id
        ]
        # Every key still has its TTL: the script wrote into existing keys only.
        for key in store.keys.request(request_id).all()[:4]:
            assert await store.client.pttl(key) > 0

    in_store(scenario)


def test_a_decided_or_expired_request_is_not_withdrawn_and_an_unknown_one_is_not_found(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        approved = await accepted(store, required=1, peers=1, expires_at=int(time.time()) + 60)
        await store.requests.record_decision(approved, kind="approval", signer="beta", decision=b"yes")
        result = await store.requests.withdraw(approved, withdrawal=WITHDRAWAL)
        assert (result.state, result.withdrawn) == ("approved", False)
        stored = await store.requests.get(approved)
        assert stored is not None
        assert (stored.state, stored.withdrawal) == ("approved", None)
        # Past its expiry, a withdrawal settles it expired instead: an expiry is never hidden.
        late = await accepted(store, required=1, peers=1, expires_at=NOW + 10)
        result = await store.requests.withdraw(late, withdrawal=WITHDRAWAL, now=NOW + 11)
        assert (result.state, result.withdrawn) == ("expired", False)
        at_expiry = await accepted(store, required=1, peers=1, expires_at=NOW + 10)
        result = await store.requests.withdraw(at_expiry, withdrawal=WITHDRAWAL, now=NOW + 10)
        assert (result.state, result.withdrawn) == ("withdrawn", True)
        unknown = new_id()
        with pytest.raises(RequestNotFoundError, match=f"request {unknown} is not stored here"):
            await store.requests.withdraw(unknown, withdrawal=WITHDRAWAL)
        assert await store.client.exists(*store.keys.request(unknown).all()) == 0
        with pytest.raises(TypeError, match="withdrawal must be non-empty bytes"):
            await store.requests.withdraw(approved, withdrawal=b"")

    in_store(scenario)


def test_a_withdrawn_inbox_item_leaves_the_pending_listing_and_its_decision_is_not_recorded(
    in_store: Run,
) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        expires = int(time.time()) + 60
        await store.inbox.accept("alpha", request_id, DOC, expires_at=expires)
        other = new_id()
        await store.inbox.accept("alpha", other, DOC, expires_at=expires)
        result = await store.inbox.withdraw("alpha", request_id, withdrawal=WITHDRAWAL)
        assert (result.state, result.withdrawn) == ("withdrawn", True)
        assert [item.request_id for item in await store.inbox.list_requests(state="pending")] == [other]
        listed = await store.inbox.list_requests(state=None)
        assert [(item.request_id, item.state) for item in listed] == [
            (other, "pending"),
            (request_id, "withdrawn"),
        ]
        decided = await store.inbox.record_decision(
            "alpha", request_id, kind="approval", signer="beta", decision=APPROVAL
        )
        assert (decided.state, decided.counted) == ("withdrawn", False)
        stored = await store.inbox.get("alpha", request_id)
        assert stored is not None
        assert (stored.state, stored.approvals, stored.withdrawal) == ("withdrawn", {}, WITHDRAWAL)

    in_store(scenario)
