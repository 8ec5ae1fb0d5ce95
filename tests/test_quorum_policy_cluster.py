"""Version 2 end to end: ``all_of`` and ``any_of`` over real relays and approvers, on loopback.

alpha's rules: ``git.push*`` needs two of ops (beta, gamma) *and* one of security (delta);
``deploy.*`` needs two of ops *or* one of security. beta and gamma run real approver processes
(``teaagent approver serve``) whose rules approve pushes and leave deploys to an operator; delta
has no approver process: the test is its operator, deciding on its relay's inbox. Every relay is a
real ``teaagent relay serve`` process; alpha's gate is the one its agent uses.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from relay_support import (
    ApproverProcess,
    MakeCluster,
    Node,
    approval,
    denial,
    rule,
    running,
    wait_until,
)

from teaagent.config import load_config
from teaagent.errors import ApprovalDeniedError, RelayError
from teaagent.quorum import evaluate, verify_certificate
from teaagent.relay_client import RelayClient, describe_wait
from teaagent.trust import MultiSigQuorumConfig

pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds a test waits for what takes a few on an idle host

QUORUM_RULES = """
[quorum.groups]
ops = ["beta", "gamma"]
security = ["delta"]

[[quorum.rules]]
pattern = "git.push*"
all_of = [{ group = "ops", required = 2 }, { group = "security", required = 1 }]

