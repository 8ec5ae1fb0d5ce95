"""Settled requests reach the peers, verifiably (docs/protocol.md, Settlement).

alpha asks beta, gamma and delta (2 of 3). When beta and gamma decide it, alpha's relay records the
outcome and its delivery worker posts the evidence (the quorum certificate, or the denials) to every
peer's relay, which verifies it under its own configuration before it marks the item ``settled``.
delta's approver (a real process) verifies the evidence again before it shows the item settled, and
``teaagent approvals approve`` there refuses in one sentence and signs nothing. Relays are served on
real sockets in this process, on the embedded Redis.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_support import (
    ApproverProcess,
    MakeCluster,
    Node,
    approval,
    denial,
    in_process,
    served,
    wait_until,
)
from test_tui import Terminal, scripted

from teaagent.approver_client import ApproverClient
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.errors import RelayError
from teaagent.relay_client import RelayClient
from teaagent.tui import TeaAgentTUI
from teaagent_relay._worker import DeliveryWorker

WAIT = 30.0  # a loaded two-core host


@pytest.fixture
def nodes(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha, beta, gamma, delta, each a peer of every other; 2 approvals required."""
    return make_cluster("alpha", "beta", "gamma", "delta")


@pytest.fixture
def delta_approver(nodes: dict[str, Node], tmp_path: Path) -> Iterator[ApproverProcess]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    process = ApproverProcess(nodes["delta"], logs)
    try:
        yield process
    finally:
        process.stop()


def relay_item(node: Node, request_id: str) -> Any:
    with RelayClient(node.url, token=node.token) as client:
        try:
            return client.get_inbox_item(request_id, origin="alpha")
        except RelayError:
            return None


def approver_item(node: Node, request_id: str) -> Any:
    token = load_config(node.config_path).load_token()
    with ApproverClient(node.approver_url, token=token) as client:
        return client.get_request(request_id, origin="alpha")


def decide_at(node: Node, request: dict[str, Any], *, deny: bool = False) -> None:
    document = denial(request, node.name) if deny else approval(request, node.name)
    with RelayClient(node.url, token=node.token) as client:
        client.submit_decision(request["request_id"], document["statement"], document["signature"])


