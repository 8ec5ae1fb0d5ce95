"""Interop with OpenSSH: an operator approves with nothing but ``ssh-keygen -Y sign``, and
``ssh-keygen -Y verify`` accepts what teaagent signs (PROTOCOL.md: byte for byte)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from teaagent.policy import MultiSigQuorumConfig, PeerSignature
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    approval_statement,
    build_certificate,
    build_request,
    denial_statement,
    evaluate,
    sign_approval,
    sign_request,
    statement_bytes,
    verify_certificate,
)
from teaagent.signing import armor, load_private_key, parse_sshsig, signature_to_wire

pytestmark = pytest.mark.slow

NOW = 1_764_570_000
KEY_TYPES = [("ed25519", None), ("ecdsa", None), ("ecdsa", 384), ("ecdsa", 521), ("rsa", None), ("rsa", 2048)]


def _keygen_sign(key_path: Path, data_path: Path, namespace: str, *options: str) -> str:
    subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-n", namespace, *options, "-f", str(key_path), str(data_path)],
        check=True,
        capture_output=True,
    )
    signature_path = data_path.with_name(data_path.name + ".sig")
    text = signature_path.read_text()
    signature_path.unlink()
    return text


@dataclass(frozen=True)
class _Key:
    private_path: Path
    public_line: str


def _beta_key(ssh_key_factory: Callable[..., Any], key_type: str, bits: int | None) -> Any:
    if bits is None:
        return ssh_key_factory("beta", key_type)
    # conftest's ssh_key_factory puts "-b BITS" between "-t" and the type; sized keys are made here.
    folder = Path(ssh_key_factory("beta").private_path).parent
    path = folder / f"interop-beta-{key_type}-{bits}"
    if not path.exists():
        command = [
            "ssh-keygen",
            "-q",
            "-t",
            key_type,
            "-b",
            str(bits),
            "-N",
            "",
            "-C",
            "beta",
            "-f",
            str(path),
        ]
        subprocess.run(command, check=True, capture_output=True)
    return _Key(path, Path(f"{path}.pub").read_text().strip())


def _cluster(
    ssh_key_factory: Callable[..., Any], key_type: str, bits: int | None
) -> tuple[Any, Any, dict[str, Any]]:
    beta = _beta_key(ssh_key_factory, key_type, bits)
    gamma = ssh_key_factory("gamma")
    delta = ssh_key_factory("delta")
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=["beta", "gamma", "delta"],
        peer_public_keys={"beta": beta.public_line, "gamma": gamma.public_line, "delta": delta.public_line},
        peer_relay_urls={
            name: f"http://127.0.0.1:{port}" for name, port in (("beta", 1), ("gamma", 2), ("delta", 3))
        },
        high_risk_patterns=["shell.*"],
    )
    request = build_request(
        origin="alpha",
        run_id="run",
        call_id="call",
        tool_name="shell.run",
        arguments={"command": "make deploy", "timeout": 12.5},
        reason="deploy the tested build",
        config=config,
        now=NOW,
    )
    return beta, config, request


@pytest.mark.parametrize(("key_type", "bits"), KEY_TYPES)
def test_an_operator_approves_with_ssh_keygen_alone(
    ssh_key_factory: Callable[..., Any], tmp_path: Path, key_type: str, bits: int | None
) -> None:
    beta, config, request = _cluster(ssh_key_factory, key_type, bits)
    gamma = load_private_key(ssh_key_factory("gamma").private_path)
    statement_file = tmp_path / "statement.json"
    statement_file.write_bytes(statement_bytes(approval_statement(request, "beta", NOW + 4)))
    armored = _keygen_sign(beta.private_path, statement_file, APPROVAL_NAMESPACE)
    assert armored.startswith("-----BEGIN SSH SIGNATURE-----\n")

    submitted = {"statement": json.loads(statement_file.read_bytes()), "signature": armored}
    compact = PeerSignature(
        peer_id="beta", signature=signature_to_wire(armored), timestamp=float(NOW + 4), ssh_key_id=None
    )
    for approval in (submitted, compact):
        outcome = evaluate(
            request, [approval, sign_approval(request, "gamma", gamma, NOW + 5)], [], config, now=NOW + 9
        )
        assert (outcome.state, outcome.signers, outcome.rejected) == ("approved", ("beta", "gamma"), {})

    cert = build_certificate(request, sign_request(request, gamma), outcome.approvals)
    assert verify_certificate(cert, config).signers == ("beta", "gamma")


def test_a_sha256_sshsig_from_ssh_keygen_counts(ssh_key_factory: Callable[..., Any], tmp_path: Path) -> None:
    beta, config, request = _cluster(ssh_key_factory, "ed25519", None)
    statement_file = tmp_path / "statement.json"
    statement_file.write_bytes(statement_bytes(approval_statement(request, "beta", NOW + 4)))
    armored = _keygen_sign(beta.private_path, statement_file, APPROVAL_NAMESPACE, "-O", "hashalg=sha256")
    assert parse_sshsig(armored).hash_algorithm == "sha256"
    document = {"statement": json.loads(statement_file.read_bytes()), "signature": armored}
    outcome = evaluate(request, [document], [], config, now=NOW + 9)
    assert (outcome.signers, outcome.rejected) == (("beta",), {})


def test_an_ssh_keygen_signature_in_another_namespace_does_not_count(
    ssh_key_factory: Callable[..., Any], tmp_path: Path
) -> None:
    beta, config, request = _cluster(ssh_key_factory, "ed25519", None)
    statement_file = tmp_path / "statement.json"
    statement_file.write_bytes(statement_bytes(approval_statement(request, "beta", NOW + 4)))
    armored = _keygen_sign(beta.private_path, statement_file, "file")
    document = {"statement": json.loads(statement_file.read_bytes()), "signature": armored}
    outcome = evaluate(request, [document], [], config, now=NOW + 9)
    assert outcome.signers == ()
    assert "namespace is 'file' but 'teaagent-approval' was expected" in outcome.rejected["beta"]


def test_an_operator_denies_with_ssh_keygen_alone(
    ssh_key_factory: Callable[..., Any], tmp_path: Path
) -> None:
    beta, config, request = _cluster(ssh_key_factory, "ed25519", None)
    statement_file = tmp_path / "denial.json"
    statement_file.write_bytes(statement_bytes(denial_statement(request, "beta", NOW + 4, "not on a Friday")))
    armored = _keygen_sign(beta.private_path, statement_file, "teaagent-denial")
    document = {"statement": json.loads(statement_file.read_bytes()), "signature": armored}
    outcome = evaluate(request, [], [document], config, now=NOW + 9)
    assert (outcome.denied_by, outcome.denial_reasons) == (("beta",), {"beta": "not on a Friday"})


@pytest.mark.parametrize(("key_type", "bits"), KEY_TYPES)
def test_ssh_keygen_verifies_what_teaagent_signs(
    ssh_key_factory: Callable[..., Any], tmp_path: Path, key_type: str, bits: int | None
) -> None:
    beta, _, request = _cluster(ssh_key_factory, key_type, bits)
    approval = sign_approval(request, "beta", load_private_key(beta.private_path), NOW + 4)
    statement_file = tmp_path / "statement.json"
    statement_file.write_bytes(statement_bytes(approval_statement(request, "beta", NOW + 4)))
    signature_file = tmp_path / "statement.json.sig"
    signature_file.write_text(armor(parse_sshsig(approval.signature).blob))
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f"beta {beta.public_line}\n")
    verify = [
        "ssh-keygen", "-Y", "verify", "-f", str(allowed), "-I", "beta", "-n", APPROVAL_NAMESPACE,
        "-s", str(signature_file),
    ]  # fmt: skip
    with statement_file.open("rb") as data:
        result = subprocess.run(verify, stdin=data, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    if key_type == "ed25519":  # deterministic signatures: byte for byte what ssh-keygen writes
        assert signature_file.read_text() == _keygen_sign(
            beta.private_path, statement_file, APPROVAL_NAMESPACE
        )
