"""One approver round costs what it costs with ten pending requests when ten thousand are pending.

A round reads only what is new in the inbox (``teaagent.store._inbox_news.InboxNews``: the
inbox queue's stream from the last entry it read, a page at a time) instead of listing up to a
thousand pending requests each time. Beta's inbox holds 10 pending requests, then 10,000, none of
which its rules decide (they wait for an operator); once the engine has read them all, one more
request arrives, and the round that looks at it is counted: the Redis server's own count of the
commands it ran, the same at both sizes.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from relay_support import Node, approver_in_process, asynctest, served, write_cluster

from teaagent._canonical import canonical
from teaagent.store import Store, connect

SIZES = (10, 10_000)
APPROVER_TARGET = "approver"  # the relay's name for its inbox queue's one consumer


@pytest.fixture(name="cluster")
def fixture_cluster(tmp_path: Path, redis_url: str, redis_prefix: str) -> dict[str, Node]:
    """alpha asks beta; beta's one rule matches none of alpha's requests, which stay pending."""
    return write_cluster(
        tmp_path,
        ["alpha", "beta"],
        redis_url=redis_url,
        prefix=redis_prefix,
        peers_of={"alpha": ["beta"], "beta": ["alpha"]},
        rules={"beta": '[[approver.rules]]\ntool = "none.*"\ndecision = "approve"\n'},
    )


async def receive(store: Store, alpha: Node, requests: list[dict[str, Any]]) -> None:
    """Store alpha's signed requests in beta's inbox and queue each for the approver, as the relay does."""
    for start in range(0, len(requests), 500):
        chunk = requests[start : start + 500]
        await asyncio.gather(
            *(
                store.inbox.accept(
                    "alpha", r["request_id"], canonical(alpha.signed(r)), expires_at=r["expires_at"]
                )
                for r in chunk
            )
        )
        payloads = [json.dumps({"origin": "alpha", "request_id": r["request_id"]}).encode() for r in chunk]
        await asyncio.gather(
            *(
                store.inbox_queue.enqueue(APPROVER_TARGET, r["request_id"], payload, r["expires_at"])
                for r, payload in zip(chunk, payloads, strict=True)
            )
        )


async def commands(redis_url: str) -> int:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return int((await client.info("stats"))["total_commands_processed"])
    finally:
        await client.aclose()


def asks(rounds: Any) -> int:
    """The items the rounds have left to an operator so far."""
    return len(rounds._asked)


@pytest.mark.slow
@asynctest
async def test_a_round_costs_the_same_with_ten_or_ten_thousand_pending(
    cluster: dict[str, Node], redis_url: str
) -> None:
    alpha, beta = cluster["alpha"], cluster["beta"]
    requests = [alpha.request(call_id=f"call-{index}") for index in range(max(SIZES) + len(SIZES))]
    counted: dict[int, int] = {}
    asked: dict[int, int] = {}
    store = connect(redis_url, prefix=beta.redis_prefix)
    try:
        with served(beta, deliver=False):
            # The engine's loop off: the test runs its rounds itself, one look at a time.
            async with approver_in_process(beta, engine=False) as approver:
                rounds = approver.app.state.engine.rounds  # type: ignore[attr-defined]
                held = 0
                for size in SIZES:
                    await receive(store, alpha, requests[held:size])
                    held = size
                    while True:  # read the backlog, a page a look
                        await rounds.look()
                        if rounds.news.caught_up:
                            break
                    before_asked = asks(rounds)
                    await receive(store, alpha, [requests[size + SIZES.index(size)]])
                    before = await commands(redis_url)
                    await rounds.look()
                    counted[size] = await commands(redis_url) - before - 1  # less the INFO
                    asked[size] = asks(rounds) - before_asked
    finally:
        await store.aclose()

    assert asked == {size: 1 for size in SIZES}  # the new request was looked at, and only it
    # The queue's page (XRANGE), the item's three reads, the ledger's reads of it, the EVALSHAs
    # of what the store reads in scripts: the same whatever the inbox holds.
    assert counted[10] == counted[10_000], counted
    assert counted[10] <= 10, counted
