"""Signing through a real ``ssh-agent`` started for this module, keys added with ``ssh-add``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.errors import SignatureError
from teaagent.signing import (
    AgentSigner,
    SSHPrivateKey,
    agent_identities,
    load_private_key,
    parse_sshsig,
    sshsig_sign,
    sshsig_verify,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("ssh-agent") is None, reason="OpenSSH's ssh-agent is not installed"),
]

NS = "teaagent-approval"
DATA = b'{"request_id":"0123456789abcdef0123456789abcdef","signer":"beta","v":1}'
AGENT_START_SECONDS = 10.0

KEY_MAKERS: dict[str, Callable[[], object]] = {
    "ed25519": Ed25519PrivateKey.generate,
    "nistp256": lambda: ec.generate_private_key(ec.SECP256R1()),
    "nistp384": lambda: ec.generate_private_key(ec.SECP384R1()),
    "nistp521": lambda: ec.generate_private_key(ec.SECP521R1()),
    "rsa2048": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
}


@pytest.fixture(scope="module")
def agent_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private ssh-agent in the foreground (``-D``), ended when the module is done."""
    folder = tmp_path_factory.mktemp("agent")
    socket_path = folder / "agent.sock"
    process = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(socket_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + AGENT_START_SECONDS
        while not socket_path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail("ssh-agent did not start")
            time.sleep(0.02)
        yield socket_path
    finally:
        process.terminate()
        process.wait(timeout=AGENT_START_SECONDS)


@pytest.fixture(scope="module")
def agent_keys(agent_socket: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One key file of each type, all added to the agent with ssh-add."""
    folder = tmp_path_factory.mktemp("agent-keys")
    paths = {}
    for name, make in KEY_MAKERS.items():
        private = make()
        path = folder / f"id_{name}"
        path.write_bytes(
            private.private_bytes(  # type: ignore[attr-defined]
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        path.chmod(0o600)
        public = SSHPrivateKey.from_cryptography(private).public_key  # type: ignore[arg-type]
        Path(f"{path}.pub").write_text(public.to_line(f"agent-{name}") + "\n")
        subprocess.run(
            ["ssh-add", str(path)],
            env={**os.environ, "SSH_AUTH_SOCK": str(agent_socket)},
            check=True,
            capture_output=True,
        )
        paths[name] = path
    return paths


def _ssh_keygen_accepts(tmp_path: Path, signature: str, public_line: str) -> bool:
    (tmp_path / "allowed").write_text(f"beta {public_line}\n")
    (tmp_path / "data.sig").write_text(signature)
    allowed, sig = str(tmp_path / "allowed"), str(tmp_path / "data.sig")
    result = subprocess.run(
        ["ssh-keygen", "-Y", "verify", "-f", allowed, "-I", "beta", "-n", NS, "-s", sig],
        input=DATA,
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


@pytest.mark.parametrize("name", list(KEY_MAKERS))
def test_agent_signature_verifies_here_and_with_ssh_keygen(
    agent_socket: Path, agent_keys: dict[str, Path], tmp_path: Path, name: str
) -> None:
    public = load_private_key(agent_keys[name]).public_key
    signer = AgentSigner(public, agent_socket)
    signature = sshsig_sign(DATA, signer, NS)
    sshsig_verify(DATA, signature, public, NS)
    assert _ssh_keygen_accepts(tmp_path, signature, public.to_line())
    assert parse_sshsig(signature).public_key_blob == public.blob


def test_agent_rsa_signature_is_rsa_sha2_512(agent_socket: Path, agent_keys: dict[str, Path]) -> None:
    public = load_private_key(agent_keys["rsa2048"]).public_key
    field = parse_sshsig(sshsig_sign(DATA, AgentSigner(public, agent_socket), NS)).signature
    assert field[4:16] == b"rsa-sha2-512"


def test_agent_ed25519_signature_equals_the_key_file_signature(
    agent_socket: Path, agent_keys: dict[str, Path]
) -> None:
    loaded = load_private_key(agent_keys["ed25519"])
    from_agent = sshsig_sign(DATA, AgentSigner(loaded.public_key.to_line(), agent_socket), NS)
    assert from_agent == sshsig_sign(DATA, loaded, NS)


def test_agent_socket_defaults_to_ssh_auth_sock(
    agent_socket: Path, agent_keys: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_socket))
    public = load_private_key(agent_keys["nistp256"]).public_key
    signer = AgentSigner(public)
    assert signer.socket_path == str(agent_socket)
    sshsig_verify(DATA, sshsig_sign(DATA, signer, NS), public, NS)


def test_agent_identities_lists_the_added_keys(agent_socket: Path, agent_keys: dict[str, Path]) -> None:
    listed = agent_identities(agent_socket)
    expected = {load_private_key(path).public_key for path in agent_keys.values()}
    assert set(listed) == expected
    assert all(key.comment.startswith("/") or key.comment.startswith("agent-") for key in listed)


def test_key_not_in_the_agent_is_refused(agent_socket: Path, agent_keys: dict[str, Path]) -> None:
    stranger = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()).public_key
    signer = AgentSigner(stranger, agent_socket)
    expected = (
        f"the ssh-agent at {agent_socket} does not hold the key {stranger.fingerprint}; add it with ssh-add."
    )
    with pytest.raises(SignatureError, match=f"^{re.escape(expected)}$"):
        sshsig_sign(DATA, signer, NS)


def test_key_removed_from_the_agent_is_refused(agent_socket: Path, tmp_path: Path) -> None:
    private = Ed25519PrivateKey.generate()
    path = tmp_path / "id_removed"
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    public = SSHPrivateKey.from_cryptography(private).public_key
    Path(f"{path}.pub").write_text(public.to_line() + "\n")
    env = {**os.environ, "SSH_AUTH_SOCK": str(agent_socket)}
    subprocess.run(["ssh-add", str(path)], env=env, check=True, capture_output=True)
    signer = AgentSigner(public, agent_socket)
    sshsig_verify(DATA, sshsig_sign(DATA, signer, NS), public, NS)
    subprocess.run(["ssh-add", "-d", str(path)], env=env, check=True, capture_output=True)
    with pytest.raises(SignatureError, match="does not hold the key"):
        sshsig_sign(DATA, signer, NS)
