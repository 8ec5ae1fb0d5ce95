"""A one-node folder for the benches that run a node's own process (``bench agent``, ``bench mcp``)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["write_node"]


def write_node(folder: Path, settings: str) -> Path:
    """The node ``bench`` in ``folder``: a fresh key, an empty workspace and node.toml; its path.

    node.toml names the node and its key, then holds ``settings`` (its relay_url, token, tables).
    """
    key = folder / "key"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    key.chmod(0o600)
    (folder / "workspace").mkdir()
    config = folder / "node.toml"
    config.write_text(f'agent_id = "bench"\nprivate_key = "key"\n{settings}')
    return config
