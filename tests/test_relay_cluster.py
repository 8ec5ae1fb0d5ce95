"""Relays as real processes (``teaagent relay serve``) on loopback, exchanging requests and decisions.

Two and three relays pass a request to the peers and its decisions back; then the faults: a relay
killed (``kill -9``) between accepting a decision and delivering it, a Redis restart, a peer relay
that is down, a decision delivered five times, fifty decisions racing at the threshold.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from redis_fixture import RestartableRedis
from relay_support import (
    MakeCluster,
    Node,
    RelayProcess,
    approval,
    approve_next,
    public_line,
    running,
    sample,
    undelivered,
    wait_until,
    write_cluster,
)

from teaagent.errors import ApprovalDeniedError, RelayError
from teaagent.policy import ApprovalPolicy, PermissionMode
from teaagent.quorum import verify_certificate
from teaagent.relay_client import RelayClient
from teaagent.store import Keys

pytestmark = pytest.mark.slow

WAIT = 20.0  # seconds a test waits for something that takes well under one on an idle host


def test_two_relays_exchange_a_request_and_its_decision(tmp_path: Path, make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha = nodes["alpha"]
    with running(nodes.values(), tmp_path), RelayClient(alpha.url, token=alpha.token) as client:
        request = alpha.request()
        submitted = client.submit_request(request, alpha.signed(request)["signature"])
        item = approve_next(nodes["beta"])
        outcome = client.wait_outcome(request["request_id"], WAIT)

    assert submitted.state == "pending"
    assert item.request == request
    assert item.origin == "alpha"
    assert outcome.state == "approved"
    assert outcome.signers == ("beta",)
    assert outcome.certificate is not None
    verified = verify_certificate(outcome.certificate, alpha.quorum(), origin_public_key=public_line("alpha"))
    assert verified.signers == ("beta",)


def test_three_relays_give_the_gate_its_certificate_or_the_denial(
    tmp_path: Path, workspace: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", required=2, star="alpha")
    alpha = nodes["alpha"]
    gate = alpha.gate(
        timeout=WAIT,
    )
    policy = ApprovalPolicy.for_workspace(
        workspace,
        mode=PermissionMode.DANGER_FULL_ACCESS,
        agent_id="alpha",
        multi_sig_config=alpha.quorum(),
        quorum_gate=gate,
        use_presets=False,
    )
    arguments = {"command": "rm -rf build"}
    with running(nodes.values(), tmp_path):
        approvers = [
            threading.Thread(target=approve_next, args=(nodes[name],), daemon=True)
            for name in ("beta", "gamma")
        ]
        for approver in approvers:
            approver.start()
        authorization = policy.authorize(
            "shell.run", "call-1", True, arguments, reason="clean", run_id="run-1"
        )
        for approver in approvers:
            approver.join(WAIT)

        deniers = [
            threading.Thread(target=approve_next, args=(nodes["beta"],), daemon=True),
            threading.Thread(
                target=approve_next,
                args=(nodes["gamma"],),
                kwargs={"deny_reason": "not on Fridays"},
                daemon=True,
            ),
        ]
        for denier in deniers:
            denier.start()
        with pytest.raises(
            ApprovalDeniedError,
            match=r"^shell\.run was denied by gamma: not on Fridays \(2 approvals from 2 peers needed\)\.$",
        ):
            gate.obtain(alpha.request(arguments=arguments, call_id="call-2", run_id="run-1", reason=""))
        for denier in deniers:
            denier.join(WAIT)
    gate.close()

    assert authorization.certificate is not None
    assert authorization.certificate["request"]["call_id"] == "call-1"
    assert [a["statement"]["signer"] for a in authorization.certificate["approvals"]] == ["beta", "gamma"]


def test_a_relay_killed_between_accepting_a_decision_and_delivering_it_loses_nothing(
    tmp_path: Path, redis_url: str, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    alpha_relay = RelayProcess(alpha, tmp_path).start()
    beta_relay = RelayProcess(beta, tmp_path).start()
    restarted: list[RelayProcess] = []
    try:
        request = alpha.request()
        with RelayClient(alpha.url, token=alpha.token) as client:
            client.submit_request(request, alpha.signed(request)["signature"])
        alpha_relay.stop()  # the origin's relay is away: beta cannot deliver the decision now
        approve_next(beta)  # beta's relay accepted (200) the decision and queued it
        beta_relay.kill()  # kill -9 before any delivery could succeed
        assert undelivered(redis_url, beta) == 1
        restarted.append(RelayProcess(alpha, tmp_path).start())
        restarted.append(RelayProcess(beta, tmp_path).start())
        with RelayClient(alpha.url, token=alpha.token) as client:
            outcome = client.wait_outcome(request["request_id"], WAIT)
        # While beta's relay still runs: its worker acknowledges the delivery just after alpha's 200.
        delivered = wait_until(lambda: undelivered(redis_url, beta) == 0, timeout=WAIT)
    finally:
        for process in (alpha_relay, beta_relay, *restarted):
            process.stop()

    assert outcome.state == "approved"
    assert outcome.signers == ("beta",)
    assert delivered


class GateInThread:
    """The origin's quorum gate asking for one shell.run in a thread, with its progress lines kept."""

    def __init__(self, node: Node, timeout: float) -> None:
        self.progress: list[str] = []
        self.outcome: list[Any] = []  # the certificate, or what obtain() raised
        self.gate = node.gate(
            timeout=timeout,
            on_progress=self.progress.append,
        )
        self.request = node.request(arguments={"command": "make"}, call_id="c", run_id="r", reason="")
        self.thread = threading.Thread(target=self._obtain, daemon=True)

    def _obtain(self) -> None:
        try:
            self.outcome.append(self.gate.obtain(self.request))
        except Exception as exc:
            self.outcome.append(exc)

    def start_and_wait_until_sent(self) -> None:
        self.thread.start()
        assert wait_until(lambda: any("sent to the peers" in line for line in self.progress))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.progress)


