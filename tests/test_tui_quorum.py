"""The TUI's quorum in view, with real relays and approvers: approved decision by decision, denied,
withdrawn with Ctrl-C, and a peer's request approved and denied from ``/inbox``.

alpha's TUI runs in this process (``input_fn``/``output_fn``); every node's relay is served on its
own port, and the approvers of alpha, beta and gamma are real ``teaagent approver serve``
processes. beta's rules approve ``echo *`` and deny ``rm *``; gamma's deny ``rm *`` and leave the
rest to an operator, which the test plays through gamma's approver API, only once the TUI has
shown beta's signature: so the screen proves that each decision is shown as it is counted.
"""

from __future__ import annotations

import _thread
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from port_support import refusing_port
from relay_support import (
    APPROVE_ECHO,
    DENY_RM,
    MakeCluster,
    Node,
    rule,
    served,
    signer,
    wait_until,
    write_cluster,
)
from test_tui import Terminal, scripted

from teaagent.approver_client import ApproverClient
from teaagent.audit import verify_log_or_raise
from teaagent.config import load_config
from teaagent.errors import RelayError
from teaagent.policy import PermissionMode
from teaagent.quorum import sign_request, sign_withdrawal
from teaagent.relay_client import RelayClient
from teaagent.signing import fingerprint
from teaagent.tui import TeaAgentTUI

pytestmark = pytest.mark.slow

WAIT = 30.0

BETA_RULES = DENY_RM + APPROVE_ECHO

GAMMA_RULES = rule("shell.run", "deny", command="rm *", reason="not on Fridays")


@dataclass
class Cluster:
    nodes: dict[str, Node]

    @property
    def alpha(self) -> Node:
        return self.nodes["alpha"]

    def approver(self, name: str) -> ApproverClient:
        return ApproverClient(self.nodes[name].approver_url, token=self.nodes[name].token)


@pytest.fixture(scope="module")
def cluster(star_cluster: Callable[..., dict[str, Node]]) -> Cluster:
    """alpha needs 2 of beta and gamma; beta and gamma each need alpha. Relays and approvers run."""
    return Cluster(
        star_cluster(
            "tui-quorum",
            required=2,
            rules={"beta": BETA_RULES, "gamma": GAMMA_RULES},
            operators={"alpha": ["alpha-operator"]},
            approvers=["alpha", "beta", "gamma"],
        )
    )


def alpha_tui(
    cluster: Cluster, terminal: Terminal, turns: list[dict[str, Any]], **options: Any
) -> TeaAgentTUI:
    adapter = scripted(turns)
    return TeaAgentTUI(
        node=load_config(cluster.alpha.config_path),
        input_fn=terminal.input,
        output_fn=terminal.print,
        adapter_factory=lambda provider, model: adapter,
        # The local check lets it through: what stands between the model and the shell is the quorum.
        permission_mode=PermissionMode.DANGER_FULL_ACCESS,
        **options,
    )


def shell(command: str) -> dict[str, Any]:
    return {
        "content": f"Running {command}.",
        "tool_calls": [{"tool_name": "shell.run", "arguments": {"command": command}}],
    }


def in_background(target: Any) -> threading.Thread:
    """Run the test's side (an operator, a Ctrl-C) beside the TUI; its failure is re-raised by join()."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            failures.append(exc)
            _thread.interrupt_main()  # end the TUI's wait, so the failure is reported, not a timeout

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.failures = failures  # type: ignore[attr-defined]
    return thread


def finish(thread: threading.Thread) -> None:
    thread.join(timeout=WAIT)
    failures = thread.failures  # type: ignore[attr-defined]
    if failures:
        raise failures[0]


def pending_for_origin(cluster: Cluster, name: str, request_id: str) -> str:
    """Wait until ``name``'s approver holds the request; return its id."""
    deadline = time.monotonic() + WAIT
    with cluster.approver(name) as client:
        while True:
            try:
                return client.get_request(request_id).request_id
            except RelayError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def pending_for(cluster: Cluster, name: str, tool_name: str, command: str) -> str:
    """The id of the request of alpha's that waits at ``name``'s approver for an operator."""
    deadline = time.monotonic() + WAIT
    with cluster.approver(name) as client:
        while time.monotonic() < deadline:
            for item in client.list_requests("pending", origin="alpha"):
                if item.tool_name == tool_name and item.arguments.get("command") == command:
                    return item.request_id
            time.sleep(0.05)
    raise AssertionError(f"no request for {command!r} reached {name}'s approver")


