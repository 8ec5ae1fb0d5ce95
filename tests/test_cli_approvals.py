"""``teaagent approvals``: the operators' command line against beta's real approver and relay.

The node is beta, its relay and approver real processes (``teaagent relay serve``, ``teaagent
approver serve``) shared by the module; alpha asks it (each test delivers requests of its own,
signed with alpha's key, to beta's relay as alpha's relay would). Operators' keys are made by the
real ``ssh-keygen`` and listed in beta's ``[approver] operators`` file; signatures made by
``ssh-keygen -Y sign`` and by a real ``ssh-agent`` go through ``submit``, ``--key`` and ``--agent``.
Each refusal is checked for its exit code and its one sentence on stderr. A stand-in server is used
only for answers the real approver never gives (a wrong statement to sign, an undocumented body).
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import queue
import re
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from conftest import SSHKey
from redis_fixture import delete_prefix, new_prefix
from relay_support import (
    APPROVE_ECHO,
    ApproverProcess,
    Node,
    RelayProcess,
    free_port,
    rule,
    signer,
    write_cluster,
)
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from web_support import fingerprint_of, ssh_keygen_sign

from teaagent.approver_client import ApproverClient
from teaagent.cli import _operator_keys
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.errors import RelayError
from teaagent.quorum import approval_statement, sign_request, sign_withdrawal, statement_bytes
from teaagent.relay_client import RelayClient

PASSPHRASE = "correct horse battery staple"
STOP_SECONDS = 30.0  # for a watch to exit once told to quit, on a loaded host
DEADLINE = 30.0  # seconds for anything a test waits on (a loaded two-core host)


# -- the cluster -------------------------------------------------------------------------------


@dataclass
class Cluster:
    """beta (the node under test), alpha (the origin) and gamma, beta's operators' keys."""

    nodes: dict[str, Node]
    operator: SSHKey  # listed in beta's operators file
    second_operator: SSHKey  # listed too
    locked: SSHKey  # listed, passphrase-protected
    stranger: SSHKey  # listed nowhere
    approver_port: int

    @property
    def beta(self) -> Node:
        return self.nodes["beta"]

    @property
    def config(self) -> str:
        return str(self.beta.config_path)

    def request(
        self, *, tool_name: str = "shell.run", arguments: dict[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        return self.nodes["alpha"].request(tool_name=tool_name, arguments=arguments, **fields)


RULES = APPROVE_ECHO + rule("fs.delete", "ask")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str, ssh_key_factory: Callable[..., SSHKey]
) -> Iterator[Cluster]:
    """One cluster for the module (each test sends requests of its own), its keys under one prefix."""
    folder = tmp_path_factory.mktemp("approvals")
    prefix = new_prefix()
    nodes = write_cluster(
        folder,
        ["alpha", "beta", "gamma"],
        redis_url=redis_server,
        prefix=prefix,
        operators={"beta": ["ops-placeholder"]},
        rules={"beta": RULES},
    )
    operator = ssh_key_factory("ops-one")
    second = ssh_key_factory("ops-two")
    locked = ssh_key_factory("ops-locked", passphrase=PASSPHRASE)
    stranger = ssh_key_factory("stranger")
    # beta's operators are keys of the real ssh-keygen (beta reads the file as [approver] operators).
    (folder / "beta.operators").write_text(
        "".join(f"beta {key.public_line}\n" for key in (operator, second, locked))
    )
    yield Cluster(nodes, operator, second, locked, stranger, nodes["beta"].approver_port)
    delete_prefix(redis_server, prefix)


def config_with_approver_port(cluster: Cluster, port: int) -> str:
    """A copy of beta's configuration whose approver is on ``port`` (nobody's, or a stand-in's)."""
    text = cluster.beta.config_path.read_text()
    marker = f"[approver]\nport = {cluster.approver_port}\n"
    assert marker in text
    path = cluster.beta.folder / f"beta-{port}.toml"
    path.write_text(text.replace(marker, f"[approver]\nport = {port}\n"))
    return str(path)


class Approver:
    """beta's relay and approver, real processes, and the way alpha's requests reach beta."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        logs = cluster.beta.folder / "logs"
        logs.mkdir(exist_ok=True)
        self.relay = RelayProcess(cluster.beta, logs)
        self.process = ApproverProcess(cluster.beta, logs)
        self.token = load_config(cluster.beta.config_path).load_token()

    def client(self) -> ApproverClient:
        return ApproverClient(self.cluster.beta.approver_url, token=self.token)

    def deliver(self, request: dict[str, Any]) -> dict[str, Any]:
        """Deliver the request to beta's inbox as alpha's relay would; wait until the approver shows it."""
        with RelayClient(self.cluster.beta.url) as relay:
            relay.deliver_request(request, sign_request(request, signer("alpha")))
        with self.client() as client:
            deadline = time.monotonic() + DEADLINE
            while True:
                try:
                    client.get_request(request["request_id"])
                    return request
                except RelayError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def decision(self, request_id: str) -> Any:
        """beta's own decision on the request, as its approver tells it."""
        with self.client() as client:
            return client.get_request(request_id).decision

    def ensure_running(self) -> None:
        if self.relay.process is None or self.relay.process.poll() is not None:
            self.relay.start()
        if self.process.process is None or self.process.process.poll() is not None:
            self.start()

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        self.process.stop()
        self.relay.stop()


@pytest.fixture(scope="module")
def approver_processes(cluster: Cluster) -> Iterator[Approver]:
    served = Approver(cluster)
    try:
        served.ensure_running()
        yield served
    finally:
        served.close()


