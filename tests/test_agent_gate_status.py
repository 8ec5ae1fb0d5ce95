"""RelayQuorumGate's on_status and stop, which the agent service streams: each counted decision seen as
it arrives, and a wait that a cancelled run stops. Real relays in this process, real Redis."""

from __future__ import annotations

import threading
import time

import pytest
from relay_support import MakeCluster, Node, approve_next, public_line, served, wait_until

from teaagent.errors import ApprovalDeniedError
from teaagent.quorum import verify_certificate
from teaagent.relay_client import RelayQuorumGate, RequestStatus
from teaagent.relay_client._gate import STOP_CHECK_SECONDS

WAIT = 20.0


@pytest.fixture
def nodes(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks beta, gamma and delta (2 of 3)."""
    return make_cluster(
        "alpha",
        "beta",
        "gamma",
        "delta",
        required=2,
        peers_of={
            "alpha": ["beta", "delta", "gamma"],
            "beta": ["alpha"],
            "gamma": ["alpha"],
            "delta": ["alpha"],
        },
    )


def gate_of(alpha: Node, **extra: object) -> RelayQuorumGate:
    return alpha.gate(
        timeout=WAIT,
        **extra,  # type: ignore[arg-type]
    )


class Watch:
    """The statuses on_status reported, from the gate's thread, with when each came."""

    def __init__(self) -> None:
        self.statuses: list[tuple[float, RequestStatus]] = []
        self.lock = threading.Lock()

    def __call__(self, status: RequestStatus) -> None:
        with self.lock:
            self.statuses.append((time.monotonic(), status))

    def counted(self) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
        with self.lock:
            seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
            for _at, status in self.statuses:
                pair = (status.signers, status.denied_by)
                if not seen or seen[-1] != pair:
                    seen.append(pair)
            return seen


@pytest.mark.slow
def test_on_status_sees_each_decision_as_it_arrives_and_the_certificate_still_verifies(
    nodes: dict[str, Node],
) -> None:
    alpha, beta, gamma, delta = nodes["alpha"], nodes["beta"], nodes["gamma"], nodes["delta"]
    watch = Watch()
    result: dict[str, object] = {}
    with served(alpha, beta, gamma, delta):
        gate = gate_of(alpha, on_status=watch)
        request = alpha.request(arguments={"command": "make"}, call_id="c-1", run_id="r-1")
        worker = threading.Thread(target=lambda: result.update(certificate=gate.obtain(request)), daemon=True)
        worker.start()
        approve_next(delta, deny_reason="not on Fridays")
        assert wait_until(lambda: ((), ("delta",)) in watch.counted(), WAIT)
        denied_seen = time.monotonic()
        approve_next(beta)
        assert wait_until(lambda: (("beta",), ("delta",)) in watch.counted(), WAIT)
        assert "certificate" not in result  # one approval of two: still waiting
        approve_next(gamma)
        worker.join(WAIT)
        gate.close()

    assert watch.counted() == [
        ((), ()),
        ((), ("delta",)),
        (("beta",), ("delta",)),
        (("beta", "gamma"), ("delta",)),
    ]
    assert watch.statuses[0][1].state == "pending"
    assert watch.statuses[-1][1].state == "approved"
    # Each decision reached the watcher within a poll of its arrival, not at the outcome only.
    first_denied = next(at for at, status in watch.statuses if status.denied_by)
    assert first_denied <= denied_seen
    certificate = result["certificate"]
    assert isinstance(certificate, dict)
    outcome = verify_certificate(certificate, alpha.quorum(), origin_public_key=public_line("alpha"))
    assert outcome.signers == ("beta", "gamma")


@pytest.mark.slow
def test_stop_ends_the_wait_within_a_poll_with_a_denial(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    stop = threading.Event()
    with served(alpha, deliver=False):
        gate = gate_of(alpha, stop=stop)
        threading.Timer(0.3, stop.set).start()
        started = time.monotonic()
        with pytest.raises(
            ApprovalDeniedError,
            match=r"^shell\.run was not run: the wait for its quorum was stopped\. Withdrawn: request "
            r"[0-9a-f]{32} of shell\.run; the peers drop it\.$",
        ):
            gate.obtain(alpha.request(arguments={"command": "rm"}, call_id="c", run_id="r"))
        gate.close()
    assert time.monotonic() - started < 0.3 + STOP_CHECK_SECONDS + 2.0


@pytest.mark.slow
def test_a_callback_that_raises_does_not_break_the_gate(nodes: dict[str, Node]) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]

    def broken(_status: RequestStatus) -> None:
        raise RuntimeError("display gone")

    with served(alpha, beta, gamma):
        gate = gate_of(alpha, on_status=broken)
        threads = [threading.Thread(target=approve_next, args=(node,), daemon=True) for node in (beta, gamma)]
        for thread in threads:
            thread.start()
        certificate = gate.obtain(alpha.request(arguments={"command": "make"}, call_id="c", run_id="r"))
        for thread in threads:
            thread.join(WAIT)
        gate.close()
    assert verify_certificate(certificate, alpha.quorum(), origin_public_key=public_line("alpha")).signers


def outcome_polls(alpha: Node) -> float:
    """How many outcome long-polls alpha's relay has answered (its own counter, by route)."""
    import re

    import httpx

    text = httpx.get(f"{alpha.url}/metrics", headers=alpha.headers, timeout=10).text
    pattern = (
        r'^teaagent_relay_http_requests_total\{[^}]*route="/v1/requests/\{request_id\}/outcome"[^}]*\} (\S+)$'
    )
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


@pytest.mark.slow
@pytest.mark.parametrize("with_stop", [False, True], ids=["on_status", "on_status-and-stop"])
def test_a_watched_wait_holds_one_long_poll_per_change_not_one_per_half_second(
    nodes: dict[str, Node], with_stop: bool
) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    watch = Watch()
    result: dict[str, object] = {}
    extra: dict[str, object] = {"on_status": watch}
    if with_stop:
        extra["stop"] = threading.Event()
    with served(alpha, beta, gamma):
        before = outcome_polls(alpha)
        gate = gate_of(alpha, **extra)
        request = alpha.request(arguments={"command": "make"}, call_id="c-1", run_id="r-1")
        worker = threading.Thread(target=lambda: result.update(certificate=gate.obtain(request)), daemon=True)
        worker.start()
        assert wait_until(lambda: len(watch.statuses) >= 1, WAIT)  # submitted; now it waits
        time.sleep(4.0)  # the quiet wait whose requests are counted (a 0.5 s poll sent 8 here)
        quiet = outcome_polls(alpha) - before
        approve_next(beta)
        assert wait_until(lambda: (("beta",), ()) in watch.counted(), WAIT)
        approve_next(gamma)
        worker.join(WAIT)
        gate.close()
        total = outcome_polls(alpha) - before

    assert "certificate" in result
    assert quiet <= 1  # one long-poll held through four quiet seconds
    assert total <= 3  # one per change: beta's approval, then the outcome (plus the first)
    assert watch.counted()[-1] == (("beta", "gamma"), ())
