"""A running relay and approver read their trust again without a restart (teaagent._reload).

Real processes on loopback (``teaagent relay serve``, ``teaagent approver serve``) over the test's
Redis: ``teaagent peers add`` and ``teaagent operators add`` have them reload through
``POST /v1/reload`` and say so; ``SIGHUP`` makes them read hand-edited files again; a file that no
longer loads leaves the old trust in use, logged once and counted.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from relay_support import (
    APPROVE_ECHO,
    ApproverProcess,
    MakeCluster,
    Node,
    RelayProcess,
    approval,
    approver_in_process,
    in_process,
    private_key,
    public_line,
    served,
    shell_request,
    signer,
    wait_until,
)

from teaagent._http import client_verify
from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import approval_statement, sign_approval, sign_withdrawal

WAIT = 60.0  # seconds a test waits for what takes a few on an idle host

RULES = APPROVE_ECHO


def teaagent(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("TEAAGENT_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "teaagent", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=env,
        check=False,
    )


def write_private_key(folder: Path, name: str) -> Path:
    path = folder / "keys" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        private_key(name).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    path.with_name(f"{name}.pub").write_text(public_line(name) + "\n")
    return path


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10, verify=client_verify()).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def reloads(url: str, service: str, result: str) -> float:
    return metric(url, f'teaagent_{service}_trust_reloads_total{{result="{result}"}}')


def hang_up(process: RelayProcess | ApproverProcess) -> None:
    assert process.process is not None
    os.kill(process.process.pid, signal.SIGHUP)


def signed_as(request: dict[str, Any], node: str, key: str) -> dict[str, Any]:
    """``node``'s approval of ``request``, signed with the key of ``key`` (an operator of ``node``)."""
    signed = sign_approval(request, node, signer(key))
    return {
        "statement": approval_statement(request, node, int(signed.timestamp)),
        "signature": signed.signature,
    }


def submitted(alpha: Node, config: MultiSigQuorumConfig, call_id: str) -> dict[str, Any]:
    """A request of alpha's agent, stored by alpha's relay (and fanned out to its peers)."""
    request = shell_request(config, f"rm -rf {call_id}", call_id=call_id, reason="clean up")
    response = httpx.post(
        f"{alpha.url}/v1/requests", json=alpha.signed(request), headers=alpha.headers, timeout=20
    )
    assert response.status_code == 201, response.text
    return request


