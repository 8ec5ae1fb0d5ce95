"""The asking side, as a user sees it: ``teaagent tools call`` and ``teaagent run`` against 2 of 3 real peers.

alpha asks beta, gamma and delta for 2 of 3 approvals. beta's and gamma's relays are served in
this process and their approvers are real ``teaagent approver serve`` processes; delta's relay is
down (nothing listens on its port). beta's rules approve ``echo`` and ``true`` commands, gamma's
only ``echo`` (anything else waits for an operator who never comes). So an ``echo`` is approved
by beta and gamma with delta unreachable, and a ``true`` expires with gamma never answering.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from port_support import refusing_port
from relay_support import APPROVE_ECHO, Node, rule, signer

pytestmark = pytest.mark.slow

CALL_TIMEOUT = 120.0  # seconds for one CLI process, start-up on a loaded host included
SHORT_TIMEOUT = 12  # the quorum timeout of the expiry scenario: sent with 11 s left, reminded at 10
RULES = {
    "beta": APPROVE_ECHO + rule("shell.run", "approve", command="true *"),
    "gamma": APPROVE_ECHO,
}


@pytest.fixture(scope="module")
def cluster(star_cluster: Callable[..., dict[str, Node]]) -> Iterator[dict[str, Node]]:
    # delta is down: its relay's port is held, never listening, so every delivery to it is refused
    # for the whole module, whatever else this machine starts meanwhile.
    with refusing_port() as down:

        def short_config(nodes: dict[str, Node]) -> None:
            alpha = nodes["alpha"]
            short = alpha.config_path.read_text().replace(
                "timeout_seconds = 60", f"timeout_seconds = {SHORT_TIMEOUT}"
            )
            (alpha.folder / "alpha-short.toml").write_text(short)

        yield star_cluster(
            "tools-cli-quorum",
            leaves=["beta", "gamma", "delta"],
            required=2,
            timeout_seconds=60,
            rules=RULES,
            ports={"delta": down},
            extra_toml={
                "alpha": '\n[agent]\npermission_mode = "danger-full-access"\nprovider = "scripted"\n'
            },
            prepare=short_config,
            relays=["alpha", "beta", "gamma"],
            approvers=["beta", "gamma"],
        )


def teaagent(alpha: Node, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = alpha.env()
    return subprocess.run(
        [sys.executable, "-m", "teaagent", *args, "--config", str(config or alpha.config_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        check=False,
    )


def request_id_of(stderr: str) -> str:
    found = re.search(r"request ([0-9a-f]{32}) sent to the peers", stderr)
    assert found is not None, stderr
    return found.group(1)


def relay_status(alpha: Node, request_id: str) -> dict[str, Any]:
    response = httpx.get(f"{alpha.url}/v1/requests/{request_id}", headers=alpha.headers, timeout=10)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def delta_unreachable(cluster: dict[str, Node]) -> str:
    return f"delta's relay at {cluster['delta'].url}/v1/inbox is unreachable: "


def fingerprint(name: str) -> str:
    return str(signer(name).public_key.fingerprint)


def test_an_approved_call_names_who_received_it_and_who_signed_and_saves_its_certificate(
    cluster: dict[str, Node],
) -> None:
    alpha = cluster["alpha"]
    out = alpha.folder / "certificates" / "echo.json"
    out.parent.mkdir(exist_ok=True)

    done = teaagent(
        alpha, "tools", "call", "shell.run", '{"command": "echo two of three"}', "--certificate-out", str(out)
    )

    assert done.returncode == 0, done.stderr
    # stdout is the tool's result, alone.
    result = json.loads(done.stdout)
    assert (result["exit_code"], result["stdout"], result["stderr"]) == (0, "two of three\n", "")
    assert done.stdout.count("\n") == 1
    lines = done.stderr.splitlines()
    assert all(line.startswith("teaagent: ") for line in lines), done.stderr
    assert "teaagent: beta's relay received the request." in lines
    assert "teaagent: gamma's relay received the request." in lines
    [unreachable] = [line for line in lines if line.startswith("teaagent: delta could not be reached: ")]
    assert delta_unreachable(cluster) in unreachable
    approvals = [line for line in lines if "✓" in line]
    assert len(approvals) == 2, done.stderr
    for line, name in zip(sorted(approvals), ("beta", "gamma"), strict=True):
        assert re.fullmatch(
            rf"teaagent: ✓ {name} approved \(key {re.escape(fingerprint(name))}, \d+\.\d s after asking\): "
            r"[12] approvals? of the 2 needed\.",
            line,
        ), line
    # While it waits: the request, the count, who received it, the time left, and what a peer runs.
    request_id = request_id_of(done.stderr)
    short = request_id[:8]
    [sent] = [line for line in lines if line.startswith(f"teaagent: request {short} for shell.run: ")]
    assert re.fullmatch(
        rf"teaagent: request {short} for shell\.run: 0 approvals of the 2 needed; received by [a-z, ]+; "
        rf"(not reached yet: [a-z, ]+; )?\d+s left \(expires at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\dZ\)\. "
        rf"A peer's operator approves it with: "
        rf"teaagent approvals approve {short} --config <their node\.toml>",
        sent,
    ), sent
    assert f"teaagent: the quorum certificate is saved in {out}." in lines

    # The certificate: JSON, verified offline by teaagent quorum verify.
    certificate = json.loads(out.read_text())
    assert certificate["request"]["arguments"] == {"command": "echo two of three"}
    assert sorted(a["statement"]["signer"] for a in certificate["approvals"]) == ["beta", "gamma"]
    assert not list(out.parent.glob(".*.tmp"))
    verified = teaagent(alpha, "quorum", "verify", str(out))
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The origin relay's view: who received the request, who could not be reached, and why.
    status = relay_status(alpha, request_id_of(done.stderr))
    deliveries = status["deliveries"]
    assert set(deliveries) == {"beta", "gamma", "delta"}
    assert deliveries["beta"]["state"] == deliveries["gamma"]["state"] == "delivered"
    assert deliveries["beta"]["attempts"] >= 1
    assert deliveries["beta"]["error"] is None
    assert deliveries["delta"]["state"] in ("failing", "given_up")
    assert deliveries["delta"]["attempts"] >= 1
    assert deliveries["delta"]["error"].startswith(delta_unreachable(cluster))
    assert sorted(a["statement"]["signer"] for a in status["approvals"]) == ["beta", "gamma"]


def test_an_expiry_names_who_never_answered_and_who_was_unreachable(cluster: dict[str, Node]) -> None:
    alpha = cluster["alpha"]
    out = alpha.folder / "never.json"

    done = teaagent(
        alpha,
        "tools",
        "call",
        "shell.run",
        '{"command": "true slow"}',
        "--certificate-out",
        str(out),
        config=alpha.folder / "alpha-short.toml",
    )

    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    assert not out.exists()
    lines = done.stderr.splitlines()
    request_id = request_id_of(done.stderr)
    assert any(
        re.fullmatch(
            rf"teaagent: ✓ beta approved \(key {re.escape(fingerprint('beta'))}, \d+\.\d s after asking\): "
            r"1 approval of the 2 needed\.",
            line,
        )
        for line in lines
    ), done.stderr
    # Reminded of the time left, from the local clock, with nothing new from the peers.
    waits = [line for line in lines if line.startswith(f"teaagent: request {request_id[:8]} for shell.run: ")]
    assert len(waits) >= 2, done.stderr
    assert re.search(r"; (10|9|8)s left \(expires at ", waits[-1]), waits
    assert waits[-1].startswith(
        f"teaagent: request {request_id[:8]} for shell.run: 1 approval of the 2 needed (beta); "
        "received by beta, gamma; not reached yet: delta; "
    ), waits[-1]
    [why] = [line for line in lines if line.startswith(f"teaagent: request {request_id} expired: ")]
    assert why.startswith(
        f"teaagent: request {request_id} expired: approved by beta (1 approval of the 2 needed); "
        "never answered: gamma; "
        f"unreachable: delta ({delta_unreachable(cluster)}"
    ), why
    assert re.search(r"; \d+ attempts\)\.$", why), why
    assert "expired" in lines[-1]
    status = relay_status(alpha, request_id)
    assert status["state"] == "expired"
    assert status["deliveries"]["gamma"]["state"] == "delivered"
    assert status["deliveries"]["delta"]["state"] in ("failing", "given_up")


def test_a_run_shows_the_quorums_deliveries_and_approvals_as_they_arrive(
    cluster: dict[str, Node], tmp_path: Path
) -> None:
    alpha = cluster["alpha"]
    script = tmp_path / "echo.json"
    script.write_text(
        json.dumps(
            {
                "format": 1,
                "turns": [
                    {
                        "content": "I will say hello.",
                        "tool_calls": [
                            {
                                "tool_name": "shell.run",
                                "arguments": {"command": "echo hello"},
                                "call_id": "c1",
                            }
                        ],
                    },
                    {"content": "Said."},
                ],
            }
        )
    )

    done = teaagent(alpha, "run", "Say hello.", "--script", str(script))

    assert done.returncode == 0, done.stdout + done.stderr
    shown = done.stdout
    assert "beta's relay received the request." in shown
    assert "gamma's relay received the request." in shown
    assert "delta could not be reached: " + delta_unreachable(cluster) in shown
    assert re.search(
        rf"✓ beta approved \(key {re.escape(fingerprint('beta'))}, \d+\.\d s after asking\)", shown
    )
    assert re.search(rf"✓ gamma approved \(key {re.escape(fingerprint('gamma'))}, ", shown)
    assert "completed after 2 turns and 1 tool call" in shown