def submit(alpha: Node, request: dict[str, Any], *peers: Node) -> None:
    with RelayClient(alpha.url, token=alpha.token) as origin:
        origin.submit_request(request, alpha.signed(request)["signature"])
    for peer in peers:
        assert wait_until(lambda peer=peer: relay_item(peer, request["request_id"]) is not None, WAIT)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(["approvals", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def settle_at_alpha(nodes: dict[str, Node], request: dict[str, Any], *, deny: bool) -> None:
    alpha, beta, gamma, delta = (nodes[name] for name in ("alpha", "beta", "gamma", "delta"))
    submit(alpha, request, beta, gamma, delta)
    decide_at(beta, request, deny=deny)
    decide_at(gamma, request, deny=deny)
    with RelayClient(alpha.url, token=alpha.token) as origin:
        state = "denied" if deny else "approved"
        assert wait_until(lambda: origin.get_request(request["request_id"]).state == state, WAIT)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("deny", "outcome", "evidence"), [(False, "approved", "certificate"), (True, "denied", "denials")]
)
def test_a_request_decided_at_its_origin_is_settled_at_the_third_peer_and_approve_signs_nothing(
    nodes: dict[str, Node],
    delta_approver: ApproverProcess,
    capsys: pytest.CaptureFixture[str],
    deny: bool,
    outcome: str,
    evidence: str,
) -> None:
    alpha, delta = nodes["alpha"], nodes["delta"]
    request = alpha.request(arguments={"command": "make deploy"})
    request_id = request["request_id"]
    with served(*nodes.values()):
        delta_approver.start()
        settle_at_alpha(nodes, request, deny=deny)

        # delta's relay verified the evidence alpha's relay sent and marks the item settled.
        assert wait_until(lambda: relay_item(delta, request_id).state == "settled", WAIT)
        item = relay_item(delta, request_id)
        assert list(item.settlement) == [evidence]
        assert item.decision is None
        # Its approver verified it again: the item is settled, by whom and when, as signed.
        shown = approver_item(delta, request_id)
        assert shown.state == "settled"
        assert shown.settled is not None
        assert (shown.settled.outcome, shown.settled.decided_by) == (outcome, ("beta", "gamma"))

        code, out, _ = cli(capsys, "list", "--state", "all", "--config", str(delta.config_path))
        assert code == 0
        assert f"{outcome} at alpha by beta, gamma" in out
        code, out, _ = cli(capsys, "show", request_id, "--config", str(delta.config_path))
        assert code == 0
        assert f"settled      {outcome} at alpha by beta, gamma" in out

        code, out, err = cli(capsys, "approve", request_id, "--config", str(delta.config_path))
        assert code == 1
        assert out == ""
        assert err.count("\n") == 1, err
        assert err.startswith(f"teaagent: Request {request_id} was already {outcome} at alpha by beta, gamma")
        assert err.endswith("; this node signs nothing for it.\n")
        # Nothing was signed: delta's relay holds no decision of delta, alpha counted none.
        assert relay_item(delta, request_id).decision is None
        with RelayClient(alpha.url, token=alpha.token) as origin:
            status = origin.get_request(request_id)
        assert "delta" not in status.signers + status.denied_by
        # The approver's API refuses as well (409 settled), and so does the relay.
        token = load_config(delta.config_path).load_token()
        answer = httpx.post(
            f"{delta.approver_url}/v1/requests/{request_id}/approve",
            json={"origin": "alpha", "expect_payload_digest": request["payload_digest"]},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert (answer.status_code, answer.json()["error"]) == (409, "settled")
        # The TUI's /inbox shows it settled, and /approve there is refused in the same sentence.
        node = load_config(delta.config_path)
        node.workspace.mkdir(parents=True, exist_ok=True)
        terminal = Terminal(["/inbox", f"/approve {request_id}"])
        adapter = scripted([])
        tui = TeaAgentTUI(
            node=node,
            input_fn=terminal.input,
            output_fn=terminal.print,
            adapter_factory=lambda provider, model: adapter,
        )
        assert tui.run_repl() == 0
        assert re.search(
            rf"^{request_id} +alpha +shell\.run +{outcome} at alpha by beta, gamma \d+s ago ",
            terminal.text,
            re.M,
        ), terminal.text
        assert f"Request {request_id} was already {outcome} at alpha by beta, gamma" in terminal.text
        assert relay_item(delta, request_id).decision is None
        late = approval(request, "delta")
        with RelayClient(delta.url, token=delta.token) as client, pytest.raises(RelayError) as refused:
            client.submit_decision(request_id, late["statement"], late["signature"])
        assert refused.value.code == "settled"


def post_settlement(node: Node, request_id: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{node.url}/v1/inbox/{request_id}/settled", json=body, timeout=10)


def refusal(response: httpx.Response) -> str:
    assert 400 <= response.status_code < 500, response.text
    message = response.json()["message"]
    assert message.endswith("."), message
    assert ". " not in message, message
    return str(message)


@pytest.mark.slow
def test_a_forged_settlement_is_refused_and_the_item_stays_pending(nodes: dict[str, Node]) -> None:
    alpha, delta = nodes["alpha"], nodes["delta"]
    request = alpha.request(arguments={"command": "make one"})
    other = alpha.request(arguments={"command": "make two"}, call_id="call-2")
    request_id = request["request_id"]
    with served(*nodes.values()):
        submit(alpha, request, delta)
        submit(alpha, other, delta)
        signature = alpha.signed(request)["signature"]

        # Approvals that do not verify: beta's statement with gamma's signature, and gamma's with beta's.
        beta_ok, gamma_ok = approval(request, "beta"), approval(request, "gamma")
        swapped = [
            {"statement": beta_ok["statement"], "signature": gamma_ok["signature"]},
            {"statement": gamma_ok["statement"], "signature": beta_ok["signature"]},
        ]
        forged = {"request": request, "request_signature": signature, "approvals": swapped}
        answer = post_settlement(delta, request_id, {"origin": "alpha", "certificate": forged})
        assert answer.json()["error"] == "unverified"
        assert refusal(answer).startswith(
            f"The certificate settling request {request_id} does not verify here: "
        )

        # Another request's certificate, whole and valid for that request.
        foreign = {
            "request": other,
            "request_signature": alpha.signed(other)["signature"],
            "approvals": [approval(other, "beta"), approval(other, "gamma")],
        }
        answer = post_settlement(delta, request_id, {"origin": "alpha", "certificate": foreign})
        assert refusal(answer) == f"The certificate settling request {request_id} is another request's."

        # One true denial of three peers cannot deny a 2 of 3: delta's own approval could carry it.
        answer = post_settlement(delta, request_id, {"origin": "alpha", "denials": [denial(request, "beta")]})
        assert refusal(answer).startswith(f"The denials settling request {request_id} do not deny it here")

        # A request no canonical JSON can write (JSON's NaN, a lone surrogate): refused, not a 500.
        for value in (b"NaN", b'"\\ud800"'):
            answer = httpx.post(
                f"{delta.url}/v1/inbox/{request_id}/settled",
                content=b'{"origin":"alpha","certificate":{"request":{"x":' + value + b"}}}",
                headers={"content-type": "application/json"},
                timeout=10,
            )
            assert answer.json()["error"] == "unverified", answer.text
            assert refusal(answer) == (
                f"The certificate settling request {request_id} carries a request that is not canonical JSON."
            )

        # Neither and both are malformed.
        assert post_settlement(delta, request_id, {"origin": "alpha"}).status_code == 422
        both = {"origin": "alpha", "certificate": foreign, "denials": []}
        assert post_settlement(delta, request_id, both).status_code == 422

        item = relay_item(delta, request_id)
        assert (item.state, item.settlement) == ("pending", None)
        with RelayClient(delta.url, token=delta.token) as client:
            assert request_id in [listed.request_id for listed in client.list_inbox()]


@pytest.mark.anyio
async def test_a_settlement_that_overtakes_its_request_is_retried_until_the_peer_settles_it(
    make_cluster: MakeCluster,
) -> None:
    # gamma was out of reach while beta approved: its request and its settlement then leave together,
    # and gamma refuses the settlement (404) until it holds the request. Refused for good, gamma
    # would offer its operators a request already decided.
    nodes = make_cluster(
        "alpha",
        "beta",
        "gamma",
        required=1,
        peers_of={"alpha": ["beta", "gamma"], "beta": ["alpha"], "gamma": ["alpha", "beta"]},
    )
    alpha, gamma = nodes["alpha"], nodes["gamma"]
    async with (
        in_process(gamma, deliver=False) as gamma_client,
        # No grace: the settlement is queued with the count, beside the request's delivery.
        in_process(
            alpha, deliver=False, delivery_retry_base_seconds=0.05, settlement_grace_seconds=0
        ) as alpha_client,
    ):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        request = alpha.request()
        request_id = request["request_id"]
        await alpha_client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        receipt = await relay.count(request_id, **approval(request, "beta"))
        assert receipt["state"] == "approved"
        worker = DeliveryWorker(
            relay,
            min_idle_seconds=10,
            transport=httpx.ASGITransport(app=gamma_client.app),  # type: ignore[attr-defined]
        )

        async def state() -> str | None:
            answer = await gamma_client.get(
                f"/v1/inbox/{request_id}", params={"origin": "alpha"}, headers=gamma.headers
            )
            return answer.json()["state"] if answer.status_code == 200 else None

        try:
            batch = await relay.deliveries.claim(worker.consumer, 10, 0)
            mine = {json.loads(d.payload)["path"]: d for d in batch if d.target == "gamma"}
            await worker.deliver(mine[f"/v1/inbox/{request_id}/settled"])  # overtakes...
            await worker.deliver(mine["/v1/inbox"])  # ...its request
            between = await state()
            for delivery in batch:
                if delivery.target == "beta":  # beta is not served: its deliveries are not this test's
                    await relay.deliveries.ack(delivery)
            deadline = time.monotonic() + WAIT
            while await state() != "settled" and time.monotonic() < deadline:
                await worker.run_once(block_ms=100)
        finally:
            await worker.aclose()
        final = await state()
        dead = await relay.deliveries.dead_letters()

    assert sorted(mine) == ["/v1/inbox", f"/v1/inbox/{request_id}/settled"]
    assert between == "pending"
    assert final == "settled"
    assert dead == []


def _settlements(batch: list[Any]) -> list[str]:
    return sorted(d.target for d in batch if json.loads(d.payload)["path"].endswith("/settled"))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("peers", "settled_to"), [(("beta", "gamma"), []), (("beta", "gamma", "delta"), ["delta"])]
)
async def test_the_settlement_reads_the_request_only_when_a_peer_is_left_to_tell(
    make_cluster: MakeCluster, monkeypatch: pytest.MonkeyPatch, peers: tuple[str, ...], settled_to: list[str]
) -> None:
    # 2 approvals of 2 peers: both decided, nobody is told, and the store is not read for it (issue 29).
    # Of 3 peers, delta is told: the settlement reads the request to build its certificate.
    nodes = make_cluster("alpha", *peers, required=2, peers_of={"alpha": list(peers)})
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False, settlement_grace_seconds=0) as client:
        relay = client.app.state.relay  # type: ignore[attr-defined]
        request = alpha.request()
        request_id = request["request_id"]
        await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        await relay.count(request_id, **approval(request, "beta"))
        reads: list[str] = []
        read = relay.store.requests.get

        async def counted(request_id: str) -> Any:
            reads.append(request_id)
            return await read(request_id)

        monkeypatch.setattr(relay.store.requests, "get", counted)
        receipt = await relay.count(request_id, **approval(request, "gamma"))
        batch = await relay.deliveries.claim("test", 10, 0)

    assert receipt["state"] == "approved"
    assert reads == ([request_id] if settled_to else [])
    assert _settlements(batch) == settled_to


async def _approved_by_beta_and_gamma(client: httpx.AsyncClient, alpha: Node, request: dict[str, Any]) -> Any:
    """alpha's relay (in ``client``) takes ``request`` and counts beta's and gamma's approvals: approved."""
    relay = client.app.state.relay  # type: ignore[attr-defined]
    await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
    await relay.count(request["request_id"], **approval(request, "beta"))
    receipt = await relay.count(request["request_id"], **approval(request, "gamma"))
    assert receipt["state"] == "approved"
    return relay


@pytest.mark.anyio
@pytest.mark.parametrize(("late", "settled_to"), [(None, ["delta"]), ("approval", []), ("denial", [])])
async def test_the_settlement_waits_its_grace_and_spares_a_peer_whose_decision_came_in_it(
    make_cluster: MakeCluster, late: str | None, settled_to: list[str]
) -> None:
    # 2 of beta, gamma and delta: beta and gamma decide it. delta's decision, on its way, arrives in
    # the grace (or never): verified, it counts for nothing, and delta is not sent the evidence it
    # would verify only to learn what it did. A stopping relay queues the settlement at once.
    alpha = make_cluster("alpha", "beta", "gamma", "delta", required=2)["alpha"]
    request = alpha.request()
    request_id = request["request_id"]
    async with in_process(alpha, deliver=False, settlement_grace_seconds=60) as client:
        relay = await _approved_by_beta_and_gamma(client, alpha, request)
        if late is not None:
            decided = approval(request, "delta") if late == "approval" else denial(request, "delta")
            assert (await relay.count(request_id, **decided))["counted"] is False
        assert _settlements(await relay.deliveries.claim("test", 10, 0)) == []  # in its grace
    registry = relay.metrics.registry
    counted = {
        result: registry.get_sample_value("teaagent_relay_settlements_total", {"result": result})
        for result in ("queued", "spared")
    }
    async with in_process(alpha, deliver=False) as client:  # stopped: queued then
        relay = client.app.state.relay  # type: ignore[attr-defined]
        assert _settlements(await relay.deliveries.claim("test", 10, 0)) == settled_to
    assert counted == {"queued": len(settled_to), "spared": 1 - len(settled_to)}


@pytest.mark.anyio
async def test_a_settlement_goes_to_the_silent_peers_once_its_grace_is_over(
    make_cluster: MakeCluster,
) -> None:
    alpha = make_cluster("alpha", "beta", "gamma", "delta", required=2)["alpha"]
    async with in_process(alpha, deliver=False, settlement_grace_seconds=0.2) as client:
        relay = await _approved_by_beta_and_gamma(client, alpha, alpha.request())
        found: list[str] = []
        deadline = time.monotonic() + WAIT
        while not found and time.monotonic() < deadline:
            found = _settlements(await relay.deliveries.claim("test", 10, 1000))
        assert found == ["delta"]
