"""Every key the store writes carries a TTL: after a full scenario, no key is left to live forever."""

from __future__ import annotations

import secrets
import time

import pytest
from store_support import Run

from teaagent.store import REQUEST_RETENTION_SECONDS, Intake, Store, open_store
from teaagent.tools import ToolRateLimit


@pytest.mark.anyio
async def test_every_key_of_a_full_scenario_has_a_ttl_bounded_by_expiry_plus_retention(
    redis_url: str, redis_prefix: str
) -> None:
    now = time.time()
    expires_at = int(now) + 120

    async def scenario() -> dict[str, int]:
        async with open_store(redis_url, prefix=redis_prefix) as store:
            own, received = secrets.token_hex(16), secrets.token_hex(16)
            await store.requests.accept(own, b"{}", required_approvals=2, peers=3, expires_at=expires_at)
            for signer in ("beta", "gamma"):
                await store.requests.record_decision(own, kind="approval", signer=signer, decision=b"a")
            await store.requests.list_requests()
            await store.inbox.accept("alpha", received, b"{}", expires_at=expires_at)
            await store.inbox.record_decision("alpha", received, kind="denial", signer="beta", decision=b"d")
            await store.inbox_queue.enqueue("approver", received, b"{}", expires_at)
            deliveries = store.queue("deliveries", max_attempts=2)
            for target in ("beta", "gamma"):
                await deliveries.enqueue(target, own, b"{}", expires_at)
            first, second = await deliveries.claim("w1", 2, 0)
            await deliveries.retry_later(first, "refused")  # scheduled
            await deliveries.retry_later(second, "refused")
            [again] = await deliveries.claim("w1", 1, 0, now=now + 60)
            await deliveries.retry_later(again, "refused")  # dead-lettered (second attempt of two)
            await store.rate_limiter.hit("origin:alpha", ToolRateLimit(5, 60.0))
            intake = Intake(
                store.rate_limiter, "origin:gamma", ToolRateLimit(5, 60.0), store.inbox_queue, "approver"
            )
            taken_in = secrets.token_hex(16)
            await store.inbox.receive(
                "gamma", taken_in, b"{}", expires_at=expires_at, intake=intake, payload=b"{}"
            )
            keys = [
                key.decode() async for key in store.client.scan_iter(match=store.keys.pattern(), count=1000)
            ]
            return {key: await store.client.pttl(key) for key in keys}

    ttls = await scenario()
    kinds = {key.rsplit(":", 1)[-1] for key in ttls}
    # The scenario reached every kind of key, so the check below is not vacuous.
    assert {"doc", "outcome", "decisions", "events", "index", "stream", "schedule", "dead"} <= kinds
    assert any(":gcra:" in key for key in ttls)
    assert any(":in:held:" in key for key in ttls)  # gamma's share of the inbox
    ceiling_ms = (expires_at - now + REQUEST_RETENTION_SECONDS + 1) * 1000
    for key, ttl in ttls.items():
        assert 0 < ttl <= ceiling_ms, key


async def script_calls(store: Store) -> dict[str, int]:
    """Calls of each command so far, by the server's own count (commands run by scripts included)."""
    stats = await store.client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def test_a_queue_stream_keeps_its_group_and_a_ttl_that_only_grows_one_pexpire_as_it_grows(
    in_store: Run,
) -> None:
    async def scenario(store: Store) -> None:
        queue, stream = store.queue("ttl"), store.keys.queue("ttl").stream
        far = int(time.time()) + 600

        async def ttl_after(expires_at: int) -> int:
            await queue.enqueue("peer", secrets.token_hex(16), b"{}", expires_at)
            return int(await store.client.pttl(stream))

        before = await script_calls(store)
        made = await ttl_after(far)  # the stream made: its group with it
        assert await ttl_after(far - 300) > made - 1000  # a shorter TTL leaves the longer one
        assert await ttl_after(far + 300) > made + 200_000  # a longer one extends it
        assert await ttl_after(far + 400) > made + 300_000
        await store.client.persist(stream)  # a stream left without a TTL is given one
        assert 0 < await ttl_after(far) <= made + 1000
        after = await script_calls(store)
        counted = ("pexpire", "xgroup|create", "xlen")
        calls = {name: after.get(name, 0) - before.get(name, 0) for name in counted}
        # One PEXPIRE where the TTL grows (made, longer, longer, persisted), none where it would
        # shrink; the group once, with the stream; no length to check of a stream not made yet.
        assert calls == {"pexpire": 4, "xgroup|create": 1, "xlen": 4}
        assert len(await queue.claim("w1", 10, 0)) == 5  # the group had every entry

        await store.client.delete(stream)  # expired: the next entry makes it and its group again
        await ttl_after(far)
        assert len(await queue.claim("w1", 10, 0)) == 1
        # A claim on a queue never written makes its stream and group, with a TTL; the next one
        # finds both (BUSYGROUP) and sets no TTL.
        assert await store.queue("idle").claim("w1", 1, 0) == []
        assert await store.client.pttl(store.keys.queue("idle").stream) > 0
        before = await script_calls(store)
        assert await store.queue("idle").claim("w1", 1, 0) == []
        assert (await script_calls(store)).get("pexpire", 0) == before.get("pexpire", 0)

    in_store(scenario)
