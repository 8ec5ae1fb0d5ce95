"""A signer's several keys (PROTOCOL.md "Keys of a peer"): any may sign, the signer counts once.

The story: beta's node key and its operator's own key both count for beta, once; a key's
``allowed_signers`` limits (namespaces, valid-after/valid-before) bind it; a key that is nobody's
counts for nobody; a key can belong to one peer only; and the relay applies the same keys at both
ends (a peer's operator approving the origin's request, this node's operator deciding its inbox).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from key_forms import rsa_exponent_forms, rsa_line, sk_form
from relay_support import (
    MakeCluster,
    approval,
    denial,
    in_process,
    private_key,
    public_line,
    served,
    shell_request,
    signer,
)
from words_support import date_of, moment_re

from teaagent.errors import QuorumError, SignatureError
from teaagent.quorum import (
    approval_statement,
    build_certificate,
    denial_statement,
    evaluate,
    sign_approval,
    sign_denial,
    sign_request,
    sign_withdrawal,
    statement_bytes,
    verify_certificate,
    verify_decision,
    verify_request_signature,
    verify_withdrawal,
)
from teaagent.signing import SSHPrivateKey, signature_to_wire, sshsig_sign
from teaagent.trust import MultiSigQuorumConfig, SignerKey, parse_allowed_signers

PEERS = ["beta", "delta", "gamma"]


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def config(peer_keys: dict[str, tuple[SignerKey, ...]] | None = None, **changes: Any) -> MultiSigQuorumConfig:
    fields: dict[str, Any] = {
        "enabled": True,
        "required_approvals": 2,
        "peer_agent_ids": list(PEERS),
        "peer_public_keys": {peer: public_line(peer) for peer in PEERS},
        "peer_relay_urls": {peer: f"http://127.0.0.1:{9100 + n}" for n, peer in enumerate(PEERS)},
        "high_risk_patterns": ["shell.*"],
        "peer_keys": peer_keys or {},
    }
    fields.update(changes)
    return MultiSigQuorumConfig(**fields)


def operator_key(name: str = "beta-op", **limits: Any) -> SignerKey:
    return SignerKey(line=public_line(name), source=f"{name}.pub", **limits)


def request_for(quorum: MultiSigQuorumConfig) -> dict[str, Any]:
    return shell_request(quorum, "make", reason="build")


def approval_by(
    request: dict[str, Any], peer: str, key_name: str, signed_at: int | None = None
) -> dict[str, Any]:
    """``peer``'s approval, signed with the key of ``key_name`` (the peer's own, or an operator's)."""
    statement = approval_statement(request, peer, int(time.time()) if signed_at is None else signed_at)
    signature = sshsig_sign(statement_bytes(statement), signer(key_name), "teaagent-approval")
    return {"statement": statement, "signature": signature_to_wire(signature)}


def denial_by(request: dict[str, Any], peer: str, key_name: str, reason: str = "no") -> dict[str, Any]:
    statement = denial_statement(request, peer, int(time.time()), reason)
    signature = sshsig_sign(statement_bytes(statement), signer(key_name), "teaagent-denial")
    return {"statement": statement, "signature": signature_to_wire(signature)}


# -- counting ---------------------------------------------------------------------------------------


def test_an_operators_key_counts_for_its_peer() -> None:
    quorum = config({"beta": (operator_key(),)})
    request = request_for(quorum)
    outcome = evaluate(
        request, [approval_by(request, "beta", "beta-op"), approval(request, "gamma")], [], quorum
    )
    assert (outcome.state, outcome.signers) == ("approved", ("beta", "gamma"))
    certificate = {"request": request, "request_signature": "dev:alpha", "approvals": list(outcome.approvals)}
    assert verify_certificate(certificate, quorum).signers == ("beta", "gamma")


