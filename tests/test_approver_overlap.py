"""While beta's relay takes one page of decisions, beta's approver reads and signs the next.

The engine's loop (``RuleRounds.run``) keeps up to ``LOOKS_AT_ONCE`` (two) looks at once while a backlog
lasts. Here beta's relay, on a real socket, holds every decision the approver posts until the
test releases them: with the looks overlapped, the approver signs the second page of its inbox
while the first page's decisions are still held; one look at a time, it would sign only the
first page's and wait. Released, every decision reaches the relay once. And a look whose read
fails (Redis down) keeps the items it was to look at again due, for the next look.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from approver_support import WAIT, metric
from redis_fixture import RestartableRedis
from relay_support import APPROVE_ECHO, MakeCluster, ServedApp, approver_in_process, until, write_cluster

from teaagent._http import client_verify
from teaagent.errors import StoreError
from teaagent.store._inbox_news import NEWS_PAGE

SECOND_PAGE = NEWS_PAGE // 2
REQUESTS = NEWS_PAGE + SECOND_PAGE
SIGNED, FORWARDED = "teaagent_approver_signatures_total", "teaagent_approver_forwards_total"


class HeldDecisions:
    """An ASGI app in front of a relay's: the approver's decision posts wait until ``release`` is set."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.release = threading.Event()
        self.held = 0  # decision posts that arrived while held

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and path.endswith(("/decision", "/decisions"))
        ):
            if not self.release.is_set():
                self.held += 1
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        await self.app(scope, receive, send)


@pytest.mark.anyio
async def test_the_approver_signs_the_next_page_while_the_relay_holds_the_last(
    make_cluster: MakeCluster,
) -> None:
    from teaagent_relay import create_app

    nodes = make_cluster("alpha", "beta", star="alpha", rules={"beta": APPROVE_ECHO})
    alpha, beta = nodes["alpha"], nodes["beta"]
    relay = HeldDecisions(create_app(beta.settings(deliver=False, inbox_rate_limit=10_000)))
    with ServedApp(relay, port=beta.port, name="beta's holding relay"):
        async with httpx.AsyncClient(timeout=10, verify=client_verify()) as client:
            for index in range(REQUESTS):  # the whole backlog before the approver starts
                request = alpha.request(call_id=f"call-{index}", arguments={"command": f"echo {index}"})
                response = await client.post(f"{beta.url}/v1/inbox", json=alpha.signed(request))
                assert response.status_code == 201, response.text
        async with approver_in_process(beta) as approver:
            # Both pages signed while the relay holds what the poster sent and has let nothing through.
            signed_both = await until(
                lambda: metric(approver, SIGNED) >= REQUESTS and relay.held >= 1,
                timeout=WAIT,
            )
            held_then = relay.held
            # Not after the held posts timed out and were put off: then one look at a time gets there too.
            put_off = metric(approver, FORWARDED, result="retry")
            forwarded_then = metric(approver, FORWARDED, result="ok")
            relay.release.set()
            # A look is timed once its decisions are answered: the last answer may come first.
            delivered = await until(
                lambda: (
                    metric(approver, FORWARDED, result="ok") >= REQUESTS
                    and metric(approver, "teaagent_approver_look_seconds_count") >= 2
                ),
                timeout=WAIT,
            )
            decided = metric(approver, "teaagent_approver_decisions_total", by="rule", kind="approval")
            looks = metric(approver, "teaagent_approver_look_seconds_count")

    assert signed_both, metric(approver, SIGNED)
    assert forwarded_then == 0
    assert put_off == 0
    assert held_then >= 1  # what the poster sent waited at the relay (it keeps two posts out at once)
    assert delivered
    assert decided == REQUESTS  # each request decided once
    assert looks == 2


@pytest.mark.anyio
async def test_a_look_whose_read_fails_keeps_the_items_due_for_another_look(
    tmp_path: Path, redis_prefix: str
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        redis_server = RestartableRedis(Path(folder))
        redis_server.start()
        try:
            url = redis_server.url
            nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=url, prefix=redis_prefix)
            beta = nodes["beta"]
            async with approver_in_process(beta, engine=False) as approver:
                rounds = approver.app.state.engine.rounds
                ref = ("alpha", "a" * 32)
                rounds._remember(ref, int(time.time()) + 600, 0.0)  # due for another look now
                redis_server.stop()
                with pytest.raises(StoreError):
                    await rounds.look()
                still_due = ref in rounds._due
        finally:
            redis_server.stop()
    assert still_due  # looked at again once Redis is back, not forgotten
