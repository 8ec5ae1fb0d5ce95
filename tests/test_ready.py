"""``GET /ready`` of the relay, the approver and the agent service: it tells the truth.

Each test runs its own Redis (a real server on a port of its own), stops it and starts it again on
the same port, and reads each service's readiness over real sockets while it is gone and back.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis_fixture import RestartableRedis
from relay_support import MakeCluster, Served, ServedApp, wait_until, write_cluster

from teaagent._http import client_verify
from teaagent._tasks import cancel_and_wait
from teaagent.errors import StoreError

pytestmark = pytest.mark.slow


@pytest.fixture(name="own_redis")
def fixture_own_redis() -> Iterator[RestartableRedis]:
    with tempfile.TemporaryDirectory() as folder:
        server = RestartableRedis(Path(folder))
        server.start()
        try:
            yield server
        finally:
            server.stop()


def ready(url: str) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{url}/ready", timeout=10, verify=client_verify())
    return response.status_code, response.json()


def states(document: dict[str, Any]) -> dict[str, str]:
    return {name: dependency["state"] for name, dependency in document["dependencies"].items()}


def becomes(url: str, status: int) -> dict[str, Any]:
    """Poll ``/ready`` (the test's observer) until it answers ``status``; return that document."""
    seen: list[tuple[int, dict[str, Any]]] = []

    def probe() -> bool:
        seen.append(ready(url))
        return seen[-1][0] == status

    assert wait_until(probe, timeout=20, interval=0.1), f"/ready never answered {status}: {seen[-1]}"
    return seen[-1][1]


def test_the_relay_is_not_ready_while_its_redis_is_down_and_ready_again_after(
    tmp_path: Path, own_redis: RestartableRedis, redis_prefix: str
) -> None:
    nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=own_redis.url, prefix=redis_prefix)
    with Served(nodes["alpha"]) as relay:
        status, document = ready(relay.url)
        assert status == 200, document
        assert document["status"] == "ready"
        assert document["service"] == "relay"
        assert states(document) == {"store": "ok", "worker": "ok"}

        own_redis.stop()
        document = becomes(relay.url, 503)
        assert document["error"] == "unavailable"
        assert document["message"].startswith("The relay is not ready: store (")
        assert document["message"].endswith(").")
        assert states(document) == {"store": "failing", "worker": "ok"}

        own_redis.start()
        assert states(becomes(relay.url, 200)) == {"store": "ok", "worker": "ok"}


