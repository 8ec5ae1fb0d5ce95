"""The quorum tests' keys, configuration and request, and the signatures made over it.

Keys are made in-process (``cryptography``) for alpha (the origin), its peers beta, gamma and delta,
and two that are no peer's (epsilon, mallory); ``REQUEST`` is alpha's, at PROTOCOL.md's example clock.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.policy import MultiSigQuorumConfig, PeerSignature
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    QuorumOutcome,
    approval_statement,
    build_request,
    evaluate,
    sign_approval,
    sign_denial,
    statement_bytes,
)
from teaagent.signing import SSHPrivateKey, signature_to_wire, sshsig_sign

NOW = 1_764_570_000
TIMEOUT = 120
NAMES = ("alpha", "beta", "gamma", "delta", "epsilon", "mallory")
KEYS: dict[str, SSHPrivateKey] = {
    name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()) for name in NAMES
}


def line(name: str) -> str:
    return KEYS[name].public_key.to_line()


def make_config(
    peers: tuple[str, ...] = ("beta", "gamma", "delta"), required: int = 2, **fields: Any
) -> MultiSigQuorumConfig:
    return MultiSigQuorumConfig(
        enabled=True,
        required_approvals=required,
        peer_agent_ids=list(peers),
        peer_public_keys={peer: line(peer) for peer in peers},
        peer_relay_urls={peer: f"http://127.0.0.1:{8702 + index}" for index, peer in enumerate(peers)},
        local_relay_base_url="http://127.0.0.1:8701",
        high_risk_patterns=["shell.*", "fs.delete"],
        timeout_seconds=TIMEOUT,
        **fields,
    )


CONFIG = make_config()


def make_request(config: MultiSigQuorumConfig = CONFIG, **fields: Any) -> dict[str, Any]:
    arguments = fields.pop("arguments", {"command": "rm -rf build"})
    return build_request(
        origin="alpha",
        run_id="run-1",
        call_id="call-1",
        tool_name=fields.pop("tool_name", "shell.run"),
        arguments=arguments,
        reason="the build folder is stale",
        config=config,
        now=NOW,
        request_id=fields.pop("request_id", "0123456789abcdef0123456789abcdef"),
    )


REQUEST = make_request()


def approve(
    signer: str, request: dict[str, Any] = REQUEST, *, key: str | None = None, at: int = NOW + 5
) -> PeerSignature:
    return sign_approval(request, signer, KEYS[key or signer], signed_at=at)


def deny(
    signer: str,
    request: dict[str, Any] = REQUEST,
    *,
    key: str | None = None,
    at: int = NOW + 5,
    reason: str = "no",
) -> dict[str, Any]:
    return sign_denial(request, signer, KEYS[key or signer], reason, signed_at=at)


def full(approval: PeerSignature, request: dict[str, Any] = REQUEST) -> dict[str, Any]:
    return {
        "statement": approval_statement(request, approval.peer_id, int(approval.timestamp)),
        "signature": approval.signature,
    }


def sign_statement(statement: dict[str, Any], key: str, namespace: str = APPROVAL_NAMESPACE) -> str:
    return signature_to_wire(sshsig_sign(statement_bytes(statement), KEYS[key], namespace))


def outcome_of(
    approvals: list[Any],
    denials: list[Any] | None = None,
    *,
    config: MultiSigQuorumConfig = CONFIG,
    now: int = NOW + 10,
    request: dict[str, Any] = REQUEST,
) -> QuorumOutcome:
    return evaluate(request, approvals, denials or [], config, now=now)


def exactly(message: str) -> str:
    """A ``match=`` pattern for exactly ``message``."""
    return f"^{re.escape(message)}$"


def mutated(**changes: Any) -> dict[str, Any]:
    """alpha's request with fields changed (``...`` deletes one)."""
    request = copy.deepcopy(REQUEST)
    for name, value in changes.items():
        if value is ...:
            del request[name]
        else:
            request[name] = value
    return request
