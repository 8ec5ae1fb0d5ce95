"""The relay's checks of one decision (``teaagent_relay._protocol``): what it verifies is what it stores.

A verified decision is stored as the canonical JSON of ``{"signature", "statement"}``, its statement
written as the very bytes its signer signed, encoded once for the verification and reused. These
tests hold that form to RFC 8785 (:func:`teaagent.quorum.canonical` of the whole decision), with a
denial whose reason is not ASCII among them, and a decision signed by another key to its refusal.
"""

from __future__ import annotations

import json

import pytest
from quorum_support import CONFIG, KEYS, NOW, REQUEST, approve, deny, full, line

import teaagent.quorum._request as request_module
from teaagent.quorum import canonical, sign_request
from teaagent_relay._errors import ApiError
from teaagent_relay._protocol import check_request_signature, check_statement, decision_bytes, verify_decision

PEERS = tuple(CONFIG.peer_agent_ids)


def _decisions() -> list[tuple[dict[str, object], str]]:
    """An approval by beta and a denial by gamma whose reason is not ASCII: (statement, signature)."""
    approval = full(approve("beta"))
    denial = deny("gamma", reason="nein — zu riskant, «rm» überall ✋")
    return [
        (approval["statement"], approval["signature"]),
        (denial["statement"], denial["signature"]),
    ]


@pytest.mark.parametrize("which", ["approval", "denial"])
def test_a_verified_decision_is_stored_as_the_canonical_json_of_the_decision(which: str) -> None:
    statement, signature = _decisions()[0 if which == "approval" else 1]
    kind, signer, rebuilt = check_statement(REQUEST, statement, configured=PEERS, now=NOW + 10)
    assert kind == which

    verified = verify_decision(
        kind, rebuilt, signature, CONFIG.keys_of(signer), allow_dev=False, whose=f"{signer}'s key"
    )

    document = {"signature": verified.wire, "statement": rebuilt}
    assert verified.stored == canonical(document)
    assert json.loads(verified.stored) == document
    assert verified.stored == decision_bytes(rebuilt, verified.wire)


def test_a_decision_signed_by_another_key_is_refused() -> None:
    statement, signature = _decisions()[0]
    kind, _signer, rebuilt = check_statement(REQUEST, statement, configured=PEERS, now=NOW + 10)
    with pytest.raises(ApiError) as refused:
        verify_decision(
            kind, rebuilt, signature, CONFIG.keys_of("gamma"), allow_dev=False, whose="gamma's key"
        )
    assert (refused.value.status_code, refused.value.code) == (403, "bad_signature")


def test_the_origins_signature_is_checked_without_checking_the_request_a_second_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The relay refuses a malformed request in its own words first (request_problem, 422); the
    # signature's check then costs a verification, not the document's structure once more.
    signature = sign_request(REQUEST, KEYS["alpha"])
    checked: list[object] = []
    problem = request_module.request_problem
    monkeypatch.setattr(
        request_module, "request_problem", lambda request: checked.append(request) or problem(request)
    )

    wire = check_request_signature(REQUEST, signature, line("alpha"), allow_dev=False, whose="alpha's key")

    assert wire == signature
    assert checked == []
    with pytest.raises(ApiError) as refused:  # and the check is still a check
        check_request_signature(REQUEST, signature, line("beta"), allow_dev=False, whose="beta's key")
    assert (refused.value.status_code, refused.value.code) == (403, "bad_signature")