def decide(alpha: Node, request: dict[str, Any], decision: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{alpha.url}/v1/requests/{request['request_id']}/decisions", json=decision, timeout=20)


@pytest.mark.slow
def test_peers_add_while_the_services_run_counts_the_new_peer_without_a_restart(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster(
        "alpha",
        "beta",
        "gamma",
        required=1,
        peers_of={"alpha": ["beta"], "beta": ["alpha"], "gamma": ["alpha"]},
        rules={"alpha": RULES},
    )
    alpha, gamma = nodes["alpha"], nodes["gamma"]
    (tmp_path / "keys" / "gamma.pub").write_text(public_line("gamma") + "\n")
    relay = RelayProcess(alpha, tmp_path).start()
    approver = ApproverProcess(alpha, tmp_path).start()
    gamma_relay = RelayProcess(gamma, tmp_path).start()
    gate = gamma.gate(
        timeout=WAIT,
    )
    try:
        added = teaagent(
            "peers", "add", "gamma", tmp_path / "keys" / "gamma.pub", gamma.url, "--config", alpha.config_path
        )
        assert added.returncode == 0, added.stderr
        assert added.stdout.splitlines()[-1] == "alpha's relay and approver reloaded it."

        # gamma asks alpha: alpha's relay takes gamma's request, alpha's approver verifies and signs it.
        certificate = gate.obtain(gamma.request(arguments={"command": "echo 1"}))
        assert [each["statement"]["signer"] for each in certificate["approvals"]] == ["alpha"]

        # alpha asks gamma (and beta): gamma's signature counts at alpha's relay.
        both = MultiSigQuorumConfig(
            enabled=True,
            required_approvals=1,
            peer_agent_ids=["beta", "gamma"],
            peer_public_keys={"beta": public_line("beta"), "gamma": public_line("gamma")},
            peer_relay_urls={"beta": nodes["beta"].url, "gamma": gamma.url},
            high_risk_patterns=["shell.*"],
        )
        request = submitted(alpha, both, "own-1")
        counted = decide(alpha, request, approval(request, "gamma"))
        assert counted.status_code == 200, counted.text
        assert (counted.json()["counted"], counted.json()["state"]) == (True, "approved")
        assert reloads(alpha.url, "relay", "reloaded") == 1.0
        assert reloads(approver.url, "approver", "reloaded") == 1.0
        assert relay.process is not None
        assert relay.process.poll() is None
        assert approver.process is not None
        assert approver.process.poll() is None
    finally:
        gate.close()
        gamma_relay.stop()
        approver.stop()
        relay.stop()


@pytest.fixture
def operated(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks beta (1 of 1); carol signs for beta, listed in beta.operators (beta's operators file
    and, at alpha, beta's allowed_signers)."""
    return make_cluster("alpha", "beta", required=1, operators={"beta": ["carol"]})


@pytest.mark.slow
def test_sighup_after_editing_allowed_signers_counts_the_new_key(
    operated: dict[str, Node], tmp_path: Path
) -> None:
    alpha = operated["alpha"]
    relay = RelayProcess(alpha, tmp_path).start()
    try:
        request = submitted(alpha, alpha.quorum(), "dave-1")
        refused = decide(alpha, request, signed_as(request, "beta", "dave"))
        assert refused.status_code == 403, refused.text

        with (tmp_path / "beta.operators").open("a") as handle:
            handle.write(f"beta {public_line('dave')} dave\n")
        hang_up(relay)
        wait_until(lambda: reloads(alpha.url, "relay", "reloaded") == 1.0, timeout=WAIT)

        counted = decide(alpha, request, signed_as(request, "beta", "dave"))
        assert counted.status_code == 200, counted.text
        assert (counted.json()["counted"], counted.json()["state"]) == (True, "approved")
        assert metric(alpha.url, "teaagent_relay_trust_generation") == 2.0
    finally:
        relay.stop()


@pytest.mark.slow
def test_a_broken_file_on_reload_keeps_the_old_trust(operated: dict[str, Node], tmp_path: Path) -> None:
    alpha = operated["alpha"]
    relay = RelayProcess(alpha, tmp_path).start()
    operators = tmp_path / "beta.operators"
    try:
        operators.write_text(operators.read_text() + f"beta {public_line('dave')[:30]}\n")  # a cut key
        hang_up(relay)
        wait_until(lambda: reloads(alpha.url, "relay", "failed") == 1.0, timeout=WAIT)
        asked = httpx.post(f"{alpha.url}/v1/reload", headers=alpha.headers, timeout=20)
        assert asked.status_code == 422
        assert asked.json()["error"] == "reload_failed"
        assert asked.json()["message"].startswith("The relay kept its trust: ")
        assert "beta.operators:2" in asked.json()["message"]
        assert reloads(alpha.url, "relay", "failed") == 2.0

        # The old trust is in use: carol (listed before) still signs for beta, dave counts for nothing.
        request = submitted(alpha, alpha.quorum(), "carol-1")
        assert decide(alpha, request, signed_as(request, "beta", "dave")).status_code == 403
        counted = decide(alpha, request, signed_as(request, "beta", "carol"))
        assert counted.status_code == 200, counted.text
        assert counted.json()["counted"] is True
        logged = [line for line in relay.log_path.read_text().splitlines() if "kept its trust" in line]
        assert len(logged) == 2, logged  # one line per failed reload: SIGHUP, then POST /v1/reload
        assert "Traceback" not in relay.log_path.read_text()
        assert metric(alpha.url, "teaagent_relay_trust_generation") == 1.0
    finally:
        relay.stop()


def wait_for_inbox(beta: Node, request_id: str) -> None:
    def arrived() -> bool:
        response = httpx.get(f"{beta.url}/v1/inbox/{request_id}", headers=beta.headers, timeout=10)
        return response.status_code == 200

    wait_until(arrived, timeout=WAIT)


@pytest.mark.slow
def test_an_operator_key_the_approver_has_not_loaded_is_named_then_sighup_loads_it(
    operated: dict[str, Node], tmp_path: Path
) -> None:
    alpha, beta = operated["alpha"], operated["beta"]
    dave = write_private_key(tmp_path, "dave")
    relays = [RelayProcess(alpha, tmp_path).start(), RelayProcess(beta, tmp_path).start()]
    approver = ApproverProcess(beta, tmp_path).start()
    try:
        request = submitted(alpha, alpha.quorum(), "dave-2")
        request_id = request["request_id"]
        wait_for_inbox(beta, request_id)
        unknown = teaagent("approvals", "approve", request_id, "--key", dave, "--config", beta.config_path)
        assert unknown.returncode == 2
        assert unknown.stderr.count("\n") == 1, unknown.stderr
        assert unknown.stderr.endswith(
            f"(403 forbidden): The approval was signed by {signer('dave').public_key.fingerprint}, which "
            "is not a key of beta: list it first "
            f"(teaagent operators add KEY.pub --config {beta.config_path}).\n"
        )
        with (tmp_path / "beta.operators").open("a") as handle:
            handle.write(f"beta {public_line('dave')} dave\n")  # by hand: nothing reloads it

        refused = teaagent("approvals", "approve", request_id, "--key", dave, "--config", beta.config_path)
        assert refused.returncode == 2
        assert approver.process is not None
        assert refused.stderr.count("\n") == 1, refused.stderr  # one sentence, no traceback
        assert refused.stderr.endswith(
            f"(403 forbidden): The approval was signed by {signer('dave').public_key.fingerprint}, which "
            "beta.operators lists for beta but this approver has not loaded yet: reload it "
            f"(kill -HUP {approver.process.pid}, or restart it) and submit the decision again.\n"
        )

        for service in (approver, *relays):
            hang_up(service)
        wait_until(lambda: reloads(approver.url, "approver", "reloaded") == 1.0, timeout=WAIT)
        for node in (alpha, beta):
            wait_until(lambda node=node: reloads(node.url, "relay", "reloaded") == 1.0, timeout=WAIT)

        approved = teaagent("approvals", "approve", request_id, "--key", dave, "--config", beta.config_path)
        assert approved.returncode == 0, approved.stderr

        def state() -> str:
            response = httpx.get(f"{alpha.url}/v1/requests/{request_id}", headers=alpha.headers, timeout=10)
            return str(response.json()["state"])

        wait_until(lambda: state() == "approved", timeout=WAIT)
    finally:
        approver.stop()
        for relay in relays:
            relay.stop()


@pytest.mark.slow
def test_operators_add_reloads_the_running_relay_and_approver(
    operated: dict[str, Node], tmp_path: Path
) -> None:
    beta = operated["beta"]
    dave = write_private_key(tmp_path, "dave")
    relay = RelayProcess(beta, tmp_path).start()
    approver = ApproverProcess(beta, tmp_path).start()
    try:
        added = teaagent("operators", "add", dave.with_name("dave.pub"), "--config", beta.config_path)
        assert added.returncode == 0, added.stderr
        assert added.stdout.splitlines()[-1] == "beta's relay and approver reloaded it."
        assert reloads(beta.url, "relay", "reloaded") == 1.0
        assert reloads(approver.url, "approver", "reloaded") == 1.0
    finally:
        approver.stop()
        relay.stop()
    stopped = teaagent("operators", "add", tmp_path / "keys" / "gamma.pub", "--config", beta.config_path)
    assert stopped.returncode == 2  # no such file: the sentence names it
    (tmp_path / "keys" / "erin.pub").write_text(public_line("erin") + "\n")
    alone = teaagent("operators", "add", tmp_path / "keys" / "erin.pub", "--config", beta.config_path)
    assert alone.returncode == 0, alone.stderr
    assert (
        alone.stdout.splitlines()[-1]
        == "beta's relay and approver are not running; they read it when they start."
    )


def _without_peer(config: Path, peer: str) -> None:
    """Remove ``[peers.PEER]`` from a node.toml written by ``write_cluster``."""
    text = config.read_text()
    start = text.index(f"\n[peers.{peer}]\n")
    end = text.index("\n[", start + 1)
    config.write_text(text[:start] + text[end:])


@pytest.mark.anyio
async def test_a_check_in_flight_keeps_its_snapshot_when_a_reload_removes_the_peer(
    monkeypatch: pytest.MonkeyPatch, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    async with in_process(beta, deliver=False) as client:
        stored = await client.post("/v1/inbox", json=alpha.signed(request))
        assert stored.status_code == 201, stored.text
        relay = client.app.state.relay  # type: ignore[attr-defined]
        read = relay.store.inbox.get

        async def read_then_reload(origin: str, request_id: str) -> Any:
            found = await read(origin, request_id)
            # Between the withdrawal's check of its origin and its verification: alpha is removed.
            _without_peer(beta.config_path, "alpha")
            outcome = await client.app.state.trust.reload("test")  # type: ignore[attr-defined]
            assert outcome.result == "reloaded", outcome
            return found

        monkeypatch.setattr(relay.store.inbox, "get", read_then_reload)
        withdrawal = sign_withdrawal(request, alpha.key)
        path = f"/v1/inbox/{request['request_id']}/withdrawal"
        in_flight = await client.post(path, json=withdrawal)
        monkeypatch.undo()
        after = await client.post("/v1/inbox", json=alpha.signed(alpha.request(call_id="call-2")))

    # The withdrawal began under the old trust and ends under it (not a 500 half-way between two);
    # what comes after the reload is checked with the new one: alpha is no peer of beta any more.
    assert in_flight.status_code == 200, in_flight.text
    assert in_flight.json()["withdrawn"] is True
    assert after.status_code == 403
    assert after.json()["message"] == "'alpha' is not a configured peer of this node."


@pytest.mark.anyio
async def test_a_peer_removed_by_a_reload_counts_for_nothing_on_a_request_made_before(
    make_cluster: MakeCluster,
) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", required=1)
    alpha = nodes["alpha"]
    request = alpha.request()
    async with in_process(alpha, deliver=False) as client:
        submitted = await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        assert submitted.status_code == 201, submitted.text
        known = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)
        assert known.status_code == 200  # counted peers computed, and remembered, under the old trust
        _without_peer(alpha.config_path, "gamma")
        reloaded = await client.post("/v1/reload", headers=alpha.headers)
        refused = await client.post(
            f"/v1/requests/{request['request_id']}/decisions", json=approval(request, "gamma")
        )
        counted = await client.post(
            f"/v1/requests/{request['request_id']}/decisions", json=approval(request, "beta")
        )

    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json() == {
        "result": "reloaded",
        "generation": 2,
        "peers": ["beta"],
        "operators": 0,
        "restart": [],
    }
    assert refused.status_code == 403, refused.text
    assert counted.status_code == 200, counted.text
    assert (counted.json()["counted"], counted.json()["state"]) == (True, "approved")


@pytest.mark.anyio
async def test_the_approver_forgets_what_verified_under_the_old_trust(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    path = f"/v1/requests/{request['request_id']}"
    with served(beta, deliver=False):
        stored = httpx.post(f"{beta.url}/v1/inbox", json=alpha.signed(request), timeout=20)
        assert stored.status_code == 201, stored.text
        async with approver_in_process(beta, engine=False) as client:
            client.headers["Authorization"] = f"Bearer {beta.token}"
            shown = await client.get(path)  # verified once, and remembered
            _without_peer(beta.config_path, "alpha")
            reloaded = await client.post("/v1/reload")
            refused = await client.get(path)
            approved = await client.post(f"{path}/approve", json={})

    assert shown.status_code == 200, shown.text
    assert reloaded.status_code == 200, reloaded.text
    assert reloaded.json()["peers"] == ["gamma"]
    # alpha is no peer of beta any more: its request is neither shown nor signed.
    assert refused.status_code == 422, refused.text
    assert "is not a configured peer of beta" in refused.json()["message"]
    assert approved.status_code == 422, approved.text


@pytest.mark.anyio
async def test_a_reload_refuses_another_identity_and_names_what_takes_a_restart(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    from teaagent._reload import TrustReloader
    from teaagent.config import load_config

    nodes = make_cluster("alpha", "beta", required=1)
    path = nodes["alpha"].config_path
    original = path.read_text()
    reloader = TrustReloader(load_config(path), what="the relay of alpha")

    path.write_text(original.replace("[quorum]\n", "[agent]\nport = 18700\n\n[quorum]\n"))
    moved = await reloader.reload("test")
    path.write_text(original.replace("allow_dev_signatures = false", "allow_dev_signatures = true"))
    dev = await reloader.reload("test")
    write_private_key(tmp_path, "omega")
    path.write_text(original.replace('private_key = "keys/alpha"', 'private_key = "keys/omega"'))
    other_key = await reloader.reload("test")
    path.write_text(original.replace('agent_id = "alpha"', 'agent_id = "gamma"'))
    other_node = await reloader.reload("test")

    assert (moved.result, moved.restart) == ("unchanged", ("agent",))
    assert dev.result == "failed"
    assert dev.problem == f"{path}: quorum.allow_dev_signatures changed; that takes a restart."
    assert other_key.problem == f"{path}: the node key changed; a new node key takes a restart."
    assert (
        other_node.problem == f"{path}: agent_id is now 'gamma', not 'alpha'; another node takes a restart."
    )
    assert reloader.trust.generation == 1
