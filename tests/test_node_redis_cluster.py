"""A node's relay and approver, real processes, on a real three-master Redis Cluster without
replicas (``redis_cluster = true``): a rule's approval, an operator's, a denial; then one master
is killed (``kill -9``) and started again with its append-only file. What fails while it is down
says so in one sentence; nothing acknowledged is lost, and the node works on after.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from redis_cluster_fixture import RedisCluster
from relay_support import ApproverProcess, Node, RelayProcess, wait_until, write_cluster

from teaagent.errors import ApprovalDeniedError
from teaagent.relay_client import RelayClient, RelayQuorumGate

pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds a test waits for what takes a few on an idle host

RULES = """
[[approver.rules]]
tool = "shell.run"
arguments = { command = "rm *" }
decision = "deny"
reason = "nothing is removed here"

[[approver.rules]]
tool = "shell.run"
arguments = { command = "echo *" }
decision = "approve"
"""  # anything else waits for an operator


def teaagent(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "teaagent", *args, "--config", str(node.config_path)],
        env=node.env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )


def state(alpha: Node, request_id: str) -> str:
    with RelayClient(alpha.url, token=alpha.token) as client:
        return client.get_request(request_id).state


def test_relay_and_approver_on_a_redis_cluster_decide_and_lose_nothing_when_a_master_restarts(
    tmp_path: Path,
) -> None:
    cluster = RedisCluster(tmp_path / "cluster", replicas=0, persistent=True).start()
    prefix = f"test:{uuid.uuid4().hex[:12]}"
    nodes = write_cluster(
        tmp_path,
        ["alpha", "beta"],
        redis_url=cluster.url,
        prefix=prefix,
        required=1,
        rules={"beta": RULES},
        redis_cluster=True,
    )
    alpha, beta = nodes["alpha"], nodes["beta"]
    processes: list[RelayProcess | ApproverProcess] = [
        RelayProcess(alpha, tmp_path).start(),
        RelayProcess(beta, tmp_path).start(),
    ]
    approver = ApproverProcess(beta, tmp_path).start()
    processes.append(approver)
    gate = RelayQuorumGate(
        relay_url=alpha.url,
        token=alpha.token,
        origin="alpha",
        private_key_signer=alpha.key,
        config=alpha.quorum(),
        timeout=WAIT,
    )
    try:
        # 1. A rule approves, a rule denies, an operator approves what no rule decides.
        echo = alpha.request(arguments={"command": "echo 1"}, call_id="call-echo")
        gate.obtain(echo)
        rm = alpha.request(arguments={"command": "rm -rf build"}, call_id="call-rm")
        with pytest.raises(
            ApprovalDeniedError, match=r"^shell\.run was denied by beta: nothing is removed here"
        ):
            gate.obtain(rm)
        ls = alpha.request(arguments={"command": "ls"}, call_id="call-ls")
        with RelayClient(alpha.url, token=alpha.token) as client:
            client.submit_request(ls, alpha.signed(ls)["signature"])
        assert wait_until(lambda: teaagent(beta, "approvals", "show", ls["request_id"]).returncode == 0, WAIT)
        approve = teaagent(beta, "approvals", "approve", ls["request_id"], "--reason", "looked at it")
        assert approve.returncode == 0, approve.stderr
        assert wait_until(lambda: state(alpha, ls["request_id"]) == "approved", WAIT)
        decided = {echo["request_id"]: "approved", rm["request_id"]: "denied", ls["request_id"]: "approved"}

        # 2. kill -9 the master that holds the first request: reading it fails in one sentence.
        [port] = [
            p
            for p, keys in cluster.keys(f"{alpha.redis_prefix}:req:{{{echo['request_id']}}}*").items()
            if keys
        ]
        master = next(node for node in cluster.nodes if node.port == port)
        cluster.kill(master)
        down = httpx.get(f"{alpha.url}/v1/requests/{echo['request_id']}", headers=alpha.headers, timeout=WAIT)
        print(f"\nwhile a master is down: {down.status_code} {down.json()}")
        assert down.status_code == 503
        message = down.json()["message"]
        assert message.startswith("Redis at ")
        assert "\n" not in message
        cluster.restart(master)

        # 3. Nothing acknowledged is lost, and the same processes decide the next request.
        assert {rid: state(alpha, rid) for rid in decided} == decided
        gate.obtain(alpha.request(arguments={"command": "echo 2"}, call_id="call-echo-2"))
        for process in processes:
            assert process.process is not None
            assert process.process.poll() is None
            assert "Traceback" not in process.log_path.read_text()
    finally:
        gate.close()
        for process in reversed(processes):
            process.stop()
        cluster.stop()