def test_the_relay_is_not_ready_when_its_delivery_worker_died(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta")
    with Served(nodes["alpha"]) as relay:
        assert ready(relay.url)[0] == 200
        task = relay.app.state.delivery_task
        # Cancelled until it has stopped: on Python 3.11 one cancel() can be lost inside redis-py's
        # wait_for (CPython gh-86296), and the worker then claims on as if never cancelled.
        asyncio.run_coroutine_threadsafe(cancel_and_wait(task), task.get_loop()).result(timeout=20)
        document = becomes(relay.url, 503)
        assert states(document) == {"store": "ok", "worker": "failing"}
        assert (
            document["message"] == "The relay is not ready: worker (the delivery worker stopped (cancelled))."
        )


def test_the_relay_documents_ready(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta")
    with Served(nodes["alpha"]) as relay:
        paths = httpx.get(f"{relay.url}/openapi.json", timeout=10).json()["paths"]
    answers = paths["/ready"]["get"]["responses"]
    assert answers["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ReadyOut"
    }
    assert answers["503"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/NotReadyOut"
    }


@contextlib.contextmanager
def approver(node: Any, **overrides: Any) -> Iterator[ServedApp]:
    from teaagent_approver import create_app

    with ServedApp(create_app(node.approver_settings(**overrides)), name="approver") as served:
        yield served


def test_the_approver_is_not_ready_while_its_redis_or_its_relay_is_down(
    tmp_path: Path, own_redis: RestartableRedis, redis_prefix: str
) -> None:
    nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=own_redis.url, prefix=redis_prefix)
    relay = Served(nodes["alpha"]).__enter__()
    try:
        with approver(nodes["alpha"]) as served:
            assert states(becomes(served.url, 200)) == {"store": "ok", "relay": "ok", "engine": "ok"}

            own_redis.stop()
            document = becomes(served.url, 503)
            assert document["error"] == "unavailable"
            assert states(document)["store"] == "failing"
            assert document["message"].startswith("The approver is not ready: store (")
            own_redis.start()
            becomes(served.url, 200)

            relay.__exit__(None, None, None)
            document = becomes(served.url, 503)
            # The engine's rounds read the inbox's news from the store: with nothing to hand the
            # relay, they do not fail while it is down.
            assert states(document) == {"store": "ok", "relay": "failing", "engine": "ok"}
            assert "relay (" in document["message"]

            relay = Served(nodes["alpha"]).__enter__()
            assert states(becomes(served.url, 200)) == {"store": "ok", "relay": "ok", "engine": "ok"}
    finally:
        relay.__exit__(None, None, None)


def test_the_approver_is_not_ready_while_its_engine_rounds_fail(
    monkeypatch: pytest.MonkeyPatch, make_cluster: MakeCluster
) -> None:
    from teaagent.store._inbox_news import InboxNews

    nodes = make_cluster("alpha", "beta")
    read = InboxNews.read
    failing = True

    async def moved(self: InboxNews, *args: Any) -> Any:
        # What a plain client of a Redis Cluster is told for a key of another node's slot.
        if failing:
            raise StoreError("MOVED 12182 127.0.0.1:7002")
        return await read(self, *args)

    monkeypatch.setattr(InboxNews, "read", moved)
    with Served(nodes["alpha"]), approver(nodes["alpha"]) as served:
        document = becomes(served.url, 503)
        assert states(document) == {"store": "ok", "relay": "ok", "engine": "failing"}
        assert document["message"] == (
            "The approver is not ready: engine (its last round failed on its redis: "
            "MOVED 12182 127.0.0.1:7002)."
        )
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200  # alive, not ready
        failing = False
        assert states(becomes(served.url, 200))["engine"] == "ok"


def test_the_agent_service_is_not_ready_while_its_redis_is_down(
    tmp_path: Path, own_redis: RestartableRedis, redis_prefix: str
) -> None:
    from teaagent_agent import Settings, create_app

    nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=own_redis.url, prefix=redis_prefix)
    alpha = nodes["alpha"]
    (tmp_path / "workspace-alpha").mkdir()
    with alpha.config_path.open("a") as config:
        config.write(
            '\n[agent]\nprovider = "scripted"\n\n[agent.rate_limits]\n"fs.read" = { max_calls = 5 }\n'
        )
    with Served(alpha), ServedApp(create_app(Settings(config=str(alpha.config_path))), name="agent") as agent:
        assert states(becomes(agent.url, 200)) == {"store": "ok", "relay": "ok"}

        own_redis.stop()
        document = becomes(agent.url, 503)
        assert document["error"] == "unavailable"
        assert states(document) == {"store": "failing", "relay": "failing"}  # the relay's Redis is gone too
        assert document["message"].startswith("The agent service is not ready: store (")

        own_redis.start()
        assert states(becomes(agent.url, 200)) == {"store": "ok", "relay": "ok"}


def test_an_agent_service_without_rate_limits_or_quorum_is_ready_without_redis_or_relay(
    tmp_path: Path,
) -> None:
    from agent_support import write_node

    from teaagent_agent import create_app

    node = write_node(tmp_path)
    with ServedApp(create_app(node.settings()), name="agent") as agent:
        status, document = ready(agent.url)
    assert status == 200, document
    assert states(document) == {"store": "off", "relay": "off"}