@pytest.fixture
def approver(approver_processes: Approver) -> Approver:
    approver_processes.ensure_running()  # a test that stopped it (watch) has it started again
    return approver_processes


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(["approvals", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_sentence(err: str) -> str:
    """The stderr of a refusal: exactly one line, ``teaagent: ...``, one sentence, no traceback."""
    assert err.startswith("teaagent: "), err
    assert err.endswith(".\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[len("teaagent: ") : -1]


# -- list and show -----------------------------------------------------------------------------


@pytest.mark.slow
def test_list_json_has_the_documented_fields_pending_first(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    first = approver.deliver(cluster.request(arguments={"command": "rm -rf build"}, call_id="c1"))
    second = approver.deliver(cluster.request(tool_name="fs.delete", arguments={"path": "x"}, call_id="c2"))
    code, out, _ = cli(capsys, "approve", first["request_id"], "--config", cluster.config)
    assert code == 0

    code, out, err = cli(capsys, "list", "--json", "--state", "all", "--config", cluster.config)

    assert (code, err) == (0, "")
    listed = json.loads(out)
    for item in listed:
        assert {"request_id", "origin", "tool_name", "arguments", "reason", "expires_at", "state"} <= set(
            item
        )
    states = [item["state"] for item in listed]
    assert states == sorted(states, key=lambda state: state != "pending")  # the pending first
    mine = {
        item["request_id"]: item
        for item in listed
        if item["request_id"] in (first["request_id"], second["request_id"])
    }
    assert mine[second["request_id"]]["origin"] == "alpha"
    assert mine[second["request_id"]]["tool_name"] == "fs.delete"
    assert mine[second["request_id"]]["arguments"] == {"path": "x"}
    assert mine[second["request_id"]]["reason"] == "clean the build"
    assert mine[second["request_id"]]["expires_at"] == second["expires_at"]
    assert mine[second["request_id"]]["state"] == "pending"
    assert mine[first["request_id"]]["state"] == "approved"  # by this node: its own view


@pytest.mark.slow
def test_list_filters_and_prints_a_table(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = f"test.{uuid.uuid4().hex[:8]}"  # a tool no other test's request calls
    long = approver.deliver(cluster.request(tool_name=tool, arguments={"command": "x" * 300}, call_id="c1"))
    short = approver.deliver(cluster.request(tool_name=tool, arguments={"path": "x"}, call_id="c2"))

    code, out, _ = cli(capsys, "list", "--tool", tool, "--config", cluster.config)

    assert code == 0
    header, *rows, note = out.splitlines()
    assert header.split() == ["REQUEST", "ORIGIN", "TOOL", "BETA", "LEFT", "RULE", "ARGUMENTS"]
    assert sorted(row.split()[:4] for row in rows) == sorted(
        [request["request_id"], "alpha", tool, "pending"] for request in (long, short)
    )
    assert note == "(arguments cut with …; `teaagent approvals show ID` prints them whole)"
    code, out, _ = cli(capsys, "list", "--tool", tool, "--json", "--config", cluster.config)
    assert {item["request_id"] for item in json.loads(out)} == {long["request_id"], short["request_id"]}
    code, out, _ = cli(capsys, "list", "--origin", "gamma", "--config", cluster.config)
    assert (code, out) == (0, "No pending requests for beta.\n")


def test_list_refuses_an_unknown_state(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "list", "--state", "maybe", "--config", cluster.config)

    assert code == 2
    assert (
        one_sentence(err)
        == "--state is pending, approved, denied, expired, withdrawn, settled or all, not 'maybe'."
    )


@pytest.mark.slow
def test_show_prints_the_whole_request_and_what_would_decide_it(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    long_text = "y" * 5000
    request = approver.deliver(
        cluster.request(tool_name="fs.delete", arguments={"path": "build/", "note": long_text})
    )

    code, out, err = cli(capsys, "show", request["request_id"], "--config", cluster.config)

    assert (code, err) == (0, "")
    assert f"request      {request['request_id']}" in out
    assert "origin       alpha" in out
    assert "tool         fs.delete" in out
    assert f'"note": "{long_text}"' in out  # whole, not cut
    assert "note: note is 5000 characters long, printed whole above." in out
    assert '"path": "build/"' in out
    assert "reason       clean the build" in out
    assert f"digest       {request['payload_digest']}" in out
    assert "quorum       2 approvals needed from beta, gamma, counted by alpha" in out
    assert re.search(
        r"^time left    (1m 5\ds|2m 00s) \(expires at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\)$", out, re.M
    )
    assert "beta         not decided yet (this node's own decision, not the request's outcome)" in out
    assert "time left    1m 5" in out or "time left    2m 00s" in out
    assert "rule         #2 tool='fs.delete' -> ask" in out


@pytest.mark.slow
def test_show_escapes_what_a_terminal_would_hide(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(
        cluster.request(arguments={"command": "echo safe\u202e\u200b\x1b[2J"}, reason="ok\u202egnp.exe")
    )

    code, out, _ = cli(capsys, "show", request["request_id"], "--config", cluster.config)

    assert code == 0
    for hidden in ("\u202e", "\u200b", "\x1b"):
        assert hidden not in out
    assert "echo safe\\u202e\\u200b\\u001b[2J" in out
    assert "reason       ok\\u202egnp.exe" in out
    assert "rule         #1 tool='shell.run' command='echo *' -> approve" in out


@pytest.mark.slow
def test_show_json_is_the_whole_item(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, out, _ = cli(capsys, "show", request["request_id"], "--json", "--config", cluster.config)

    item = json.loads(out)
    assert code == 0
    assert item["request"] == request
    assert item["decision"] is None
    assert item["rule"] is None
    assert item["state"] == "pending"


# -- deciding with the node key ----------------------------------------------------------------


@pytest.mark.slow
def test_approve_names_this_nodes_decision_not_the_outcome(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, out, err = cli(capsys, "approve", request["request_id"], "--config", cluster.config)

    assert (code, err) == (0, "")
    node_key = load_config(cluster.beta.config_path).own_public_key().fingerprint
    first, _, third = out.splitlines()
    assert (
        first
        == f"beta approved request {request['request_id']} of alpha: signed with the node key {node_key}."
    )
    assert third == "This node's decision; the request's outcome is counted by its origin, alpha."
    assert "state" not in out

    code, out, _ = cli(capsys, "approve", request["request_id"], "--json", "--config", cluster.config)
    decision = json.loads(out)
    assert code == 0
    assert decision["this_node"] == "approved"
    assert "state" not in decision


@pytest.mark.slow
def test_deny_needs_a_reason_and_signs_it(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, _, err = cli(capsys, "deny", request["request_id"], "--reason", " ", "--config", cluster.config)
    assert code == 2
    assert one_sentence(err) == "a denial needs a reason for the origin's operators: pass --reason TEXT."

    code, out, err = cli(
        capsys, "deny", request["request_id"], "--reason", "not on Fridays", "--config", cluster.config
    )
    assert (code, err) == (0, "")
    assert out.startswith(f"beta denied request {request['request_id']} of alpha (not on Fridays): ")

    code, out, _ = cli(capsys, "show", request["request_id"], "--config", cluster.config)
    node_key = load_config(cluster.beta.config_path).own_public_key().fingerprint
    # Signed with the node key: it says so; the time is a date with how long ago.
    assert re.search(
        rf"^beta         denied with the node key {re.escape(node_key)} at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ, (now|\d+s ago): not on Fridays",
        out,
        re.M,
    ), out
    assert ": not on Fridays (this node's own decision" in out


# -- statement, ssh-keygen -Y sign, submit -----------------------------------------------------


@pytest.mark.slow
def test_statement_signed_by_ssh_keygen_is_submitted(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    path = tmp_path / "approval.json"

    code, out, err = cli(
        capsys, "statement", request["request_id"], "--out", str(path), "--config", cluster.config
    )

    assert (code, out) == (0, "")
    assert f"ssh-keygen -Y sign -n teaagent-approval -f KEY {path}" in err
    data = path.read_bytes()
    statement = json.loads(data)
    assert data == statement_bytes(statement)  # the canonical bytes, no trailing newline
    assert statement["signer"] == "beta"
    assert statement["type"] == "teaagent.approval"
    assert statement["request_id"] == request["request_id"]

    signature = ssh_keygen_sign(cluster.operator, path)
    code, out, err = cli(
        capsys, "submit", request["request_id"], "--statement", str(path), "--signature", str(signature),
        "--config", cluster.config,
    )  # fmt: skip

    assert (code, err) == (0, "")
    assert f"with an operator's own key {fingerprint_of(cluster.operator)}." in out.splitlines()[0]
    assert out.startswith(f"beta approved request {request['request_id']} of alpha")


@pytest.mark.slow
def test_statement_goes_to_stdout_without_a_newline(
    cluster: Cluster, approver: Approver, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    request = approver.deliver(cluster.request())

    code = run(["approvals", "statement", request["request_id"], "--config", cluster.config])

    data = capsysbinary.readouterr().out
    assert code == 0
    assert data == statement_bytes(json.loads(data))
    assert not data.endswith(b"\n")


@pytest.mark.slow
def test_a_denial_statement_signed_by_ssh_keygen_is_submitted(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    path = tmp_path / "denial.json"

    code, _, err = cli(
        capsys, "statement", request["request_id"], "--reason", "no", "--config", cluster.config
    )
    assert code == 2
    assert one_sentence(err) == "--reason goes with --deny: an approval statement carries no reason."

    args = ["statement", request["request_id"], "--deny", "--reason", "not today", "--out", str(path)]
    code, _, _ = cli(capsys, *args, "--config", cluster.config)
    assert code == 0
    assert json.loads(path.read_bytes())["reason"] == "not today"
    signature = ssh_keygen_sign(cluster.second_operator, path, "teaagent-denial")
    code, out, err = cli(
        capsys, "submit", request["request_id"], "--statement", str(path), "--signature", str(signature),
        "--config", cluster.config,
    )  # fmt: skip

    assert (code, err) == (0, "")
    assert out.startswith(f"beta denied request {request['request_id']} of alpha (not today): ")


# -- signing locally with an operator's key file -----------------------------------------------


@pytest.mark.slow
def test_key_file_signs_as_an_operator(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, out, err = cli(
        capsys,
        "approve",
        request["request_id"],
        "--key",
        str(cluster.operator.private_path),
        "--config",
        cluster.config,
    )

    assert (code, err) == (0, "")
    assert f"with an operator's own key {fingerprint_of(cluster.operator)}." in out


@pytest.mark.slow
def test_a_passphrase_is_asked_once_without_echo(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    request = approver.deliver(cluster.request())
    prompts: list[str] = []

    def getpass(prompt: str) -> str:
        prompts.append(prompt)
        return PASSPHRASE

    monkeypatch.setattr(_operator_keys, "_terminal_available", lambda: True)
    monkeypatch.setattr(_operator_keys.getpass, "getpass", getpass)
    code, out, err = cli(
        capsys,
        "approve",
        request["request_id"],
        "--key",
        str(cluster.locked.private_path),
        "--config",
        cluster.config,
    )

    assert (code, err) == (0, "")
    assert prompts == [f"Passphrase for {cluster.locked.private_path}: "]
    assert f"with an operator's own key {fingerprint_of(cluster.locked)}." in out


@pytest.mark.slow
def test_a_wrong_passphrase_is_a_usage_error(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    request = approver.deliver(cluster.request())
    monkeypatch.setattr(_operator_keys, "_terminal_available", lambda: True)
    monkeypatch.setattr(_operator_keys.getpass, "getpass", lambda prompt: "wrong")

    code, _, err = cli(
        capsys,
        "approve",
        request["request_id"],
        "--key",
        str(cluster.locked.private_path),
        "--config",
        cluster.config,
    )

    assert code == 2
    assert one_sentence(err) == f"the passphrase for the private key {cluster.locked.private_path} is wrong."
    assert approver.decision(request["request_id"]) is None


def _read_until(descriptor: int, wanted: bytes, deadline: float) -> bytes:
    seen = b""
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{wanted!r} not seen; got {seen!r}")
        ready, _, _ = select.select([descriptor], [], [], left)
        if ready:
            try:
                chunk = os.read(descriptor, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


@pytest.mark.slow
def test_a_passphrase_is_read_from_a_real_terminal_without_echo(cluster: Cluster, approver: Approver) -> None:
    request = approver.deliver(cluster.request())
    argv = [
        sys.executable, "-m", "teaagent", "approvals", "approve", request["request_id"],
        "--key", str(cluster.locked.private_path), "--config", cluster.config,
    ]  # fmt: skip
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execv(sys.executable, argv)  # noqa: S606 - the CLI itself, argv fixed above
    try:
        deadline = time.monotonic() + DEADLINE
        prompt = _read_until(terminal, b"Passphrase for", deadline)
        os.write(terminal, PASSPHRASE.encode() + b"\n")
        rest = _read_until(terminal, b"counted by its origin", deadline)
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(OSError):
            os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0, prompt + rest
    assert PASSPHRASE.encode() not in prompt + rest  # not echoed
    assert f"with an operator's own key {fingerprint_of(cluster.locked)}.".encode() in rest


@pytest.mark.slow
def test_a_passphrase_without_a_terminal_is_a_usage_error(cluster: Cluster, approver: Approver) -> None:
    request = approver.deliver(cluster.request())

    result = subprocess.run(
        [
            sys.executable, "-m", "teaagent", "approvals", "approve", request["request_id"],
            "--key", str(cluster.locked.private_path), "--config", cluster.config,
        ],
        input="",
        capture_output=True,
        text=True,
        start_new_session=True,  # no controlling terminal
        timeout=DEADLINE,
        check=False,
    )  # fmt: skip

    assert result.returncode == 2
    assert one_sentence(result.stderr) == (
        f"the private key {cluster.locked.private_path} is protected by a passphrase, and there is no "
        "terminal to ask for it; run the command in a terminal, or add the key to ssh-agent and use --agent."
    )
    assert approver.decision(request["request_id"]) is None


@pytest.mark.slow
def test_a_folder_given_as_key_is_a_usage_error(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())

    code, _, err = cli(
        capsys, "approve", request["request_id"], "--key", str(tmp_path), "--config", cluster.config
    )

    assert code == 2
    assert one_sentence(err) == f"the private key {tmp_path} is a folder, not a key file."


def test_a_missing_key_file_is_a_usage_error(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope"

    code, _, err = cli(capsys, "approve", "0" * 32, "--key", str(missing), "--config", cluster.config)

    assert code == 2
    assert one_sentence(err) == f"the private key file {missing} does not exist."


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_a_public_key_file_given_as_key_says_to_give_the_private_half(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    public = cluster.operator.public_path
    public.chmod(0o644)  # as ssh-keygen writes it: no warning about its mode comes before the sentence

    code, _, err = cli(
        capsys, command, "0" * 32, "--key", str(public), "--reason", "no", "--config", cluster.config
    )

    assert code == 2
    assert one_sentence(err) == (
        f"{public} is the public half of the key; "
        f"give the private key file ({cluster.operator.private_path})."
    )


@pytest.mark.slow
def test_an_unreadable_key_file_is_a_usage_error(
    cluster: Cluster, approver: Approver, tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    key = tmp_path / "unreadable"
    shutil.copy(cluster.operator.private_path, key)
    key.chmod(0o000)
    prefix: list[str] = []
    if os.geteuid() == 0:
        # root reads any file; without these two capabilities it obeys the mode bits like anyone.
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        caps = "-dac_override,-dac_read_search"
        prefix = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]

    result = subprocess.run(
        [*prefix, sys.executable, "-m", "teaagent", "approvals", "approve", request["request_id"],
         "--key", str(key), "--config", cluster.config],
        capture_output=True, text=True, timeout=DEADLINE, check=False,
    )  # fmt: skip

    assert result.returncode == 2, result.stderr
    assert one_sentence(result.stderr) == f"cannot read the private key file {key}: Permission denied."


@pytest.mark.slow
def test_a_key_readable_by_others_is_warned_about(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    key = tmp_path / "exposed"
    shutil.copy(cluster.operator.private_path, key)
    key.chmod(0o644)

    code, out, err = cli(
        capsys, "approve", request["request_id"], "--key", str(key), "--config", cluster.config
    )

    assert code == 0
    assert err == (
        f"teaagent: warning: the private key file {key} is accessible by others (mode 0644; OpenSSH "
        f"refuses such a key): run chmod 600 {key}.\n"
    )
    assert "beta approved" in out


def test_key_and_agent_together_are_a_usage_error(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "approve",
        "0" * 32,
        "--key",
        str(cluster.operator.private_path),
        "--agent",
        "--config",
        cluster.config,
    ]
    code, _, err = cli(capsys, *args)
    assert code == 2
    assert one_sentence(err) == "--key and --agent are two ways to sign; give one of them."

    code, _, err = cli(capsys, "approve", "0" * 32, "--key-id", "SHA256:x", "--config", cluster.config)
    assert code == 2
    assert one_sentence(err) == "--key-id chooses a key held by ssh-agent; give it with --agent."


# -- signing through a real ssh-agent ----------------------------------------------------------


@pytest.fixture
def agent_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    if shutil.which("ssh-agent") is None:
        pytest.skip("OpenSSH's ssh-agent is not installed")
    socket_path = tmp_path / "agent.sock"
    process = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + DEADLINE
        # The socket's file exists once bound, a moment before the agent listens: wait until it
        # answers (`ssh-add -l` exits 2 only when it cannot reach an agent).
        while not socket_path.exists() or _agent_unreachable(socket_path):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ssh-agent did not start")
            time.sleep(0.02)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket_path))
        yield socket_path
    finally:
        process.terminate()
        process.wait(timeout=DEADLINE)


def _agent_unreachable(socket_path: Path) -> bool:
    listed = subprocess.run(
        ["ssh-add", "-l"],
        env={**os.environ, "SSH_AUTH_SOCK": str(socket_path)},
        capture_output=True,
        check=False,
    )
    return listed.returncode == 2


def ssh_add(socket_path: Path, key: SSHKey) -> None:
    subprocess.run(
        ["ssh-add", str(key.private_path)],
        env={**os.environ, "SSH_AUTH_SOCK": str(socket_path)},
        check=True,
        capture_output=True,
    )


@pytest.mark.slow
def test_agent_signs_with_the_one_key_of_this_node_it_holds(
    cluster: Cluster, approver: Approver, agent_socket: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh_add(agent_socket, cluster.stranger)
    ssh_add(agent_socket, cluster.operator)
    request = approver.deliver(cluster.request())

    code, out, err = cli(capsys, "approve", request["request_id"], "--agent", "--config", cluster.config)

    assert (code, err) == (0, "")
    assert f"with an operator's own key {fingerprint_of(cluster.operator)}." in out


@pytest.mark.slow
def test_agent_with_several_keys_of_this_node_needs_a_key_id(
    cluster: Cluster, approver: Approver, agent_socket: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ssh_add(agent_socket, cluster.operator)
    ssh_add(agent_socket, cluster.second_operator)
    request = approver.deliver(cluster.request())
    one, two = fingerprint_of(cluster.operator), fingerprint_of(cluster.second_operator)

    code, _, err = cli(capsys, "approve", request["request_id"], "--agent", "--config", cluster.config)
    assert code == 2
    assert one_sentence(err) == (
        f"the ssh-agent at {agent_socket} holds 2 keys, 2 of them keys of beta; "
        f"choose one with --key-id: {one}, {two}."
    )

    code, _, err = cli(
        capsys,
        "approve",
        request["request_id"],
        "--agent",
        "--key-id",
        "SHA256:nope",
        "--config",
        cluster.config,
    )
    assert code == 2
    assert (
        one_sentence(err)
        == f"the ssh-agent at {agent_socket} holds no key SHA256:nope; it holds {one}, {two}."
    )

    code, out, err = cli(
        capsys,
        "deny",
        request["request_id"],
        "--reason",
        "no",
        "--agent",
        "--key-id",
        two,
        "--config",
        cluster.config,
    )
    assert (code, err) == (0, "")
    assert f"with an operator's own key {two}." in out


def test_agent_without_ssh_auth_sock_is_a_usage_error(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)

    code, _, err = cli(capsys, "approve", "0" * 32, "--agent", "--config", cluster.config)

    assert code == 2
    assert one_sentence(err) == "SSH_AUTH_SOCK is not set, so there is no ssh-agent to sign with."


# -- naming a request by the first characters of its id ------------------------------------------


def sharing(prefix: str, marker: str) -> str:
    """A request id that starts with ``prefix`` then ``marker`` (an origin chooses its ids)."""
    return (prefix + marker + secrets.token_hex(16))[:32]


@pytest.mark.slow
def test_show_approve_deny_statement_and_submit_take_a_unique_prefix(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shown, approved, denied, signed, keyed = (
        approver.deliver(cluster.request(call_id=f"prefix-{n}")) for n in range(5)
    )
    config = ["--config", cluster.config]

    code, out, err = cli(capsys, "show", shown["request_id"][:8], *config)
    assert (code, err) == (0, "")
    assert out.startswith(f"request      {shown['request_id']}\n")
    assert f"digest       {shown['payload_digest']}" in out

    code, out, err = cli(capsys, "approve", approved["request_id"][:8], *config)
    assert (code, err) == (0, "")
    assert out.startswith(
        f"beta approved request {approved['request_id']} of alpha: signed with the node key "
    )

    code, out, err = cli(capsys, "deny", denied["request_id"][:8], "--reason", "not now", *config)
    assert (code, err) == (0, "")
    assert out.startswith(f"beta denied request {denied['request_id']} of alpha (not now): ")

    path = tmp_path / "approval.json"
    code, out, err = cli(capsys, "statement", signed["request_id"][:8], "--out", str(path), *config)
    assert (code, out) == (0, "")
    assert f"wrote the approval statement of request {signed['request_id']} to {path}" in err
    assert f"`teaagent approvals submit {signed['request_id']} --statement {path}" in err
    assert json.loads(path.read_bytes())["request_id"] == signed["request_id"]
    signature = ssh_keygen_sign(cluster.operator, path)
    code, out, err = cli(
        capsys, "submit", signed["request_id"][:8], "--statement", str(path), "--signature", str(signature),
        *config,
    )  # fmt: skip
    assert (code, err) == (0, "")
    assert out.startswith(
        f"beta approved request {signed['request_id']} of alpha: signed with an operator's own key "
        f"{fingerprint_of(cluster.operator)}."
    )

    key = ["--key", str(cluster.operator.private_path)]
    code, out, err = cli(capsys, "approve", keyed["request_id"][:8], *key, *config)
    assert (code, err) == (0, "")
    assert out.startswith(f"beta approved request {keyed['request_id']} of alpha: ")

    decisions = {
        request["request_id"]: approver.decision(request["request_id"])
        for request in (shown, approved, denied, signed, keyed)
    }
    assert [None if d is None else d.kind for d in decisions.values()] == [
        None,
        "approval",
        "denial",
        "approval",
        "approval",
    ]

    code, _, err = cli(capsys, "show", shown["request_id"][:3], *config)
    assert code == 2
    assert one_sentence(err) == (
        f"'{shown['request_id'][:3]}' is not a request id: type its 32 hexadecimal characters, or at "
        "least its first 4."
    )


@pytest.mark.slow
def test_a_prefix_of_a_settled_and_a_pending_request_is_refused_and_nothing_is_signed(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prefix = secrets.token_hex(4)
    settled = approver.deliver(
        cluster.request(tool_name="fs.delete", arguments={"path": "old.log"}, request_id=sharing(prefix, "0"))
    )
    config = ["--config", cluster.config]
    assert cli(capsys, "approve", settled["request_id"], *config)[0] == 0
    pending = approver.deliver(
        cluster.request(arguments={"command": "rm -rf /"}, request_id=sharing(prefix, "f"), call_id="c2")
    )
    path = tmp_path / "approval.json"
    cli(capsys, "statement", pending["request_id"], "--out", str(path), *config)
    signature = ssh_keygen_sign(cluster.operator, path)

    refusal = (
        f"{prefix} starts the ids of 2 requests listed by this node's approver ({settled['request_id']} "
        f"of alpha, {pending['request_id']} of alpha), so it names none of them; type more of the id."
    )
    for command in (
        ["show"],
        ["approve"],
        ["approve", "--key", str(cluster.operator.private_path)],
        ["deny", "--reason", "no"],
        ["statement", "--out", str(tmp_path / "other.json")],
        ["submit", "--statement", str(path), "--signature", str(signature)],
    ):
        code, out, err = cli(capsys, command[0], prefix, *command[1:], *config)
        assert (code, out) == (2, ""), command
        assert one_sentence(err) == refusal, command
    assert approver.decision(pending["request_id"]) is None
    assert not (tmp_path / "other.json").exists()

    code, out, _ = cli(capsys, "show", f"{prefix}f", *config)  # one more character names one
    assert code == 0
    assert out.startswith(f"request      {pending['request_id']}\n")
    code, _, err = cli(capsys, "show", "0123", "--origin", "gamma", *config)
    assert code == 2
    assert one_sentence(err) == "no request listed by this node's approver has an id starting with 0123."


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unknown_request_id_is_a_usage_error(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["show"], ["approve"], ["deny", "--reason", "no"], ["statement"]):
        code, _, err = cli(capsys, command[0], "f" * 32, *command[1:], "--config", cluster.config)
        assert code == 2, command
        sentence = one_sentence(err)
        assert sentence.startswith(f"The approver at http://127.0.0.1:{cluster.approver_port} refused "), (
            sentence
        )
        assert "(404 not_found)" in sentence
        assert "f" * 32 in sentence


@pytest.mark.slow
def test_an_id_two_origins_sent_is_a_usage_error_until_origin_names_one(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request_id = secrets.token_hex(16)
    ours = approver.deliver(cluster.request(arguments={"command": "rm -rf dist"}, request_id=request_id))
    theirs = cluster.nodes["gamma"].request(arguments={"command": "rm -rf dist"}, request_id=request_id)
    with RelayClient(cluster.beta.url) as relay:
        relay.deliver_request(theirs, sign_request(theirs, signer("gamma")))

    results = [
        cli(capsys, command, request_id, "--config", cluster.config) for command in ("show", "approve")
    ]
    code, out, err = cli(
        capsys, "show", request_id, "--origin", "alpha", "--json", "--config", cluster.config
    )

    for refused_code, _out, refused_err in results:
        assert refused_code == 2
        sentence = one_sentence(refused_err)
        assert "(409 ambiguous)" in sentence
        assert "--origin" in sentence
    assert (code, err) == (0, "")
    assert json.loads(out)["origin"] == "alpha"
    assert json.loads(out)["request_id"] == ours["request_id"]
    assert json.loads(out)["state"] == "pending"  # the refused approve decided nothing


@pytest.mark.slow
def test_an_expired_request_is_refused_with_exit_3(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request(now=time.time() - 119))
    deadline = time.monotonic() + DEADLINE
    while time.time() < request["expires_at"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    for command in (
        ["approve"],
        ["deny", "--reason", "late"],
        ["statement"],
        ["approve", "--key", str(cluster.operator.private_path)],
    ):
        code, _, err = cli(
            capsys, command[0], request["request_id"], *command[1:], "--config", cluster.config
        )
        assert code == 3, (command, err)
        assert "(409 expired)" in one_sentence(err)


@pytest.mark.slow
def test_a_withdrawn_request_is_listed_as_withdrawn_and_refused_with_exit_3(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    # fs.delete is an ask item: nothing signs it before its origin withdraws it.
    request = approver.deliver(cluster.request(tool_name="fs.delete", arguments={"path": "gone"}))
    request_id = request["request_id"]
    withdrawal = sign_withdrawal(request, signer("alpha"))
    with RelayClient(cluster.beta.url) as relay:
        assert relay.deliver_withdrawal(request_id, withdrawal["statement"], withdrawal["signature"])[
            "withdrawn"
        ]

    code, out, _ = cli(capsys, "list", "--json", "--config", cluster.config)
    assert code == 0
    assert request_id not in [item["request_id"] for item in json.loads(out)]
    code, out, _ = cli(capsys, "list", "--state", "withdrawn", "--json", "--config", cluster.config)
    assert code == 0
    assert [(item["request_id"], item["state"]) for item in json.loads(out)] == [(request_id, "withdrawn")]
    code, out, _ = cli(capsys, "list", "--state", "withdrawn", "--config", cluster.config)
    assert code == 0
    assert re.search(rf"^{request_id[:12]}.* withdrawn ", out, re.M), out
    for command in (["approve"], ["deny", "--reason", "late"], ["statement"]):
        code, _, err = cli(capsys, command[0], request_id, *command[1:], "--config", cluster.config)
        assert code == 3, (command, err)
        assert one_sentence(err).endswith(
            f"(409 withdrawn): Request {request_id} was withdrawn by its origin alpha; this node signs "
            "nothing for it."
        )


@pytest.mark.slow
def test_a_key_that_may_not_sign_for_this_node_is_refused(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())

    code, _, err = cli(
        capsys,
        "approve",
        request["request_id"],
        "--key",
        str(cluster.stranger.private_path),
        "--config",
        cluster.config,
    )
    assert code == 2
    sentence = one_sentence(err)
    assert "(403 forbidden)" in sentence
    assert fingerprint_of(cluster.stranger) in sentence

    path = tmp_path / "statement.json"
    cli(capsys, "statement", request["request_id"], "--out", str(path), "--config", cluster.config)
    signature = ssh_keygen_sign(cluster.stranger, path)
    code, _, err = cli(
        capsys, "submit", request["request_id"], "--statement", str(path), "--signature", str(signature),
        "--config", cluster.config,
    )  # fmt: skip
    assert code == 2
    assert "(403 forbidden)" in one_sentence(err)


@pytest.mark.slow
def test_a_statement_that_does_not_match_the_request_is_refused(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    path = tmp_path / "statement.json"
    cli(capsys, "statement", request["request_id"], "--out", str(path), "--config", cluster.config)
    statement = json.loads(path.read_bytes())
    statement["tool_name"] = "fs.read"  # canonical and signed, but not the request's statement
    path.write_bytes(statement_bytes(statement))
    signature = ssh_keygen_sign(cluster.operator, path)

    code, _, err = cli(
        capsys, "submit", request["request_id"], "--statement", str(path), "--signature", str(signature),
        "--config", cluster.config,
    )  # fmt: skip

    assert code == 2
    assert "(422 invalid)" in one_sentence(err)


@pytest.mark.slow
def test_a_statement_file_that_is_not_the_signed_bytes_is_refused_here(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    other = approver.deliver(cluster.request(call_id="other"))
    path = tmp_path / "statement.json"
    cli(capsys, "statement", request["request_id"], "--out", str(path), "--config", cluster.config)
    signature = ssh_keygen_sign(cluster.operator, path)
    submit = ["--statement", str(path), "--signature", str(signature), "--config", cluster.config]

    code, _, err = cli(capsys, "submit", other["request_id"], *submit)
    assert code == 2
    assert one_sentence(err) == (
        f"the statement file {path} is about request '{request['request_id']}', not {other['request_id']}."
    )

    path.write_bytes(path.read_bytes() + b"\n")
    code, _, err = cli(capsys, "submit", request["request_id"], *submit)
    assert code == 2
    assert "is not exactly what `teaagent approvals statement` writes" in one_sentence(err)

    signature.write_text("not a signature")
    path.write_bytes(path.read_bytes()[:-1])
    code, _, err = cli(capsys, "submit", request["request_id"], *submit)
    assert code == 2
    assert one_sentence(err).startswith(f"the signature file {signature} is not an SSH signature: ")
    assert approver.decision(request["request_id"]) is None


@pytest.mark.slow
def test_a_second_different_decision_is_refused(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())
    assert cli(capsys, "approve", request["request_id"], "--config", cluster.config)[0] == 0

    code, _, err = cli(
        capsys, "deny", request["request_id"], "--reason", "changed my mind", "--config", cluster.config
    )

    assert code == 1
    assert "(409 conflict)" in one_sentence(err)


def test_an_approver_nobody_runs_is_named_with_the_command_that_starts_it(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    config = config_with_approver_port(cluster, port)
    # (watch waits for it instead: test_watch_prints_new_requests_decides_them_and_outlives_restarts)
    for command in (["list"], ["show", "0" * 32], ["approve", "0" * 32], ["statement", "0" * 32]):
        code, _, err = cli(capsys, *command, "--config", config)
        assert code == 1, command
        sentence = one_sentence(err)
        assert sentence.startswith(f"No approver answers at http://127.0.0.1:{port} ("), sentence
        assert sentence.endswith(f"; start it with `teaagent approver serve --config {config}`."), sentence


# -- watch -------------------------------------------------------------------------------------


class Lines:
    """A subprocess's stdout, read by a thread, waited on line by line with a deadline."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = DEADLINE) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such line; seen: {self.seen}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if predicate(line):
                return line


@contextlib.contextmanager
def watching(cluster: Cluster, *extra: str) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "teaagent", "approvals", "watch", "--config", cluster.config, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        yield process, Lines(process.stdout)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=DEADLINE)


@pytest.mark.slow
def test_watch_prints_new_requests_decides_them_and_outlives_restarts(
    cluster: Cluster, approver: Approver
) -> None:
    with watching(cluster) as (process, lines):
        assert process.stdin is not None
        lines.wait_for(lambda line: line.startswith("watching the requests waiting for beta"))
        first = approver.deliver(cluster.request(call_id="c1"))
        lines.wait_for(
            lambda line: line.startswith(f"new request {first['request_id']} from alpha: shell.run")
        )
        lines.wait_for(
            lambda line: line.startswith("  expires in 1m 5") or line.startswith("  expires in 2m 00s")
        )

        process.stdin.write(f"a {first['request_id'][:10]}\n")
        process.stdin.flush()
        decided = lines.wait_for(
            lambda line: line.startswith(f"beta approved request {first['request_id']} of alpha")
        )
        # The node key signed it: the line says so, not "operator".
        assert decided.startswith(
            f"beta approved request {first['request_id']} of alpha, signed with the node key SHA256:"
        ), decided

        approver.kill()  # kill -9: the watch waits for it, says so once, and goes on when it is back
        lines.wait_for(
            lambda line: (
                line.startswith("No approver answers at") and line.endswith("retrying until it answers.")
            )
        )
        approver.start()
        lines.wait_for(lambda line: line.endswith("answers again."))
        approver.relay.stop()  # the approver answers, but cannot list the relay's inbox
        down = lines.wait_for(lambda line: line.endswith("retrying until it answers."))
        assert down.startswith(
            f"The approver at {cluster.beta.approver_url} refused the listing of requests (5"
        )
        approver.relay.start()
        lines.wait_for(lambda line: line.endswith("answers again."))
        second = approver.deliver(
            cluster.request(call_id="c2", tool_name="fs.delete", arguments={"path": "x"})
        )
        lines.wait_for(
            lambda line: line.startswith(f"new request {second['request_id']} from alpha: fs.delete")
        )

        process.stdin.write(f"d {second['request_id']} too risky\n")
        process.stdin.flush()
        lines.wait_for(lambda line: line.startswith(f"beta denied request {second['request_id']} of alpha"))
        lines.wait_for(
            lambda line: line.startswith(
                f"request {second['request_id']} of alpha: beta denied with the node key"
            )
        )

        process.stdin.write("q\n")
        process.stdin.flush()
        assert process.wait(timeout=DEADLINE) == 0


@pytest.mark.slow
def test_watch_never_signs_a_request_sent_under_the_prefix_of_one_withdrawn_after_it_was_shown(
    cluster: Cluster, approver: Approver
) -> None:
    # Issue 25: the origin withdraws what the operator read and sends another request whose id
    # starts the same; the operator's `a PREFIX` names the one they read, not the newcomer.
    prefix = secrets.token_hex(4)
    with watching(cluster) as (process, lines):
        assert process.stdin is not None
        lines.wait_for(lambda line: line.startswith("watching the requests waiting for beta"))
        shown = approver.deliver(
            cluster.request(
                tool_name="fs.delete", arguments={"path": "build/old.log"}, request_id=sharing(prefix, "0")
            )
        )
        lines.wait_for(
            lambda line: line.startswith(f"new request {shown['request_id']} from alpha: fs.delete")
        )
        withdrawal = sign_withdrawal(shown, signer("alpha"))
        with RelayClient(cluster.beta.url) as relay:
            relay.deliver_withdrawal(shown["request_id"], withdrawal["statement"], withdrawal["signature"])
        lines.wait_for(
            lambda line: line == f"request {shown['request_id']} of alpha was withdrawn by its origin."
        )
        swapped = approver.deliver(
            cluster.request(
                arguments={"command": "rm -rf /"}, request_id=sharing(prefix, "f"), call_id="swap"
            )
        )
        lines.wait_for(
            lambda line: line.startswith(f"new request {swapped['request_id']} from alpha: shell.run")
        )

        process.stdin.write(f"a {prefix}\n")
        process.stdin.flush()
        answer = lines.wait_for(lambda line: line.startswith((prefix, "beta ")))
        process.stdin.write(f"a {shown['request_id'][:9]}\n")  # what the operator read: withdrawn
        process.stdin.flush()
        withdrawn = lines.wait_for(lambda line: line.startswith(("The approver at", "beta ")))
        process.stdin.write("q\n")
        process.stdin.flush()
        assert process.wait(timeout=DEADLINE) == 0

    assert answer == (
        f"{prefix} starts the ids of 2 requests shown by this watch ({shown['request_id']} of alpha, "
        f"{swapped['request_id']} of alpha), so it names none of them; type more of the id."
    )
    assert withdrawn.endswith(
        f"(409 withdrawn): Request {shown['request_id']} was withdrawn by its origin alpha; this node signs "
        "nothing for it."
    )
    assert approver.decision(swapped["request_id"]) is None
    assert approver.decision(shown["request_id"]) is None


ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\r")


@pytest.mark.slow
def test_watch_on_a_terminal_shows_a_live_table_and_takes_keystrokes(
    cluster: Cluster, approver: Approver
) -> None:
    request = approver.deliver(cluster.request())
    argv = [sys.executable, "-m", "teaagent", "approvals", "watch", "--config", cluster.config]
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execve(sys.executable, argv, env)  # noqa: S606 - the CLI itself, argv fixed above
    seen = b""
    try:
        deadline = time.monotonic() + DEADLINE

        def wait_for(text: str) -> None:
            nonlocal seen
            while text.encode() not in ANSI.sub(b"", seen):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{text!r} not on the terminal: {ANSI.sub(b'', seen)[-3000:]!r}")
                ready, _, _ = select.select([terminal], [], [], min(left, 0.5))
                if ready:
                    seen += os.read(terminal, 65536)

        wait_for(request["request_id"])  # the table's row
        wait_for("> ")
        os.write(terminal, f"a {request['request_id'][:8]}".encode())
        wait_for(f"> a {request['request_id'][:8]}")  # what is typed is shown (echo is the table's)
        os.write(terminal, b"\r")
        wait_for(f"beta approved request {request['request_id']} of alpha")
        os.write(terminal, b"q\r")
        # Keep reading the terminal until the watch exits: a pty nobody reads fills up, and the
        # watch's last redraws then block it in a write (seen on a loaded machine).
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline + STOP_SECONDS:
                raise AssertionError(f"the watch did not exit after q: {ANSI.sub(b'', seen)[-1000:]!r}")
            ready, _, _ = select.select([terminal], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):  # EIO once the child closed its side
                    seen += os.read(terminal, 65536)
    finally:
        with contextlib.suppress(OSError):
            os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0


# -- what only a stand-in can do: an approver that answers wrongly ------------------------------


@contextlib.contextmanager
def serving(port: int, *routes: Route) -> Iterator[list[str]]:
    """An HTTP server on ``port`` with ``routes``, in a thread; yields the calls it received."""
    calls: list[str] = []

    async def record(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            calls.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    app = Starlette(routes=list(routes))
    server = uvicorn.Server(
        uvicorn.Config(record, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE
    while not server.started:
        assert thread.is_alive(), "the stand-in did not start"
        assert time.monotonic() < deadline, "the stand-in did not start in time"
        time.sleep(0.01)
    try:
        yield calls
    finally:
        server.should_exit = True
        thread.join(timeout=DEADLINE)


@contextlib.contextmanager
def stand_in(cluster: Cluster, *routes: Route) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on a free port with ``routes``, in a thread; yields a configuration that names it.

    The real approver never answers like these; only a stand-in can show what the command does then.
    """
    port = free_port()
    with serving(port, *routes) as calls:
        yield config_with_approver_port(cluster, port), calls


def item_json(request: dict[str, Any]) -> dict[str, Any]:
    """The approver's ``Item`` of a pending request, as a stand-in serves it."""
    return {
        **{name: request[name] for name in ("request_id", "origin", "tool_name", "arguments", "reason")},
        **{name: request[name] for name in ("payload_digest", "run_id", "call_id", "required_approvals")},
        **{name: request[name] for name in ("peers", "created_at", "expires_at")},
        "seconds_left": max(0, request["expires_at"] - int(time.time())),
        "state": "pending",
        "decision": None,
        "rule": None,
        "request": request,
        "signature": sign_request(request, signer(request["origin"])),
    }


def test_a_statement_to_sign_that_is_not_this_nodes_is_never_signed(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    request = cluster.request()
    gammas = approval_statement(request, "gamma", int(time.time()))  # another node's statement

    async def item(_: Any) -> JSONResponse:
        return JSONResponse(item_json(request))

    async def statement(_: Any) -> JSONResponse:
        return JSONResponse({"statement": gammas, "bytes": statement_bytes(gammas).decode()})

    path = f"/v1/requests/{request['request_id']}"
    with stand_in(cluster, Route(path, item), Route(f"{path}/statement", statement)) as (config, calls):
        args = ["approve", request["request_id"], "--key", str(cluster.operator.private_path)]

        code, _, err = cli(capsys, *args, "--config", config)

    assert code == 1
    assert one_sentence(err) == (
        f"The approver at http://127.0.0.1:{config_port(config)} gave a statement to sign that is "
        "wrong (its signer is 'gamma', not beta); nothing was signed."
    )
    assert calls == [f"GET {path}", f"GET {path}/statement"]  # nothing was submitted


def test_a_decision_carries_the_tool_and_digest_shown_and_a_changed_request_is_one_sentence(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real approver answers 409 changed only when its relay shows one request and holds another;
    # a stand-in shows what such an approver says, and what the command sent it.
    request = cluster.request()
    bodies: list[dict[str, Any]] = []

    async def item(_: Any) -> JSONResponse:
        return JSONResponse(item_json(request))

    refusal = (
        f"Request {request['request_id']} of alpha is not the request the operator confirmed: its signed "
        "tool differs; this node signs nothing for it."
    )

    async def approve(http: Any) -> JSONResponse:
        bodies.append(await http.json())
        return JSONResponse({"error": "changed", "message": refusal}, status_code=409)

    path = f"/v1/requests/{request['request_id']}"
    routes = (Route(path, item), Route(f"{path}/approve", approve, methods=["POST"]))
    with stand_in(cluster, *routes) as (config, calls):
        code, out, err = cli(capsys, "approve", request["request_id"], "--config", config)

    assert (code, out) == (1, "")
    assert one_sentence(err) == (
        f"The approver at http://127.0.0.1:{config_port(config)} refused the approval of request "
        f"{request['request_id']} (409 changed): {refusal}"
    )
    assert calls == [f"GET {path}", f"POST {path}/approve"]
    assert bodies == [
        {
            "reason": "",
            "origin": "alpha",
            "expect_tool_name": "shell.run",
            "expect_payload_digest": request["payload_digest"],
        }
    ]


def test_an_answer_that_is_not_the_documented_one_is_one_sentence(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    async def listing(_: Any) -> JSONResponse:
        return JSONResponse({"items": [{"request_id": "x"}]})

    with stand_in(cluster, Route("/v1/requests", listing)) as (config, _):
        code, _, err = cli(capsys, "list", "--config", config)

    assert code == 1
    assert one_sentence(err) == (
        f"The approver at http://127.0.0.1:{config_port(config)} answered the listing of requests with "
        "something that is not what its API documents: it has no field 'state'."
    )


def config_port(config: str) -> int:
    return load_config(config).approver.port


@pytest.mark.parametrize("typed", ["", "  ", "xyz!", "abc"])
@pytest.mark.parametrize("command", ["approve", "deny", "show", "statement"])
def test_an_id_that_names_nothing_is_refused_before_the_approver_is_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, typed: str
) -> None:
    """``approvals approve ''`` is refused here, in one sentence: no approver runs for this node."""
    assert run(["init", str(tmp_path / "node"), "--name", "solo"]) == 0
    capsys.readouterr()
    extra = ["--reason", "no"] if command == "deny" else []
    code, out, err = cli(capsys, command, typed, *extra, "--config", str(tmp_path / "node" / "node.toml"))
    assert (code, out) == (2, "")
    assert one_sentence(err) == (
        f"{typed!r} is not a request id: type its 32 hexadecimal characters, or at least its first 4."
    )
