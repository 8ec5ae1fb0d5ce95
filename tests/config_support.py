"""The configuration tests' keys, the example node.toml, and a node folder to load it in."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from key_forms import rsa_exponent_forms, rsa_line

from teaagent.config import CONFIG_ENV_VAR, NodeConfig, load_config
from teaagent.signing import SSHPrivateKey

_PRIVATE = {name: Ed25519PrivateKey.generate() for name in ("alpha", "beta", "gamma", "delta")}
LINES = {name: SSHPrivateKey.from_cryptography(key).public_key.to_line() for name, key in _PRIVATE.items()}
# One RSA modulus under e = 65537 and under another exponent: one key (PROTOCOL.md "RSA key identity").
RSA_LINES = tuple(rsa_line(key) for key in rsa_exponent_forms())


def write_private_key(path: Path, name: str = "alpha") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        _PRIVATE[name].private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


RL = "port = 8700\n"  # where [agent] ends in EXAMPLE
EXAMPLE = f"""\
agent_id = "alpha"
private_key = "keys/alpha"
redis_url = "redis://127.0.0.1:6379/0"
relay_url = "http://127.0.0.1:8701"
workspace = "workspace"

[agent]
permission_mode = "workspace-write"
provider = "scripted"
port = 8700

[quorum]
enabled = true
required_approvals = 2
high_risk_patterns = ["shell.*", "fs.delete"]
timeout_seconds = 120
allow_dev_signatures = false

[peers.beta]
public_key = "{LINES["beta"]}"
relay_url = "http://127.0.0.1:8702"

[peers.gamma]
public_key = "{LINES["gamma"]}"
relay_url = "http://127.0.0.1:8712/"

[peers.delta]
public_key = "{LINES["delta"]}"
relay_url = "https://delta.example:8722"

[approver]
port = 8703
[[approver.rules]]
tool = "shell.*"
arguments = {{ command = "echo *" }}
decision = "approve"
[[approver.rules]]
tool = "fs.delete"
decision = "deny"
reason = "never delete"
"""


@pytest.fixture(name="node_dir")
def fixture_node_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding keys/alpha, and the current directory, so messages start with ``alpha.toml:``."""
    write_private_key(tmp_path / "keys" / "alpha")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CONFIG_ENV_VAR, raising=False)
    return tmp_path


def load(text: str) -> NodeConfig:
    Path("alpha.toml").write_text(text)
    return load_config("alpha.toml")
