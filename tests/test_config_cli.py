"""``teaagent keys fingerprint --config node.toml``: this node's key and its peers', in-process."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.cli._main import run
from teaagent.signing import SSHPrivateKey

RAW = {name: Ed25519PrivateKey.generate() for name in ("alpha", "beta", "gamma")}
PUBLIC = {name: SSHPrivateKey.from_cryptography(key).public_key for name, key in RAW.items()}


@pytest.fixture
def node(tmp_path: Path) -> Path:
    (tmp_path / "alpha").write_bytes(
        RAW["alpha"].private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    config = tmp_path / "alpha.toml"
    config.write_text(
        'agent_id = "alpha"\nprivate_key = "alpha"\nrelay_url = "http://127.0.0.1:8701"\n'
        f'[peers.beta]\npublic_key = "{PUBLIC["beta"].to_line()}"\nrelay_url = "http://127.0.0.1:8702"\n'
        f'[peers.gamma]\npublic_key = "{PUBLIC["gamma"].to_line()}"\nrelay_url = "http://127.0.0.1:8703"\n'
    )
    return config


def test_fingerprints_as_a_table(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["keys", "fingerprint", "--config", str(node)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["agent_id", "role", "key_type", "fingerprint"]
    assert [line.split() for line in lines[1:]] == [
        ["alpha", "self", "ssh-ed25519", PUBLIC["alpha"].fingerprint],
        ["beta", "peer", "ssh-ed25519", PUBLIC["beta"].fingerprint],
        ["gamma", "peer", "ssh-ed25519", PUBLIC["gamma"].fingerprint],
    ]
    assert len({line.index("ssh-ed25519") for line in lines[1:]}) == 1  # the columns line up


def test_fingerprints_as_json(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["keys", "fingerprint", "--config", str(node), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"agent_id": name, "role": role, "key_type": "ssh-ed25519", "fingerprint": PUBLIC[name].fingerprint}
        for name, role in (("alpha", "self"), ("beta", "peer"), ("gamma", "peer"))
    ]


def test_an_ssh_agent_key_is_shown_from_its_public_key(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node.write_text(
        node.read_text().replace('private_key = "alpha"', f'public_key = "{PUBLIC["alpha"].to_line()}"')
    )
    assert run(["keys", "fingerprint", "--config", str(node), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["fingerprint"] == PUBLIC["alpha"].fingerprint


def test_a_bad_configuration_exits_2(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node.write_text(node.read_text() + "colour = 1\n")
    assert run(["keys", "fingerprint", "--config", str(node)]) == 2
    assert capsys.readouterr().err == f"teaagent: {node}: unknown key peers.gamma.colour.\n"


@pytest.mark.slow
def test_the_fingerprints_are_those_ssh_keygen_prints(
    ssh_key_factory: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha, beta = ssh_key_factory("alpha", passphrase="secret words"), ssh_key_factory("beta", "ecdsa")
    config = tmp_path / "alpha.toml"
    config.write_text(
        f'agent_id = "alpha"\nprivate_key = "{alpha.private_path}"\nrelay_url = "http://127.0.0.1:8701"\n'
        f'[peers.beta]\npublic_key = "{beta.public_line}"\nrelay_url = "http://127.0.0.1:8702"\n'
    )
    assert run(["keys", "fingerprint", "--config", str(config), "--json"]) == 0
    shown = [row["fingerprint"] for row in json.loads(capsys.readouterr().out)]
    printed = [
        subprocess.run(
            ["ssh-keygen", "-lf", str(key.public_path)], check=True, capture_output=True, text=True
        ).stdout.split()[1]
        for key in (alpha, beta)
    ]
    assert shown == printed
