"""``teaagent.testing.LocalCluster``: nodes' files, relays and approvers, started and stopped in one place."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from interrupt_support import children_born

from teaagent.config import load_config
from teaagent.errors import TeaAgentError
from teaagent.quorum import build_request, sign_request, verify_certificate
from teaagent.relay_client import RelayClient
from teaagent.testing import LocalCluster, approver_rule, star

APPROVE_SHELL = approver_rule("shell.*", "approve")
RELEASE: dict[str, Any] = {  # alpha's high-risk call
    "origin": "alpha",
    "run_id": "run-1",
    "call_id": "call-1",
    "tool_name": "shell.run",
    "arguments": {"command": "make release"},
    "reason": "ship it",
}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie (dead, its parent not yet told) holds no port and no memory: gone.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_write_gives_each_node_its_files_peers_operators_and_rules(tmp_path: Path, redis_url: str) -> None:
    cluster = LocalCluster(
        tmp_path,
        ("alpha", "beta", "gamma", "delta"),
        redis_url=redis_url,
        prefix="p",
        peers_of=star("alpha", ("alpha", "beta", "gamma", "delta")),
        operators={"delta": ["delta-operator"]},
        rules={"beta": APPROVE_SHELL},
        required={"alpha": 2, "beta": 1, "gamma": 1, "delta": 1},
    )
    nodes = cluster.write()
    assert nodes["alpha"].peers == ("beta", "delta", "gamma")
    assert nodes["beta"].peers == ("alpha",)
    assert nodes["alpha"].redis_prefix == "p:alpha"
    alpha = load_config(nodes["alpha"].config_path)
    assert alpha.quorum.required_approvals == 2
    assert alpha.peers["delta"].relay_url == nodes["delta"].url
    assert alpha.load_token() == nodes["alpha"].token
    assert alpha.own_public_key().blob == nodes["alpha"].signer().public_key.blob
    beta = load_config(nodes["beta"].config_path)
    assert beta.approver.port == nodes["beta"].approver_port
    assert [rule.decision for rule in beta.approver.rules] == ["approve"]
    delta = load_config(nodes["delta"].config_path)
    operator_line = cluster.public_line("delta-operator")
    assert [key.line for key in delta.approver.operator_keys] == [operator_line]
    # alpha may count delta's operator's signature: delta's allowed_signers names the same key.
    table = tomllib.loads(nodes["alpha"].config_path.read_text())
    assert table["peers"]["delta"]["allowed_signers"] == "delta.operators"


def test_approver_rules_written_one_after_another_load_in_their_order_with_their_arguments() -> None:
    rules = (
        approver_rule("shell.run", "deny", command="*curl *", reason="nothing is downloaded")
        + approver_rule("fs.delete", "approve", path="build/*")
        + approver_rule("shell.run", "ask")
    )
    table = tomllib.loads(f"[approver]\n{rules}")["approver"]["rules"]
    assert table == [
        {
            "tool": "shell.run",
            "arguments": {"command": "*curl *"},
            "decision": "deny",
            "reason": "nothing is downloaded",
        },
        {"tool": "fs.delete", "arguments": {"path": "build/*"}, "decision": "approve"},
        {"tool": "shell.run", "decision": "ask"},
    ]


def test_a_key_file_already_there_is_kept(tmp_path: Path, redis_url: str) -> None:
    first = LocalCluster(tmp_path, ("alpha", "beta"), redis_url=redis_url)
    first.write()
    line = first.public_line("alpha")
    again = LocalCluster(tmp_path, ("alpha", "beta"), redis_url=redis_url)
    again.write()
    assert again.public_line("alpha") == line


@pytest.mark.slow
def test_three_nodes_come_up_approve_two_of_three_and_stop_leaves_no_process(tmp_path: Path) -> None:
    with LocalCluster(
        tmp_path,
        ("alpha", "beta", "gamma"),
        rules={"beta": APPROVE_SHELL, "gamma": APPROVE_SHELL},
        approvers=("beta", "gamma"),
    ) as cluster:
        assert cluster.redis is not None
        assert cluster.redis.pid is not None
        pids = [cluster.redis.pid, *(process.pid for process in cluster.processes.values())]
        assert sorted(cluster.processes) == [
            "alpha-relay",
            "beta-approver",
            "beta-relay",
            "gamma-approver",
            "gamma-relay",
        ]
        alpha = cluster.nodes["alpha"]
        config = load_config(alpha.config_path).quorum
        request = build_request(**RELEASE, config=config)
        with RelayClient(alpha.url, token=alpha.token) as client:
            client.submit_request(request, sign_request(request, alpha.signer()))
            status = client.wait_outcome(request["request_id"], 30.0)
            while not status.decided:
                status = client.wait_outcome(request["request_id"], 30.0)
        assert status.state == "approved"
        assert sorted(status.signers) == ["beta", "gamma"]
        assert status.certificate is not None
        verify_certificate(status.certificate, config)
        assert cluster.exited() == {}
    assert cluster.processes == {}
    assert cluster.redis is None
    assert all(_gone(pid) for pid in pids)


@pytest.mark.slow
def test_a_service_that_cannot_start_stops_the_rest_and_says_why(tmp_path: Path, redis_url: str) -> None:
    def interpreter(label: str) -> list[str]:
        # beta's relay is a process that exits at once; alpha's is the real one.
        return (
            [sys.executable, "-c", "print('no relay here'); raise SystemExit(3)"]
            if label == "beta-relay"
            else [sys.executable]
        )

    cluster = LocalCluster(
        tmp_path, ("alpha", "beta"), redis_url=redis_url, approvers=(), interpreter=interpreter
    )
    with pytest.raises(TeaAgentError, match="beta's relay exited while starting: no relay here"):
        cluster.start()
    assert cluster.processes == {}


def test_a_ctrl_c_as_a_service_of_its_own_session_starts_leaves_it_listed_and_stopped(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service in a session of its own (the demo's) hears no Ctrl-C: one that comes between the
    fork and the listing must leave it listed, so that stopping the cluster stops it."""
    cluster = LocalCluster(
        tmp_path,
        ("alpha", "beta"),
        redis_url=redis_url,
        approvers=(),
        new_session=True,
        interpreter=lambda label: [sys.executable, "-c", "import time; time.sleep(60)", "--"],
    )
    cluster.write()
    children_born(monkeypatch, ctrl_c=True)
    with pytest.raises(KeyboardInterrupt):
        cluster.start_service("alpha", "relay", wait=False)
    monkeypatch.undo()
    assert list(cluster.processes) == ["alpha-relay"]
    process = cluster.processes["alpha-relay"]
    cluster.stop()
    assert process.poll() is not None
