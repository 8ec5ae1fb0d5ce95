"""A node's relay and approver, real processes, on a real three-master Redis Cluster without
replicas (``redis_cluster = true``): a rule's approval, an operator's (node key, and their own key
through ``statement``, ``ssh-keygen -Y sign`` and ``submit``), a denial, a withdrawal; then one
master is killed (``kill -9``) and started again with its append-only file. What fails while it
is down says so in one sentence; nothing acknowledged is lost, the node works on after, and the
per-origin rate limit counts on the cluster.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from redis_cluster_fixture import RedisCluster
from redis_fixture import new_prefix
from relay_support import (
    APPROVE_ECHO,
    DENY_RM,
    ApproverProcess,
    Node,
    RelayProcess,
    private_key,
    wait_until,
    write_cluster,
)

from teaagent.errors import ApprovalDeniedError
from teaagent.relay_client import RelayClient

pytestmark = pytest.mark.slow

WAIT = 60.0  # seconds a test waits for what takes a few on an idle host
RATE_LIMIT = 12  # requests beta's relay takes from alpha per hour, in the test

RULES = DENY_RM + APPROVE_ECHO  # anything else waits for an operator


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


def operator_key_file(folder: Path, name: str) -> Path:
    """The operator's private key as OpenSSH writes it, for ``ssh-keygen -Y sign``."""
    path = folder / f"{name}-key"
    pem = private_key(name).private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


def listed(beta: Node, request_id: str) -> bool:
    """Whether ``teaagent approvals show`` finds the request at beta."""
    return teaagent(beta, "approvals", "show", request_id).returncode == 0


def inbox_state(beta: Node, request_id: str) -> str:
    with RelayClient(beta.url, token=beta.token) as client:
        return client.get_inbox_item(request_id, origin="alpha").state


def test_relay_and_approver_on_a_redis_cluster_decide_and_lose_nothing_when_a_master_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_RELAY_INBOX_RATE_LIMIT", str(RATE_LIMIT))
    monkeypatch.setenv("TEAAGENT_RELAY_INBOX_RATE_WINDOW_SECONDS", "3600")
    cluster = RedisCluster(tmp_path / "cluster", replicas=0, persistent=True).start()
    prefix = new_prefix()
    nodes = write_cluster(
        tmp_path,
        ["alpha", "beta"],
        redis_url=cluster.url,
        prefix=prefix,
        required=1,
        rules={"beta": RULES},
        operators={"beta": ["beta-operator"]},
        redis_cluster=True,
    )
    alpha, beta = nodes["alpha"], nodes["beta"]
    processes: list[RelayProcess | ApproverProcess] = [
        RelayProcess(alpha, tmp_path).start(),
        RelayProcess(beta, tmp_path).start(),
    ]
    approver = ApproverProcess(beta, tmp_path).start()
    processes.append(approver)
    gate = alpha.gate(
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
        # An operator's own key: statement, ssh-keygen -Y sign, submit.
        pwd = alpha.request(arguments={"command": "pwd"}, call_id="call-pwd")
        with RelayClient(alpha.url, token=alpha.token) as client:
            client.submit_request(pwd, alpha.signed(pwd)["signature"])
        assert wait_until(
            lambda: teaagent(beta, "approvals", "show", pwd["request_id"]).returncode == 0, WAIT
        )
        statement = tmp_path / "pwd.json"
        made = teaagent(beta, "approvals", "statement", pwd["request_id"], "--out", str(statement))
        assert made.returncode == 0, made.stderr
        key = operator_key_file(tmp_path, "beta-operator")
        subprocess.run(
            ["ssh-keygen", "-q", "-Y", "sign", "-n", "teaagent-approval", "-f", str(key), str(statement)],
            check=True,
            capture_output=True,
        )
        submitted = teaagent(
            beta, "approvals", "submit", pwd["request_id"], "--statement", str(statement),
            "--signature", f"{statement}.sig",
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        assert wait_until(lambda: state(alpha, pwd["request_id"]) == "approved", WAIT)

        # A withdrawal: the origin stops waiting; its relay and beta's mark the request withdrawn.
        stop = threading.Event()
        waiting = alpha.gate(
            timeout=WAIT,
            stop=stop,
        )
        cat = alpha.request(arguments={"command": "cat notes"}, call_id="call-cat")
        outcome: dict[str, BaseException] = {}

        def obtain() -> None:
            try:
                waiting.obtain(cat)
            except ApprovalDeniedError as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=obtain, daemon=True)
        worker.start()
        assert wait_until(
            lambda: teaagent(beta, "approvals", "show", cat["request_id"]).returncode == 0, WAIT
        )
        stop.set()
        worker.join(WAIT)
        waiting.close()
        assert "Withdrawn: request" in str(outcome["error"])
        assert wait_until(lambda: inbox_state(beta, cat["request_id"]) == "withdrawn", WAIT)
        decided = {
            echo["request_id"]: "approved",
            rm["request_id"]: "denied",
            ls["request_id"]: "approved",
            pwd["request_id"]: "approved",
            cat["request_id"]: "withdrawn",
        }
        assert {rid: state(alpha, rid) for rid in decided} == decided

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

        # 4. beta's per-origin window counts on the cluster: 6 of alpha's requests reached it so
        # far; the next six are taken, the seventh refused in one sentence and charged nothing.
        answers = []
        for number in range(RATE_LIMIT - 6 + 1):
            extra = alpha.request(arguments={"command": f"echo {number}"}, call_id=f"call-burst-{number}")
            answers.append(httpx.post(f"{beta.url}/v1/inbox", json=alpha.signed(extra), timeout=WAIT))
        assert [answer.status_code for answer in answers] == [201] * (RATE_LIMIT - 6) + [429]
        assert set(answers[-1].json()) == {"error", "message"}
        assert answers[-1].json()["message"].count(". ") == 0

        for process in processes:
            assert process.process is not None
            assert process.process.poll() is None
            assert "Traceback" not in process.log_path.read_text()
    finally:
        gate.close()
        for process in reversed(processes):
            process.stop()
        cluster.stop()