def test_an_approved_quorum_is_shown_decision_by_decision(cluster: Cluster) -> None:
    terminal = Terminal(["clean up", "/quorum"])
    turns = [shell("echo cleaned"), {"content": "Cleaned.", "expect": ["cleaned"]}]
    tui = alpha_tui(cluster, terminal, turns)

    def gamma_operator() -> None:
        terminal.wait_for("✓ beta approved")  # beta's rule decided; the screen shows it before gamma has
        request_id = pending_for(cluster, "gamma", "shell.run", "echo cleaned")
        assert "gamma approved" not in terminal.text
        with cluster.approver("gamma") as client:
            client.approve(request_id, reason="looks fine")

    operator = in_background(gamma_operator)
    assert tui.run_repl() == 0
    finish(operator)
    out = terminal.text
    opening = (
        r"^shell\.run needs 2 approvals from 2 peers \(beta, gamma\); request [0-9a-f]{12}, "
        r"\d+m \d\ds left\. Ctrl-C withdraws it\.$"
    )
    assert re.search(opening, out, re.M)
    # The wait as every surface words it: who received it, the time left, what a peer runs.
    sent = re.search(
        r"^  request ([0-9a-f]{8}) for shell\.run: 0 approvals of the 2 needed; received by [a-z, ]+; .*"
        r"\d+m \d\ds left \(expires at [0-9-]+ [0-9:]+Z\)\. A peer's operator approves it with: "
        r"teaagent approvals approve ([0-9a-f]{8}) --config <their node\.toml>$",
        out,
        re.M,
    )
    assert sent is not None, out
    assert sent.group(1) == sent.group(2)
    assert re.search(
        r"^  ✓ beta approved \(key SHA256:\S+, \d+\.\d s after asking\): 1 approval of the 2 needed\.$",
        out,
        re.M,
    )
    assert re.search(
        r"^  ✓ gamma approved \(key SHA256:\S+, \d+\.\d s after asking\): 2 approvals of the 2 needed\.$",
        out,
        re.M,
    )
    assert out.index("✓ beta approved") < out.index("✓ gamma approved") < out.index("✓ quorum reached")
    assert (
        "✓ quorum reached for shell.run: signed by beta, gamma; the certificate is verified before it runs.\n"
        in out
    )
    assert '← shell.run {"exit_code": 0, "stderr": "", "stdout": "cleaned\\n", "timed_out": false' in out
    assert "Cleaned.\n" in out
    assert re.search(
        r"^[0-9a-f]{12} +shell\.run +approved +beta, gamma +- +2 approvals from 2 peers +\d\d:\d\d:\d\d$",
        out,
        re.M,
    )
    audit = cluster.alpha.data_dir / "audit" / "alpha.jsonl"
    verify_log_or_raise(audit)
    granted = [json.loads(line) for line in audit.read_text().splitlines()]
    assert any(
        event["event_type"] == "approval_granted" and "certificate" in event["payload"] for event in granted
    )


def test_a_denied_quorum_is_a_message_and_the_repl_goes_on(cluster: Cluster) -> None:
    terminal = Terminal(["remove the build", "/quorum", "/help quorum"])
    tui = alpha_tui(cluster, terminal, [shell("rm -rf build")])
    assert tui.run_repl() == 0
    out = terminal.text
    assert re.search(
        r"^  ✗ (beta|gamma) denied \(key SHA256:\S+, \d+\.\d s after asking\): "
        r"(nothing is removed here|not on Fridays)\.$",
        out,
        re.M,
    )
    assert re.search(r"^The run ended approval_denied: shell\.run was denied by (beta|gamma)", out, re.M)
    assert "← shell.run" not in out
    assert re.search(r"^[0-9a-f]{12} +shell\.run +denied +- +(beta|gamma)", out, re.M)
    assert (
        "/quorum  This session's high-risk calls: waiting, approved by whom, denied.\n" in out
    )  # the REPL went on
    assert out.endswith("End of input: goodbye.\n")