def test_a_peer_counts_once_whichever_and_however_many_of_its_keys_signed() -> None:
    quorum = config({"beta": (operator_key(), operator_key("beta-op2"))})
    request = request_for(quorum)
    by_beta = [
        approval(request, "beta"),
        approval_by(request, "beta", "beta-op"),
        approval_by(request, "beta", "beta-op2"),
    ]
    outcome = evaluate(request, by_beta, [], quorum)
    assert (outcome.state, outcome.signers) == ("pending", ("beta",))
    with pytest.raises(Exception, match="proves 1 approval of the 2 needed"):
        verify_certificate({"request": request, "request_signature": "x", "approvals": by_beta}, quorum)


def test_a_key_that_is_none_of_the_peers_keys_counts_for_nobody() -> None:
    quorum = config({"beta": (operator_key(),)})
    request = request_for(quorum)
    outcome = evaluate(request, [approval_by(request, "beta", "stranger")], [], quorum)
    fingerprint = signer("stranger").public_key.fingerprint
    assert outcome.signers == ()
    assert outcome.rejected["beta"] == (
        "the signature does not verify with the keys configured for beta: it was made by the key "
        f"{fingerprint}, which is not one of the keys configured for beta"
    )


def test_a_keys_namespaces_bind_it() -> None:
    quorum = config({"beta": (operator_key(namespaces=frozenset({"teaagent-approval"})),)})
    request = request_for(quorum)
    outcome = evaluate(
        request, [approval_by(request, "beta", "beta-op")], [denial_by(request, "beta", "beta-op")], quorum
    )
    fingerprint = signer("beta-op").public_key.fingerprint
    assert outcome.signers == ("beta",)  # it may approve...
    assert outcome.denied_by == ()  # ...but not deny
    assert outcome.rejected_denials["beta"] == (
        "the signature does not verify with the keys configured for beta: the key "
        f"{fingerprint} may sign only in teaagent-approval, not in teaagent-denial"
    )


@pytest.mark.parametrize(
    ("limits", "why"),
    [
        ({"valid_before": 1_000_000_000}, "was valid only until 2001-09-09 01:46:40 UTC"),
        ({"valid_after": 4_000_000_000}, "is valid only from 2096-10-02 07:06:40 UTC"),
    ],
)
def test_a_keys_validity_binds_its_signing_time(limits: dict[str, int], why: str) -> None:
    quorum = config({"beta": (operator_key(**limits),)})
    request = request_for(quorum)
    outcome = evaluate(request, [approval_by(request, "beta", "beta-op")], [], quorum)
    fingerprint = signer("beta-op").public_key.fingerprint
    assert outcome.rejected["beta"] == (
        f"the signature does not verify with the keys configured for beta: the key {fingerprint} {why}"
    )


# A key beta retired on 1 January 2026, as its allowed_signers line says; the line stays (beta's
# old signatures still verify as of their signing times), so only rule 4's lower bound keeps the
# key from back-dating an approval of a request made long after it was retired.
RETIRED_LINE = f'beta valid-before="20260101" {public_line("beta-retired")} retired@laptop\n'


def retired_key() -> SignerKey:
    (key,) = parse_allowed_signers(RETIRED_LINE, principal="beta", source="beta.operators")
    assert key.valid_before is not None
    assert key.valid_before < time.time()  # retired before this test runs
    return key