def test_the_gate_outlives_its_relays_crash_and_sends_the_request_again(
    tmp_path: Path, redis_url: str, redis_prefix: str, make_cluster: MakeCluster
) -> None:
    """kill -9 of the origin's relay with its fan-out lost (as if it died before queueing it)."""
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    asking = GateInThread(alpha, timeout=WAIT * 2)
    alpha_relay = RelayProcess(alpha, tmp_path).start()  # beta's relay is not up yet
    processes = [alpha_relay]
    try:
        asking.start_and_wait_until_sent()
        alpha_relay.kill()
        # What a crash between storing the request and queueing its deliveries leaves: no delivery.
        keys = Keys(alpha.redis_prefix).queue("deliveries")
        client = redis.Redis.from_url(redis_url)
        client.delete(keys.stream, keys.schedule)
        client.close()
        processes.append(RelayProcess(beta, tmp_path).start())
        processes.append(RelayProcess(alpha, tmp_path).start())
        approve_next(beta)  # reaches beta only because the gate sent the request again
        asking.thread.join(WAIT)
    finally:
        for process in processes:
            process.stop()
        asking.gate.close()

    [certificate] = asking.outcome
    assert isinstance(certificate, dict), certificate
    assert [a["statement"]["signer"] for a in certificate["approvals"]] == ["beta"]
    assert asking.said("sent again after the relay came back")