def test_ctrl_c_withdraws_a_quorum_wait_and_the_run_ends_with_the_refusal(cluster: Cluster) -> None:
    terminal = Terminal(["deploy it", "/quorum"])
    tui = alpha_tui(cluster, terminal, [shell("make deploy")], heartbeat=1)

    def press_ctrl_c() -> None:
        terminal.wait_for("… still waiting for shell.run's quorum: 0 approvals of the 2 needed (nobody), ")
        _thread.interrupt_main()

    presser = in_background(press_ctrl_c)
    started = time.monotonic()
    assert tui.run_repl() == 0
    finish(presser)
    out = terminal.text
    assert time.monotonic() - started < 60  # not the quorum's 120 seconds
    assert re.search(
        r"^… still waiting for shell\.run's quorum: 0 approvals of the 2 needed \(nobody\), 1m \d\ds left$",
        out,
        re.M,
    )
    withdrawn = (
        r"^Withdrawing request ([0-9a-f]{12}): shell\.run will not run, the peers drop it, and the run "
        r"ends with the refusal\.$"
    )
    short = re.search(withdrawn, out, re.M)
    assert short is not None
    ended = re.search(
        r"^The run ended approval_denied: shell\.run was not run: the wait for its quorum was stopped\. "
        r"Withdrawn: request ([0-9a-f]{32}) of shell\.run; the peers drop it\.$",
        out,
        re.M,
    )
    assert ended is not None
    request_id = ended.group(1)
    assert request_id.startswith(short.group(1))
    # Really withdrawn: alpha's relay says so, and so do its peers' inboxes once delivered.
    with RelayClient(cluster.alpha.url, token=cluster.alpha.token) as relay:
        assert relay.get_request(request_id).state == "withdrawn"
    for name in ("beta", "gamma"):
        peer = cluster.nodes[name]
        with RelayClient(peer.url, token=peer.token) as relay:
            assert wait_until(
                lambda relay=relay: relay.get_inbox_item(request_id, origin="alpha").state == "withdrawn", 20
            ), name
    assert re.search(r"^[0-9a-f]{12} +shell\.run +withdrawn +- +- +2 approvals from 2 peers ", out, re.M)
    assert "← shell.run" not in out


def test_a_peers_request_is_approved_and_another_denied_from_the_inbox(cluster: Cluster) -> None:
    beta = cluster.nodes["beta"]
    sent: list[str] = []

    def send(command: str) -> str:
        request = beta.request(arguments={"command": command}, call_id=f"c-{command.split()[0]}")
        with RelayClient(beta.url, token=beta.token) as relay:
            relay.submit_request(request, sign_request(request, beta.key))
        sent.append(request["request_id"])
        # Wait until alpha's approver holds it, as an operator would before typing /inbox.
        deadline = time.monotonic() + WAIT
        with cluster.approver("alpha") as client:
            while True:
                try:
                    client.get_request(request["request_id"])
                    return str(request["request_id"])
                except RelayError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    first = send("make release")
    second = send("make mess")
    terminal = Terminal(
        ["/inbox", lambda: f"/approve {first[:8]}", lambda: f"/deny {second} not today", "/inbox"]
    )
    tui = alpha_tui(cluster, terminal, [])
    assert tui.run_repl() == 0
    out = terminal.text
    assert re.search(
        rf"^{first} +beta +shell\.run +\d+m \d\ds +ask \(no rule\) +\{{\"command\": \"make release\"\}}$",
        out,
        re.M,
    )
    assert re.search(rf"^{second} +beta +shell\.run ", out, re.M)
    assert re.search(
        rf"^alpha approved request {first} of beta: signed with the node key "
        rf"{re.escape(load_config(cluster.alpha.config_path).own_public_key().fingerprint)}\.$",
        out,
        re.M,
    )  # the approver signed it with the node key: it says so, not "operator"
    assert re.search(
        rf"^alpha denied request {second} of beta \(not today\): signed with the node key ", out, re.M
    )
    assert out.endswith("› /inbox\nNo pending requests for alpha.\n› \nEnd of input: goodbye.\n")
    # beta, the origin, counts alpha's signed decisions.
    with RelayClient(beta.url, token=beta.token) as relay:
        approved = relay.wait_outcome(first, 10)
        denied = relay.wait_outcome(second, 10)
    assert (approved.state, approved.signers) == ("approved", ("alpha",))
    assert (denied.state, denied.denied_by, dict(denied.denial_reasons)) == (
        "denied",
        ("alpha",),
        {"alpha": "not today"},
    )