def back_dating(request: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The retired key's approval of ``request`` as beta, dated the last second the key was valid."""
    valid_before = retired_key().valid_before
    assert valid_before is not None
    signed_at = valid_before - 1
    reason = (  # a pattern: each date carries how long ago it was
        f"it was signed at {moment_re(signed_at)}, more than 60 seconds before the request was created at "
        f"{moment_re(request['created_at'])}"
    )
    return approval_by(request, "beta", "beta-retired", signed_at=signed_at), reason


def test_a_retired_key_back_dating_into_a_new_request_is_refused_by_evaluate() -> None:
    quorum = config({"beta": (retired_key(),)})
    request = request_for(quorum)
    backdated, reason = back_dating(request)
    outcome = evaluate(request, [backdated, approval(request, "gamma")], [], quorum)
    assert (outcome.state, outcome.signers) == ("pending", ("gamma",))
    assert list(outcome.rejected) == ["beta"]
    assert re.fullmatch(reason, outcome.rejected["beta"]), outcome.rejected
    # Signed now instead, it is refused by the key's own validity; beta's node key still counts.
    fingerprint = signer("beta-retired").public_key.fingerprint
    now = evaluate(request, [approval_by(request, "beta", "beta-retired")], [], quorum)
    assert now.rejected["beta"].endswith(
        f"the key {fingerprint} was valid only until 2026-01-01 00:00:00 UTC"
    )
    assert evaluate(request, [approval(request, "beta"), approval(request, "gamma")], [], quorum).state == (
        "approved"
    )


def test_a_retired_key_back_dating_into_a_new_request_is_refused_by_verify_certificate() -> None:
    quorum = config({"beta": (retired_key(),)})
    request = request_for(quorum)
    backdated, reason = back_dating(request)
    certificate = build_certificate(
        request, sign_request(request, signer("alpha")), [backdated, approval(request, "gamma")]
    )
    with pytest.raises(
        QuorumError,
        match="^"
        + re.escape("The certificate proves 1 approval of the 2 needed (counted: gamma; refused: beta: ")
        + reason
        + re.escape(").")
        + "$",
    ):
        verify_certificate(certificate, quorum, origin_public_key=public_line("alpha"))


def test_a_retired_key_back_dating_into_a_new_request_is_refused_by_the_origins_relay(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    private_key("beta-retired")
    nodes = make_cluster("alpha", "beta", "gamma", operators={"beta": ["beta-retired"]})
    (tmp_path / "beta.operators").write_text(RETIRED_LINE)
    alpha = nodes["alpha"]
    request = alpha.request()
    backdated, reason = back_dating(request)
    path = f"{alpha.url}/v1/requests/{request['request_id']}/decisions"
    with served(alpha, deliver=False), httpx.Client(timeout=10) as client:
        submitted = client.post(f"{alpha.url}/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        refused = client.post(path, json=backdated)
        counted = client.post(path, json=approval(request, "gamma"))
        status = client.get(f"{alpha.url}/v1/requests/{request['request_id']}", headers=alpha.headers).json()
    assert submitted.status_code == 201
    signed_at = backdated["statement"]["signed_at"]
    assert reason.startswith(f"it was signed at {re.escape(date_of(signed_at))}, ")
    assert (refused.status_code, refused.json()["error"]) == (422, "invalid")
    assert re.fullmatch(
        f"The statement was signed at {reason[len('it was signed at ') :]}\\.", refused.json()["message"]
    )
    assert (counted.status_code, counted.json()["counted"]) == (200, True)
    assert (status["state"], status["signers"]) == ("pending", ["gamma"])


def test_a_key_can_belong_to_one_peer_only_in_any_form() -> None:
    message = "peers beta and gamma share one public key, which would count twice."
    with pytest.raises(ValueError, match=exactly(message)):
        config({"gamma": (SignerKey(line=public_line("beta")),)})
    with pytest.raises(ValueError, match=exactly(message)):
        config({"beta": (operator_key(),), "gamma": (SignerKey(line=sk_form(public_line("beta-op"))),)})
    with pytest.raises(ValueError, match=exactly("peer_keys names 'omega', which is not in peer_agent_ids.")):
        config({"omega": (operator_key(),)})
    # One peer listing one key twice (or its node key again) is one key, not an error.
    assert config({"beta": (operator_key(), operator_key(), SignerKey(line=public_line("beta")))}).keys_of(
        "beta"
    ) == (
        SignerKey(line=public_line("beta")),
        operator_key(),
    )


def test_a_signers_rsa_key_under_two_exponents_is_one_key_and_counts_once() -> None:
    usual, other = rsa_exponent_forms()
    node_key, operator = SignerKey(line=rsa_line(usual)), SignerKey(line=rsa_line(other), source="ops.pub")
    lines = {peer: public_line(peer) for peer in PEERS} | {"beta": node_key.line}
    quorum = config({"beta": (operator,)}, peer_public_keys=lines)
    assert quorum.keys_of("beta") == (node_key,)
    request = request_for(quorum)
    statement = approval_statement(request, "beta", int(time.time()))
    by_beta = []
    for key in (usual, other):
        signature = sshsig_sign(
            statement_bytes(statement), SSHPrivateKey.from_cryptography(key), "teaagent-approval"
        )
        by_beta.append({"statement": statement, "signature": signature_to_wire(signature)})
    outcome = evaluate(request, by_beta, [], quorum)
    assert (outcome.state, outcome.signers) == ("pending", ("beta",))
    with pytest.raises(
        QuorumError, match=exactly("The certificate proves 1 approval of the 2 needed (counted: beta).")
    ):
        verify_certificate({"request": request, "request_signature": "x", "approvals": by_beta}, quorum)


def test_verify_decision_names_the_key_that_signed() -> None:
    quorum = config()
    request = request_for(quorum)
    keys = (SignerKey(line=public_line("beta")), operator_key())
    document = approval_by(request, "beta", "beta-op")
    assert verify_decision(document["statement"], document["signature"], keys) == keys[1]
    denied = sign_denial(request, "beta", signer("beta"), "no")
    assert verify_decision(denied["statement"], denied["signature"], keys) == keys[0]
    with pytest.raises(SignatureError, match="which is not one of the keys of beta"):
        verify_decision(
            document["statement"], document["signature"], (*keys[:1], SignerKey(line=public_line("x")))
        )
    compact = sign_approval(request, "beta", signer("beta"))
    assert compact.ssh_key_id == keys[0].fingerprint


def test_allowed_signers_lines_are_read_as_ssh_keygen_reads_them() -> None:
    text = (
        "# comment\n\n"
        f'beta,ops-* namespaces="teaagent-approval,teaagent-denial" {public_line("beta-op")} op@laptop\n'
        f'"gamma" {public_line("gamma-op")}\n'
        f'ops-night valid-before="20300101Z" {public_line("night")}\n'
    )
    beta = parse_allowed_signers(text, principal="beta", source="f")
    assert [(key.line, key.namespaces, key.source) for key in beta] == [
        (public_line("beta-op") + " op@laptop", frozenset({"teaagent-approval", "teaagent-denial"}), "f:3")
    ]
    night = parse_allowed_signers(text, principal="ops-night", source="f")
    assert [key.valid_before for key in night] == [None, 1893456000]


# -- the origin's keys ------------------------------------------------------------------------------


def test_the_origin_signs_with_any_of_its_keys_its_limits_allow_at_the_documents_time() -> None:
    request = request_for(config())
    created_at = request["created_at"]
    retired = SignerKey(line=public_line("alpha"), valid_before=created_at - 1, source="alpha.keys:1")
    current = SignerKey(line=public_line("alpha-2"), source="alpha.keys:2")
    approve_only = SignerKey(
        line=public_line("alpha-ops"), namespaces=frozenset({"teaagent-approval"}), source="alpha.keys:3"
    )
    keys = (retired, current, approve_only)
    until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created_at - 1))
    assert verify_request_signature(request, sign_request(request, signer("alpha-2")), keys) == current
    with pytest.raises(
        SignatureError, match=exactly(f"the key {retired.fingerprint} was valid only until {until}.")
    ):
        verify_request_signature(request, sign_request(request, signer("alpha")), keys)
    with pytest.raises(
        SignatureError,
        match=exactly(
            f"the key {approve_only.fingerprint} may sign only in teaagent-approval, not in teaagent-request."
        ),
    ):
        verify_request_signature(request, sign_request(request, signer("alpha-ops")), keys)
    withdrawal = sign_withdrawal(request, signer("alpha-ops"))
    with pytest.raises(
        SignatureError,
        match=exactly(
            f"the key {approve_only.fingerprint} may sign only in teaagent-approval, "
            "not in teaagent-withdrawal."
        ),
    ):
        verify_withdrawal(request, withdrawal["statement"], withdrawal["signature"], keys)
    withdrawal = sign_withdrawal(request, signer("alpha-2"))
    assert (
        verify_withdrawal(request, withdrawal["statement"], withdrawal["signature"], keys)
        == withdrawal["statement"]
    )
    # A request's validity is checked at its created_at, a withdrawal's at its withdrawn_at.
    retiring = (SignerKey(line=public_line("alpha"), valid_before=created_at), current)
    assert verify_request_signature(request, sign_request(request, signer("alpha")), retiring) == retiring[0]
    on_time = sign_withdrawal(request, signer("alpha"), withdrawn_at=created_at)
    verify_withdrawal(request, on_time["statement"], on_time["signature"], retiring)
    late = sign_withdrawal(request, signer("alpha"), withdrawn_at=created_at + 1)
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(created_at))
    with pytest.raises(
        SignatureError, match=exactly(f"the key {retiring[0].fingerprint} was valid only until {at}.")
    ):
        verify_withdrawal(request, late["statement"], late["signature"], retiring)
    # One key line is still one key without limits.
    signed, line = sign_request(request, signer("alpha")), public_line("alpha")
    assert verify_request_signature(request, signed, line) == SignerKey(line=line)


