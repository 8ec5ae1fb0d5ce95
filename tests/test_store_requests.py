"""Stored requests on a real Redis: accept once, count decisions atomically, settle the outcome once."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.store import (
    MAX_DOCUMENT_BYTES,
    MAX_PENDING_PER_ORIGIN,
    REQUEST_RETENTION_SECONDS,
    DecisionResult,
    DecisionToCount,
    Intake,
    Store,
    StoreOptions,
    connect,
)
from teaagent.store._scripts import COMPOSITES, script_source
from teaagent.store._shapes import CLUSTER, ONE_SERVER
from teaagent.tools import ToolRateLimit

T = TypeVar("T")
NOW = 1_764_570_000  # PROTOCOL.md's example clock; scripts take time from the caller, never the server
EXPIRES = NOW + 120
FAIL_FAST = StoreOptions(socket_timeout=0.3, connect_timeout=0.5, retries=0)
DOC = b'{"request":{"request_id":"...","tool_name":"shell.run"},"signature":"AAAA"}'
APPROVAL = b'{"statement":{"type":"teaagent.approval","signer":"beta"},"signature":"AAAA"}'  # read as JSON


def new_id() -> str:
    return secrets.token_hex(16)


Run = Callable[[Callable[[Store], Awaitable[Any]]], Any]


async def accepted(store: Store, *, required: int = 2, peers: int = 3, expires_at: int = EXPIRES) -> str:
    request_id = new_id()
    result = await store.requests.accept(
        request_id, DOC, required_approvals=required, peers=peers, expires_at=expires_at, now=NOW
    )
    assert result.created
    return request_id


async def events(store: Store, request_id: str) -> list[dict[bytes, bytes]]:
    entries: Any = await store.client.xrange(store.keys.request(request_id).events)
    return [fields for _id, fields in entries]


def outcome_events(entries: list[dict[bytes, bytes]]) -> list[dict[bytes, bytes]]:
    return [fields for fields in entries if fields[b"type"] == b"outcome"]


@contextlib.contextmanager
def round_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The store's round trips while inside: one entry per write to Redis, the number of commands it
    carried (read back from the bytes sent, by hiredis)."""
    import hiredis
    from redis.asyncio.connection import AbstractConnection

    trips: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        reader = hiredis.Reader()
        if isinstance(command, str):
            command = command.encode()
        reader.feed(command if isinstance(command, bytes) else b"".join(command))
        count = 0
        while reader.gets() is not False:
            count += 1
        trips.append(count)
        await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    try:
        yield trips
    finally:
        monkeypatch.undo()


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

        # Once first, so that the blocking reads' own pool has connected (its handshake is no wait).
        await store.requests.wait_outcome(request_id, 0.01)
        xreads_before, commands_before = await counts()
        started = time.monotonic()
        stored = await store.requests.wait_outcome(request_id, 0.8)
        waited = time.monotonic() - started
        xreads_after, commands_after = await counts()
        assert stored.state == "pending"  # the timeout came first
        assert waited >= 0.75  # it did wait
        # It waited inside one blocking XREAD (two if a wake-up raced the deadline); a sleep loop
        # makes no XREAD, or a poll loop dozens, and either sends many more commands than this.
        assert 1 <= xreads_after - xreads_before <= 2
        assert commands_after - commands_before <= 12  # 11: state read, XREAD, final read, INFO

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


async def decided_in_inbox(
    store: Store,
    origin: str,
    count: int,
    *,
    expires_at: int,
    now: int,
    document: Callable[[str], bytes] = lambda _request_id: DOC,
) -> list[str]:
    """Write ``count`` items from ``origin``, each approved here, in pipelines (well under a second).

    The store's own scripts, as ``InboxBook.accept`` and ``record_decision`` run them, only not one
    round trip each: what ten thousand items approved over a busy day leave in the store.
    """
    accept, record = [
        await store.client.script_load(script_source(name)) for name in ("accept_request", "record_decision")
    ]
    request_ids = [new_id() for _ in range(count)]
    index = store.keys.inbox_index()
    for start in range(0, count, 1000):
        async with store.client.pipeline(transaction=False) as pipe:
            for request_id in request_ids[start : start + 1000]:
                keys = store.keys.inbox_item(origin, request_id)
                pipe.zadd(index, {f"{origin}/{request_id}": expires_at})
                pipe.evalsha(
                    accept, 3, keys.doc, keys.outcome, keys.events,
                    document(request_id), 1, 1, expires_at, now, REQUEST_RETENTION_SECONDS, 1000,
                )  # fmt: skip
                pipe.evalsha(
                    record, 3, keys.outcome, keys.decisions, keys.events,
                    "approval", "beta", APPROVAL, now, 1000,
                )  # fmt: skip
            await pipe.execute()
    await store.client.expire(index, expires_at - now + REQUEST_RETENTION_SECONDS)
    last = await store.inbox.get(origin, request_ids[-1])
    assert last is not None
    assert last.state == "approved"
    return request_ids


async def commands_sent(store: Store) -> tuple[int, int]:
    """Documents read (GET calls) and commands processed so far, by the server's own count."""
    stats = await store.client.info("all")
    return stats.get("cmdstat_get", {}).get("calls", 0), stats["total_commands_processed"]


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
        # sorts before it: 2 purges, 1 range, GET and 2 HGETALL, and one INFO.
        assert gets_after - gets_before == 1
        assert commands_after - commands_before <= 7
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


PATHS = pytest.mark.parametrize("path", ["script", "steps"])


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


def test_receive_loads_its_script_when_the_server_lost_it(in_store: Run) -> None:
    async def scenario(store: Store) -> tuple[bool, bool]:
        await store.client.script_flush()  # a restarted or flushed server
        request_id = new_id()
        result = await received(store, "script", request_id)
        stored = await store.inbox.get("alpha", request_id)
        return result.accepted.created, stored is not None and stored.queued

    assert in_store(scenario) == (True, True)


@pytest.mark.parametrize("name", sorted(COMPOSITES))
def test_a_composite_script_is_its_parts_own_text_then_its_own(name: str) -> None:
    source = script_source(name)
    for part in COMPOSITES[name]:
        assert f"local function {part}(KEYS, ARGV)\n{script_source(part).rstrip()}\nend\n" in source
    assert source.endswith(
        (Path(__file__).parents[1] / f"libs/teaagent/store/lua/{name}.lua").read_text(encoding="utf-8")
    )


def test_withdrawing_and_settling_close_a_pending_request_with_one_part() -> None:
    assert COMPOSITES["withdraw"] == COMPOSITES["settle_elsewhere"] == ("close_pending",)


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
