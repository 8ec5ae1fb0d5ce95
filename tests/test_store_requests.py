"""Stored requests on a real Redis: accept once, count decisions atomically, settle the outcome once."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from store_support import (
    DOC,
    EXPIRES,
    FAIL_FAST,
    NOW,
    Run,
    accepted,
    events,
    new_id,
    outcome_events,
    round_trips,
)

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.store import MAX_DOCUMENT_BYTES, DecisionResult, DecisionToCount, Store, connect

# Accepting -----------------------------------------------------------------------------------------


def test_accept_lists_and_stores_a_request_in_one_round_trip_on_one_server(
    in_store: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(store: Store) -> tuple[list[int], bool]:
        await accepted(store)  # the script is loaded, a connection open
        with round_trips(monkeypatch) as trips:
            request_id = await accepted(store)
        listed = [stored.request_id for stored in await store.requests.list_requests(now=NOW)]
        return trips, request_id in listed

    # One write: the six index commands, then the script, in that order.
    assert in_store(scenario) == ([7], True)


def test_accept_runs_its_script_after_the_index_when_the_server_lost_it(in_store: Run) -> None:
    async def scenario(store: Store) -> tuple[bool, str | None, bool]:
        await store.client.script_flush()  # a restarted or flushed server
        request_id = new_id()
        result = await store.requests.accept(
            request_id, DOC, required_approvals=2, peers=3, expires_at=EXPIRES, now=NOW
        )
        stored = await store.requests.get(request_id)
        listed = [entry.request_id for entry in await store.requests.list_requests(now=NOW)]
        return result.created, stored.state if stored else None, request_id in listed

    assert in_store(scenario) == (True, "pending", True)


def test_accept_keeps_the_document_verbatim_and_the_same_bytes_twice_are_one_request(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        first = await store.requests.accept(
            request_id, DOC, required_approvals=2, peers=3, expires_at=EXPIRES, now=NOW
        )
        again = await store.requests.accept(
            request_id, DOC, required_approvals=2, peers=3, expires_at=EXPIRES, now=NOW
        )
        assert (first.created, first.state) == (True, "pending")
        assert (again.created, again.state) == (False, "pending")
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert stored.document == DOC
        assert (stored.state, stored.required, stored.peers, stored.expires_at) == ("pending", 2, 3, EXPIRES)
        assert (stored.accepted_at, stored.decided_at, stored.approvals, stored.denials) == (
            NOW,
            None,
            {},
            {},
        )
        assert [fields[b"type"] for fields in await events(store, request_id)] == [b"accepted"]
        listed = await store.requests.list_requests(state=None, now=NOW)
        assert [item.request_id for item in listed] == [request_id]

    in_store(scenario)


def test_a_created_request_comes_back_as_a_read_of_the_store_would_return_it(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        own_id, item_id = new_id(), new_id()
        own = await store.requests.accept(
            own_id, DOC, required_approvals=2, peers=3, expires_at=EXPIRES, now=NOW
        )
        item = await store.inbox.accept("alpha", item_id, DOC, expires_at=EXPIRES, now=NOW)
        # What the call reports it stored is, field for field, what the store holds.
        assert own.stored is not None
        assert own.stored == await store.requests.get(own_id)
        assert item.stored is not None
        assert item.stored == await store.inbox.get("alpha", item_id)
        assert (own.stored.origin, item.stored.origin) == (None, "alpha")
        # A repeat, or a request accepted already expired, is read from the store instead.
        again = await store.requests.accept(
            own_id, DOC, required_approvals=2, peers=3, expires_at=EXPIRES, now=NOW
        )
        assert again.stored is None
        late = await store.requests.accept(
            new_id(), DOC, required_approvals=1, peers=1, expires_at=NOW - 1, now=NOW
        )
        assert (late.created, late.state, late.stored) == (True, "expired", None)

    in_store(scenario)


def test_accept_refuses_another_document_under_a_stored_id_and_keeps_the_first(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        with pytest.raises(
            RequestConflictError,
            match=f"^request {request_id} already exists with a different document; the new one is refused$",
        ):
            await store.requests.accept(
                request_id, DOC + b" ", required_approvals=2, peers=3, expires_at=EXPIRES + 3600, now=NOW
            )
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert stored.document == DOC
        # Nor does the refused document move the request in the index (its expiry orders listings).
        assert await store.client.zscore(store.keys.request_index(), request_id) == EXPIRES

    in_store(scenario)


@pytest.mark.parametrize(("required", "peers"), [(0, 3), (4, 3), (-1, 0)])
def test_accept_refuses_counting_that_can_never_settle(in_store: Run, required: int, peers: int) -> None:
    async def scenario(store: Store) -> None:
        with pytest.raises(ValueError, match="required_approvals must be between 1 and peers"):
            await store.requests.accept(
                new_id(), DOC, required_approvals=required, peers=peers, expires_at=EXPIRES
            )

    in_store(scenario)


def test_accept_refuses_documents_that_are_not_bytes_or_too_large(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        with pytest.raises(TypeError, match="document must be non-empty bytes"):
            await store.requests.accept(new_id(), "text", required_approvals=1, peers=1, expires_at=EXPIRES)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="document must be non-empty bytes"):
            await store.requests.accept(new_id(), b"", required_approvals=1, peers=1, expires_at=EXPIRES)
        with pytest.raises(ValueError, match=f"above the limit of {MAX_DOCUMENT_BYTES}"):
            await store.requests.accept(
                new_id(), b"x" * (MAX_DOCUMENT_BYTES + 1), required_approvals=1, peers=1, expires_at=EXPIRES
            )
        # The limit itself passes.
        result = await store.requests.accept(
            new_id(), b"x" * MAX_DOCUMENT_BYTES, required_approvals=1, peers=1, expires_at=EXPIRES, now=NOW
        )
        assert result.created

    in_store(scenario)


def test_accepting_an_already_expired_request_records_it_expired_with_one_outcome(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        result = await store.requests.accept(
            request_id, DOC, required_approvals=1, peers=1, expires_at=NOW - 1, now=NOW
        )
        assert (result.created, result.state) == (True, "expired")
        assert len(outcome_events(await events(store, request_id))) == 1

    in_store(scenario)


# Counting ------------------------------------------------------------------------------------------


def test_quorum_story_duplicates_count_once_and_the_threshold_settles_approved_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=2, peers=3)
        record = store.requests.record_decision

        first = await record(request_id, kind="approval", signer="beta", decision=b"beta-1", now=NOW + 1)
        assert (first.state, first.approvals, first.counted, first.decided) == ("pending", 1, True, False)

        repeat = await record(request_id, kind="approval", signer="beta", decision=b"beta-2", now=NOW + 2)
        assert (repeat.state, repeat.approvals, repeat.counted, repeat.decided) == (
            "pending",
            1,
            False,
            False,
        )

        settling = await record(request_id, kind="approval", signer="gamma", decision=b"gamma-1", now=NOW + 3)
        assert (settling.state, settling.approvals, settling.counted, settling.decided) == (
            "approved",
            2,
            True,
            True,
        )

        late = await record(request_id, kind="approval", signer="delta", decision=b"delta-1", now=NOW + 4)
        assert (late.state, late.approvals, late.counted, late.decided) == ("approved", 2, False, False)

        stored = await store.requests.get(request_id)
        assert stored is not None
        assert stored.approvals == {"beta": b"beta-1", "gamma": b"gamma-1"}  # a repeat keeps the first copy
        assert (stored.state, stored.decided, stored.decided_at) == ("approved", True, NOW + 3)
        assert [fields[b"type"] for fields in await events(store, request_id)] == [
            b"accepted",
            b"decision",
            b"decision",
            b"outcome",
        ]

    in_store(scenario)


@pytest.mark.parametrize(
    ("required", "peers", "denials_to_deny"),
    [(2, 3, 2), (3, 3, 1), (1, 3, 3), (2, 5, 4)],
)
def test_denied_exactly_when_denials_exceed_peers_minus_required(
    in_store: Run, required: int, peers: int, denials_to_deny: int
) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=required, peers=peers)
        signers = [f"peer{index}" for index in range(peers)]
        for count, signer in enumerate(signers[:denials_to_deny], start=1):
            result = await store.requests.record_decision(
                request_id, kind="denial", signer=signer, decision=b"no", now=NOW
            )
            assert result.denials == count
            # One short stays pending; the threshold denies.
            assert result.state == ("denied" if count == denials_to_deny else "pending")
            assert result.decided == (count == denials_to_deny)

    in_store(scenario)


def test_a_signer_that_denied_counts_as_a_denial_only_and_a_decided_outcome_never_changes(
    in_store: Run,
) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=2, peers=3)
        record = store.requests.record_decision
        await record(request_id, kind="approval", signer="beta", decision=b"beta-yes", now=NOW)
        # PROTOCOL.md rule 6: beta's denial after its approval counts and takes the approval away,
        # whichever relay process brings it; its approval after that is not counted.
        vetoed = await record(request_id, kind="denial", signer="beta", decision=b"beta-no", now=NOW + 1)
        assert (vetoed.state, vetoed.approvals, vetoed.denials, vetoed.counted) == ("pending", 0, 1, True)
        again = await record(request_id, kind="approval", signer="beta", decision=b"beta-yes", now=NOW + 2)
        assert (again.state, again.approvals, again.denials, again.counted) == ("pending", 0, 1, False)
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.approvals, stored.denials) == ({}, {"beta": b"beta-no"})
        await record(request_id, kind="approval", signer="gamma", decision=b"gamma-yes", now=NOW + 3)
        approved = await record(
            request_id, kind="approval", signer="delta", decision=b"delta-yes", now=NOW + 4
        )
        assert (approved.state, approved.approvals, approved.denials, approved.decided) == (
            "approved",
            2,
            1,
            True,
        )
        # Decided: gamma's denial now changes nothing, and takes nothing away.
        after = await record(request_id, kind="denial", signer="gamma", decision=b"gamma-no", now=NOW + 5)
        assert (after.state, after.approvals, after.denials, after.counted, after.decided) == (
            "approved",
            2,
            1,
            False,
            False,
        )
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.approvals, stored.denials) == (
            {"gamma": b"gamma-yes", "delta": b"delta-yes"},
            {"beta": b"beta-no"},
        )
        # One event per change of the count (the long-poll wakes on each), one outcome.
        assert [
            (fields[b"type"], fields.get(b"approvals"), fields.get(b"denials"))
            for fields in await events(store, request_id)
        ] == [
            (b"accepted", None, None),
            (b"decision", b"1", b"0"),
            (b"decision", b"0", b"1"),
            (b"decision", b"1", b"1"),
            (b"decision", b"2", b"1"),
            (b"outcome", b"2", b"1"),
        ]

    in_store(scenario)


def test_a_denial_after_the_signers_approval_can_deny_the_request(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=3, peers=3)  # every peer must approve
        record = store.requests.record_decision
        await record(request_id, kind="approval", signer="beta", decision=b"a", now=NOW)
        await record(request_id, kind="approval", signer="gamma", decision=b"a", now=NOW)
        denied = await record(request_id, kind="denial", signer="beta", decision=b"d", now=NOW + 1)
        assert (denied.state, denied.approvals, denied.denials, denied.counted, denied.decided) == (
            "denied",
            1,
            1,
            True,
            True,
        )
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.state, list(stored.approvals), list(stored.denials)) == ("denied", ["gamma"], ["beta"])
        assert len(outcome_events(await events(store, request_id))) == 1

    in_store(scenario)


def test_the_decisions_keep_their_expiry_when_a_denial_replaces_the_only_approval(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=2, peers=3)
        keys = store.keys.request(request_id)
        await store.requests.record_decision(
            request_id, kind="approval", signer="beta", decision=b"a", now=NOW
        )
        await store.requests.record_decision(request_id, kind="denial", signer="beta", decision=b"d", now=NOW)
        # The hash never emptied on the way (it would have been deleted and born again without a TTL).
        assert await store.client.hkeys(keys.decisions) == [b"denial:beta"]
        # Absolute expiry times: two PTTLs read one after the other differ by the time between them.
        assert await store.client.pttl(keys.decisions) > 0
        assert await store.client.pexpiretime(keys.decisions) <= await store.client.pexpiretime(keys.outcome)

    in_store(scenario)


def test_expiry_a_decision_at_expires_at_counts_and_one_second_later_expires_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=2, peers=3)
        record = store.requests.record_decision
        at_expiry = await record(request_id, kind="approval", signer="beta", decision=b"a", now=EXPIRES)
        assert (at_expiry.state, at_expiry.counted) == ("pending", True)
        past = await record(request_id, kind="approval", signer="gamma", decision=b"a", now=EXPIRES + 1)
        assert (past.state, past.approvals, past.counted, past.decided) == ("expired", 1, False, True)
        again = await record(request_id, kind="approval", signer="delta", decision=b"a", now=EXPIRES + 2)
        assert (again.state, again.counted, again.decided) == ("expired", False, False)
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.state, stored.decided_at, list(stored.approvals)) == ("expired", EXPIRES + 1, ["beta"])
        assert len(outcome_events(await events(store, request_id))) == 1

    in_store(scenario)


def test_settle_expiry_only_acts_past_expires_at_and_only_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        early = await store.requests.settle_expiry(request_id, now=EXPIRES)
        assert (early.state, early.decided) == ("pending", False)
        late = await store.requests.settle_expiry(request_id, now=EXPIRES + 1)
        assert (late.state, late.decided) == ("expired", True)
        later = await store.requests.settle_expiry(request_id, now=EXPIRES + 9)
        assert (later.state, later.decided) == ("expired", False)

    in_store(scenario)


def test_fifty_concurrent_approvals_racing_at_the_threshold_settle_exactly_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=25, peers=50)
        results = await asyncio.gather(
            *(
                store.requests.record_decision(
                    request_id, kind="approval", signer=f"peer{index:02d}", decision=b"yes", now=NOW
                )
                for index in range(50)
            )
        )
        assert sum(result.decided for result in results) == 1
        assert sum(result.counted for result in results) == 25
        assert {result.state for result in results if result.counted and not result.decided} == {"pending"}
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.state, len(stored.approvals)) == ("approved", 25)
        assert len(outcome_events(await events(store, request_id))) == 1

    in_store(scenario)


def test_fifty_concurrent_copies_of_one_decision_count_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=2, peers=3)
        results = await asyncio.gather(
            *(
                store.requests.record_decision(
                    request_id, kind="approval", signer="beta", decision=b"yes", now=NOW
                )
                for _ in range(50)
            )
        )
        assert sum(result.counted for result in results) == 1
        assert {(result.state, result.approvals) for result in results} == {("pending", 1)}

    in_store(scenario)


def test_approvals_and_denials_racing_at_both_thresholds_settle_exactly_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        # 26 of 50: approved at the 26th approval, denied at the 25th denial; only one can win.
        request_id = await accepted(store, required=26, peers=50)
        calls = [
            store.requests.record_decision(
                request_id,
                kind="approval" if index % 2 else "denial",
                signer=f"peer{index:02d}",
                decision=b"x",
                now=NOW,
            )
            for index in range(50)
        ]
        results = await asyncio.gather(*calls)
        winners = [result for result in results if result.decided]
        assert len(winners) == 1
        assert winners[0].state == "denied"  # 25 approvals can never reach 26
        assert len(outcome_events(await events(store, request_id))) == 1

    in_store(scenario)


def test_recording_for_an_unknown_request_is_not_found(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        with pytest.raises(
            RequestNotFoundError,
            match=f"^request {request_id} is not stored here \\(it never arrived, or it expired\\)$",
        ):
            await store.requests.record_decision(request_id, kind="approval", signer="beta", decision=b"x")
        assert await store.requests.get(request_id) is None

    in_store(scenario)


@pytest.mark.parametrize(
    ("kind", "signer", "decision", "error", "message"),
    [
        ("maybe", "beta", b"x", ValueError, "decision kind must be 'approval' or 'denial'"),
        ("approval", "Beta!", b"x", ValueError, "signer 'Beta!' is not a valid agent id"),
        ("approval", "beta", b"", TypeError, "decision must be non-empty bytes"),
    ],
)
def test_record_decision_refuses_malformed_input(
    in_store: Run, kind: str, signer: str, decision: bytes, error: type[Exception], message: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        with pytest.raises(error, match=message):
            await store.requests.record_decision(request_id, kind=kind, signer=signer, decision=decision)  # type: ignore[arg-type]

    in_store(scenario)


# Counting many in one round trip ---------------------------------------------------------------------


def test_a_batch_counts_each_decision_as_record_decision_would_alone(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        first, second = await accepted(store, required=2, peers=3), await accepted(store, required=2, peers=3)
        unknown = new_id()
        answers = await store.requests.record_decisions(
            [
                DecisionToCount(first, "approval", "beta", b"beta-1", NOW + 1),
                DecisionToCount(second, "denial", "beta", b"beta-2", NOW + 1),
                DecisionToCount(first, "denial", "beta", b"beta-3", NOW + 2),  # takes beta's approval away
                DecisionToCount(unknown, "approval", "beta", b"beta-4", NOW + 2),
                DecisionToCount(first, "maybe", "gamma", b"gamma-1", NOW + 2),  # type: ignore[arg-type]
                DecisionToCount(first, "approval", "gamma", b"gamma-2", NOW + 3),
                DecisionToCount(first, "approval", "beta", b"beta-5", NOW + 3),  # beta denied: not counted
                DecisionToCount(first, "approval", "delta", b"delta-1", NOW + 3),
            ]
        )
        assert answers[0] == DecisionResult("pending", 1, 0, counted=True, decided=False)
        assert answers[1] == DecisionResult("pending", 0, 1, counted=True, decided=False)
        assert answers[2] == DecisionResult("pending", 0, 1, counted=True, decided=False)
        assert isinstance(answers[3], RequestNotFoundError)
        assert str(answers[3]) == f"request {unknown} is not stored here (it never arrived, or it expired)"
        assert isinstance(answers[4], ValueError)
        assert str(answers[4]) == "decision kind must be 'approval' or 'denial', not 'maybe'"
        assert answers[5] == DecisionResult("pending", 1, 1, counted=True, decided=False)
        assert answers[6] == DecisionResult("pending", 1, 1, counted=False, decided=False)
        assert answers[7] == DecisionResult("approved", 2, 1, counted=True, decided=True)
        stored = await store.requests.get(first)
        assert stored is not None
        assert (stored.state, stored.decided_at, stored.approvals, stored.denials) == (
            "approved",
            NOW + 3,
            {"gamma": b"gamma-2", "delta": b"delta-1"},
            {"beta": b"beta-3"},
        )
        assert len(outcome_events(await events(store, first))) == 1

    in_store(scenario)


def test_a_batch_after_the_server_lost_its_scripts_loads_them_and_counts_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=3, peers=3)
        await store.client.script_flush()
        batch = [
            DecisionToCount(request_id, "approval", signer, signer.encode(), NOW + 1)
            for signer in ("beta", "gamma", "beta")
        ]
        answers = await store.requests.record_decisions(batch)
        assert [(a.approvals, a.counted) for a in answers if isinstance(a, DecisionResult)] == [
            (1, True),
            (2, True),
            (2, False),
        ]

    in_store(scenario)


@pytest.mark.anyio
async def test_a_batch_on_an_unreachable_server_is_one_store_error_without_the_password() -> None:
    async def scenario() -> None:
        store = connect("redis://:hunter2@127.0.0.1:1/0", prefix="ta:alpha", options=FAIL_FAST)
        async with store:  # connect() does not connect: the batch is the first use
            with pytest.raises(
                StoreError, match=r"^Redis at redis://:\*\*\*@127\.0\.0\.1:1/0 is unreachable"
            ):
                await store.requests.record_decisions([DecisionToCount(new_id(), "approval", "beta", b"x")])

    await scenario()


def test_an_empty_or_wholly_malformed_batch_sends_nothing(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        assert await store.requests.record_decisions([]) == []
        answers = await store.requests.record_decisions(
            [DecisionToCount("not an id", "approval", "beta", b"x")]
        )
        assert len(answers) == 1
        assert isinstance(answers[0], ValueError)

    in_store(scenario)


# Waiting -------------------------------------------------------------------------------------------


def test_wait_outcome_wakes_on_the_outcome_event(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=1, peers=1, expires_at=int(time.time()) + 60)
        waiter = asyncio.create_task(store.requests.wait_outcome(request_id, 10))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await store.requests.record_decision(request_id, kind="approval", signer="beta", decision=b"yes")
        stored = await asyncio.wait_for(waiter, 5)
        assert (stored.state, stored.approvals) == ("approved", {"beta": b"yes"})

    in_store(scenario)


def test_wait_outcome_returns_a_decided_request_at_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=1, peers=1, expires_at=int(time.time()) + 60)
        await store.requests.record_decision(request_id, kind="denial", signer="beta", decision=b"no")
        started = time.monotonic()
        stored = await store.requests.wait_outcome(request_id, 30)
        assert stored.state == "denied"
        assert time.monotonic() - started < 5  # far below the 30 s timeout: it did not wait

    in_store(scenario)


def test_wait_outcome_blocks_on_the_stream_instead_of_polling(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=1, peers=1, expires_at=int(time.time()) + 60)

        async def counts() -> tuple[int, int]:
            stats = await store.client.info("all")
            return stats.get("cmdstat_xread", {}).get("calls", 0), stats["total_commands_processed"]

        # Once first, and the blocking reads' own pool connected, so that no handshake (HELLO and
        # two CLIENT SETINFO) falls in the window: under load the short wait may end before its
        # XREAD, and the second's handshake made 13 commands.
        await store.requests.wait_outcome(request_id, 0.01)
        await store.blocking.ping()
        xreads_before, commands_before = await counts()
        started = time.monotonic()
        stored = await store.requests.wait_outcome(request_id, 0.8)
        waited = time.monotonic() - started
        xreads_after, commands_after = await counts()
        assert stored.state == "pending"  # the timeout came first
        assert waited >= 0.75  # it did wait
        # It waited inside one blocking XREAD (two if a wake-up raced the deadline); a sleep loop
        # makes no XREAD, or a poll loop dozens, and either sends many more commands than this.
        xreads = xreads_after - xreads_before
        assert 1 <= xreads <= 2
        # Beside the XREADs, 8: the wait's start (a script and its HMGET and XREVRANGE), the final
        # read (a script, its GET and HGETALL; no decision counted, no decisions hash read) and
        # the first INFO.
        assert commands_after - commands_before <= 8 + xreads

    in_store(scenario)


def test_wait_outcome_settles_expiry_itself(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=1, peers=1, expires_at=EXPIRES)
        stored = await store.requests.wait_outcome(request_id, 30, clock=lambda: float(EXPIRES + 1))
        assert (stored.state, stored.decided_at) == ("expired", EXPIRES + 1)
        assert len(outcome_events(await events(store, request_id))) == 1

    in_store(scenario)


@pytest.mark.slow
def test_wait_outcome_wakes_at_expiry_on_the_real_clock(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store, required=1, peers=1, expires_at=int(time.time()) + 1)
        stored = await store.requests.wait_outcome(request_id, 10)
        assert stored.state == "expired"

    in_store(scenario)


def test_wait_outcome_on_an_unknown_request_is_not_found(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        with pytest.raises(RequestNotFoundError, match="is not stored here"):
            await store.requests.wait_outcome(new_id(), 1)
        with pytest.raises(ValueError, match="timeout must be >= 0 seconds"):
            await store.requests.wait_outcome(await accepted(store), -1)

    in_store(scenario)


# Delivery states -------------------------------------------------------------------------------------


def test_a_delivery_state_is_kept_per_peer_on_the_requests_own_keys_with_its_expiry(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        assert (await store.requests.get(request_id)).deliveries == {}  # type: ignore[union-attr]
        assert await store.requests.record_delivery(request_id, "beta", state="pending", attempts=0, now=NOW)
        assert await store.requests.record_delivery(
            request_id, "gamma", state="failing", attempts=1, error="gamma's relay\n is  down", now=NOW + 1
        )
        assert await store.requests.record_delivery(
            request_id, "beta", state="delivered", attempts=1, now=NOW
        )
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert {peer: (d.state, d.attempts, d.error) for peer, d in stored.deliveries.items()} == {
            "beta": ("delivered", 1, None),
            "gamma": ("failing", 1, "gamma's relay is down"),
        }
        assert stored.deliveries["gamma"].to_dict() == {
            "state": "failing",
            "attempts": 1,
            "error": "gamma's relay is down",
            "at": float(NOW + 1),
        }
        keys = store.keys.request(request_id)
        assert 0 < await store.client.pttl(keys.deliveries) <= await store.client.pttl(keys.outcome) + 1000
        waited = await store.requests.wait_outcome(request_id, 0)
        assert set(waited.deliveries) == {"beta", "gamma"}

    in_store(scenario)


def test_delivered_is_final_and_pending_never_hides_what_an_attempt_found(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        record = store.requests.record_delivery
        assert await record(request_id, "beta", state="failing", attempts=1, error="refused")
        assert not await record(request_id, "beta", state="pending", attempts=0)  # queued again
        assert await record(request_id, "beta", state="given_up", attempts=2, error="gone")
        assert await record(request_id, "beta", state="delivered", attempts=3)
        assert not await record(request_id, "beta", state="failing", attempts=1, error="a repeat failed")
        assert not await record(request_id, "beta", state="given_up", attempts=1, error="a repeat gave up")
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert (stored.deliveries["beta"].state, stored.deliveries["beta"].attempts) == ("delivered", 3)

    in_store(scenario)


def test_no_delivery_state_is_written_for_a_request_not_stored(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = new_id()
        assert not await store.requests.record_delivery(request_id, "beta", state="delivered", attempts=1)
        assert not await store.client.exists(store.keys.request(request_id).deliveries)

    in_store(scenario)


@pytest.mark.parametrize(
    ("peer", "state", "attempts", "message"),
    [
        ("Beta", "delivered", 1, "peer 'Beta' is not a valid agent id"),
        (
            "beta",
            "lost",
            1,
            "delivery state must be one of pending, delivered, failing, given_up, not 'lost'",
        ),
        ("beta", "failing", -1, "attempts must be >= 0, not -1"),
    ],
)
def test_a_malformed_delivery_state_is_refused(
    in_store: Run, peer: str, state: Any, attempts: int, message: str
) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        with pytest.raises(ValueError, match=f"^{message}$"):
            await store.requests.record_delivery(request_id, peer, state=state, attempts=attempts)

    in_store(scenario)


def test_a_delivery_record_that_cannot_be_read_is_left_out(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        request_id = await accepted(store)
        await store.requests.record_delivery(request_id, "beta", state="delivered", attempts=1)
        await store.client.hset(store.keys.request(request_id).deliveries, "gamma", b"not json")
        stored = await store.requests.get(request_id)
        assert stored is not None
        assert list(stored.deliveries) == ["beta"]

    in_store(scenario)