# -- the relay, at both ends ------------------------------------------------------------------------


@pytest.fixture
def staffed(make_cluster: MakeCluster) -> dict[str, Any]:
    private_key("beta-ops1")  # make the operator's key before the files are written
    return make_cluster("alpha", "beta", "gamma", operators={"beta": ["beta-ops1"]})


@pytest.mark.anyio
async def test_the_relay_takes_this_nodes_decision_from_its_operators_key_only(
    staffed: dict[str, Any],
) -> None:
    alpha, beta = staffed["alpha"], staffed["beta"]
    request = alpha.request()
    async with in_process(beta, deliver=False) as client:
        signed = alpha.signed(request)
        assert (await client.post("/v1/inbox", json=signed)).status_code == 201
        path = f"/v1/inbox/{request['request_id']}/decision"
        stranger = await client.post(path, json=approval_by(request, "beta", "mallory"), headers=beta.headers)
        by_operator = await client.post(
            path, json=approval_by(request, "beta", "beta-ops1"), headers=beta.headers
        )
    assert stranger.status_code == 403
    assert stranger.json()["error"] == "bad_signature"
    fingerprint = signer("mallory").public_key.fingerprint
    assert stranger.json()["message"] == (
        f"The approval does not verify with this node's keys: it was made by the key {fingerprint}, "
        "which is not one of this node's keys."
    )
    assert (by_operator.status_code, by_operator.json()["this_node"]) == (200, "approved")


