"""A listing costs what its page costs, whatever the inbox holds: no full scan of a large inbox.

Beta's inbox holds 10 pending requests, then 2,010; ``GET /v1/requests?limit=10`` on beta's
approver (what ``teaagent approvals list --limit 10`` calls) and ``GET /v1/inbox?limit=10`` on its
relay read the same documents from Redis either way (the server's own count of GET calls, the
command that reads a stored request or a ledger entry): ten, and the approver's ledger for those ten.

One approver round costs the same too (issue 29): it reads only what is new in the inbox (the inbox
queue's stream from the last entry it read, a page at a time, ``InboxNews``) instead of listing up
to a thousand pending requests. With 10, then 10,000 pending requests its rules leave to an
operator, once the engine has read them all, one more arrives, and the round that looks at it sends
the same Redis commands at both sizes (the server's own count).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import redis.asyncio
from approver_support import metric
from relay_support import MakeCluster, Node, approver_in_process, served
from store_support import documents_read

from teaagent._canonical import canonical
from teaagent.store import Store, connect

MANY = 2_010  # past the relay's bound on one listing (1,000): a listing of all would show


@pytest.fixture(name="cluster")
def fixture_cluster(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks beta; beta's one rule matches none of alpha's requests, which stay pending."""
    return make_cluster(
        "alpha",
        "beta",
        star="alpha",
        rules={"beta": '[[approver.rules]]\ntool = "none.*"\ndecision = "approve"\n'},
    )


async def accept(store: Store, alpha: Node, requests: list[dict[str, Any]]) -> None:
    """Store alpha's signed requests in beta's inbox, as its relay stores them."""
    await asyncio.gather(
        *(
            store.inbox.accept(
                "alpha",
                request["request_id"],
                canonical(alpha.signed(request)),
                expires_at=request["expires_at"],
            )
            for request in requests
        )
    )


async def fill_inbox(beta: Node, redis_url: str, requests: list[dict[str, Any]], alpha: Node) -> None:
    """Write alpha's signed requests into beta's inbox, as its relay stores them."""
    store = connect(redis_url, prefix=beta.redis_prefix)
    try:
        for start in range(0, len(requests), 200):
            await accept(store, alpha, requests[start : start + 200])
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_page_of_ten_reads_ten_documents_with_ten_or_two_thousand_pending(
    cluster: dict[str, Node], redis_url: str
) -> None:
    alpha, beta = cluster["alpha"], cluster["beta"]
    requests = [alpha.request(call_id=f"call-{index}") for index in range(MANY)]
    counts: dict[int, tuple[int, int, int, int]] = {}
    with served(beta, deliver=False):
        # The engine off: its own rounds (which list the relay's whole bound) would read Redis
        # while a listing is counted; the operators' listing is what is measured here.
        async with (
            approver_in_process(beta, engine=False) as approver,
            httpx.AsyncClient(base_url=beta.url) as relay,
        ):
            approver.headers["Authorization"] = f"Bearer {beta.token}"
            held = 0
            for size in (10, MANY):
                await fill_inbox(beta, redis_url, requests[held:size], alpha)
                held = size
                listed, approvals = await documents_read(
                    redis_url, lambda: approver.get("/v1/requests", params={"limit": 10})
                )
                paged, page = await documents_read(
                    redis_url, lambda: relay.get("/v1/inbox", params={"limit": 10}, headers=beta.headers)
                )
                assert approvals.status_code == 200, approvals.text
                assert page.status_code == 200, page.text
                counts[size] = (listed, len(approvals.json()["items"]), paged, len(page.json()))

    # The same reads with ten pending as with two thousand: the relay's page of ten, and the
    # approver's ledger for those ten (the whole bound of 1,000, and its ledger for each, before
    # the approver passed its page down to the relay).
    assert counts[10] == counts[MANY]
    listed, shown, paged, page_size = counts[MANY]
    assert (shown, paged, page_size) == (10, 10, 10)
    assert listed <= 3 * 10


# -- one approver round (issue 29) ------------------------------------------------------------------

SIZES = (10, 10_000)
APPROVER_TARGET = "approver"  # the relay's name for its inbox queue's one consumer


async def receive(store: Store, alpha: Node, requests: list[dict[str, Any]]) -> None:
    """Store alpha's signed requests in beta's inbox and queue each for the approver, as the relay does."""
    for start in range(0, len(requests), 500):
        chunk = requests[start : start + 500]
        await accept(store, alpha, chunk)
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


def looks(approver: Any) -> tuple[float, float]:
    """The approver's timed looks so far: its ``look_seconds`` histogram's count and sum."""
    name = "teaagent_approver_look_seconds"
    return metric(approver, f"{name}_count"), metric(approver, f"{name}_sum")


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_round_costs_the_same_with_ten_or_ten_thousand_pending(
    cluster: dict[str, Node], redis_url: str
) -> None:
    alpha, beta = cluster["alpha"], cluster["beta"]
    requests = [alpha.request(call_id=f"call-{index}") for index in range(max(SIZES) + len(SIZES))]
    counted: dict[int, int] = {}
    asked: dict[int, int] = {}
    timings: dict[int, tuple[float, bool, bool]] = {}
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
                    timed = looks(approver)
                    before = await commands(redis_url)
                    await rounds.look()
                    counted[size] = await commands(redis_url) - before - 1  # less the INFO
                    asked[size] = asks(rounds) - before_asked
                    # The look is timed once (what bench quorum --peers reads), and a look that
                    # finds nothing new is not timed.
                    after = looks(approver)
                    await rounds.look()
                    timings[size] = (after[0] - timed[0], after[1] > timed[1], looks(approver) == after)
    finally:
        await store.aclose()

    assert asked == {size: 1 for size in SIZES}  # the new request was looked at, and only it
    assert timings == {size: (1.0, True, True) for size in SIZES}
    # The queue's page (XRANGE), the item's three reads, the ledger's reads of it, the EVALSHAs
    # of what the store reads in scripts: the same whatever the inbox holds.
    assert counted[10] == counted[10_000], counted
    assert counted[10] <= 10, counted
