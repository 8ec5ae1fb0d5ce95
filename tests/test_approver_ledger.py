"""The approver's ledger on a real Redis: the first record and the first signature stand, whoever
races, and each costs one command (issue 29), on one server and on a Redis Cluster."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis_cluster_fixture import RedisCluster
from store_support import Run, new_id, round_trips

from teaagent.store import Store, connect
from teaagent_approver._ledger import Ledger, Record

EXPIRES_IN = 600


def record(instance: str, *, signature: str | None = None) -> Record:
    return Record(
        kind="approval",
        reason="rule 1 matched",
        by="rule 1",
        key_fingerprint="SHA256:test",
        statement={"type": "teaagent.approval", "signer": "beta", "signed_at": 1_764_570_000},
        signature=signature,
        instance=instance,
        recorded_at=time.time(),
    )


async def race(stores: list[Store]) -> None:
    """Two approver processes (a store each) claim one item, then both attach their own signature."""
    expires_at = int(time.time()) + EXPIRES_IN
    request_id = new_id()
    ledgers = [Ledger(store) for store in stores]
    mine = [record(f"process-{n}") for n in range(len(ledgers))]
    claims = await asyncio.gather(
        *(
            ledger.claim("alpha", request_id, expires_at, own)
            for ledger, own in zip(ledgers, mine, strict=True)
        )
    )
    [winner] = [claim for claim in claims if claim.won]
    assert [claim.record for claim in claims] == [winner.record] * len(claims)
    assert winner.record in mine
    assert {claim.signature for claim in claims} == {None}

    standing = await asyncio.gather(
        *(ledger.attach("alpha", request_id, expires_at, f"sig-{n}") for n, ledger in enumerate(ledgers))
    )
    assert len(set(standing)) == 1
    assert standing[0] in {"sig-0", "sig-1"}
    # The loser of the record finds the signature that stands, and so does any later claim.
    again = await ledgers[1].claim("alpha", request_id, expires_at, record("late"))
    assert (again.won, again.record, again.signature) == (False, winner.record, standing[0])
    assert await ledgers[0].read([("alpha", request_id)]) == [(winner.record, standing[0])]


def races(url: str, prefix: str, rounds: int, *, cluster: bool = False) -> None:
    """``rounds`` races (:func:`race`) between two stores of their own on ``url``."""

    async def scenario() -> None:
        stores = [connect(url, prefix=prefix, cluster=cluster) for _ in range(2)]
        try:
            for _ in range(rounds):
                await race(stores)
        finally:
            for store in stores:
                await store.aclose()

    asyncio.run(scenario())


def test_the_first_record_and_the_first_signature_stand_whoever_races(
    redis_url: str, redis_prefix: str
) -> None:
    races(redis_url, redis_prefix, 20)


def test_a_claim_and_an_attach_are_one_command_each_and_a_batch_one_round_trip(
    in_store: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario(store: Store) -> list[list[int]]:
        ledger = Ledger(store)
        expires_at = int(time.time()) + EXPIRES_IN
        ids = [new_id() for _ in range(4)]
        await ledger.read([("alpha", ids[0])])  # a connection open
        seen = []
        with round_trips(monkeypatch) as trips:
            assert (await ledger.claim("alpha", ids[0], expires_at, record("a"))).won
        seen.append(trips)
        with round_trips(monkeypatch) as trips:
            claims = await asyncio.gather(
                *(ledger.claim("alpha", request_id, expires_at, record("a")) for request_id in ids[1:])
            )
            assert all(claim.won for claim in claims)
        seen.append(trips)
        with round_trips(monkeypatch) as trips:
            assert await ledger.attach("alpha", ids[0], expires_at, "sig") == "sig"
        seen.append(trips)
        # Losing to a record whose signature is stored apart: that signature is read, one more trip.
        with round_trips(monkeypatch) as trips:
            lost = await ledger.claim("alpha", ids[0], expires_at, record("b"))
            assert (lost.won, lost.signature) == (False, "sig")
        seen.append(trips)
        # Losing to a record that carries its own signature (an operator's): nothing more to read.
        signed = new_id()
        await ledger.claim("alpha", signed, expires_at, record("operator", signature="inline"))
        with round_trips(monkeypatch) as trips:
            lost = await ledger.claim("alpha", signed, expires_at, record("b"))
            assert (lost.won, lost.signature) == (False, "inline")
        seen.append(trips)
        return seen

    assert in_store(scenario) == [[1], [3], [1], [1, 1], [1]]


def test_a_stored_record_that_cannot_be_read_fails_its_own_claim_alone(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        ledger = Ledger(store)
        expires_at = int(time.time()) + EXPIRES_IN
        broken, fine = new_id(), new_id()
        await store.client.set(store.keys.approver_item("alpha", broken).decision, b"{not json")
        answers = await asyncio.gather(
            ledger.claim("alpha", broken, expires_at, record("a")),
            ledger.claim("alpha", fine, expires_at, record("a")),
            return_exceptions=True,
        )
        assert isinstance(answers[0], ValueError)
        assert not isinstance(answers[1], BaseException)
        assert answers[1].won

    in_store(scenario)


@pytest.mark.slow
def test_the_ledger_races_the_same_on_a_redis_cluster(
    redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    races(redis_cluster.url, cluster_prefix, 10, cluster=True)