[[quorum.rules]]
pattern = "deploy.*"
any_of = [{ group = "ops", required = 2 }, { group = "security", required = 1 }]
"""

APPROVER_RULES = rule("git.push*", "approve")


@pytest.fixture(name="cluster")
def fixture_cluster(make_cluster: MakeCluster) -> dict[str, Node]:
    return make_cluster(
        "alpha",
        "beta",
        "gamma",
        "delta",
        star="alpha",
        quorum_rules={"alpha": QUORUM_RULES},
        high_risk=("shell.*", "fs.delete", "git.push*", "deploy.*"),
        rules={"beta": APPROVER_RULES, "gamma": APPROVER_RULES},
    )


class Asking:
    """alpha's gate asking for one call in a thread: its certificate or its error, when it ends."""

    def __init__(self, alpha: Node, config: MultiSigQuorumConfig, request: dict[str, Any]) -> None:
        self.request = request
        self.result: dict[str, Any] | BaseException | None = None
        self.lines: list[str] = []  # the gate's progress lines (a command line's stderr)
        self.waits: list[str] = []  # describe_wait of each view of the wait (the agent's, the TUI's)
        self._gate = alpha.gate(
            config=config,
            timeout=WAIT,
            on_progress=self.lines.append,
            on_wait=lambda progress: self.waits.append(describe_wait(progress, command=False)),
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.result = self._gate.obtain(self.request)
        except BaseException as exc:  # handed to the test
            self.result = exc

    def wait(self) -> dict[str, Any] | BaseException | None:
        self._thread.join(WAIT + 10)
        self._gate.close()
        return self.result


def request(alpha: Node, config: MultiSigQuorumConfig, tool_name: str, call_id: str) -> dict[str, Any]:
    from teaagent.quorum import build_request

    return build_request(
        origin="alpha",
        run_id="run-1",
        call_id=call_id,
        tool_name=tool_name,
        arguments={"target": "release"},
        reason="ship it",
        config=config,
    )


def decide_as_delta(delta: Node, request_id: str, reason: str | None = None) -> None:
    """delta's operator: wait for the request in delta's inbox, sign a decision, hand it to its relay."""
    with RelayClient(delta.url, token=delta.token) as client:
        item = wait_until(
            lambda: next(
                (i for i in client.list_inbox(wait=2) if i.request_id == request_id and i.state == "pending"),
                None,
            ),
            timeout=WAIT,
        )
        document = (
            approval(item.request, "delta") if reason is None else denial(item.request, "delta", reason)
        )
        client.submit_decision(request_id, document["statement"], document["signature"])


def status_of(alpha: Node, request_id: str) -> Any:
    with RelayClient(alpha.url, token=alpha.token) as client:
        return client.get_request(request_id)


def ops_approved(alpha: Node, request_id: str) -> Any:
    """alpha's relay's status of the request once both operators' approvals are counted, else None."""
    try:
        status = status_of(alpha, request_id)
    except RelayError:
        return None  # not submitted yet
    return status if set(status.signers) == {"beta", "gamma"} else None


def test_all_of_runs_only_when_both_terms_are_met_and_a_security_denial_denies_it(
    cluster: dict[str, Node], tmp_path: Path
) -> None:
    alpha, delta = cluster["alpha"], cluster["delta"]
    config = load_config(alpha.config_path).quorum
    approvers = [ApproverProcess(cluster[name], tmp_path) for name in ("beta", "gamma")]
    with running(cluster.values(), tmp_path):
        try:
            for approver in approvers:
                approver.start(wait=False)
            for approver in approvers:
                approver.wait_ready()
            push = request(alpha, config, "git.push", "call-push")
            asking = Asking(alpha, config, push)
            # Both operators approved (their approvers' rules): the ops term is met, and still pending.
            ops_met = wait_until(lambda: ops_approved(alpha, push["request_id"]), timeout=WAIT)
            assert ops_met.state == "pending"
            waiting = evaluate(push, list(ops_met.approvals), [], config)
            assert waiting.describe() == (
                "waiting (rule git.push*, all of: ops: met by beta, gamma; needs 1 more of security: delta)"
            )
            decide_as_delta(delta, push["request_id"])
            certificate = asking.wait()

            # The second push: the operators approve again, security denies: denied.
            second = request(alpha, config, "git.push", "call-push-2")
            refused = Asking(alpha, config, second)
            decide_as_delta(delta, second["request_id"], reason="not this release")
            denied = refused.wait()
        finally:
            for approver in approvers:
                approver.stop()

    assert isinstance(certificate, dict), certificate
    verified = verify_certificate(certificate, config, origin_public_key=alpha.key.public_key.to_line())
    assert verified.signers == ("beta", "delta", "gamma")
    assert certificate["request"]["policy"]["rule"] == "git.push*"
    assert verified.describe() == (
        "approved by beta, delta, gamma "
        "(rule git.push*, all of: ops: met by beta, gamma; security: met by delta)"
    )
    # The asking side showed the terms while it waited, and what was still missing.
    missing = "ops: met by beta, gamma; needs 1 more of security: delta"
    assert asking.lines[0].startswith(
        "git.push needs rule 'git.push*' (all of: 2 of beta, gamma; 1 of delta); request "
    )
    assert any(missing in line for line in asking.waits), asking.waits
    assert isinstance(denied, ApprovalDeniedError), denied
    assert str(denied).startswith("git.push was denied by delta: not this release (rule git.push*, all of: ")
    assert "security: can no longer be met (denied by delta)" in str(denied)


def test_any_of_runs_when_one_term_is_met(cluster: dict[str, Node], tmp_path: Path) -> None:
    alpha, delta = cluster["alpha"], cluster["delta"]
    config = load_config(alpha.config_path).quorum
    approvers = [ApproverProcess(cluster[name], tmp_path) for name in ("beta", "gamma")]
    with running(cluster.values(), tmp_path):
        try:
            for approver in approvers:
                approver.start(wait=False)
            for approver in approvers:
                approver.wait_ready()
            deploy = request(alpha, config, "deploy.prod", "call-deploy")
            assert deploy["policy"]["any_of"][1] == {"peers": ["delta"], "required": 1}
            asking = Asking(alpha, config, deploy)
            started = time.monotonic()
            # beta's and gamma's approvers leave deploys to their operators; delta's alone suffices.
            decide_as_delta(delta, deploy["request_id"])
            certificate = asking.wait()
        finally:
            for approver in approvers:
                approver.stop()

    assert isinstance(certificate, dict), certificate
    assert time.monotonic() - started < WAIT
    verified = verify_certificate(certificate, config, origin_public_key=alpha.key.public_key.to_line())
    assert verified.signers == ("delta",)
    assert verified.state == "approved"
    assert "security: met by delta" in verified.describe()
