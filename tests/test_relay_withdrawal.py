"""Withdrawal end to end (PROTOCOL.md, Withdrawal): the origin signs it, its relay marks the request
withdrawn and tells every peer's relay, which verify it against the origin's key and drop the item.

Relays in this process (uvicorn in a thread for the ones that deliver, the app over ASGI for the
refusals), real Redis, real keys; the command-line test runs ``teaagent tools call`` as a process
and interrupts it with SIGINT.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_support import (
    MakeCluster,
    Node,
    approval,
    approve_next,
    error,
    in_process,
    refusing_port,
    served,
    signer,
    undelivered,
    wait_until,
    write_cluster,
)
from words_support import AN_HOUR_AHEAD, moment_re

from teaagent.errors import ApprovalDeniedError, RelayError
from teaagent.quorum import sign_withdrawal
from teaagent.relay_client import RelayClient, RelayQuorumGate, RequestStatus
from teaagent_relay._worker import DeliveryWorker

WAIT = 20.0
PROCESS_WAIT = 90.0  # a command's Python start-up on a loaded two-core host comes first


@pytest.fixture
def nodes(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks beta and gamma (2 of 2); beta and gamma know alpha."""
    return make_cluster("alpha", "beta", "gamma", required=2, star="alpha")


def client_of(node: Node) -> RelayClient:
    return RelayClient(node.url, token=node.token)


def inbox_state(node: Node, request_id: str) -> str | None:
    with client_of(node) as client:
        try:
            return client.get_inbox_item(request_id, origin="alpha").state
        except RelayError:
            return None


def gate_of(alpha: Node, **overrides: Any) -> RelayQuorumGate:
    values: dict[str, Any] = {
        "relay_url": alpha.url,
        "token": alpha.token,
        "origin": "alpha",
        "private_key_signer": alpha.key,
        "config": alpha.quorum(),
        "timeout": WAIT,
    }
    values.update(overrides)
    return RelayQuorumGate(**values)


@pytest.mark.slow
def test_a_withdrawal_reaches_both_peers_and_no_later_decision_counts(nodes: dict[str, Node]) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    request = alpha.request(arguments={"command": "rm -rf build"})
    request_id = request["request_id"]
    with served(alpha, beta, gamma), client_of(alpha) as origin, client_of(gamma) as peer:
        origin.submit_request(request, alpha.signed(request)["signature"])
        assert wait_until(lambda: inbox_state(gamma, request_id) == "pending", WAIT)
        approve_next(beta)  # beta decided before the withdrawal: counted at alpha, 1 of 2
        assert wait_until(lambda: origin.get_request(request_id).signers == ("beta",), WAIT)

        withdrawal = sign_withdrawal(request, alpha.key)
        status = origin.withdraw(request_id, withdrawal["statement"], withdrawal["signature"])
        assert (status.state, status.signers) == ("withdrawn", ("beta",))
        assert status.withdrawal is not None
        assert status.withdrawal["statement"] == withdrawal["statement"]
        assert status.decided_at is not None
        # Final: GET and the outcome long-poll say so at once.
        assert origin.get_request(request_id).state == "withdrawn"
        started = time.monotonic()
        assert origin.wait_outcome(request_id, 30).state == "withdrawn"
        assert time.monotonic() - started < 5
        # A repeat is harmless, signed anew or not; the first withdrawal stays.
        again = sign_withdrawal(request, alpha.key, withdrawn_at=withdrawal["statement"]["withdrawn_at"] + 1)
        repeat = origin.withdraw(request_id, again["statement"], again["signature"])
        assert repeat.state == "withdrawn"
        assert repeat.withdrawal == status.withdrawal

        # The peers' relays verified it: gamma's item is withdrawn, off the pending listing.
        assert wait_until(lambda: inbox_state(gamma, request_id) == "withdrawn", WAIT)
        assert [item.request_id for item in peer.list_inbox()] == []
        assert [item.request_id for item in peer.list_inbox("withdrawn")] == [request_id]
        assert [(i.request_id, i.state) for i in peer.list_inbox("all")] == [(request_id, "withdrawn")]
        # beta had decided first: its own decision stays (it is on record at alpha already).
        assert inbox_state(beta, request_id) == "approved"

        # gamma's operator is too late: its relay refuses the decision and sends nothing.
        late = approval(request, "gamma")
        with pytest.raises(
            RelayError, match=r"\(409 withdrawn\): Request [0-9a-f]{32} was withdrawn by its origin alpha"
        ) as refused:
            peer.submit_decision(request_id, late["statement"], late["signature"])
        assert refused.value.code == "withdrawn"
        # Delivered to alpha by other means, it is answered as the state says and not counted.
        receipt = RelayClient(alpha.url).deliver_decision(request_id, late["statement"], late["signature"])
        assert (receipt.state, receipt.counted, receipt.decided) == ("withdrawn", False, False)
        final = origin.get_request(request_id)
        assert (final.state, final.signers, final.certificate) == ("withdrawn", ("beta",), None)