@pytest.mark.anyio
async def test_the_origins_relay_counts_a_peers_operator_once(staffed: dict[str, Any]) -> None:
    alpha = staffed["alpha"]
    request = alpha.request()
    async with in_process(alpha, deliver=False) as client:
        assert (
            await client.post("/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        ).status_code == 201
        path = f"/v1/requests/{request['request_id']}/decisions"
        first = await client.post(path, json=approval_by(request, "beta", "beta-ops1"))
        again = await client.post(path, json=approval(request, "beta"))  # beta's node key: the same voter
        stranger = await client.post(path, json=approval_by(request, "gamma", "beta-ops1"))
        status = (await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)).json()
    assert (first.status_code, first.json()["counted"]) == (200, True)
    assert (again.status_code, again.json()["counted"]) == (200, False)
    assert stranger.status_code == 403  # beta's operator cannot sign as gamma
    assert (status["state"], status["signers"]) == ("pending", ["beta"])


def test_a_denial_document_of_the_helpers_is_signed_by_the_node_key() -> None:
    # relay_support's denial() signs with the node key: the other tests rely on it.
    quorum = config()
    request = request_for(quorum)
    document = denial(request, "beta")
    assert (
        verify_decision(document["statement"], document["signature"], quorum.keys_of("beta"))
        == quorum.keys_of("beta")[0]
    )
