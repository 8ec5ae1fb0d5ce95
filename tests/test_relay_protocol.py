"""The relay's checks of one decision (``teaagent_relay._protocol``): what it verifies is what it stores.

A verified decision is stored as the canonical JSON of ``{"signature", "statement"}``, its statement
written as the very bytes its signer signed, encoded once for the verification and reused. These
tests hold that form to RFC 8785 (:func:`teaagent.quorum.canonical` of the whole decision), with a
denial whose reason is not ASCII among them, and a decision signed by another key to its refusal.
"""

from __future__ import annotations

import json
import time

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.quorum import approval_statement, build_request, canonical, sign_approval, sign_denial
from teaagent.signing import SSHPrivateKey
from teaagent.trust import MultiSigQuorumConfig
from teaagent_relay._errors import ApiError
from teaagent_relay._protocol import check_statement, decision_bytes, verify_decision

PEERS = ("beta", "gamma")
KEYS = {name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment=name) for name in PEERS}
QUORUM = MultiSigQuorumConfig(
    enabled=True,
    required_approvals=2,
    peer_agent_ids=list(PEERS),
    peer_public_keys={peer: KEYS[peer].public_key.to_line() for peer in PEERS},
    peer_relay_urls={peer: f"http://127.0.0.1:1/{peer}" for peer in PEERS},
    high_risk_patterns=["shell.*"],
)


def _request() -> dict[str, object]:
    return build_request(
        origin="alpha",
        run_id="run-1",
        call_id="call-1",
        tool_name="shell.exec",
        arguments={"command": "make deploy"},
        reason="ship it",
        config=QUORUM,
    )


def _decisions(request: dict[str, object]) -> list[tuple[dict[str, object], str]]:
    """An approval by beta and a denial by gamma whose reason is not ASCII: (statement, signature)."""
    compact = sign_approval(request, "beta", KEYS["beta"])
    denial = sign_denial(request, "gamma", KEYS["gamma"], "nein — zu riskant, «rm» überall ✋")
    return [
        (approval_statement(request, "beta", int(compact.timestamp)), compact.signature),
        (denial["statement"], denial["signature"]),
    ]


@pytest.mark.parametrize("which", ["approval", "denial"])
def test_a_verified_decision_is_stored_as_the_canonical_json_of_the_decision(which: str) -> None:
    request = _request()
    statement, signature = _decisions(request)[0 if which == "approval" else 1]
    kind, signer, rebuilt = check_statement(request, statement, configured=PEERS, now=time.time())
    assert kind == which

    verified = verify_decision(
        kind, rebuilt, signature, QUORUM.keys_of(signer), allow_dev=False, whose=f"{signer}'s key"
    )

    document = {"signature": verified.wire, "statement": rebuilt}
    assert verified.stored == canonical(document)
    assert json.loads(verified.stored) == document
    assert verified.stored == decision_bytes(rebuilt, verified.wire)


def test_a_decision_signed_by_another_key_is_refused() -> None:
    request = _request()
    statement, signature = _decisions(request)[0]
    kind, _signer, rebuilt = check_statement(request, statement, configured=PEERS, now=time.time())
    with pytest.raises(ApiError) as refused:
        verify_decision(
            kind, rebuilt, signature, QUORUM.keys_of("gamma"), allow_dev=False, whose="gamma's key"
        )
    assert (refused.value.status_code, refused.value.code) == (403, "bad_signature")
