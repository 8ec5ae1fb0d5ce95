"""Work queues on a real Redis: claim and ack, reclaim after a crash, backoff, dead letters."""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from teaagent.errors import StoreError
from teaagent.store import Delivery, DeliveryQueue, Store, backoff_delay
from teaagent.store._inbox_news import InboxNews

T = TypeVar("T")
PAYLOAD = '{"request":{"tool_name":"shell.run","arguments":{"command":"echo é \\" ☃"}}}'.encode()


class Lowest(random.Random):
    """Jitter pinned to its lowest value, so each delay is exactly half its ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return a


class Highest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


def new_id() -> str:
    return secrets.token_hex(16)


Run = Callable[[Callable[[Store], Awaitable[Any]]], Any]


async def one(queue: DeliveryQueue, consumer: str = "w1", **kwargs: Any) -> Delivery:
    claimed = await queue.claim(consumer, 1, 0, **kwargs)
    assert len(claimed) == 1
    return claimed[0]


# Backoff -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "ceiling"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (6, 16.0), (7, 30.0), (40, 30.0)]
)
def test_backoff_doubles_to_the_cap_with_jitter_in_the_upper_half(failures: int, ceiling: float) -> None:
    assert backoff_delay(failures, rng=Lowest()) == ceiling / 2
    assert backoff_delay(failures, rng=Highest()) == ceiling
    for seed in range(20):
        assert ceiling / 2 <= backoff_delay(failures, rng=random.Random(seed)) <= ceiling


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="failures must be >= 1, not 0"):
        backoff_delay(0)
    with pytest.raises(ValueError, match="base and cap must be positive"):
        backoff_delay(1, base=0)


# Claim and ack -------------------------------------------------------------------------------------


def test_enqueue_claim_ack_hands_the_entry_over_once(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.deliveries
        request_id, expires_at = new_id(), int(time.time()) + 60
        entry_id = await queue.enqueue("beta", request_id, PAYLOAD, expires_at)
        delivery = await one(queue)
        assert delivery.entry_id == entry_id
        assert (delivery.target, delivery.request_id, delivery.payload) == ("beta", request_id, PAYLOAD)
        assert (delivery.expires_at, delivery.attempts, delivery.last_error) == (expires_at, 0, None)
        assert await queue.claim("w2", 10, 0) == []  # in w1's hands, not idle long enough to reclaim
        assert await queue.ack(delivery) is True
        assert await queue.ack(delivery) is False
        stats = await queue.stats()
        assert (stats.length, stats.pending, stats.scheduled, stats.dead) == (0, 0, 0, 0)

    in_store(scenario)


def test_claim_blocks_until_an_entry_arrives(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.deliveries
        assert await queue.claim("w1", 10, 0) == []  # creates the group on an empty queue

        async def later() -> None:
            await asyncio.sleep(0.2)
            await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)

        producer = asyncio.create_task(later())
        claimed = await queue.claim("w1", 10, 2000)
        await producer
        assert [delivery.target for delivery in claimed] == ["beta"]

    in_store(scenario)


async def command_calls(store: Store, *names: str) -> dict[str, int]:
    """Calls of each of ``names`` so far, by the server's count (commands run by scripts included)."""
    stats = await store.client.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names}