def test_a_gate_whose_relay_never_comes_back_says_so_at_its_deadline(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha = nodes["alpha"]
    asking = GateInThread(alpha, timeout=3.0)
    alpha_relay = RelayProcess(alpha, tmp_path).start()
    try:
        asking.start_and_wait_until_sent()
        alpha_relay.kill()
        asking.thread.join(WAIT)
    finally:
        alpha_relay.stop()
        asking.gate.close()

    [error] = asking.outcome
    assert isinstance(error, RelayError)
    assert f"The relay at {alpha.url}" in str(error)
    assert asking.said("Waiting for it.")


def test_a_peer_relay_that_is_down_receives_its_delivery_once_back(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    with running([alpha], tmp_path), RelayClient(alpha.url, token=alpha.token) as client:
        request = alpha.request()
        client.submit_request(request, alpha.signed(request)["signature"])
        # Attempts fail while beta is away (backoff capped at 0.5 s here).
        assert wait_until(
            lambda: sample(httpx.get(f"{alpha.url}/metrics").text, "teaagent_relay_delivery_retries_total"),
            WAIT,
        ), "no failed delivery was counted while beta was away"
        with running([beta], tmp_path):
            item = approve_next(beta)
            outcome = client.wait_outcome(request["request_id"], WAIT)

    assert item.request_id == request["request_id"]
    assert outcome.state == "approved"


def test_a_redis_restart_with_append_only_keeps_pending_requests(tmp_path: Path) -> None:
    server = RestartableRedis(tmp_path / "valkey", append_only=True)
    server.start()
    nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=server.url, prefix="restart", required=1)
    alpha = nodes["alpha"]
    alpha.extra_env["TEAAGENT_RELAY_DELIVER"] = "0"
    try:
        with running([alpha], tmp_path), RelayClient(alpha.url, token=alpha.token) as client:
            request = alpha.request()
            client.submit_request(request, alpha.signed(request)["signature"])
            server.stop()
            while_down = httpx.get(
                f"{alpha.url}/v1/requests/{request['request_id']}", headers=alpha.headers, timeout=30
            )
            server.start()
            kept = client.get_request(request["request_id"])
            counted = client.deliver_decision(request["request_id"], **approval(request, "beta"))
    finally:
        server.stop()

    assert while_down.status_code == 503
    assert while_down.json()["error"] == "unavailable"
    assert kept.state == "pending"
    assert (counted.counted, counted.state) == (True, "approved")


@pytest.mark.anyio
async def test_the_same_decision_delivered_five_times_counts_once(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", "gamma")
    alpha = nodes["alpha"]
    alpha.extra_env["TEAAGENT_RELAY_DELIVER"] = "0"
    request = alpha.request()
    document = approval(request, "beta")

    async def deliver_five_times() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=alpha.url, timeout=WAIT) as client:
            path = f"/v1/requests/{request['request_id']}/decisions"
            return list(await asyncio.gather(*(client.post(path, json=document) for _ in range(5))))

    with running([alpha], tmp_path), RelayClient(alpha.url, token=alpha.token) as client:
        client.submit_request(request, alpha.signed(request)["signature"])
        answers = await deliver_five_times()
        status = client.get_request(request["request_id"])

    assert [answer.status_code for answer in answers] == [200] * 5
    assert sorted(answer.json()["counted"] for answer in answers) == [False] * 4 + [True]
    assert status.signers == ("beta",)
    assert status.state == "pending"


@pytest.mark.anyio
async def test_fifty_concurrent_decisions_racing_at_the_threshold_produce_exactly_one_outcome_event(
    tmp_path: Path, redis_url: str, redis_prefix: str, make_cluster: MakeCluster
) -> None:
    peers = [f"p{index:02d}" for index in range(50)]
    nodes = make_cluster("alpha", required=25, peers_of={"alpha": peers})
    alpha = nodes["alpha"]
    alpha.extra_env["TEAAGENT_RELAY_DELIVER"] = "0"
    request = alpha.request()
    documents = [approval(request, peer) for peer in peers]

    async def race() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(base_url=alpha.url, timeout=WAIT, limits=limits) as client:
            path = f"/v1/requests/{request['request_id']}/decisions"
            answers = await asyncio.gather(*(client.post(path, json=document) for document in documents))
        assert {answer.status_code for answer in answers} == {200}
        return [answer.json() for answer in answers]

    with running([alpha], tmp_path), RelayClient(alpha.url, token=alpha.token) as client:
        client.submit_request(request, alpha.signed(request)["signature"])
        receipts = await race()
        status = client.get_request(request["request_id"])
    events_key = Keys(alpha.redis_prefix).request(request["request_id"]).events
    store = redis.Redis.from_url(redis_url)
    events = store.xrange(events_key)
    store.close()

    assert sum(receipt["decided"] for receipt in receipts) == 1
    assert sum(receipt["counted"] for receipt in receipts) == 25
    assert [fields[b"type"] for _id, fields in events].count(b"outcome") == 1
    assert status.state == "approved"
    assert status.certificate is not None
    assert len(status.certificate["approvals"]) == 25
    verified = verify_certificate(status.certificate, alpha.quorum(), origin_public_key=public_line("alpha"))
    assert len(verified.signers) == 25
