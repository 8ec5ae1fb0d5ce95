"""``teaagent quorum verify CERT.json --config node.toml``: exit codes and what it prints, in-process."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from relay_support import shell_request

from teaagent.cli._main import run
from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import build_certificate, sign_approval, sign_request
from teaagent.signing import SSHPrivateKey

NAMES = ("alpha", "beta", "gamma", "delta", "mallory")
RAW = {name: Ed25519PrivateKey.generate() for name in NAMES}
KEYS = {name: SSHPrivateKey.from_cryptography(key) for name, key in RAW.items()}
LINES = {name: key.public_key.to_line() for name, key in KEYS.items()}
PORTS = {"alpha": 8701, "beta": 8711, "gamma": 8721, "delta": 8731}


def node_toml(name: str, required: int = 2) -> str:
    peers = "".join(
        f'[peers.{peer}]\npublic_key = "{LINES[peer]}"\nrelay_url = "http://127.0.0.1:{port}"\n\n'
        for peer, port in PORTS.items()
        if peer != name
    )
    return (
        f'agent_id = "{name}"\nprivate_key = "keys/{name}"\nrelay_url = "http://127.0.0.1:{PORTS[name]}"\n\n'
        f"[quorum]\nenabled = true\nrequired_approvals = {required}\n"
        f'high_risk_patterns = ["shell.*"]\n\n{peers}'
    )


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    for name in PORTS:
        key_file = tmp_path / "keys" / name
        key_file.parent.mkdir(exist_ok=True)
        key_file.write_bytes(
            RAW[name].private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        (tmp_path / f"{name}.toml").write_text(node_toml(name))
    return tmp_path


CONFIG = MultiSigQuorumConfig(
    enabled=True,
    required_approvals=2,
    peer_agent_ids=["beta", "gamma", "delta"],
    peer_public_keys={peer: LINES[peer] for peer in ("beta", "gamma", "delta")},
    peer_relay_urls={peer: f"http://127.0.0.1:{PORTS[peer]}" for peer in ("beta", "gamma", "delta")},
    high_risk_patterns=["shell.*"],
)
REQUEST = shell_request(
    CONFIG,
    "make release",
    run_id="run-7",
    call_id="call-3",
    reason="ship it",
    request_id="c" * 32,
    now=1_764_570_000,
)


def certificate(*signers: str, signed_by: dict[str, str] | None = None) -> dict[str, Any]:
    signed_by = signed_by or {}
    approvals = [
        sign_approval(REQUEST, signer, KEYS[signed_by.get(signer, signer)], signed_at=1_764_570_005)
        for signer in signers
    ]
    return build_certificate(REQUEST, sign_request(REQUEST, KEYS["alpha"]), approvals)


def write(folder: Path, cert: Any, name: str = "cert.json") -> Path:
    path = folder / name
    path.write_text(json.dumps(cert))
    return path


def test_a_valid_certificate_exits_0_with_a_summary(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert = write(cluster, certificate("beta", "gamma"))
    assert run(["quorum", "verify", str(cert), "--config", str(cluster / "alpha.toml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"certificate for request {'c' * 32}: shell.run from alpha"
    assert out[1] == "approved by beta, gamma (2 approvals of the 2 needed)"
    assert out[2] == f"request signature: verified with alpha's key {KEYS['alpha'].public_key.fingerprint}"


def test_a_peer_node_verifies_the_origins_certificate_with_its_own_key_among_the_signers(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert = write(cluster, certificate("beta", "delta"))
    assert run(["quorum", "verify", str(cert), "--config", str(cluster / "beta.toml")]) == 0
    assert "approved by beta, delta (2 approvals of the 2 needed)" in capsys.readouterr().out


def test_teaagent_config_stands_in_for_the_option(
    cluster: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_CONFIG", str(cluster / "gamma.toml"))
    assert run(["quorum", "verify", str(write(cluster, certificate("beta", "gamma")))]) == 0
    assert "approved by beta, gamma" in capsys.readouterr().out


def test_one_short_exits_1_with_the_reason(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = write(cluster, certificate("beta"))
    assert run(["quorum", "verify", str(cert), "--config", str(cluster / "alpha.toml")]) == 1
    assert capsys.readouterr().err == (
        "teaagent: The certificate proves 1 approval of the 2 needed (counted: beta).\n"
    )


def test_a_forged_approval_exits_1(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = write(cluster, certificate("beta", "gamma", signed_by={"gamma": "mallory"}))
    assert run(["quorum", "verify", str(cert), "--config", str(cluster / "alpha.toml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "teaagent: The certificate proves 1 approval of the 2 needed (counted: beta; refused: gamma:"
    )


def test_a_tampered_request_exits_1(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = certificate("beta", "gamma")
    tampered = copy.deepcopy(cert)
    tampered["request"]["reason"] = "nothing to see"
    path = write(cluster, tampered)
    assert run(["quorum", "verify", str(path), "--config", str(cluster / "alpha.toml")]) == 1
    assert capsys.readouterr().err.startswith(
        "teaagent: The request signature does not verify with the origin alpha's key: bad signature"
    )


def test_a_wrong_origin_key_exits_1(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cert = write(cluster, certificate("beta", "gamma"))
    code = run(
        [
            "quorum",
            "verify",
            str(cert),
            "--config",
            str(cluster / "alpha.toml"),
            "--origin-key",
            LINES["mallory"],
        ]
    )
    assert code == 1
    assert "The request signature does not verify with the origin alpha's key" in capsys.readouterr().err


def test_a_certificate_of_an_unknown_origin_is_checked_without_its_signature(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cluster / "beta.toml").write_text(node_toml("beta").replace("[peers.alpha]", "[peers.omega]"))
    cert = write(cluster, certificate("beta", "gamma"))
    assert run(["quorum", "verify", str(cert), "--config", str(cluster / "beta.toml")]) == 0
    assert (
        "request signature: not checked (alpha's key is unknown here; pass --origin-key)"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "teaagent: {path}: the certificate file does not exist.\n"),
        ("{not json", "teaagent: {path}: the certificate is not valid JSON (line 1, column 2).\n"),
        (b'{"a": "\xc3\x28"}', "teaagent: {path}: the certificate is not valid JSON.\n"),
    ],
)
def test_a_bad_certificate_file_exits_2(
    cluster: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None, message: str
) -> None:
    path = cluster / "cert.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert run(["quorum", "verify", str(path), "--config", str(cluster / "alpha.toml")]) == 2
    assert capsys.readouterr().err == message.format(path=path)


def test_a_certificate_that_is_not_an_object_exits_1(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(cluster, [1, 2])
    assert run(["quorum", "verify", str(path), "--config", str(cluster / "alpha.toml")]) == 1
    assert "The quorum certificate is not a JSON object" in capsys.readouterr().err


def test_a_bad_configuration_exits_2(cluster: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = cluster / "alpha.toml"
    config.write_text(node_toml("alpha", required=4))
    cert = write(cluster, certificate("beta", "gamma"))
    assert run(["quorum", "verify", str(cert), "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"teaagent: {config}: quorum.required_approvals is 4 but only 3 peers are configured.\n"
    )
