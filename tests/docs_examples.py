"""The worked examples of docs/protocol.md, made by the code itself from fixed keys and times.

Ed25519 signatures are deterministic, so the same keys sign the same bytes the same way every
time: the test (tests/test_docs.py) rebuilds every example and compares it with the page.
``python tests/docs_examples.py`` prints them, to paste after a deliberate change.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import (
    approval_statement,
    build_certificate,
    build_request,
    canonical,
    denial_statement,
    payload_digest,
    sign_approval,
    sign_denial,
    sign_request,
    sign_withdrawal,
    statement_bytes,
)
from teaagent.signing import SSHPrivateKey, fingerprint

CREATED_AT = 1764570000  # 2025-12-01 06:20:00 UTC
REQUEST_ID = "4f1c2a9e8b7d6c5e4f3a2b1c0d9e8f7a"


def key(name: str) -> SSHPrivateKey:
    """A fixed key per name: the Ed25519 seed is SHA-256 of ``teaagent docs <name>``."""
    seed = hashlib.sha256(f"teaagent docs {name}".encode()).digest()
    return SSHPrivateKey.from_cryptography(Ed25519PrivateKey.from_private_bytes(seed), comment=name)


def _wire(signature: str) -> str:
    """The bare base64 of an armored signature (what travels on the wire)."""
    return "".join(line for line in signature.splitlines() if line and not line.startswith("-----"))


def examples() -> dict[str, str]:
    keys = {name: key(name) for name in ("alpha", "beta", "gamma", "delta")}
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=["beta", "gamma", "delta"],
        peer_public_keys={name: keys[name].public_key.to_line() for name in ("beta", "gamma", "delta")},
        peer_relay_urls={name: f"https://{name}.example:8701" for name in ("beta", "gamma", "delta")},
        high_risk_patterns=["shell.*", "fs.delete"],
        timeout_seconds=120,
    )
    arguments: dict[str, Any] = {"command": "rm -rf build"}
    request = build_request(
        origin="alpha",
        run_id="run-7",
        call_id="call-3",
        tool_name="shell.run",
        arguments=arguments,
        reason="clean the build before the release",
        config=config,
        now=CREATED_AT,
        request_id=REQUEST_ID,
    )
    request_signature = _wire(sign_request(request, keys["alpha"]))
    approval = sign_approval(request, "beta", keys["beta"], CREATED_AT + 3)
    gamma = sign_approval(request, "gamma", keys["gamma"], CREATED_AT + 9)
    denial = sign_denial(request, "delta", keys["delta"], "not during the freeze", CREATED_AT + 5)
    blob = base64.b64decode(_wire(approval.signature))
    certificate = build_certificate(request, request_signature, [approval, gamma])
    withdrawal = sign_withdrawal(request, keys["alpha"], CREATED_AT + 10)
    return {
        "keys": "\n".join(
            f"{name:<6} {keys[name].public_key.to_line()}\n{'':6} {fingerprint(keys[name].public_key)}"
            for name in keys
        ),
        "digest-input": canonical({"arguments": arguments, "tool_name": "shell.run"}).decode(),
        "digest": payload_digest("shell.run", arguments),
        "request": json.dumps(request, indent=2),
        "request-bytes": canonical(request).decode(),
        "request-signature": request_signature,
        "approval-bytes": canonical(approval_statement(request, "beta", CREATED_AT + 3)).decode(),
        "approval-sha512": hashlib.sha512(
            canonical(approval_statement(request, "beta", CREATED_AT + 3))
        ).hexdigest(),
        "approval-signature": _wire(approval.signature),
        "approval-blob": _blob_layout(blob),
        "denial-bytes": canonical(
            denial_statement(request, "delta", CREATED_AT + 5, "not during the freeze")
        ).decode(),
        "denial": json.dumps(denial, indent=2),
        "certificate": json.dumps(certificate, indent=2),
        "withdrawal-bytes": statement_bytes(withdrawal["statement"]).decode(),
        "withdrawal": json.dumps(withdrawal, indent=2),
    }


def _blob_layout(blob: bytes) -> str:
    """The SSHSIG blob of an approval, field by field (PROTOCOL.sshsig)."""
    lines = []
    offset = 6
    lines.append(f"{blob[:6]!r:<34} magic")
    version = int.from_bytes(blob[offset : offset + 4], "big")
    lines.append(f"{blob[offset : offset + 4].hex():<34} version {version}")
    offset += 4
    for name in ("public key", "namespace", "reserved", "hash algorithm", "signature"):
        length = int.from_bytes(blob[offset : offset + 4], "big")
        field = blob[offset + 4 : offset + 4 + length]
        shown = field.decode() if name in ("namespace", "hash algorithm") else f"{length} bytes"
        lines.append(f"{blob[offset : offset + 4].hex():<34} {name}: {shown}")
        offset += 4 + length
    lines.append(f"(end at byte {offset} of {len(blob)}: no trailing bytes)")
    return "\n".join(lines)


if __name__ == "__main__":
    for name, text in examples().items():
        print(f"<!-- example: {name} -->\n```\n{text}\n```\n")
