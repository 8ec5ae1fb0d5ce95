"""Approvers as real processes (``teaagent approver serve``) beside real relays, on loopback.

The rules decide for two peers and the origin's gate gets its certificate or its denial; then the
faults: an approver killed (``kill -9``) while requests keep arriving, and two approver processes
racing on one inbox. Each request is signed once: one audit record, one decision at the origin.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_support import (
    APPROVE_ECHO,
    DENY_RM,
    ApproverProcess,
    MakeCluster,
    Node,
    free_port,
    running,
    sample,
    wait_until,
)

from teaagent.audit import verify_log
from teaagent.cli._serve import STOP_GRACE_SECONDS
from teaagent.errors import ApprovalDeniedError
from teaagent.quorum import verify_certificate
from teaagent.relay_client import RelayClient
from teaagent_approver import AUDIT_FILE_NAME, DECISION_EVENT

pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds a test waits for what takes a few on an idle host

RULES = DENY_RM + APPROVE_ECHO


def audit_records(node: Node) -> list[dict[str, Any]]:
    path = node.data_dir / AUDIT_FILE_NAME
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return [line["payload"] for line in lines if line["event_type"] == DECISION_EVENT]


def relay_metrics(node: Node) -> str:
    return httpx.get(f"{node.url}/metrics", timeout=5).text


def test_the_rules_of_two_peers_give_the_origin_its_certificate_and_its_denial(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster(
        "alpha", "beta", "gamma", required=2, star="alpha", rules={"beta": RULES, "gamma": RULES}
    )
    alpha = nodes["alpha"]
    approvers = [ApproverProcess(nodes[name], tmp_path) for name in ("beta", "gamma")]
    with running(nodes.values(), tmp_path):
        try:
            for approver in approvers:
                approver.start(wait=False)
            for approver in approvers:
                approver.wait_ready()
            gate = alpha.gate(
                timeout=WAIT,
            )
            echo = alpha.request(arguments={"command": "echo hello"}, call_id="call-echo")
            certificate = gate.obtain(echo)
            with pytest.raises(
                ApprovalDeniedError,
                match=r"^shell\.run was denied by (beta|gamma|beta, gamma): nothing is removed here",
            ):
                gate.obtain(alpha.request(arguments={"command": "rm -rf build"}, call_id="call-rm"))
            gate.close()
        finally:
            for approver in approvers:
                approver.stop()

    verified = verify_certificate(
        certificate, alpha.quorum(), origin_public_key=alpha.key.public_key.to_line()
    )
    assert verified.signers == ("beta", "gamma")
    assert certificate["request"] == echo
    for name in ("beta", "gamma"):
        records = audit_records(nodes[name])
        assert sorted((r["tool_name"], r["decision"], r["by"]) for r in records) == [
            ("shell.run", "approval", "rule 2"),
            ("shell.run", "denial", "rule 1"),
        ]
        assert verify_log(nodes[name].data_dir / AUDIT_FILE_NAME).ok


class Stream:
    """Submit ``count`` of alpha's requests to its relay from ``threads`` threads, each pausing
    ``interval`` seconds between two."""

    def __init__(
        self, alpha: Node, count: int, *, interval: float = 0.0, threads: int = 1, first: int = 0
    ) -> None:
        self.alpha = alpha
        self.interval = interval
        self.ids: list[str] = []
        self.errors: list[BaseException] = []
        self._next = iter(range(first, first + count))
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        try:
            with RelayClient(self.alpha.url, token=self.alpha.token) as client:
                while True:
                    with self._lock:
                        n = next(self._next, None)
                    if n is None:
                        return
                    request = self.alpha.request(arguments={"command": f"echo {n}"}, call_id=f"call-{n}")
                    client.submit_request(request, self.alpha.signed(request)["signature"])
                    with self._lock:
                        self.ids.append(request["request_id"])
                    time.sleep(self.interval)
        except BaseException as exc:  # the test reports it
            self.errors.append(exc)

    def __enter__(self) -> Stream:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for thread in self.threads:
            thread.join(WAIT)


def outcomes(alpha: Node, ids: list[str]) -> dict[str, Any]:
    with RelayClient(alpha.url, token=alpha.token) as client:
        return {request_id: client.get_request(request_id) for request_id in ids}


def all_approved(alpha: Node, ids: list[str]) -> bool:
    return all(status.state == "approved" for status in outcomes(alpha, ids).values())


def check_signed_once(alpha: Node, beta: Node, ids: list[str]) -> None:
    """One audit record per request, the decision the origin counted is the one audited, no other."""
    records = audit_records(beta)
    assert collections.Counter(record["request_id"] for record in records) == dict.fromkeys(ids, 1)
    report = verify_log(beta.data_dir / AUDIT_FILE_NAME)
    assert report.ok, report.message
    signed_at = {record["request_id"]: record["signed_at"] for record in records}
    for request_id, status in outcomes(alpha, ids).items():
        assert status.signers == ("beta",)
        [approval] = status.certificate["approvals"]
        assert approval["statement"]["signed_at"] == signed_at[request_id]
    # A second, different decision of beta's would be refused by beta's relay (409) and never leave.
    assert sample(relay_metrics(beta), "teaagent_relay_refusals_total", code="conflict") == 0
    # Every decision alpha's relay counted is beta's one per request.
    assert sample(
        relay_metrics(alpha), "teaagent_relay_decisions_total", source="peer", result="counted"
    ) == len(ids)
    assert (
        sample(relay_metrics(alpha), "teaagent_relay_decisions_total", source="peer", result="rejected") == 0
    )


def test_an_approver_killed_mid_stream_skips_nothing_and_signs_nothing_twice(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1, rules={"beta": RULES})
    alpha, beta = nodes["alpha"], nodes["beta"]
    with running(nodes.values(), tmp_path):
        approver = ApproverProcess(beta, tmp_path)
        restarted = ApproverProcess(beta, tmp_path)
        try:
            # A backlog first, so that the kill lands while the approver decides many at once:
            # some recorded and not yet signed, some signed and not yet audited or sent.
            with Stream(alpha, 150, threads=4, first=0) as backlog:
                pass
            approver.start()
            assert wait_until(lambda: len(audit_records(beta)) >= 20, WAIT, interval=0.002), "nothing decided"
            approver.kill()
            # Requests keep arriving while nobody approves them, and after the restart.
            with Stream(alpha, 60, interval=0.01, threads=2, first=150) as stream:
                assert wait_until(lambda: len(stream.ids) >= 10, WAIT)
                restarted.start()
            ids = backlog.ids + stream.ids
            assert not backlog.errors + stream.errors, backlog.errors + stream.errors
            assert len(set(ids)) == 210
            assert wait_until(lambda: all_approved(alpha, ids), WAIT), "a request was skipped"
            check_signed_once(alpha, beta, ids)
        finally:
            approver.stop()
            restarted.stop()


def test_two_approvers_racing_on_one_inbox_sign_each_request_once(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1, rules={"beta": RULES})
    alpha, beta = nodes["alpha"], nodes["beta"]
    count = 60
    with running(nodes.values(), tmp_path):
        approvers = [ApproverProcess(beta, tmp_path), ApproverProcess(beta, tmp_path, port=free_port())]
        try:
            for approver in approvers:
                approver.start(wait=False)
            for approver in approvers:
                approver.wait_ready()
            with Stream(alpha, count, threads=4) as stream:
                pass
            assert not stream.errors, stream.errors
            assert wait_until(lambda: all_approved(alpha, stream.ids), WAIT), "a request was skipped"
            check_signed_once(alpha, beta, stream.ids)
            pages = [approver.metrics() for approver in approvers]
        finally:
            for approver in approvers:
                approver.stop()
    # Signed once each, by one process or the other: the loser of a record signs nothing.
    assert sum(sample(page, "teaagent_approver_signatures_total") for page in pages) == count
    recorded = [
        sample(page, "teaagent_approver_decisions_total", by="rule", kind="approval") for page in pages
    ]
    assert sum(recorded) == count


def test_approver_serve_refuses_a_port_in_use_and_stops_on_sigterm_during_a_long_poll(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    import signal
    import socket
    import subprocess
    import sys

    nodes = make_cluster("alpha", "beta", required=1)
    beta = nodes["beta"]
    with running([beta], tmp_path):
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        try:
            refused = subprocess.run(
                [sys.executable, "-m", "teaagent", "approver", "serve", "--config", str(beta.config_path),
                 "--port", str(taken)],
                env=beta.env(),
                capture_output=True,
                text=True,
                timeout=WAIT,
            )  # fmt: skip
        finally:
            holder.close()
        approver = ApproverProcess(beta, tmp_path).start()
        try:
            answers: list[httpx.Response] = []

            def poll() -> None:
                answers.append(
                    httpx.get(
                        f"{approver.url}/v1/requests",
                        params={"wait": 50},
                        headers=beta.headers,
                        timeout=WAIT,
                    )
                )

            polling = threading.Thread(target=poll, daemon=True)
            polling.start()
            time.sleep(0.5)  # the long-poll is in flight (nothing waits for it to finish: it may not)
            assert approver.process is not None
            started = time.monotonic()
            approver.process.send_signal(signal.SIGTERM)
            status = approver.process.wait(timeout=WAIT)
            stopped_in = time.monotonic() - started
            polling.join(WAIT)
        finally:
            approver.stop()

    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        f"teaagent: the approver of beta cannot listen on 127.0.0.1:{taken}: the address is already in use "
        "(another program, or another copy of this service, holds it)."
    )
    assert status == 0
    # Answered (not cut off after the stop's grace): the long-poll ends when the service stops.
    assert stopped_in < STOP_GRACE_SECONDS, stopped_in
    [answer] = answers
    assert (answer.status_code, answer.json()) == (200, {"items": []})
