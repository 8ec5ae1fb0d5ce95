"""A listing costs what its page costs, whatever the inbox holds: no full scan of a large inbox.

Beta's inbox holds 10 pending requests, then 2,010; ``GET /v1/requests?limit=10`` on beta's
approver (what ``teaagent approvals list --limit 10`` calls) and ``GET /v1/inbox?limit=10`` on its
relay read the same documents from Redis either way (the server's own count of GET calls, the
command that reads a stored request or a ledger entry): ten, and the approver's ledger for those ten.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis.asyncio
from relay_support import MakeCluster, Node, approver_in_process, served

from teaagent._canonical import canonical
from teaagent.store import connect

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


async def fill_inbox(beta: Node, redis_url: str, requests: list[dict[str, Any]], alpha: Node) -> None:
    """Write alpha's signed requests into beta's inbox, as its relay stores them."""
    store = connect(redis_url, prefix=beta.redis_prefix)
    try:
        for start in range(0, len(requests), 200):
            await asyncio.gather(
                *(
                    store.inbox.accept(
                        "alpha",
                        request["request_id"],
                        canonical(alpha.signed(request)),
                        expires_at=request["expires_at"],
                    )
                    for request in requests[start : start + 200]
                )
            )
    finally:
        await store.aclose()


async def documents_read(redis_url: str, call: Any) -> tuple[int, httpx.Response]:
    """The stored documents Redis served (GET calls) while ``call`` ran, and its answer."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        before = (await client.info("commandstats")).get("cmdstat_get", {}).get("calls", 0)
        response = await call()
        after = (await client.info("commandstats")).get("cmdstat_get", {}).get("calls", 0)
    finally:
        await client.aclose()
    return after - before, response


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
