"""A node that heals by itself: its relay (and with it the embedded Redis) restarted under a
running approver, the approver started before its relay, and a Ctrl-C in the relay's terminal.

Real processes on loopback, each node on its own embedded Redis (``redis_url = "embedded"``):
the server keeps its Unix socket and password across restarts, so the approver's clients
reconnect to the same URL and nobody is restarted by hand.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from relay_support import APPROVE_ECHO, ApproverProcess, Node, RelayProcess, wait_until, write_cluster

from teaagent.relay_client import RelayQuorumGate

pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds a test waits for what takes a few on an idle host

RULES = APPROVE_ECHO


def two_nodes(tmp_path: Path) -> dict[str, Node]:
    """alpha asks, beta's approver approves by rule; each node runs its own embedded Redis."""
    return write_cluster(
        tmp_path,
        ["alpha", "beta"],
        redis_url="embedded",
        prefix="ta",
        required=1,
        rules={"beta": RULES},
    )


def gate_of(alpha: Node) -> RelayQuorumGate:
    return alpha.gate(
        timeout=WAIT,
    )


def approved(gate: RelayQuorumGate, alpha: Node, n: int) -> None:
    """alpha's call ``n`` gets its certificate, signed by beta's approver."""
    certificate = gate.obtain(alpha.request(arguments={"command": f"echo {n}"}, call_id=f"call-{n}"))
    assert [a["statement"]["signer"] for a in certificate["approvals"]] == ["beta"]


def server_pid(node: Node) -> int:
    return int(json.loads((node.data_dir / "redis" / "server.json").read_text())["pid"])


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def lines_with(path: Path, text: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if text in line]


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "kill -9"])
def test_an_approver_heals_by_itself_when_its_relay_and_redis_restart(tmp_path: Path, how: str) -> None:
    nodes = two_nodes(tmp_path)
    alpha, beta = nodes["alpha"], nodes["beta"]
    alpha_relay = RelayProcess(alpha, tmp_path).start()
    beta_relay = RelayProcess(beta, tmp_path).start()
    approver = ApproverProcess(beta, tmp_path).start()
    gate = gate_of(alpha)
    try:
        approved(gate, alpha, 1)
        assert beta_relay.process is not None
        if how == "kill -9":
            beta_relay.kill()  # its Redis is left behind; the next relay stops it and starts its own
        else:
            beta_relay.process.send_signal(getattr(signal, how))
            assert beta_relay.process.wait(timeout=WAIT) == 0
        restarted = time.monotonic()
        beta_relay = RelayProcess(beta, tmp_path).start()
        ready = time.monotonic()
        approved(gate, alpha, 2)  # the same approver process, never restarted
        healed = time.monotonic()
        print(
            f"\nheal after {how}: relay ready {ready - restarted:.2f} s after its restart, "
            f"the approver's next approval {healed - restarted:.2f} s after it"
        )
        assert approver.process is not None
        assert approver.process.poll() is None
        assert not lines_with(approver.log_path, "Traceback")
    finally:
        gate.close()
        approver.stop()
        beta_relay.stop()
        alpha_relay.stop()


def test_an_approver_started_before_its_relay_waits_says_so_once_and_then_works(tmp_path: Path) -> None:
    nodes = two_nodes(tmp_path)
    alpha, beta = nodes["alpha"], nodes["beta"]
    approver = ApproverProcess(beta, tmp_path).start(wait=False)
    relays: list[RelayProcess] = []
    gate = gate_of(alpha)
    try:
        assert wait_until(lambda: lines_with(approver.log_path, "waits for its Redis"), timeout=WAIT)
        relays.append(RelayProcess(alpha, tmp_path).start())  # a few seconds pass: the approver waits on
        relays.append(RelayProcess(beta, tmp_path).start())
        approver.wait_ready()
        approved(gate, alpha, 1)
        assert approver.process is not None
        assert approver.process.poll() is None
        [waiting] = lines_with(approver.log_path, "waits for its Redis")
        assert waiting.endswith(
            f"approver of beta waits for its Redis: beta's embedded Redis runs with its relay: "
            f"start it (teaagent relay serve --config {beta.config_path})"
        )
        assert len(lines_with(approver.log_path, "approver of beta's Redis answers after")) == 1
        assert not lines_with(approver.log_path, "Traceback")
    finally:
        gate.close()
        approver.stop()
        for relay in relays:
            relay.stop()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT"])
def test_an_approver_waiting_for_its_redis_stops_at_once_on_a_stop_signal(tmp_path: Path, how: str) -> None:
    """Stopped while it waits for the relay's Redis, the approver exits 0 in one line, no traceback.

    It used to wait inside its application's start-up, where uvicorn hears the signal but acts on
    it only once the start-up ends: that is, never, until a SIGKILL.
    """
    beta = two_nodes(tmp_path)["beta"]
    approver = ApproverProcess(beta, tmp_path).start(wait=False)
    assert approver.process is not None
    try:
        assert wait_until(lambda: lines_with(approver.log_path, "waits for its Redis"), timeout=WAIT)
        approver.process.send_signal(getattr(signal, how))
        assert approver.process.wait(timeout=WAIT) == 0
        assert lines_with(approver.log_path, "the approver of beta stopped before its Redis answered.")
        assert not lines_with(approver.log_path, "Traceback")
    finally:
        approver.stop()


def test_ctrl_c_in_the_relays_terminal_stops_relay_and_redis_once_and_cleanly(tmp_path: Path) -> None:
    beta = two_nodes(tmp_path)["beta"]
    relay = RelayProcess(beta, tmp_path).start(new_session=True)  # its own group, as a terminal's job
    assert relay.process is not None
    redis_pid = server_pid(beta)
    os.killpg(relay.process.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
    assert relay.process.wait(timeout=WAIT) == 0
    assert wait_until(lambda: gone(redis_pid), timeout=WAIT)
    assert not lines_with(relay.log_path, "starting it again")
    assert not lines_with(relay.log_path, "Traceback")


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "kill -9"])
def test_a_restarted_approver_decides_what_waited_and_nothing_else_is_restarted(
    tmp_path: Path, how: str
) -> None:
    """The approver stopped, a request arrives meanwhile, a new approver decides it; relays run on."""
    nodes = two_nodes(tmp_path)
    alpha, beta = nodes["alpha"], nodes["beta"]
    relays = [RelayProcess(alpha, tmp_path).start(), RelayProcess(beta, tmp_path).start()]
    approver = ApproverProcess(beta, tmp_path).start()
    gate = gate_of(alpha)
    try:
        approved(gate, alpha, 1)
        assert approver.process is not None
        if how == "kill -9":
            approver.kill()
        else:
            approver.process.send_signal(getattr(signal, how))
            assert approver.process.wait(timeout=WAIT) == 0
        restarted = time.monotonic()
        approver = ApproverProcess(beta, tmp_path).start()
        ready = time.monotonic()
        approved(gate, alpha, 2)
        healed = time.monotonic()
        print(
            f"\napprover restart after {how}: ready {ready - restarted:.2f} s after its start, "
            f"its first approval {healed - restarted:.2f} s after it"
        )
        for relay in relays:
            assert relay.process is not None
            assert relay.process.poll() is None  # never restarted
        assert not lines_with(approver.log_path, "Traceback")
    finally:
        gate.close()
        approver.stop()
        for relay in relays:
            relay.stop()
