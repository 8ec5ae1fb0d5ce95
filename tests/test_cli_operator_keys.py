"""``teaagent approvals approve --key/--agent``: operators sign with keys of their own.

Operators' keys are made by the real ``ssh-keygen`` (one protected by a passphrase, asked on a real
terminal); ``--agent`` signs through a real ``ssh-agent``. The node is ``approvals_support``'s:
beta's real relay and approver.
"""

from __future__ import annotations

import contextlib
import os
import pty
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from approvals_support import (
    DEADLINE,
    PASSPHRASE,
    Approver,
    Cluster,
    approve_with_key,
    cli,
    one_sentence,
    readable,
)
from approvals_support import fixture_approver as fixture_approver  # the module's fixture
from approvals_support import fixture_approver_processes as fixture_approver_processes  # the module's fixture
from approvals_support import fixture_cluster as fixture_cluster  # the module's fixture
from conftest import SSHKey
from web_support import fingerprint_of

from teaagent.cli import _operator_keys

# -- signing locally with an operator's key file -----------------------------------------------


@pytest.mark.slow
def test_key_file_signs_as_an_operator(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, out, err = approve_with_key(capsys, cluster, request["request_id"], cluster.operator)

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
    code, out, err = approve_with_key(capsys, cluster, request["request_id"], cluster.locked)

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

    code, _, err = approve_with_key(capsys, cluster, request["request_id"], cluster.locked)

    assert code == 2
    assert one_sentence(err) == f"the passphrase for the private key {cluster.locked.private_path} is wrong."
    assert approver.decision(request["request_id"]) is None


def _read_until(descriptor: int, wanted: bytes, deadline: float) -> bytes:
    seen = b""
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{wanted!r} not seen; got {seen!r}")
        if readable(descriptor, left):
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