def test_claims_in_a_row_are_one_round_trip_each_the_housekeeping_once_in_a_while(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        # Its housekeeping at most every 15 s (a quarter of min_idle_seconds): none due in this test.
        queue = store.queue("deliveries", min_idle_seconds=60, housekeeping_seconds=3600)
        await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        counted = ("zrangebyscore", "xautoclaim", "xreadgroup")  # promote_due's, the takeover, the read
        before = await command_calls(store, *counted)
        assert len(await queue.claim("w1", 10, 0)) == 1
        for _ in range(4):
            assert await queue.claim("w1", 10, 0) == []
        after = await command_calls(store, *counted)
        assert {name: after[name] - before[name] for name in counted} == {
            "zrangebyscore": 1,
            "xautoclaim": 1,
            "xreadgroup": 5,
        }
        # Its time come, a claim runs it again.
        often = store.queue("deliveries", housekeeping_seconds=0.05)
        assert await often.claim("w1", 10, 0) == []  # a queue's first claim runs it
        await asyncio.sleep(0.1)  # past its time (at least: a loaded host only makes it later)
        assert await often.claim("w1", 10, 0) == []
        again = await command_calls(store, *counted)
        assert again["zrangebyscore"] - after["zrangebyscore"] == 2
        assert again["xautoclaim"] - after["xautoclaim"] == 2

    in_store(scenario)


def test_a_claim_makes_the_stream_and_its_group_again_at_once_after_they_expired(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue, stream = store.queue("deliveries"), store.keys.queue("deliveries").stream
        assert await queue.claim("w1", 1, 0) == []  # makes the stream and its group
        await store.client.delete(stream)  # its TTL ran out
        assert await queue.claim("w1", 1, 0) == []  # NOGROUP: nothing to read, and no error
        assert await queue.claim("w1", 1, 0) == []  # the next claim makes them again, not a second later
        assert len(await store.client.xinfo_groups(stream)) == 1

    in_store(scenario)


def test_a_retry_another_process_scheduled_is_claimed_at_its_next_housekeeping(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        failing = store.queue("deliveries", rng=Lowest())  # one relay process's worker
        claiming = store.queue("deliveries")  # another's, on the same queue: it knows of no retry
        await failing.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        delivery = await one(failing)
        assert await claiming.claim("w2", 1, 0) == []  # its housekeeping ran: nothing was scheduled
        result = await failing.retry_later(delivery, "beta answered 503")
        assert result.action == "retry"
        assert result.not_before is not None  # due in 0.25 s
        deadline = time.monotonic() + 30
        while not (claimed := await claiming.claim("w2", 1, 100)):
            assert time.monotonic() < deadline, "the retry was never claimed"
        assert time.time() >= result.not_before  # never before it was due
        assert (claimed[0].payload, claimed[0].attempts) == (PAYLOAD, 1)

    in_store(scenario)


def test_an_entry_of_a_crashed_consumer_is_reclaimed_by_another_after_min_idle(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        # Two workers' views of one queue: worker-b's reclaims after 0.2 s of idleness. Before it,
        # worker-a's view (60 s) checks that a fresh entry is not taken over: with 0.2 s there too,
        # a pause of 0.2 s on a loaded host between the two claims would let it be, rightly.
        queue = store.queue("deliveries", min_idle_seconds=60)
        await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        crashed = await one(queue, "worker-a")  # worker-a dies here: it never acks
        assert await queue.claim("worker-b", 10, 0) == []
        rescuer = store.queue("deliveries", min_idle_seconds=0.2)
        await asyncio.sleep(0.3)  # idleness is time itself: at least this long, however loaded
        rescued = await one(rescuer, "worker-b")
        assert (rescued.entry_id, rescued.payload) == (crashed.entry_id, PAYLOAD)
        assert await queue.ack(rescued) is True
        assert (await queue.stats()).pending == 0

    in_store(scenario)


def test_consumers_of_dead_processes_are_pruned_once_they_hold_nothing(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        # Nothing is taken over while the scene is set (60 s); the rescue below reclaims after 0.1 s.
        queue = store.queue("deliveries", min_idle_seconds=60)
        assert await queue.prune_consumers("live") == []  # no stream, no group: nothing to do
        for _ in range(2):
            await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        crashed = await one(queue, "crashed")  # dies holding an entry
        done = await one(queue, "restarted")  # an earlier process of this host: finished its work
        assert await queue.ack(done) is True
        await queue.claim("live", 10, 0)
        await asyncio.sleep(0.2)
        # The live worker is kept as the caller; the one holding an entry is kept: removing it
        # would leave its entry unclaimable.
        assert await queue.prune_consumers("live", min_idle_seconds=0.15) == ["restarted"]
        consumers = await store.client.xinfo_consumers(store.keys.queue("deliveries").stream, "workers")
        assert sorted(consumer["name"] for consumer in consumers) == [b"crashed", b"live"]
        # Once its entry is taken over, the crashed consumer holds nothing and goes too.
        rescued = await one(store.queue("deliveries", min_idle_seconds=0.1), "live")
        assert rescued.entry_id == crashed.entry_id
        await asyncio.sleep(0.2)
        assert await queue.prune_consumers("live", min_idle_seconds=0.15) == ["crashed"]
        # A consumer that read recently stays, whatever it holds.
        assert await queue.prune_consumers("someone-else", min_idle_seconds=60) == []
        with pytest.raises(ValueError, match=r"^min_idle_seconds must be positive, not 0$"):
            await queue.prune_consumers("live", min_idle_seconds=0)

    in_store(scenario)


def test_entries_are_listed_without_claiming_and_removed_claimed_or_not(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.queue("inbox")
        first = await queue.enqueue("approver", new_id(), PAYLOAD, int(time.time()) + 60)
        second = await queue.enqueue("approver", new_id(), PAYLOAD, int(time.time()) + 60)
        held = await one(queue, "approver-1")  # the first is in a consumer's hands
        assert [entry.entry_id for entry in await queue.entries()] == [first, second]
        assert [entry.entry_id for entry in await queue.entries(1)] == [first]
        assert (await queue.stats()).pending == 1
        assert await queue.remove([held.entry_id, second, "1-1"]) == 2
        assert await queue.remove([]) == 0
        stats = await queue.stats()
        assert (stats.length, stats.pending) == (0, 0)
        assert await queue.ack(held) is False  # removed: nothing left to acknowledge

    in_store(scenario)


def test_claim_count_bounds_the_batch(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.deliveries
        for _ in range(5):
            await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        assert len(await queue.claim("w1", 3, 0)) == 3
        assert len(await queue.claim("w1", 3, 0)) == 2
        with pytest.raises(ValueError, match="count must be between 1 and 100, not 0"):
            await queue.claim("w1", 0)
        with pytest.raises(ValueError, match="count must be between 1 and 100, not 101"):
            await queue.claim("w1", 101)
        with pytest.raises(ValueError, match="block_ms must be >= 0, not -1"):
            await queue.claim("w1", 1, -1)
        with pytest.raises(ValueError, match="consumer must be a non-empty printable name"):
            await queue.claim("", 1)

    in_store(scenario)


# Retries and dead letters --------------------------------------------------------------------------


def test_failed_attempts_come_back_after_growing_delays(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.queue("deliveries", rng=Lowest(), max_attempts=10)
        now = time.time()
        await queue.enqueue("beta", new_id(), PAYLOAD, int(now) + 3600, now=now)
        delivery = await one(queue, now=now)
        delays = []
        for attempt in range(1, 6):
            result = await queue.retry_later(delivery, f"beta answered 503 (try {attempt})", now=now)
            assert (result.action, result.attempts) == ("retry", attempt)
            assert result.not_before is not None
            delays.append(round(result.not_before - now, 3))
            [(not_before, waiting)] = await queue.scheduled()
            assert not_before == pytest.approx(result.not_before, abs=0.002)
            assert waiting.payload == PAYLOAD
            # Not due a millisecond early; due at its time, with the count and the error carried along.
            assert await queue.claim("w1", 1, 0, now=result.not_before - 0.01) == []
            now = result.not_before
            delivery = await one(queue, now=now)
            assert (delivery.attempts, delivery.last_error) == (attempt, f"beta answered 503 (try {attempt})")
            assert delivery.payload == PAYLOAD  # UTF-8, quotes and backslashes survive the round trip
        assert delays == [0.25, 0.5, 1.0, 2.0, 4.0]

    in_store(scenario)


def test_an_entry_that_keeps_failing_is_dead_lettered_after_max_attempts(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.queue("deliveries", max_attempts=3, rng=Lowest())
        now = time.time()
        request_id = new_id()
        await queue.enqueue("beta", request_id, PAYLOAD, int(now) + 3600, now=now)
        for attempt in (1, 2):
            delivery = await one(queue, now=now)
            result = await queue.retry_later(delivery, "connection refused", now=now)
            assert (result.action, result.attempts) == ("retry", attempt)
            now = result.not_before or now
        last = await one(queue, now=now)
        result = await queue.retry_later(last, "connection refused", now=now)
        assert (result.action, result.attempts, result.not_before) == ("dead", 3, None)
        [letter] = await queue.dead_letters()
        assert letter.error == "connection refused; gave up after 3 attempts"
        assert (letter.delivery.request_id, letter.delivery.payload, letter.delivery.attempts) == (
            request_id,
            PAYLOAD,
            3,
        )
        assert letter.delivery.entry_id == last.entry_id
        assert letter.dead_at == pytest.approx(now, abs=0.002)
        stats = await queue.stats()
        assert (stats.length, stats.pending, stats.scheduled, stats.dead) == (0, 0, 0, 1)

    in_store(scenario)


def test_without_an_attempt_bound_an_entry_is_retried_until_its_request_expires(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.queue("deliveries", max_attempts=None, retry_cap_seconds=30.0, rng=Highest())
        start = time.time()
        expires_at = int(start) + 3600  # an hour: a peer down for most of it still gets the entry
        await queue.enqueue("beta", new_id(), PAYLOAD, expires_at, now=start)
        now, attempts = start, 0
        while True:
            delivery = await one(queue, now=now)
            result = await queue.retry_later(delivery, "connection refused", now=now)
            attempts += 1
            if result.action == "dead":
                break
            assert result.action == "retry"
            assert result.not_before is not None
            now = result.not_before
        # Thirty seconds apart once capped, until the next attempt would fall after the expiry.
        assert attempts > 100
        assert expires_at - 30 < now <= expires_at
        [letter] = await queue.dead_letters()
        assert letter.error == "connection refused; the request expires before another attempt"

    in_store(scenario)


def test_a_retry_that_would_come_after_expiry_is_dead_lettered_now(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.queue("deliveries", retry_base_seconds=5.0, rng=Lowest())
        now = time.time()
        await queue.enqueue("beta", new_id(), PAYLOAD, int(now) + 2, now=now)
        result = await queue.retry_later(await one(queue, now=now), "timed out", now=now)
        assert result.action == "dead"
        [letter] = await queue.dead_letters()
        assert letter.error == "timed out; the request expires before another attempt"

    in_store(scenario)


def test_an_entry_whose_request_expired_is_dead_lettered_instead_of_claimed(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.deliveries
        now = time.time()
        await queue.enqueue("beta", new_id(), PAYLOAD, int(now) + 5, now=now)
        assert await queue.claim("w1", 10, 0, now=now + 6) == []
        [letter] = await queue.dead_letters()
        assert letter.error == "the request expired before it was delivered"

    in_store(scenario)


def test_retry_later_of_an_entry_finished_elsewhere_changes_nothing(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.deliveries
        await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        delivery = await one(queue)
        assert await queue.ack(delivery)
        result = await queue.retry_later(delivery, "late failure report")
        assert (result.action, result.attempts) == ("gone", 0)
        stats = await queue.stats()
        assert (stats.scheduled, stats.dead) == (0, 0)

    in_store(scenario)


# Limits and input ----------------------------------------------------------------------------------


def test_a_full_queue_refuses_new_entries(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        queue = store.queue("deliveries", max_length=2)
        for _ in range(2):
            await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)
        with pytest.raises(
            StoreError, match=r"^queue deliveries already holds 2 entries; its consumers do not keep up$"
        ):
            await queue.enqueue("beta", new_id(), PAYLOAD, int(time.time()) + 60)

    in_store(scenario)


@pytest.mark.parametrize(
    ("target", "request_id", "payload", "error", "message"),
    [
        ("", "0" * 32, b"{}", ValueError, "target must be 1 to 256 printable characters"),
        ("beta\n", "0" * 32, b"{}", ValueError, "target must be 1 to 256 printable characters"),
        ("beta", "not-an-id", b"{}", ValueError, "request id 'not-an-id' is not 32 lowercase hex characters"),
        ("beta", "0" * 32, "{}", TypeError, "payload must be bytes"),
        ("beta", "0" * 32, b"\xff\xfe", ValueError, "payload must be UTF-8 text"),
    ],
)
def test_enqueue_refuses_malformed_entries(
    in_store: Run, target: str, request_id: str, payload: Any, error: type[Exception], message: str
) -> None:
    async def scenario(store: Store) -> None:
        with pytest.raises(error, match=message):
            await store.deliveries.enqueue(target, request_id, payload, int(time.time()) + 60)

    in_store(scenario)


def test_queues_of_different_names_are_separate(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        await store.inbox_queue.enqueue("approver", new_id(), PAYLOAD, int(time.time()) + 60)
        assert await store.deliveries.claim("w1", 10, 0) == []
        assert [delivery.target for delivery in await store.inbox_queue.claim("w1", 10, 0)] == ["approver"]
        assert store.inbox_queue.name == "inbox"

    in_store(scenario)


def test_news_a_wait_brought_is_read_without_another_round_trip(in_store: Run) -> None:
    async def scenario(store: Store) -> None:
        news = InboxNews(store)
        assert await news.read() == []  # an empty inbox: caught up
        assert news.caught_up
        payload = json.dumps({"origin": "alpha"}).encode()
        entry_id = await store.inbox_queue.enqueue("approver", new_id(), payload, int(time.time()) + 60)
        before = await command_calls(store, "xread", "xrange")
        assert await news.wait(30) is True  # the entry is there already: at once
        assert await news.read() == []  # (no such request stored: nothing pending to show)
        after = await command_calls(store, "xread", "xrange")
        assert {name: after[name] - before[name] for name in after} == {"xread": 1, "xrange": 0}
        assert news.cursor == entry_id  # past it: the next wait waits for what comes after
        assert await news.wait(0.05) is False
        await news.read()  # nothing brought: the page is read
        assert (await command_calls(store, "xrange"))["xrange"] == after["xrange"] + 1

    in_store(scenario)