@pytest.mark.slow
def test_a_decided_request_cannot_be_withdrawn(nodes: dict[str, Node]) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    request = alpha.request(arguments={"command": "make"})
    with served(alpha, beta, gamma), client_of(alpha) as origin:
        origin.submit_request(request, alpha.signed(request)["signature"])
        approve_next(beta)
        approve_next(gamma)
        assert wait_until(lambda: origin.get_request(request["request_id"]).state == "approved", WAIT)
        withdrawal = sign_withdrawal(request, alpha.key)
        with pytest.raises(
            RelayError,
            match=r"\(409 already_decided\): Request [0-9a-f]{32} is already approved; it can no longer be "
            r"withdrawn\.$",
        ) as refused:
            origin.withdraw(request["request_id"], withdrawal["statement"], withdrawal["signature"])
        assert refused.value.status_code == 409
        assert origin.get_request(request["request_id"]).state == "approved"


@pytest.mark.anyio
async def test_the_origin_relay_refuses_forged_and_mismatched_withdrawals(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    request = alpha.request()
    request_id = request["request_id"]
    path = f"/v1/requests/{request_id}/withdrawal"
    async with in_process(alpha, deliver=False) as client:
        genuine = sign_withdrawal(request, alpha.key)
        # Unknown request first: nothing to withdraw.
        response = await client.post(path, json=genuine, headers=alpha.headers)
        assert error(response) == (
            404,
            "not_found",
            f"Request {request_id} is not stored here (it never arrived, or it expired).",
        )
        response = await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        assert response.status_code == 201
        # No token: the node's own call.
        response = await client.post(path, json=genuine)
        assert error(response)[:2] == (401, "unauthorized")
        # Wrong key: beta's key cannot withdraw alpha's request.
        forged = sign_withdrawal(request, signer("beta"))
        response = await client.post(path, json=forged, headers=alpha.headers)
        status, code, message = error(response)
        assert (status, code) == (403, "bad_signature")
        assert message.startswith("The withdrawal does not verify with this node's own key: ")
        # Mismatched digest (signed as it is: the statement is checked against the request first).
        other = dict(genuine["statement"], payload_digest="sha256:" + "0" * 64)
        response = await client.post(
            path, json={"statement": other, "signature": genuine["signature"]}, headers=alpha.headers
        )
        assert error(response) == (
            422,
            "invalid",
            f"The withdrawal's payload_digest does not match request {request_id}.",
        )
        # Another origin's withdrawal, a malformed time, a date in the future, a dev signature.
        response = await client.post(
            path,
            json={"statement": dict(genuine["statement"], origin="beta"), "signature": genuine["signature"]},
            headers=alpha.headers,
        )
        assert error(response)[:2] == (403, "forbidden")
        response = await client.post(
            path,
            json={
                "statement": dict(genuine["statement"], withdrawn_at=True),
                "signature": genuine["signature"],
            },
            headers=alpha.headers,
        )
        assert error(response) == (
            422,
            "invalid",
            "The withdrawal's withdrawn_at is not an integer Unix time.",
        )
        ahead = int(time.time()) + 3600
        future = sign_withdrawal(request, alpha.key, withdrawn_at=ahead)
        response = await client.post(path, json=future, headers=alpha.headers)
        status, code, message = error(response)
        assert (status, code) == (422, "invalid")
        assert re.fullmatch(  # a date and how far ahead, not Unix seconds
            f"The withdrawal is dated {moment_re(ahead, AN_HOUR_AHEAD)}, more than 60 seconds "
            "in the future\\.",
            message,
        ), message
        response = await client.post(
            path, json={"statement": genuine["statement"], "signature": "dev:alpha"}, headers=alpha.headers
        )
        assert error(response)[:2] == (403, "bad_signature")
        # None of it withdrew anything; the genuine one does.
        response = await client.get(f"/v1/requests/{request_id}", headers=alpha.headers)
        assert response.json()["state"] == "pending"
        response = await client.post(path, json=genuine, headers=alpha.headers)
        assert response.status_code == 200
        assert response.json()["state"] == "withdrawn"
        response = await client.get("/metrics")
        assert 'teaagent_relay_outcomes_total{state="withdrawn"} 1.0' in response.text


@pytest.mark.anyio
async def test_a_peer_relay_refuses_withdrawals_it_cannot_verify(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    request_id = request["request_id"]
    path = f"/v1/inbox/{request_id}/withdrawal"
    genuine = sign_withdrawal(request, alpha.key)
    async with in_process(beta, deliver=False) as client:
        response = await client.post(path, json=genuine)
        assert error(response) == (
            404,
            "not_found",
            f"No request {request_id} from alpha is in this node's inbox.",
        )
        response = await client.post("/v1/inbox", json=alpha.signed(request))
        assert response.status_code == 201
        # Signed by another key (gamma's, or beta's own): refused, the item stays pending.
        for name in ("gamma", "beta"):
            forged = sign_withdrawal(request, signer(name))
            response = await client.post(path, json=forged)
            status, code, message = error(response)
            assert (status, code) == (403, "bad_signature")
            assert message.startswith("The withdrawal does not verify with the key configured for alpha: ")
        mismatched = dict(genuine["statement"], expires_at=genuine["statement"]["expires_at"] + 1)
        response = await client.post(path, json={"statement": mismatched, "signature": genuine["signature"]})
        assert error(response) == (
            422,
            "invalid",
            f"The withdrawal's expires_at does not match request {request_id}.",
        )
        stranger = dict(genuine["statement"], origin="mallory")
        response = await client.post(path, json={"statement": stranger, "signature": genuine["signature"]})
        assert error(response) == (403, "forbidden", "'mallory' is not a configured peer of this node.")
        response = await client.post(f"/v1/inbox/{'f' * 32}/withdrawal", json=genuine)
        assert error(response) == (
            422,
            "invalid",
            "The withdrawal's request_id is not the request in the path.",
        )
        response = await client.post(path, json={"statement": genuine["statement"]})
        assert error(response)[:2] == (422, "invalid")
        response = await client.get(f"/v1/inbox/{request_id}", headers=beta.headers)
        assert response.json()["state"] == "pending"
        # The genuine one withdraws it; a repeat says so without changing anything.
        response = await client.post(path, json=genuine)
        assert response.status_code == 200
        assert response.json() == {
            "request_id": request_id,
            "origin": "alpha",
            "state": "withdrawn",
            "withdrawn": True,
        }
        response = await client.post(path, json=genuine)
        assert response.json()["withdrawn"] is False
        response = await client.get("/v1/inbox", headers=beta.headers)
        assert response.json() == []
        decision = approval(request, "beta")
        response = await client.post(f"/v1/inbox/{request_id}/decision", json=decision, headers=beta.headers)
        assert error(response) == (
            409,
            "withdrawn",
            f"Request {request_id} was withdrawn by its origin alpha; no decision on it counts any more.",
        )


@pytest.mark.slow
def test_the_gate_withdraws_its_request_on_keyboard_interrupt(nodes: dict[str, Node]) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    seen: list[RequestStatus] = []
    with served(alpha, beta, gamma):
        gate = gate_of(alpha, on_status=seen.append)
        request = alpha.request(arguments={"command": "rm -rf /tmp/x"})
        request_id = request["request_id"]

        def interrupt_once_it_waits() -> None:
            # Ctrl-C as the terminal sends it: SIGINT to this process, KeyboardInterrupt in the main thread.
            # Once both peers hold it: a withdrawal overtaking its request is the tests' below.
            wait_until(
                lambda: inbox_state(beta, request_id) == inbox_state(gamma, request_id) == "pending", WAIT
            )
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt_once_it_waits, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            gate.obtain(request)
        assert gate.last_withdrawal == f"Withdrawn: request {request_id} of shell.run; the peers drop it."
        with client_of(alpha) as origin:
            assert origin.get_request(request_id).state == "withdrawn"
        assert wait_until(lambda: inbox_state(beta, request_id) == "withdrawn", WAIT)
        assert wait_until(lambda: inbox_state(gamma, request_id) == "withdrawn", WAIT)
        gate.close()


@pytest.mark.slow
def test_a_stopped_wait_withdraws_and_says_so(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    stop = threading.Event()
    with served(alpha, beta):
        gate = gate_of(alpha, stop=stop)
        request = alpha.request(arguments={"command": "rm"})
        request_id = request["request_id"]
        threading.Thread(
            target=lambda: (
                wait_until(lambda: inbox_state(beta, request_id) == "pending", WAIT) and stop.set()
            ),
            daemon=True,
        ).start()
        with pytest.raises(
            ApprovalDeniedError,
            match=rf"^shell\.run was not run: the wait for its quorum was stopped\. Withdrawn: request "
            rf"{request_id} of shell\.run; the peers drop it\.$",
        ):
            gate.obtain(request)
        assert wait_until(lambda: inbox_state(beta, request_id) == "withdrawn", WAIT)
        gate.close()


def test_an_interrupted_wait_whose_relay_is_gone_says_the_request_was_not_withdrawn(
    nodes: dict[str, Node],
) -> None:
    alpha = nodes["alpha"]
    request = alpha.request()
    # alpha's relay is down (its port refuses every connection): the gate fails its submission at
    # once; the withdrawal sentence of an interrupted wait says what happened instead of raising.
    with refusing_port() as down:
        gone = f"http://127.0.0.1:{down}"
        gate = gate_of(alpha, relay_url=gone)
        sentence = gate._withdraw(request)
        gate.close()
    assert sentence.startswith(
        f"Not withdrawn: request {request['request_id']} of shell.run stays with the peers until it expires "
        f"(The relay at {gone} is unreachable"
    )
    assert gate.last_withdrawal == sentence


# -- the command line ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_in_tools_call_withdraws_the_request_and_exits_130_with_one_line(
    nodes: dict[str, Node],
) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    with alpha.config_path.open("a") as config:
        config.write('\n[agent]\npermission_mode = "danger-full-access"\n')
    (alpha.folder / "workspace-alpha").mkdir()
    with served(alpha, beta, gamma), client_of(beta) as peer:
        process = subprocess.Popen(
            [sys.executable, "-m", "teaagent", "tools", "call", "--config", str(alpha.config_path),
             "shell.run", '{"command": "touch ran"}'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=alpha.env(),
        )  # fmt: skip
        try:
            # Nobody answers: the call waits for its quorum until the request reaches beta's inbox.
            items = wait_until(lambda: peer.list_inbox(), PROCESS_WAIT)
            assert items, "the request never reached beta"
            [item] = items
            os.kill(process.pid, signal.SIGINT)
            out, err = process.communicate(timeout=WAIT)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        assert process.returncode == 130, err
        assert out == ""
        lines = err.splitlines()
        assert lines[-1] == f"teaagent: Withdrawn: request {item.request_id} of shell.run; the peers drop it."
        assert "Traceback" not in err
        assert [line for line in lines if "ithdraw" in line or "nterrupt" in line] == [lines[-1]]
        assert not (alpha.folder / "workspace-alpha" / "ran").exists()
        assert wait_until(lambda: inbox_state(beta, item.request_id) == "withdrawn", WAIT)
        assert wait_until(lambda: inbox_state(gamma, item.request_id) == "withdrawn", WAIT)
        assert peer.list_inbox() == []
        with client_of(alpha) as origin:
            assert origin.get_request(item.request_id).state == "withdrawn"


@pytest.mark.slow
def test_ctrl_c_in_teaagent_run_withdraws_the_wait_of_its_worker_thread(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    with alpha.config_path.open("a") as config:
        config.write('\n[agent]\npermission_mode = "danger-full-access"\nprovider = "scripted"\n')
    (alpha.folder / "workspace-alpha").mkdir()
    script = alpha.folder / "script.json"
    script.write_text(
        '[{"tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "touch ran"}}]}, '
        '{"content": "done"}]'
    )
    with served(alpha, beta), client_of(beta) as peer:
        process = subprocess.Popen(
            [sys.executable, "-m", "teaagent", "run", "--config", str(alpha.config_path),
             "--script", str(script), "Touch it."],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=alpha.env(),
        )  # fmt: skip
        try:
            items = wait_until(lambda: peer.list_inbox(), PROCESS_WAIT)
            assert items, "the request never reached beta"
            [item] = items
            os.kill(process.pid, signal.SIGINT)
            out, err = process.communicate(timeout=WAIT)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        assert process.returncode == 130, err
        assert err.splitlines() == [
            f"teaagent: Withdrawn: request {item.request_id} of shell.run; the peers drop it."
        ]
        assert "Traceback" not in out
        assert not (alpha.folder / "workspace-alpha" / "ran").exists()
        assert wait_until(lambda: inbox_state(beta, item.request_id) == "withdrawn", WAIT)


@pytest.mark.slow
def test_a_request_withdrawn_while_a_peer_was_down_never_reaches_it(
    nodes: dict[str, Node], redis_url: str
) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    request = alpha.request(arguments={"command": "rm -rf cache"})
    request_id = request["request_id"]
    with served(alpha), client_of(alpha) as origin:
        origin.submit_request(request, alpha.signed(request)["signature"])
        # beta's and gamma's relays are down: the deliveries fail and wait for a retry.
        assert wait_until(lambda: origin.get_request(request_id).deliveries.get("beta"), WAIT)
        assert wait_until(lambda: origin.get_request(request_id).deliveries["beta"].attempts >= 1, WAIT)
        withdrawal = sign_withdrawal(request, alpha.key)
        assert (
            origin.withdraw(request_id, withdrawal["statement"], withdrawal["signature"]).state == "withdrawn"
        )
        with served(beta, gamma):
            # Back: the request's retry is dropped at alpha, its withdrawal refused (unknown there).
            assert wait_until(lambda: undelivered(redis_url, alpha) == 0, WAIT)
            for peer_node in (beta, gamma):
                with client_of(peer_node) as peer:
                    with pytest.raises(RelayError, match=r"\(404 not_found\)"):
                        peer.get_inbox_item(request_id, origin="alpha")
                    assert peer.list_inbox("all") == []


# -- a withdrawal and its request on their way to one peer ------------------------------------------


def pair(tmp_path: Path, redis_url: str, redis_prefix: str) -> tuple[Node, Node]:
    """alpha asks gamma alone (1 of 1): one peer, so one worker's transport reaches every target."""
    nodes = write_cluster(
        tmp_path,
        ["alpha", "gamma"],
        redis_url=redis_url,
        prefix=redis_prefix,
        required=1,
        peers_of={"alpha": ["gamma"], "gamma": ["alpha"]},
    )
    return nodes["alpha"], nodes["gamma"]


async def deliver_until_done(worker: DeliveryWorker) -> None:
    """Run the worker's rounds (retries included) until alpha's queue holds nothing waiting."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        await worker.run_once(block_ms=100)
        stats = await worker.relay.deliveries.stats()
        if stats.length == 0 and stats.scheduled == 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"alpha's deliveries still wait after {WAIT} s")


async def gamma_state(gamma_client: httpx.AsyncClient, gamma: Node, request_id: str) -> str | None:
    answer = await gamma_client.get(
        f"/v1/inbox/{request_id}", params={"origin": "alpha"}, headers=gamma.headers
    )
    return answer.json()["state"] if answer.status_code == 200 else None


@pytest.mark.anyio
async def test_a_withdrawal_that_overtakes_its_request_is_retried_until_the_peer_drops_it(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    # Both leave at once; a slow peer may store the request after it refused the withdrawal (404).
    # Refused for good, the peer would then offer its operators a request nobody waits for.
    alpha, gamma = pair(tmp_path, redis_url, redis_prefix)
    async with (
        in_process(gamma, deliver=False) as gamma_client,
        in_process(alpha, deliver=False, delivery_retry_base_seconds=0.05) as alpha_client,
    ):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        request = alpha.request()
        request_id = request["request_id"]
        await alpha_client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        withdrawal = sign_withdrawal(request, alpha.key)
        withdrawn = await alpha_client.post(
            f"/v1/requests/{request_id}/withdrawal", json=withdrawal, headers=alpha.headers
        )
        worker = DeliveryWorker(
            relay,
            min_idle_seconds=10,
            transport=httpx.ASGITransport(app=gamma_client.app),  # type: ignore[attr-defined]
        )
        try:
            batch = await relay.deliveries.claim(worker.consumer, 10, 0)
            by_path = {json.loads(delivery.payload)["path"]: delivery for delivery in batch}
            await worker.deliver(by_path[f"/v1/inbox/{request_id}/withdrawal"])  # overtakes...
            await worker.deliver(by_path["/v1/inbox"])  # ...its request
            between = await gamma_state(gamma_client, gamma, request_id)
            await deliver_until_done(worker)
        finally:
            await worker.aclose()
        final = await gamma_state(gamma_client, gamma, request_id)
        dead = await relay.deliveries.dead_letters()

    assert withdrawn.status_code == 200
    assert sorted(by_path) == ["/v1/inbox", f"/v1/inbox/{request_id}/withdrawal"]
    assert between == "pending"
    assert final == "withdrawn"
    assert dead == []


@pytest.mark.anyio
async def test_a_withdrawal_of_a_request_that_never_reached_the_peer_ends_without_a_dead_letter(
    tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    alpha, gamma = pair(tmp_path, redis_url, redis_prefix)
    async with (
        in_process(gamma, deliver=False) as gamma_client,
        in_process(alpha, deliver=False, delivery_retry_base_seconds=0.05) as alpha_client,
    ):
        relay = alpha_client.app.state.relay  # type: ignore[attr-defined]
        request = alpha.request()
        request_id = request["request_id"]
        await alpha_client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        # gamma's port has nobody listening (its app runs over ASGI only): the first attempt fails.
        down = DeliveryWorker(relay, min_idle_seconds=10)
        try:
            assert await down.run_once(block_ms=0) == 1
        finally:
            await down.aclose()
        withdrawal = sign_withdrawal(request, alpha.key)
        await alpha_client.post(
            f"/v1/requests/{request_id}/withdrawal", json=withdrawal, headers=alpha.headers
        )
        up = DeliveryWorker(
            relay,
            min_idle_seconds=10,
            transport=httpx.ASGITransport(app=gamma_client.app),  # type: ignore[attr-defined]
        )
        try:
            await deliver_until_done(up)
        finally:
            await up.aclose()
        final = await gamma_state(gamma_client, gamma, request_id)
        dead = await relay.deliveries.dead_letters()
        stored = await relay.store.requests.get(request_id)

    # The request's retry is dropped (withdrawn), so its withdrawal, refused 404, ends too: acked.
    assert final is None
    assert dead == []
    assert stored is not None
    assert stored.deliveries["gamma"].state == "given_up"
    assert stored.deliveries["gamma"].error == "withdrawn before it reached gamma"