def test_a_prefix_shown_by_inbox_never_names_a_request_sent_under_it_after_a_withdrawal(
    cluster: Cluster,
) -> None:
    # Issue 25: beta withdraws what alpha's operator read in /inbox and sends another request whose id
    # starts the same (an origin chooses its ids); /approve PREFIX then names neither.
    beta = cluster.nodes["beta"]
    prefix = secrets.token_hex(4)

    def send(command: str, marker: str) -> dict[str, Any]:
        request_id = (prefix + marker + secrets.token_hex(16))[:32]
        request = beta.request(arguments={"command": command}, call_id=f"c-{marker}", request_id=request_id)
        with RelayClient(beta.url, token=beta.token) as relay:
            relay.submit_request(request, sign_request(request, beta.key))
        pending_for_origin(cluster, "alpha", request_id)
        return request

    shown = send("make release", "0")
    swapped: dict[str, Any] = {}

    def withdraw_and_swap() -> str:
        withdrawal = sign_withdrawal(shown, beta.key)
        with RelayClient(beta.url, token=beta.token) as relay:
            relay.withdraw(shown["request_id"], withdrawal["statement"], withdrawal["signature"])
        with cluster.approver("alpha") as client:
            assert wait_until(lambda: client.get_request(shown["request_id"]).state == "withdrawn", WAIT)
        swapped.update(send("make mess", "f"))
        return "/inbox"

    terminal = Terminal(["/inbox", withdraw_and_swap, f"/approve {prefix}", f"/deny {prefix} no"])
    tui = alpha_tui(cluster, terminal, [])
    assert tui.run_repl() == 0
    out = terminal.text
    refusal = (
        f"{prefix} starts the ids of 2 requests shown by /inbox ({shown['request_id']} of beta, "
        f"{swapped['request_id']} of beta), so it names none of them; type more of the id.\n"
    )
    assert re.search(rf"^{swapped['request_id']} +beta +shell\.run ", out, re.M)  # the second /inbox
    assert out.count(refusal) == 2, out
    with cluster.approver("alpha") as client:
        assert client.get_request(swapped["request_id"]).decision is None


def test_an_operator_key_signs_the_decision_instead_of_the_node_key(cluster: Cluster) -> None:
    beta = cluster.nodes["beta"]
    request = beta.request(arguments={"command": "make docs"}, call_id="c-operator")
    with RelayClient(beta.url, token=beta.token) as relay:
        relay.submit_request(request, sign_request(request, beta.key))
    request_id = pending_for_origin(cluster, "alpha", request["request_id"])
    operator = signer("alpha-operator")
    terminal = Terminal(["/inbox", f"/approve {request_id}"])
    tui = alpha_tui(cluster, terminal, [], operator_signer=operator)
    assert tui.run_repl() == 0
    out = terminal.text
    assert re.search(
        rf"^alpha approved request {request_id} of beta: signed with an operator's own key "
        rf"{re.escape(fingerprint(operator.public_key))}\.$",
        out,
        re.M,
    ), out
    with RelayClient(beta.url, token=beta.token) as relay:
        outcome = relay.wait_outcome(request_id, 10)
    assert (outcome.state, outcome.signers) == ("approved", ("alpha",))  # the operator signs for alpha


def test_an_expired_quorum_is_shown_as_expired(tmp_path: Path, make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", required=1, timeout_seconds=2, star="alpha")
    (tmp_path / "workspace-alpha").mkdir()
    terminal = Terminal(["wait for nobody", "/quorum"])
    adapter = scripted([shell("make wait")])
    tui = TeaAgentTUI(
        node=load_config(nodes["alpha"].config_path),
        input_fn=terminal.input,
        output_fn=terminal.print,
        adapter_factory=lambda provider, model: adapter,
        permission_mode=PermissionMode.DANGER_FULL_ACCESS,
    )
    with served(*nodes.values()):  # beta's relay takes the request; nobody decides it
        assert tui.run_repl() == 0
    out = terminal.text
    assert re.search(r"^The run ended approval_denied: .*expired", out, re.M), out
    assert re.search(r"^[0-9a-f]{12} +shell\.run +expired +- +- +1 approval from 1 peer ", out, re.M), out


def test_a_relay_that_is_down_is_one_sentence_and_the_repl_goes_on(tmp_path: Path) -> None:
    with refusing_port() as down:  # alpha's relay is down: its port refuses every connection
        nodes = write_cluster(
            tmp_path,
            ["alpha", "beta"],
            redis_url="redis://127.0.0.1:1/0",
            prefix="unused",
            required=1,
            ports={"alpha": down},
        )
        (tmp_path / "workspace-alpha").mkdir()
        terminal = Terminal(["run it", "/quorum", "/approvals"])
        adapter = scripted([shell("echo hi")])
        tui = TeaAgentTUI(
            node=load_config(nodes["alpha"].config_path),
            input_fn=terminal.input,
            output_fn=terminal.print,
            adapter_factory=lambda provider, model: adapter,
            permission_mode=PermissionMode.DANGER_FULL_ACCESS,
        )
        assert tui.run_repl() == 0
    out = terminal.text
    assert (
        "High-risk calls (shell.*, fs.delete) also need 1 approval from 1 peer (beta): no local approval "
        "replaces the quorum.\n" in out
    ), out
    denial = [
        line for line in out.splitlines() if line.startswith("The run ended approval_denied: shell.run needs")
    ]
    assert len(denial) == 1, out
    assert "no quorum could be obtained" in denial[0]
    assert re.search(r"^[0-9a-f]{12} +shell\.run +failed +- +- +1 approval from 1 peer ", out, re.M), out
    assert out.endswith("End of input: goodbye.\n")
