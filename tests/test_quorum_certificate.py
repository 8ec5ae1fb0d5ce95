"""teaagent.quorum's certificates: built from the counted approvals, verified as the counting would,
denials carried along (rule 6), malformed ones refused in one sentence."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from quorum_support import (
    CONFIG,
    KEYS,
    NOW,
    REQUEST,
    approve,
    deny,
    exactly,
    line,
    make_config,
    make_request,
    outcome_of,
)

from teaagent.errors import QuorumError
from teaagent.quorum import (
    MAX_CERTIFICATE_APPROVALS,
    build_certificate,
    payload_digest,
    sign_request,
    verify_certificate,
)
from teaagent.signing import armor, parse_sshsig

# --- certificates ----------------------------------------------------------------------------------------


def make_certificate(approvals: list[Any] | None = None, request: dict[str, Any] = REQUEST) -> dict[str, Any]:
    if approvals is None:
        approvals = [approve("beta", request), approve("gamma", request)]
    return build_certificate(request, sign_request(request, KEYS["alpha"]), approvals)


def test_certificate_story_tampered_wrong_key_one_short_threshold_met() -> None:
    origin = line("alpha")
    # Threshold met: verifiable long after the request expired.
    cert = make_certificate()
    outcome = verify_certificate(cert, CONFIG, origin_public_key=origin, now=NOW + 30 * 86400)
    assert (outcome.state, outcome.signers) == ("approved", ("beta", "gamma"))
    # Tampered arguments, digest recomputed: the approvals no longer verify.
    tampered = copy.deepcopy(cert)
    tampered["request"]["arguments"] = {"command": "rm -rf /"}
    tampered["request"]["payload_digest"] = payload_digest("shell.run", {"command": "rm -rf /"})
    with pytest.raises(QuorumError, match=r"^The certificate proves 0 approvals of the 2 needed"):
        verify_certificate(tampered, CONFIG)
    with pytest.raises(
        QuorumError, match=r"^The request signature does not verify with the origin alpha's key"
    ):
        verify_certificate(tampered, CONFIG, origin_public_key=origin)
    # Wrong key: mallory signs as gamma.
    wrong = make_certificate([approve("beta"), replace(approve("gamma", key="mallory"), ssh_key_id=None)])
    with pytest.raises(
        QuorumError, match=r"proves 1 approval of the 2 needed \(counted: beta; refused: gamma: "
    ):
        verify_certificate(wrong, CONFIG, origin_public_key=origin)
    # One short.
    with pytest.raises(
        QuorumError, match=r"^The certificate proves 1 approval of the 2 needed \(counted: beta\)\.$"
    ):
        verify_certificate(make_certificate([approve("beta")]), CONFIG)


def test_a_certificate_with_one_signer_twice_is_one_short() -> None:
    cert = make_certificate([approve("beta"), approve("beta", at=NOW + 9)])
    with pytest.raises(QuorumError, match=r"proves 1 approval of the 2 needed"):
        verify_certificate(cert, CONFIG)


def test_a_certificate_never_trusts_the_carried_statement() -> None:
    cert = make_certificate()
    cert["approvals"][1]["statement"]["signer"] = "delta"
    with pytest.raises(
        QuorumError, match=r"refused: delta: .*the signature was made by key SHA256:\S+ but key"
    ):
        verify_certificate(cert, CONFIG)
    cert = make_certificate()
    cert["approvals"][1]["statement"]["expires_at"] += 3600
    with pytest.raises(
        QuorumError, match=r"refused: gamma: the statement's expires_at does not match the request\)\.$"
    ):
        verify_certificate(cert, CONFIG)


def test_a_certificate_approval_signed_after_expiry_does_not_count() -> None:
    cert = make_certificate([approve("beta"), approve("gamma", at=REQUEST["expires_at"] + 1)])
    with pytest.raises(
        QuorumError,
        match=re.escape(
            "gamma: it was signed at 2025-12-01 06:22:01Z, 9s ago, after the request expired at "
            "2025-12-01 06:22:00Z, 10s ago)."
        )
        + "$",
    ):
        verify_certificate(cert, CONFIG, now=REQUEST["expires_at"] + 10)


def test_a_certificate_approval_signed_before_the_request_existed_does_not_count() -> None:
    created = REQUEST["created_at"]
    verified = verify_certificate(
        make_certificate([approve("beta", at=created - 60), approve("gamma")]), CONFIG
    )
    assert verified.signers == ("beta", "gamma")
    early = make_certificate([approve("beta", at=created - 61), approve("gamma")])
    with pytest.raises(
        QuorumError,
        match=exactly(
            "The certificate proves 1 approval of the 2 needed (counted: gamma; refused: beta: it was "
            "signed at 2025-12-01 06:18:59Z, 720h 01m ago, more than 60 seconds before the request was "
            "created at 2025-12-01 06:20:00Z, 720h 00m ago)."
        ),
    ):
        verify_certificate(early, CONFIG, now=NOW + 30 * 86400)


def test_a_certificate_from_the_future_does_not_count() -> None:
    cert = make_certificate()
    with pytest.raises(QuorumError, match=r"more than 60 seconds in the future"):
        verify_certificate(cert, CONFIG, now=NOW + 5 - 61)
    verify_certificate(cert, CONFIG, now=NOW + 5 - 60)


# rule 6 in a certificate: the denials it carries -----------------------------------------------------


def make_certificate_with_denials(approvals: list[Any], denials: list[dict[str, Any]]) -> dict[str, Any]:
    return build_certificate(REQUEST, sign_request(REQUEST, KEYS["alpha"]), approvals, denials)


def test_build_certificate_carries_denials_only_when_there_are_some() -> None:
    without = make_certificate_with_denials([approve("beta"), approve("gamma")], [])
    assert set(without) == {"request", "request_signature", "approvals"}  # the shape of before
    vetoed = deny("delta")
    armored = {"statement": vetoed["statement"], "signature": armor(parse_sshsig(vetoed["signature"]).blob)}
    carried = make_certificate_with_denials([approve("beta"), approve("gamma")], [armored])
    assert carried["denials"] == [vetoed]  # the signature in wire form
    assert json.loads(json.dumps(carried)) == carried


@pytest.mark.parametrize(
    ("approved_at", "denied_at"),
    [
        pytest.param(NOW + 4, NOW + 6, id="denied-after-approving"),
        pytest.param(NOW + 6, NOW + 4, id="denied-first"),
    ],
)
def test_rule6_a_certificate_whose_approver_also_denied_is_one_short(
    approved_at: int, denied_at: int
) -> None:
    cert = make_certificate_with_denials(
        [approve("beta", at=approved_at), approve("gamma")],
        [deny("beta", at=denied_at, reason="changed my mind")],
    )
    with pytest.raises(
        QuorumError,
        match=exactly(
            "The certificate proves 1 approval of the 2 needed (counted: gamma; refused: beta: beta also "
            "denied the request, so its approval is not counted)."
        ),
    ):
        verify_certificate(cert, CONFIG, origin_public_key=line("alpha"), now=NOW + 30 * 86400)


def test_rule6_a_certificate_stands_with_a_denial_of_a_peer_that_did_not_approve() -> None:
    cert = make_certificate_with_denials(
        [approve("beta"), approve("gamma")], [deny("delta", reason="not on Fridays")]
    )
    outcome = verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))
    assert (outcome.state, outcome.signers, outcome.denied_by) == ("approved", ("beta", "gamma"), ("delta",))
    assert outcome.denial_reasons == {"delta": "not on Fridays"}
    # Three of three: that one denial is one too many.
    config = make_config(required=3)
    request = make_request(config)
    strict = build_certificate(
        request,
        sign_request(request, KEYS["alpha"]),
        [approve(peer, request) for peer in ("beta", "gamma", "delta")],
        [deny("delta", request)],
    )
    with pytest.raises(
        QuorumError, match=r"^The certificate proves 2 approvals of the 3 needed \(counted: beta, "
    ):
        verify_certificate(strict, config)


def test_rule6_a_denial_that_does_not_verify_takes_no_approval_away() -> None:
    created = REQUEST["created_at"]
    forged = deny("beta", key="mallory")
    other_request = deny("gamma", make_request(request_id="f" * 32))
    cert = make_certificate_with_denials(
        [approve("beta"), approve("gamma")],
        [forged, other_request, deny("beta", at=created - 61), deny("mallory")],
    )
    cert["denials"].append({"statement": {}})  # no signature: malformed
    outcome = verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))
    assert (outcome.state, outcome.signers, outcome.denied_by) == ("approved", ("beta", "gamma"), ())
    assert set(outcome.rejected_denials) == {"beta", "gamma", "mallory", "#4"}
    assert outcome.rejected_denials["beta"].startswith(
        "the signature does not verify with beta's configured key: "
    )
    assert outcome.rejected_denials["gamma"] == "the statement's request_id does not match the request"
    assert outcome.rejected_denials["mallory"] == "mallory is not a peer of this request"
    assert outcome.rejected_denials["#4"] == "the submission is malformed: it names no signer"
    # The same denial, valid: the approval goes.
    with pytest.raises(QuorumError, match=r"refused: beta: beta also denied the request"):
        verify_certificate(
            make_certificate_with_denials([approve("beta"), approve("gamma")], [deny("beta")]), CONFIG
        )


def test_evaluate_and_certificate_agree_with_denials() -> None:
    approvals = [approve("beta"), approve("gamma"), approve("delta")]
    denials = [deny("gamma", at=NOW + 7)]
    outcome = outcome_of(approvals, denials)
    assert (outcome.state, outcome.signers, outcome.denied_by) == ("approved", ("beta", "delta"), ("gamma",))
    cert = build_certificate(REQUEST, sign_request(REQUEST, KEYS["alpha"]), approvals, denials)
    verified = verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))
    assert (verified.signers, verified.denied_by, verified.rejected) == (
        outcome.signers,
        outcome.denied_by,
        outcome.rejected,
    )


@pytest.mark.parametrize(
    ("cert", "message"),
    [
        (
            [],
            "The quorum certificate is not a JSON object with exactly request, "
            "request_signature and approvals, and optionally denials.",
        ),
        ({"request": REQUEST, "approvals": []}, "The quorum certificate is not a JSON object with exactly"),
        (
            {"request": REQUEST, "request_signature": "", "approvals": [], "denials": [], "notes": []},
            "The quorum certificate is not a JSON object with exactly request, "
            "request_signature and approvals, and optionally denials.",
        ),
        (
            {"request": REQUEST, "request_signature": "", "approvals": [], "denials": {}},
            "The certificate's denials are not a list.",
        ),
        (
            {
                "request": REQUEST,
                "request_signature": "",
                "approvals": [],
                "denials": [{}] * (MAX_CERTIFICATE_APPROVALS + 1),
            },
            "The certificate carries 1025 denials, more than the limit of 1024.",
        ),
        (
            {"request": {}, "request_signature": "", "approvals": []},
            "The certificate's request is malformed: the request lacks the field ",
        ),
        (
            {"request": REQUEST, "request_signature": "", "approvals": {}},
            "The certificate's approvals are not a list.",
        ),
        (
            {
                "request": REQUEST,
                "request_signature": "",
                "approvals": [{}] * (MAX_CERTIFICATE_APPROVALS + 1),
            },
            "The certificate carries 1025 approvals, more than the limit of 1024.",
        ),
    ],
)
def test_malformed_certificates_are_refused(cert: Any, message: str) -> None:
    with pytest.raises(QuorumError, match="^" + re.escape(message)):
        verify_certificate(cert, CONFIG)


def test_the_request_signature_is_checked_only_with_an_origin_key() -> None:
    cert = make_certificate()
    cert["request_signature"] = sign_request(REQUEST, KEYS["mallory"])
    verify_certificate(cert, CONFIG)
    with pytest.raises(
        QuorumError, match=r"^The request signature does not verify with the origin alpha's key: "
    ):
        verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))
    cert["request_signature"] = 42
    with pytest.raises(QuorumError, match=r"^The certificate's request_signature is not a string\.$"):
        verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))


def test_a_dev_request_signature_passes_only_when_dev_signatures_are_allowed() -> None:
    cert = make_certificate()
    cert["request_signature"] = "dev:alpha"
    with pytest.raises(QuorumError, match=r"is a development signature"):
        verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))
    outcome = verify_certificate(
        cert, make_config(allow_dev_signatures=True), origin_public_key=line("alpha")
    )
    assert outcome.state == "approved"


def test_evaluate_and_certificate_agree() -> None:
    outcome = outcome_of([approve("beta"), approve("delta"), approve("mallory")])
    cert = build_certificate(REQUEST, sign_request(REQUEST, KEYS["alpha"]), outcome.approvals)
    verified = verify_certificate(cert, CONFIG, origin_public_key=line("alpha"))
    assert verified.signers == outcome.signers == ("beta", "delta")
    assert [entry["statement"]["signer"] for entry in cert["approvals"]] == ["beta", "delta"]
    assert json.loads(json.dumps(cert)) == cert
