"""The relay's checks of one decision (``teaagent_relay._protocol``): what it verifies is what it stores.

A verified decision is stored as the canonical JSON of ``{"signature", "statement"}``, its statement
written as the very bytes its signer signed, encoded once for the verification and reused. These
tests hold that form to RFC 8785 (:func:`teaagent.quorum.canonical` of the whole decision), with a
denial whose reason is not ASCII among them, and a decision signed by another key to its refusal.
"""

from __future__ import annotations

import json

import pytest
from quorum_support import CONFIG, NOW, REQUEST, approve, deny, full

from teaagent.quorum import canonical
from teaagent_relay._errors import ApiError
from teaagent_relay._protocol import check_statement, decision_bytes, verify_decision

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
