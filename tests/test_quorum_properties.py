"""Property tests of the counting rules: whatever mix of signatures arrives, exactly the distinct
authorised valid signers count.

Keys and signatures are made once, at import, so that each example only runs :func:`evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st
from relay_support import shell_request

from teaagent.errors import QuorumError
from teaagent.policy import MultiSigQuorumConfig, PeerSignature
from teaagent.quorum import (
    DENIAL_NAMESPACE,
    approval_statement,
    build_certificate,
    denial_statement,
    evaluate,
    sign_approval,
    sign_denial,
    sign_request,
    statement_bytes,
    verify_certificate,
)
from teaagent.signing import SSHPrivateKey, signature_to_wire, sshsig_sign

NOW = 1_764_570_000
PEERS = ("p1", "p2", "p3", "p4", "p5")
REQUIRED = 3
OUTSIDERS = ("x1", "x2")
KEYS = {
    name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate())
    for name in ("origin", *PEERS, *OUTSIDERS)
}
CONFIG = MultiSigQuorumConfig(
    enabled=True,
    required_approvals=REQUIRED,
    peer_agent_ids=list(PEERS),
    peer_public_keys={peer: KEYS[peer].public_key.to_line() for peer in PEERS},
    peer_relay_urls={peer: f"http://127.0.0.1:{9000 + index}" for index, peer in enumerate(PEERS)},
    high_risk_patterns=["shell.*"],
    timeout_seconds=120,
)


def _request(request_id: str, command: str) -> dict[str, Any]:
    return shell_request(
        CONFIG,
        command,
        origin="origin",
        run_id="run",
        call_id="call",
        reason="",
        now=NOW,
        request_id=request_id,
    )


REQUEST = _request("a" * 32, "make clean")
OTHER_REQUEST = _request("b" * 32, "make clean")  # same call, another request
OTHER_DIGEST = _request("a" * 32, "rm -rf /")  # same request id, other arguments
CREATED_AT = REQUEST["created_at"]
EXPIRES_AT = REQUEST["expires_at"]
EVALUATED_AT = NOW + 30


@dataclass(frozen=True)
class Submitted:
    kind: str  # "valid" counts; every other kind must not
    claimed: str
    document: Any


def _full(approval: PeerSignature) -> dict[str, Any]:
    statement = approval_statement(REQUEST, approval.peer_id, int(approval.timestamp))
    return {"statement": statement, "signature": approval.signature}


def _approvals() -> list[Submitted]:
    made: list[Submitted] = []
    for index, peer in enumerate(PEERS):
        wrong_key = PEERS[(index + 1) % len(PEERS)]
        valid = sign_approval(REQUEST, peer, KEYS[peer], signed_at=NOW + 1)
        made += [
            Submitted("valid", peer, valid),
            Submitted("valid", peer, sign_approval(REQUEST, peer, KEYS[peer], signed_at=NOW + 2)),
            Submitted("valid", peer, _full(valid)),
            # Rule 4's lower bound: from 60 seconds before the request was created, not one earlier.
            Submitted("valid", peer, sign_approval(REQUEST, peer, KEYS[peer], signed_at=CREATED_AT - 60)),
            Submitted(
                "back-dated", peer, sign_approval(REQUEST, peer, KEYS[peer], signed_at=CREATED_AT - 61)
            ),
            Submitted(
                "forged", peer, replace(sign_approval(REQUEST, peer, KEYS[wrong_key], signed_at=NOW + 1))
            ),
            Submitted(
                "forged",
                peer,
                replace(sign_approval(REQUEST, peer, KEYS["x1"], signed_at=NOW + 1), ssh_key_id=None),
            ),
            Submitted(
                "replayed-request", peer, sign_approval(OTHER_REQUEST, peer, KEYS[peer], signed_at=NOW + 1)
            ),
            Submitted(
                "replayed-digest", peer, sign_approval(OTHER_DIGEST, peer, KEYS[peer], signed_at=NOW + 1)
            ),
            Submitted(
                "replayed-namespace",
                peer,
                {
                    "statement": approval_statement(REQUEST, peer, NOW + 1),
                    "signature": signature_to_wire(
                        sshsig_sign(
                            statement_bytes(approval_statement(REQUEST, peer, NOW + 1)),
                            KEYS[peer],
                            DENIAL_NAMESPACE,
                        )
                    ),
                },
            ),
            Submitted("expired", peer, sign_approval(REQUEST, peer, KEYS[peer], signed_at=EXPIRES_AT + 1)),
            Submitted("future", peer, sign_approval(REQUEST, peer, KEYS[peer], signed_at=EVALUATED_AT + 61)),
        ]
    for outsider in (*OUTSIDERS, "origin"):
        made.append(
            Submitted(
                "unauthorised", outsider, sign_approval(REQUEST, outsider, KEYS[outsider], signed_at=NOW)
            )
        )
    return made


APPROVALS = _approvals()
VALID_DENIALS = {
    # Half of them signed at rule 4's lower bound, 60 seconds before the request was created.
    peer: sign_denial(REQUEST, peer, KEYS[peer], "no", signed_at=NOW + 3 if index % 2 else CREATED_AT - 60)
    for index, peer in enumerate(PEERS)
}
BAD_DENIALS = [
    sign_denial(REQUEST, "p1", KEYS["p2"], "no", signed_at=NOW + 3),  # wrong key
    sign_denial(OTHER_REQUEST, "p2", KEYS["p2"], "no", signed_at=NOW + 3),  # another request
    sign_denial(REQUEST, "x1", KEYS["x1"], "no", signed_at=NOW + 3),  # not a peer
    {"statement": denial_statement(REQUEST, "p3", NOW + 3, "no"), "signature": "dev:p3"},  # dev, disabled
    sign_denial(REQUEST, "p4", KEYS["p4"], "no", signed_at=CREATED_AT - 61),  # signed before the request
]
REQUEST_SIGNATURE = sign_request(REQUEST, KEYS["origin"])
ORIGIN_KEY = KEYS["origin"].public_key.to_line()

mixes = st.lists(st.sampled_from(APPROVALS), max_size=24)


def _expected(picked: list[Submitted]) -> tuple[str, ...]:
    valid = {item.claimed for item in picked if item.kind == "valid"}
    return tuple(peer for peer in REQUEST["peers"] if peer in valid)


@settings(deadline=None, max_examples=150)
@given(picked=mixes)
def test_exactly_the_distinct_authorised_valid_signers_count(picked: list[Submitted]) -> None:
    outcome = evaluate(REQUEST, [item.document for item in picked], [], CONFIG, now=EVALUATED_AT)
    expected = _expected(picked)
    assert outcome.signers == expected
    assert outcome.state == ("approved" if len(expected) >= REQUIRED else "pending")
    assert [entry["statement"]["signer"] for entry in outcome.approvals] == list(expected)
    # Every claimed signer with nothing counted is reported; no counted signer is.
    assert set(outcome.rejected) == {item.claimed for item in picked} - set(expected)


@settings(deadline=None, max_examples=100)
@given(picked=mixes)
def test_a_certificate_verifies_exactly_when_the_count_reaches_the_threshold(picked: list[Submitted]) -> None:
    # Carry every submission, valid or not, in the certificate: the verifier must sort them out
    # exactly as evaluate does (the same clock, since "future" signatures depend on it).
    documents = [item.document for item in picked]
    cert = build_certificate(REQUEST, REQUEST_SIGNATURE, documents)
    expected = _expected(picked)
    if len(expected) >= REQUIRED:
        outcome = verify_certificate(cert, CONFIG, origin_public_key=ORIGIN_KEY, now=EVALUATED_AT)
        assert outcome.signers == expected
    else:
        with pytest.raises(
            QuorumError,
            match=rf"^The certificate proves {len(expected)} approvals? of the {REQUIRED} needed ",
        ):
            verify_certificate(cert, CONFIG, origin_public_key=ORIGIN_KEY, now=EVALUATED_AT)


@settings(deadline=None, max_examples=100)
@given(
    picked=mixes,
    deniers=st.lists(st.sampled_from(PEERS), max_size=4),
    bad=st.lists(st.sampled_from(BAD_DENIALS), max_size=4),
)
def test_a_certificate_with_denials_counts_no_signer_that_denied(
    picked: list[Submitted], deniers: list[str], bad: list[dict[str, Any]]
) -> None:
    # Rule 6 at the verifier: the certificate carries denials (valid ones of some peers, and ones
    # that must count for nothing); it verifies exactly when the approvers who did not validly deny
    # reach the threshold, as evaluate counts the same documents.
    documents = [item.document for item in picked]
    denials = [VALID_DENIALS[peer] for peer in deniers] + bad
    cert = build_certificate(REQUEST, REQUEST_SIGNATURE, documents, denials)
    denied_by = tuple(peer for peer in REQUEST["peers"] if peer in set(deniers))
    signers = tuple(peer for peer in _expected(picked) if peer not in denied_by)
    counted = evaluate(REQUEST, documents, denials, CONFIG, now=EVALUATED_AT)
    assert (counted.signers, counted.denied_by) == (signers, denied_by)
    if len(signers) >= REQUIRED:
        outcome = verify_certificate(cert, CONFIG, origin_public_key=ORIGIN_KEY, now=EVALUATED_AT)
        assert (outcome.signers, outcome.denied_by) == (signers, denied_by)
        assert [entry["statement"]["signer"] for entry in outcome.approvals] == list(signers)
    else:
        with pytest.raises(
            QuorumError, match=rf"^The certificate proves {len(signers)} approvals? of the {REQUIRED} needed "
        ):
            verify_certificate(cert, CONFIG, origin_public_key=ORIGIN_KEY, now=EVALUATED_AT)


@settings(deadline=None, max_examples=100)
@given(
    picked=mixes,
    deniers=st.lists(st.sampled_from(PEERS), max_size=8),
    bad=st.lists(st.sampled_from(BAD_DENIALS), max_size=4),
)
def test_denials_decide_exactly_when_the_quorum_becomes_unreachable(
    picked: list[Submitted], deniers: list[str], bad: list[dict[str, Any]]
) -> None:
    denials = [VALID_DENIALS[peer] for peer in deniers] + bad
    outcome = evaluate(REQUEST, [item.document for item in picked], denials, CONFIG, now=EVALUATED_AT)
    denied_by = tuple(peer for peer in REQUEST["peers"] if peer in set(deniers))
    signers = tuple(peer for peer in _expected(picked) if peer not in denied_by)
    assert outcome.denied_by == denied_by
    assert outcome.signers == signers
    if len(denied_by) > len(PEERS) - REQUIRED:
        assert outcome.state == "denied"
    else:
        assert outcome.state == ("approved" if len(signers) >= REQUIRED else "pending")
    assert not set(outcome.rejected_denials) & set(denied_by)


@settings(deadline=None, max_examples=50)
@given(picked=mixes, late=st.integers(min_value=1, max_value=10**6))
def test_nothing_counts_once_the_request_has_expired(picked: list[Submitted], late: int) -> None:
    outcome = evaluate(REQUEST, [item.document for item in picked], [], CONFIG, now=EXPIRES_AT + late)
    assert (outcome.state, outcome.signers, outcome.approvals) == ("expired", (), ())
