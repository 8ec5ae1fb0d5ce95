"""A node on a real Redis Cluster (``redis_cluster = true``): three masters, one replica, no CROSSSLOT.

The keys' hash tags were written for Redis Cluster (``teaagent.store._keys``); here they meet one.
The store's every operation runs on it and the keys of different requests land on more than one
master; the agent's tool limits and the relay's per-origin limit count there; a failover promotes
a node that has none of the scripts, and each call loads its script on the node that runs it; and
three relay processes reach a quorum through a ``kill -9`` and restart of the origin's relay; after a
``kill -9`` and restart of a master, each client's first call there is answered. No
node of the cluster ever answers CROSSSLOT (``INFO errorstats``), and no client refuses a command
for its keys' slots (that would be a ``StoreError``, and the operation would fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.crc
from redis_cluster_fixture import ClusterNode, RedisCluster
from relay_support import (
    Node,
    RelayProcess,
    approval,
    approve_next,
    public_line,
    running,
    wait_until,
    write_cluster,
)

from teaagent.config import load_config
from teaagent.errors import StoreError
from teaagent.quorum import verify_certificate
from teaagent.relay_client import RelayClient
from teaagent.runner._node import node_rate_limiter
from teaagent.store import (
    DecisionResult,
    DecisionToCount,
    Intake,
    Keys,
    ReceiveResult,
    Store,
    StoreOptions,
    open_node_store,
    open_store,
)
from teaagent.store._scripts import script_sha
from teaagent.tools import ToolRateLimit

WAIT = 20.0  # seconds a test waits for something that takes well under one on an idle host
REQUESTS = 48  # three masters all miss one's slots with odds (2/3)^48 * 3, about 1e-8
FAIL_FAST = StoreOptions(socket_timeout=1.0, connect_timeout=1.0, retries=0)
DOC = b'{"request":{"request_id":"...","tool_name":"shell.run"},"signature":"AAAA"}'


def new_id() -> str:
    return secrets.token_hex(16)


def cluster_nodes(
    tmp_path: Path, redis_cluster: RedisCluster, prefix: str, **options: Any
) -> dict[str, Node]:
    """alpha, beta, gamma, each a peer of the others, 2 approvals required, on the cluster."""
    return write_cluster(
        tmp_path,
        ["alpha", "beta", "gamma"],
        redis_url=redis_cluster.url,
        prefix=prefix,
        redis_cluster=True,
        **options,
    )


@contextlib.contextmanager
def owners(redis_cluster: RedisCluster) -> Iterator[Callable[[str], int]]:
    """``port_of(key)``: the port of the master that serves ``key``'s slot now (a fresh client's map)."""
    with contextlib.closing(redis_cluster.client()) as client:
        yield lambda key: int(client.get_node_from_key(key).port)


def has_script(node: ClusterNode, name: str) -> bool:
    with contextlib.closing(node.client()) as client:
        return bool(client.script_exists(script_sha(name))[0])


def test_the_keys_of_one_request_one_queue_one_window_share_a_slot_and_requests_do_not() -> None:
    keys = Keys("ta:alpha")
    request_ids = [new_id() for _ in range(REQUESTS)]
    groups = [
        *(keys.request(request_id).all() for request_id in request_ids),
        *(keys.inbox_item("beta", request_id).all() for request_id in request_ids),
        *(dataclass_keys(keys.queue(name)) for name in ("deliveries", "inbox")),
        *(
            (keys.ratelimit("origin:beta"), keys.ratelimit_charged("origin:beta", f"beta/{request_id}"))
            for request_id in request_ids
        ),
    ]
    for group in groups:
        assert len({redis.crc.key_slot(key.encode()) for key in group}) == 1, group
    slots = {redis.crc.key_slot(keys.request(request_id).doc.encode()) for request_id in request_ids}
    assert len(slots) > REQUESTS // 2  # spread over the slots, not pinned to the node's
    # The same id from two origins is two inbox items, in slots of their own.
    assert keys.inbox_item("beta", request_ids[0]).doc != keys.inbox_item("gamma", request_ids[0]).doc


def dataclass_keys(queue: Any) -> tuple[str, ...]:
    return (queue.stream, queue.schedule, queue.dead)


@pytest.mark.anyio
@pytest.mark.slow
async def test_the_store_runs_every_operation_on_a_cluster_and_spreads_requests_over_its_masters(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    alpha = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)["alpha"]
    config = load_config(alpha.config_path)
    crossslot = redis_cluster.error_counts("CROSSSLOT")

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with open_node_store(config, prefix=alpha.redis_prefix) as store:
            now = int(time.time())
            expires = now + 300
            own = [new_id() for _ in range(REQUESTS)]
            for request_id in own:
                accepted = await store.requests.accept(
                    request_id, DOC, required_approvals=2, peers=2, expires_at=expires, now=now
                )
                assert accepted.created
            single = await store.requests.record_decision(
                own[0], kind="approval", signer="beta", decision=b"beta", now=now
            )
            batch = [
                DecisionToCount(request_id, "approval", signer, signer.encode(), now)
                for request_id in own[1:]
                for signer in ("beta", "gamma")
            ]
            answers = await store.requests.record_decisions(batch)
            # A waiter on the pending request wakes (XREAD on its events) when gamma's decision settles it.
            waiter = asyncio.create_task(store.requests.wait_outcome(own[0], WAIT))
            await asyncio.sleep(0.05)
            await store.requests.record_decision(
                own[0], kind="denial", signer="gamma", decision=b"no", now=now
            )
            seen["waited"] = await waiter
            seen["single"] = single
            seen["answers"] = answers
            seen["approved"] = await store.requests.list_requests(state="approved", limit=REQUESTS)
            seen["pending"] = await store.requests.list_requests(state="pending")
            seen["all"] = await store.requests.list_requests(state=None, limit=REQUESTS)

            received = [("beta", new_id()) for _ in range(6)] + [("gamma", new_id()) for _ in range(6)]
            for origin, request_id in received:
                await store.inbox.accept(origin, request_id, DOC, expires_at=expires, now=now)
                entry = await store.inbox_queue.enqueue("approver", request_id, DOC, expires)
                assert await store.inbox.mark_queued(origin, request_id, entry)
                assert await store.inbox.exists(origin, request_id)
            origin, request_id = received[0]
            await store.inbox.record_decision(
                origin, request_id, kind="approval", signer="alpha", decision=b"yes", now=now
            )
            seen["inbox_pending"] = await store.inbox.list_requests(state="pending")
            seen["inbox_item"] = await store.inbox.get(origin, request_id)
            seen["received"] = received
            seen["inbox_items"] = await store.inbox.get_many(received)  # items on every master, one pipeline

            queue = store.deliveries
            for index, request_id in enumerate(own[:5]):
                await queue.enqueue(f"peer-{index}", request_id, b'{"path":"/v1/inbox"}', expires)
            claimed = await queue.claim("worker-1", count=5, block_ms=100)
            retried = await queue.retry_later(claimed[0], "peer down", now=time.time())
            for delivery in claimed[1:3]:
                assert await queue.ack(delivery)
            seen["removed"] = await queue.remove([delivery.entry_id for delivery in claimed[3:]])
            seen["retried"] = retried
            seen["scheduled"] = await queue.scheduled()
            seen["stats"] = await queue.stats()
            seen["entries"] = await queue.entries()
            seen["dead"] = await queue.dead_letters()
            seen["pruned"] = await queue.prune_consumers("worker-1", min_idle_seconds=3600)
            seen["claimed_inbox"] = await store.inbox_queue.claim("approver-1", count=20, block_ms=100)

            limit = ToolRateLimit(max_calls=2, window_seconds=60)
            seen["hits"] = [
                (await store.rate_limiter.hit(f"origin:{peer}", limit)).allowed
                for peer in ("beta", "gamma")
                for _ in range(3)
            ]
        return seen

    seen = await scenario()

    assert seen["single"] == DecisionResult("pending", 1, 0, True, False)
    assert all(isinstance(answer, DecisionResult) for answer in seen["answers"])
    assert [answer.state for answer in seen["answers"][1::2]] == ["approved"] * (REQUESTS - 1)
    assert seen["waited"].state == "denied"  # beta approved, gamma denied: 1 of 2 can no longer pass
    assert len(seen["approved"]) == REQUESTS - 1
    assert seen["pending"] == []
    assert len(seen["all"]) == REQUESTS
    assert len(seen["inbox_pending"]) == 11
    assert seen["inbox_item"].state == "approved"
    assert seen["inbox_item"].queued
    assert [(item.origin, item.request_id) for item in seen["inbox_items"]] == seen["received"]
    assert [item.state for item in seen["inbox_items"]] == ["approved"] + ["pending"] * 11
    assert seen["retried"].action == "retry"
    assert [delivery.target for _at, delivery in seen["scheduled"]] == ["peer-0"]
    assert seen["removed"] == 2
    assert (seen["stats"].length, seen["stats"].pending, seen["stats"].scheduled) == (0, 0, 1)
    assert seen["entries"] == []
    assert seen["dead"] == []
    assert seen["pruned"] == []
    assert len(seen["claimed_inbox"]) == 12
    assert seen["hits"] == [True, True, False, True, True, False]

    # Each master holds keys of some requests; each request's four keys sit on one master.
    found = redis_cluster.keys(f"{alpha.redis_prefix}:req:{{*")
    holders: dict[str, set[int]] = {}
    for port, keys in found.items():
        for key in keys:
            request_id = key.decode().split("{", 1)[1].split("}", 1)[0]
            holders.setdefault(request_id, set()).add(port)
    assert set(holders) == set(seen_ids(seen))
    assert all(len(ports) == 1 for ports in holders.values())
    assert len({port for ports in holders.values() for port in ports}) > 1
    assert sum(len(keys) for keys in found.values()) == 4 * REQUESTS  # doc, outcome, decisions, events
    assert redis_cluster.error_counts("CROSSSLOT") == crossslot


def seen_ids(seen: dict[str, Any]) -> list[str]:
    return [item.request_id for item in seen["all"]]


@pytest.mark.slow
def test_the_agents_tool_limits_are_shared_on_the_cluster_and_fail_closed_without_it(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    alpha = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)["alpha"]
    config = load_config(alpha.config_path)
    limit = ToolRateLimit(max_calls=3, window_seconds=60)
    # The tools' windows are the node's (ta:alpha), not the test's prefix: names of this test's own.
    tools = [f"tool-{uuid.uuid4().hex[:8]}-{n}" for n in range(12)]
    # Two limiters, as two processes of the node (teaagent run and the agent service) would hold.
    first, second = node_rate_limiter(config), node_rate_limiter(config)
    answers = {
        tool: [limiter.hit(tool, limit).allowed for limiter in (first, second, first, second)]
        for tool in tools
    }

    assert answers == {tool: [True, True, True, False] for tool in tools}
    with owners(redis_cluster) as port_of:
        windows = {port_of(Keys(f"ta:{config.agent_id}").ratelimit(tool)) for tool in tools}
    assert len(windows) > 1  # the windows spread over the masters, and every one counted

    gone = write_cluster(
        tmp_path / "gone", ["alpha", "beta"], redis_url="redis://127.0.0.1:1", prefix="x", redis_cluster=True
    )["alpha"]
    with pytest.raises(StoreError, match=r"^Redis at redis://127\.0\.0\.1:1 is unreachable"):
        node_rate_limiter(load_config(gone.config_path)).hit(tools[0], limit)


@pytest.mark.anyio
@pytest.mark.slow
async def test_after_a_failover_every_call_loads_its_script_on_the_promoted_node_alone(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    alpha = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)["alpha"]
    config = load_config(alpha.config_path)
    master, replica = redis_cluster.replica_of_a_master()
    keys = Keys(alpha.redis_prefix)
    # Requests, an origin's window and a tool's window that the pair serves.
    unique = uuid.uuid4().hex[:8]
    with owners(redis_cluster) as port_of:
        ids = [
            rid for rid in (new_id() for _ in range(60)) if port_of(keys.request(rid).outcome) == master.port
        ]
        origin = next(
            o
            for o in (f"peer-{n}" for n in range(60))
            if port_of(keys.ratelimit(f"origin:{o}")) == master.port
        )
        tool = next(
            t
            for t in (f"tool-{unique}-{n}" for n in range(60))
            if port_of(Keys("ta:alpha").ratelimit(t)) == master.port
        )
    for node in redis_cluster.nodes:
        with contextlib.closing(node.client()) as client:
            client.script_flush()
    tools = node_rate_limiter(config)
    limit = ToolRateLimit(max_calls=2, window_seconds=60)
    crossslot = redis_cluster.error_counts("CROSSSLOT")

    async def scenario(store: Store) -> dict[str, Any]:
        now = int(time.time())
        for request_id in ids[:3]:
            await store.requests.accept(
                request_id, DOC, required_approvals=1, peers=2, expires_at=now + 300, now=now
            )
        before = (await store.rate_limiter.hit(f"origin:{origin}", limit)).remaining
        tools_before = tools.hit(tool, limit).remaining
        premise = has_script(master, "accept_request") and not has_script(replica, "accept_request")
        # The same store and limiter on both sides: their clients learn the change from MOVED.
        await asyncio.to_thread(redis_cluster.fail_over, replica)
        lost = not has_script(replica, "accept_request") and not has_script(replica, "record_decision")
        single = await store.requests.record_decision(
            ids[0], kind="approval", signer="beta", decision=b"b", now=now
        )
        batch = await store.requests.record_decisions(
            [DecisionToCount(request_id, "approval", "beta", b"b", now) for request_id in ids[1:3]]
        )
        after = (await store.rate_limiter.hit(f"origin:{origin}", limit)).remaining
        return {
            "premise": premise,
            "lost": lost,
            "single": single,
            "batch": batch,
            "origin": (before, after),
            "tool": (tools_before, tools.hit(tool, limit).remaining),
        }

    async def main() -> dict[str, Any]:
        async with open_node_store(config, prefix=alpha.redis_prefix) as store:
            return await scenario(store)

    seen = await main()

    assert seen["premise"]
    assert seen["lost"]
    assert seen["single"].state == "approved"
    assert [answer.state for answer in seen["batch"]] == ["approved", "approved"]
    assert seen["origin"] == (1, 0)
    assert seen["tool"] == (1, 0)
    assert replica.is_master()
    assert not master.is_master()
    for name in ("record_decision", "ratelimit"):
        assert has_script(replica, name)
        # Loaded where it ran, not broadcast: the other masters never ran these calls.
        assert not any(has_script(node, name) for node in redis_cluster.masters() if node is not replica)
    assert redis_cluster.error_counts("CROSSSLOT") == crossslot


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_replica_that_does_not_answer_leaves_the_stores_health_alone(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    alpha = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)["alpha"]
    config = load_config(alpha.config_path)
    _master, replica = redis_cluster.replica_of_a_master()

    async def ping() -> float:
        async with open_node_store(config, prefix=alpha.redis_prefix, options=FAIL_FAST) as store:
            return await store.ping()

    os.kill(replica.process.pid, signal.SIGSTOP)  # alive, and silent: a replica on a stalled host
    try:
        took = await ping()
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)

    assert took < FAIL_FAST.socket_timeout  # the primaries answered; nobody waited for the replica


def relay_logs(tmp_path: Path) -> str:
    return "".join(path.read_text() for path in tmp_path.glob("relay-*.log"))


@pytest.mark.slow
def test_three_relays_on_a_cluster_reach_a_quorum_through_a_restart_of_the_origins_relay(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    nodes = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)
    alpha = nodes["alpha"]
    crossslot = redis_cluster.error_counts("CROSSSLOT")
    gamma = nodes["gamma"]
    with running(nodes.values(), tmp_path) as relays:
        with RelayClient(alpha.url, token=alpha.token) as client:
            request = alpha.request(call_id="call-1")
            client.submit_request(request, alpha.signed(request)["signature"])
            first = request["request_id"]
            approve_next(nodes["beta"])
            counted = wait_until(lambda: client.get_request(first).signers == ("beta",), timeout=WAIT)
        with RelayClient(gamma.url, token=gamma.token) as peer:
            reached = peer.list_inbox(wait=WAIT)  # delivered to gamma too before alpha's relay dies
        # kill -9 mid-flow: one approval counted, the second still to come.
        relays["alpha"].kill()
        restarted = RelayProcess(alpha, tmp_path)
        try:
            approve_next(gamma)  # gamma's relay keeps the delivery until alpha's is back
            restarted.start()
            with RelayClient(alpha.url, token=alpha.token) as client:
                outcome = client.wait_outcome(first, WAIT)
                # The restarted relay takes a new request (in a slot of its own) to its end too.
                again = alpha.request(call_id="call-2")
                client.submit_request(again, alpha.signed(again)["signature"])
                approve_next(nodes["beta"])
                approve_next(gamma)
                second = client.wait_outcome(again["request_id"], WAIT)
        finally:
            restarted.stop()

    assert counted
    assert reached
    assert outcome.state == "approved"
    assert outcome.signers == ("beta", "gamma")
    assert outcome.certificate is not None
    verified = verify_certificate(outcome.certificate, alpha.quorum(), origin_public_key=public_line("alpha"))
    assert verified.signers == ("beta", "gamma")
    assert second.state == "approved"
    assert redis_cluster.error_counts("CROSSSLOT") == crossslot
    assert "CROSSSLOT" not in relay_logs(tmp_path)
    assert "same slot" not in relay_logs(tmp_path)


@pytest.mark.slow
def test_a_delivery_retried_after_a_failed_step_on_a_cluster_is_charged_to_its_origin_once(
    redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    """The relay's receive runs step by step on a cluster: when the store step fails after the
    origin's window was charged (here the inbox index is no sorted set, as a master restarting
    fails it), the origin delivers again, and that repeat is not charged a second time."""
    limit = ToolRateLimit(2, 3600.0)

    async def scenario() -> list[bool]:
        async with open_store(redis_cluster.url, prefix=cluster_prefix, cluster=True) as store:
            intake = Intake(store.rate_limiter, "origin:alpha", limit, store.inbox_queue, "approver")
            now = int(time.time())

            async def receive(request_id: str) -> ReceiveResult:
                return await store.inbox.receive(
                    "alpha", request_id, DOC, expires_at=now + 300, intake=intake, payload=b"{}", now=now
                )

            retried = new_id()
            await store.client.set(store.keys.inbox_index(), b"not a sorted set")
            with pytest.raises(StoreError):
                await receive(retried)
            await store.client.delete(store.keys.inbox_index())
            again = await receive(retried)
            assert again.accepted is not None
            assert again.accepted.created
            others = [await receive(new_id()) for _ in range(2)]
        return [result.decision is not None and result.decision.allowed for result in (again, *others)]

    assert asyncio.run(scenario()) == [True, True, False]  # the window's two calls: the retried one, one more


@pytest.mark.slow
def test_a_relay_on_a_cluster_limits_each_origin_on_its_own(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    nodes = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    beta.extra_env.update(
        {"TEAAGENT_RELAY_INBOX_RATE_LIMIT": "2", "TEAAGENT_RELAY_INBOX_RATE_WINDOW_SECONDS": "30"}
    )
    crossslot = redis_cluster.error_counts("CROSSSLOT")
    with running([beta], tmp_path):
        answers = {
            sender.name: [
                httpx.post(
                    f"{beta.url}/v1/inbox", json=sender.signed(sender.request(call_id=f"c-{n}")), timeout=WAIT
                )
                for n in range(3)
            ]
            for sender in (alpha, gamma)
        }

    assert {name: [a.status_code for a in replies] for name, replies in answers.items()} == {
        "alpha": [201, 201, 429],
        "gamma": [201, 201, 429],
    }
    assert answers["alpha"][2].json()["error"] == "rate_limited"
    assert (
        answers["alpha"][2]
        .json()["message"]
        .startswith("alpha is over its limit of 2 requests per 30 seconds; retry in ")
    )
    assert redis_cluster.error_counts("CROSSSLOT") == crossslot


@pytest.mark.slow
def test_a_relay_on_a_cluster_holds_each_origin_to_its_share_of_the_inbox(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    nodes = cluster_nodes(tmp_path, redis_cluster, cluster_prefix)
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    beta.extra_env["TEAAGENT_RELAY_INBOX_MAX_PENDING"] = "2"
    crossslot = redis_cluster.error_counts("CROSSSLOT")
    requests = [alpha.request(call_id=f"c-{n}") for n in range(3)]
    with running([beta], tmp_path):

        def post(sender: Node, request: dict[str, Any]) -> httpx.Response:
            return httpx.post(f"{beta.url}/v1/inbox", json=sender.signed(request), timeout=WAIT)

        taken = [post(alpha, request).status_code for request in requests[:2]]
        full = post(alpha, requests[2])
        from_gamma = post(gamma, gamma.request())
        with RelayClient(beta.url, token=beta.token) as client:
            first = requests[0]
            decision = approval(first, "beta")
            client.submit_decision(first["request_id"], decision["statement"], decision["signature"])
        after = post(alpha, requests[2])

    assert taken == [201, 201]
    assert (full.status_code, full.json()) == (
        429,
        {
            "error": "origin_full",
            "message": "alpha already holds 2 pending requests in this node's inbox, its limit of 2; "
            "one must be decided, withdrawn or expire first.",
        },
    )
    assert from_gamma.status_code == 201
    assert after.status_code == 201
    assert redis_cluster.error_counts("CROSSSLOT") == crossslot


@pytest.mark.anyio
@pytest.mark.slow
async def test_after_a_master_restarts_each_client_answers_its_first_call_there(tmp_path: Path) -> None:
    """A ``kill -9`` and restart leaves dead connections in each client's pool for that master.

    redis-py's cluster pipeline retries a node's failure only when it raises it; the store reads
    each call's own reply (``raise_on_error=False``), so each of its pipelines sends a command
    whose node failed again (``send_pipeline``). Three stores, each with clients of its own, meet
    the restarted master first with one kind of pipeline each: a script call in a batch (a rate
    limit), scripts run in a pipeline of their own (a batch of decisions), a read of a queue's sizes.
    """
    cluster = RedisCluster(tmp_path / "cluster", replicas=0, persistent=True).start()
    prefix = f"ta-restart-{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    limit = ToolRateLimit(max_calls=5, window_seconds=60)
    try:
        master = cluster.masters()[1]
        with owners(cluster) as port_of:
            request_id = next(
                rid
                for rid in (new_id() for _ in range(60))
                if port_of(keys.request(rid).outcome) == master.port
            )
            scope = next(
                s for s in (f"peer-{n}" for n in range(60)) if port_of(keys.ratelimit(s)) == master.port
            )
            queue = next(
                q
                for q in (f"q{a}{b}" for a in "abcdefgh" for b in "abcdefgh")
                if port_of(keys.queue(q).stream) == master.port
            )

        async def scenario(stack: contextlib.AsyncExitStack) -> dict[str, Any]:
            stores = [
                await stack.enter_async_context(open_store(cluster.url, prefix=prefix, cluster=True))
                for _ in range(3)
            ]
            limits, decisions, queues = stores
            now = int(time.time())
            # Each store's clients hold a connection to the master before it dies.
            before = (await limits.rate_limiter.hit(scope, limit)).remaining
            await decisions.requests.accept(
                request_id, DOC, required_approvals=3, peers=3, expires_at=now + 300, now=now
            )
            await decisions.requests.record_decisions(
                [DecisionToCount(request_id, "approval", "gamma", b"g", now)]
            )
            await queues.queue(queue).enqueue("beta", request_id, b"{}", now + 300, now=now)
            sizes = await queues.queue(queue).stats()
            await asyncio.to_thread(cluster.kill, master)
            await asyncio.to_thread(cluster.restart, master)
            return {
                "limit": (before, (await limits.rate_limiter.hit(scope, limit)).remaining),
                "decision": await decisions.requests.record_decisions(
                    [DecisionToCount(request_id, "approval", "beta", b"b", now)]
                ),
                "sizes": (sizes.length, (await queues.queue(queue).stats()).length),
            }

        async with contextlib.AsyncExitStack() as stack:
            seen = await scenario(stack)
    finally:
        cluster.stop()
    assert seen["limit"] == (4, 3)  # the window's first call survived the restart (append-only file)
    [decision] = seen["decision"]
    assert isinstance(decision, DecisionResult), decision
    assert decision.state == "pending"
    assert decision.approvals == 2
    assert seen["sizes"] == (1, 1)
