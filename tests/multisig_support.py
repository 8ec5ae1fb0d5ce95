"""The multi-signature tests' peers, their keys and relays, and a quorum configuration of them."""

from __future__ import annotations

import re
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from teaagent.policy import MultiSigQuorumConfig


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def public_line(comment: str = "") -> str:
    """A fresh real ed25519 OpenSSH public key line (no process needed)."""
    key = Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    return f"{line} {comment}".strip()


PEERS = ["beta", "delta", "gamma"]
KEYS = {peer: public_line(peer) for peer in PEERS}
URLS = {peer: f"http://127.0.0.1:{8702 + number}" for number, peer in enumerate(PEERS)}


def config(**changes: Any) -> MultiSigQuorumConfig:
    fields: dict[str, Any] = {
        "enabled": True,
        "required_approvals": 2,
        "peer_agent_ids": list(PEERS),
        "peer_public_keys": dict(KEYS),
        "peer_relay_urls": dict(URLS),
        "local_relay_base_url": "http://127.0.0.1:8701",
        "high_risk_patterns": ["shell.*", "fs.delete"],
        "timeout_seconds": 120,
    }
    fields.update(changes)
    return MultiSigQuorumConfig(**fields)
