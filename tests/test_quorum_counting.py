"""teaagent.quorum's counting rules (PROTOCOL.md "Counting"): a story in the python-tuf manner, then
each rule at its boundaries: who counts, which key, which statement, when, and how often."""

from __future__ import annotations

import base64
import copy
import json
import logging
from dataclasses import replace

import pytest
from quorum_support import (
    CONFIG,
    KEYS,
    NOW,
    REQUEST,
    approve,
    deny,
    full,
    make_config,
    make_request,
    mutated,
    outcome_of,
    sign_statement,
)

from teaagent.errors import QuorumError
from teaagent.policy import PeerSignature
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    MAX_CLOCK_SKEW_SECONDS,
    REQUEST_NAMESPACE,
    approval_statement,
    denial_statement,
    evaluate,
)
from teaagent.signing import armor, parse_sshsig

# --- counting: a story in the python-tuf manner ----------------------------------------------------------


def test_story_tampered_fails_wrong_key_fails_one_short_fails_threshold_met_passes() -> None:
    beta, gamma = approve("beta"), approve("gamma")
    # Tampered: a signature for other arguments does not count for this request.
    other = make_request(arguments={"command": "rm -rf /"})
    tampered = outcome_of([approve("beta", other), gamma])
    assert (tampered.state, tampered.signers) == ("pending", ("gamma",))
    assert tampered.rejected["beta"].startswith("the signature does not verify with beta's configured key")
    # Wrong key: mallory signs in beta's name.
    forged = outcome_of([replace(approve("beta", key="mallory"), ssh_key_id=None), gamma])
    assert (forged.state, forged.signers) == ("pending", ("gamma",))
    assert "was made by key" in forged.rejected["beta"]
    # One short.
    short = outcome_of([beta])
    assert (short.state, short.signers, short.rejected) == ("pending", ("beta",), {})
    # Threshold met.
    met = outcome_of([gamma, beta])
    assert (met.state, met.signers, met.rejected) == ("approved", ("beta", "gamma"), {})
    assert met.describe() == "approved by beta, gamma (2 approvals of the 2 needed)"


def test_an_outcome_is_json_ready() -> None:
    outcome = outcome_of([approve("beta"), approve("mallory")], [deny("gamma", reason="late")])
    document = json.loads(json.dumps(outcome.to_dict()))
    assert document == {
        "state": "pending",
        "request_id": REQUEST["request_id"],
        "origin": "alpha",
        "tool_name": "shell.run",
        "payload_digest": REQUEST["payload_digest"],
        "required": 2,
        "peers": ["beta", "delta", "gamma"],
        "signers": ["beta"],
        "denied_by": ["gamma"],
        "denial_reasons": {"gamma": "late"},
        "rejected": {"mallory": "mallory is not a peer of this request"},
        "rejected_denials": {},
        "approvals": [full(approve("beta"))],
        "dev_signers": [],
    }
    assert outcome.describe() == "waiting: 1 approval of the 2 needed (asked of 3 peers)"


def test_all_three_approvals_are_counted_and_ordered_by_peer() -> None:
    outcome = outcome_of([approve("gamma"), approve("beta"), approve("delta")])
    assert outcome.signers == ("beta", "delta", "gamma")
    assert outcome.state == "approved"
    assert outcome.peers == ("beta", "delta", "gamma")
    assert outcome.required == 2
    assert outcome.decided


# rule 1 -------------------------------------------------------------------------------------------------


def test_rule1_an_outsider_does_not_count() -> None:
    outcome = outcome_of([approve("beta"), approve("mallory")])
    assert outcome.state == "pending"
    assert outcome.rejected == {"mallory": "mallory is not a peer of this request"}


def test_rule1_the_origin_cannot_approve_its_own_request() -> None:
    outcome = outcome_of([approve("beta"), approve("alpha")])
    assert outcome.state == "pending"
    assert outcome.rejected == {"alpha": "the origin cannot approve or deny its own request"}


def test_rule1_a_request_peer_unknown_to_the_verifier_does_not_count() -> None:
    wide = make_config(("beta", "gamma", "delta", "epsilon"))
    request = make_request(wide)
    outcome = outcome_of([approve("beta", request), approve("epsilon", request)], request=request)
    assert outcome.peers == ("beta", "delta", "gamma")
    assert outcome.state == "pending"
    assert outcome.rejected == {"epsilon": "epsilon is not a configured peer of this node"}


def test_rule1_a_configured_peer_absent_from_the_request_does_not_count() -> None:
    wide = make_config(("beta", "gamma", "delta", "epsilon"))
    outcome = outcome_of([approve("beta"), approve("epsilon")], config=wide)
    assert outcome.state == "pending"
    assert outcome.rejected == {"epsilon": "epsilon is not a peer of this request"}


def test_rule1_a_quorum_out_of_the_verifiers_reach_is_an_error() -> None:
    wide = make_config(("beta", "gamma", "delta", "epsilon"), required=3)
    request = make_request(wide)
    narrow = make_config(("beta", "epsilon"), required=1)
    with pytest.raises(
        QuorumError, match=r"needs 3 approvals, but only 2 of its peers are configured peers of this node\.$"
    ):
        outcome_of([], request=request, config=narrow)


def test_the_threshold_is_never_lower_than_the_verifiers_own() -> None:
    lenient = make_request(make_config(required=1))
    one = outcome_of([approve("beta", lenient)], request=lenient)
    assert (one.state, one.required) == ("pending", 2)
    assert (
        outcome_of([approve("beta", lenient)], request=lenient, config=make_config(required=1)).state
        == "approved"
    )


def test_the_threshold_is_never_lower_than_the_requests_own() -> None:
    strict = make_request(make_config(required=3))
    two = outcome_of([approve("beta", strict), approve("gamma", strict)], request=strict)
    assert (two.state, two.required) == ("pending", 3)


# rule 2 -------------------------------------------------------------------------------------------------


def test_rule2_a_peer_signing_with_another_peers_key_does_not_count() -> None:
    outcome = outcome_of([approve("gamma"), replace(approve("beta", key="delta"), ssh_key_id=None)])
    assert outcome.state == "pending"
    assert "the signature was made by key" in outcome.rejected["beta"]


def test_rule2_a_claimed_ssh_key_id_must_match_the_configured_key() -> None:
    wrong_id = replace(approve("beta"), ssh_key_id=KEYS["mallory"].public_key.fingerprint)
    outcome = outcome_of([wrong_id, approve("gamma")])
    assert outcome.rejected == {
        "beta": "its ssh_key_id is not the fingerprint of the key configured for beta"
    }
    assert outcome_of([replace(approve("beta"), ssh_key_id=None), approve("gamma")]).state == "approved"


# rule 3 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", [DENIAL_NAMESPACE, REQUEST_NAMESPACE, "file"])
def test_rule3_an_approval_signed_in_another_namespace_does_not_count(namespace: str) -> None:
    statement = approval_statement(REQUEST, "beta", NOW + 5)
    signature = sign_statement(statement, "beta", namespace)
    outcome = outcome_of([{"statement": statement, "signature": signature}, approve("gamma")])
    assert outcome.state == "pending"
    assert f"namespace is '{namespace}' but 'teaagent-approval' was expected" in outcome.rejected["beta"]


def test_rule3_an_approval_for_another_request_does_not_count() -> None:
    other = make_request(request_id="f" * 32)
    outcome = outcome_of([approve("beta", other), approve("gamma")])
    assert outcome.state == "pending"
    assert "bad signature" in outcome.rejected["beta"]


def test_rule3_a_carried_statement_must_equal_the_one_rebuilt_from_the_request() -> None:
    beta = full(approve("beta"))
    changed = copy.deepcopy(beta)
    changed["statement"]["tool_name"] = "fs.read"
    extra = copy.deepcopy(beta)
    extra["statement"]["note"] = "hi"
    missing = copy.deepcopy(beta)
    del missing["statement"]["payload_digest"]
    typed = copy.deepcopy(beta)
    typed["statement"]["v"] = True
    for document, reason in [
        (changed, "the statement's tool_name does not match the request"),
        (extra, "the statement has the unknown field note"),
        (missing, "the statement lacks the field payload_digest"),
        (typed, "the statement's v does not match the request"),
    ]:
        outcome = outcome_of([document, approve("gamma")])
        assert (outcome.state, outcome.rejected) == ("pending", {"beta": reason})
    assert outcome_of([beta, approve("gamma")]).state == "approved"


def test_rule3_malformed_signatures_are_reported_never_raised() -> None:
    blob = parse_sshsig(approve("beta").signature).blob
    trailing = base64.b64encode(blob + b"\x00").decode()
    for signature, reason in [
        ("!!!", "not valid base64"),
        (trailing, "unexpected trailing byte"),
        (base64.b64encode(blob[:40]).decode(), "truncated"),
        ("", "the signature does not verify with beta's configured key: "),
    ]:
        outcome = outcome_of([replace(approve("beta"), signature=signature), approve("gamma")])
        assert outcome.state == "pending"
        assert reason in outcome.rejected["beta"]


def test_rule3_malformed_submissions_are_reported_by_position() -> None:
    outcome = outcome_of([{"signature": "x"}, {"statement": "x", "signature": "y"}, approve("beta")])
    assert outcome.rejected == {
        "#0": "the submission is malformed: it names no signer",
        "#1": "the submission is malformed: it names no signer",
    }


def test_rule3_an_armored_signature_counts_like_the_bare_one() -> None:
    beta = approve("beta")
    armored = replace(beta, signature=armor(parse_sshsig(beta.signature).blob))
    outcome = outcome_of([armored, approve("gamma")])
    assert outcome.state == "approved"
    assert outcome.approvals[0]["signature"] == beta.signature


# rule 4 -------------------------------------------------------------------------------------------------


def test_rule4_an_approval_signed_at_expiry_counts_one_second_later_does_not() -> None:
    expiry = REQUEST["expires_at"]
    at_expiry = outcome_of([approve("beta", at=expiry), approve("gamma")], now=expiry)
    assert at_expiry.state == "approved"
    late = outcome_of([approve("beta", at=expiry + 1), approve("gamma")], now=expiry)
    assert late.state == "pending"
    assert late.rejected == {  # dates with their distance from the evaluation's now
        "beta": "it was signed at 2025-12-01 06:22:01Z, in 1s, after the request expired at "
        "2025-12-01 06:22:00Z, now"
    }


def test_rule4_an_approval_counts_from_sixty_seconds_before_the_request_was_created() -> None:
    created = REQUEST["created_at"]
    at_bound = outcome_of([approve("beta", at=created - 60), approve("gamma")])
    assert (at_bound.state, at_bound.signers) == ("approved", ("beta", "gamma"))
    early = outcome_of([approve("beta", at=created - 61), approve("gamma")])
    assert (early.state, early.signers) == ("pending", ("gamma",))
    assert created == NOW
    assert early.rejected == {
        "beta": "it was signed at 2025-12-01 06:18:59Z, 1m 11s ago, more than 60 seconds before the request "
        "was created at 2025-12-01 06:20:00Z, 10s ago"
    }


def test_rule4_a_denial_counts_from_sixty_seconds_before_the_request_was_created() -> None:
    created = REQUEST["created_at"]
    at_bound = outcome_of([], [deny("beta", at=created - 60), deny("gamma")])
    assert (at_bound.state, at_bound.denied_by) == ("denied", ("beta", "gamma"))
    early = outcome_of([], [deny("beta", at=created - 61), deny("gamma")])
    assert (early.state, early.denied_by) == ("pending", ("gamma",))
    assert early.rejected_denials == {
        "beta": "it was signed at 2025-12-01 06:18:59Z, 1m 11s ago, more than 60 seconds before the request "
        "was created at 2025-12-01 06:20:00Z, 10s ago"
    }


def test_rule4_the_clock_skew_allowance_is_exactly_sixty_seconds() -> None:
    now = NOW + 10
    assert MAX_CLOCK_SKEW_SECONDS == 60
    ahead = outcome_of([approve("beta", at=now + 60), approve("gamma")], now=now)
    assert ahead.state == "approved"
    too_far = outcome_of([approve("beta", at=now + 61), approve("gamma")], now=now)
    assert too_far.rejected == {
        "beta": "it is dated 2025-12-01 06:21:11Z, in 1m 01s, more than 60 seconds in the future"
    }


def test_rule4_the_request_expires_one_second_after_expires_at() -> None:
    approvals = [approve("beta"), approve("gamma")]
    expiry = REQUEST["expires_at"]
    assert outcome_of(approvals, now=expiry).state == "approved"
    expired = outcome_of(approvals, now=expiry + 1)
    assert (expired.state, expired.signers, expired.approvals) == ("expired", (), ())
    assert expired.describe() == "expired with 0 approvals of the 2 needed"


def test_rule4_a_fractional_compact_timestamp_does_not_count() -> None:
    outcome = outcome_of([replace(approve("beta"), timestamp=NOW + 5.5), approve("gamma")])
    assert outcome.rejected == {"beta": "its signing time is not an integer Unix time"}


# rule 5 -------------------------------------------------------------------------------------------------


def test_rule5_a_signer_counts_once_however_many_times_it_signs() -> None:
    beta = approve("beta")
    outcome = outcome_of([beta, beta, full(beta), approve("beta", at=NOW + 9)])
    assert (outcome.state, outcome.signers, outcome.rejected) == ("pending", ("beta",), {})
    assert len(outcome.approvals) == 1


def test_rule5_a_forgery_before_a_valid_signature_does_not_hide_it() -> None:
    forged = replace(approve("beta", key="mallory"), ssh_key_id=None)
    outcome = outcome_of([forged, approve("gamma"), approve("beta")])
    assert (outcome.state, outcome.signers, outcome.rejected) == ("approved", ("beta", "gamma"), {})


def test_rule5_the_first_refusal_is_reported_when_nothing_counts() -> None:
    first = replace(approve("beta", key="mallory"), ssh_key_id=None)
    second = approve("beta", at=REQUEST["expires_at"] + 1)
    outcome = outcome_of([first, second])
    assert "was made by key" in outcome.rejected["beta"]


# denials ------------------------------------------------------------------------------------------------


def test_denied_as_soon_as_the_quorum_can_no_longer_be_reached() -> None:
    one = outcome_of([], [deny("beta", reason="not now")])
    assert (one.state, one.denied_by) == ("pending", ("beta",))
    two = outcome_of([approve("delta")], [deny("beta", reason="not now"), deny("gamma", reason="")])
    assert (two.state, two.denied_by, two.signers) == ("denied", ("beta", "gamma"), ("delta",))
    assert two.denial_reasons == {"beta": "not now", "gamma": ""}
    assert two.describe() == "denied by beta: not now; gamma (2 approvals from 3 peers needed)"


def test_a_three_of_three_quorum_is_denied_by_one_denial() -> None:
    config = make_config(required=3)
    request = make_request(config)
    outcome = outcome_of([approve("beta", request)], [deny("gamma", request)], config=config, request=request)
    assert outcome.state == "denied"


def test_denials_count_once_per_signer() -> None:
    denial = deny("beta")
    outcome = outcome_of([], [denial, denial, deny("beta", at=NOW + 6)])
    assert (outcome.state, outcome.denied_by, outcome.rejected_denials) == ("pending", ("beta",), {})


def test_a_peer_that_denied_has_its_approval_ignored() -> None:
    outcome = outcome_of([approve("beta"), approve("gamma")], [deny("beta")])
    assert (outcome.state, outcome.signers) == ("pending", ("gamma",))
    assert outcome.rejected == {"beta": "beta also denied the request, so its approval is not counted"}


def test_denials_are_checked_field_by_field() -> None:
    base = deny("beta", reason="no")
    approval_typed = copy.deepcopy(base)
    approval_typed["statement"]["type"] = "teaagent.approval"
    other_reason = copy.deepcopy(base)
    other_reason["statement"]["reason"] = "yes"
    wrong_namespace = {
        "statement": base["statement"],
        "signature": sign_statement(base["statement"], "beta", APPROVAL_NAMESPACE),
    }
    no_reason = copy.deepcopy(base)
    del no_reason["statement"]["reason"]
    cases = [
        (approval_typed, "the statement's type does not match the request"),
        (other_reason, "bad signature"),
        (wrong_namespace, "namespace is 'teaagent-approval' but 'teaagent-denial' was expected"),
        (no_reason, "the denial's reason is not a string"),
        (deny("mallory"), "mallory is not a peer of this request"),
        (deny("beta", key="mallory"), "was made by key"),
        (deny("beta", at=REQUEST["expires_at"] + 1), "after the request expired"),
        (base | {"extra": 1}, "the submission is malformed"),
    ]
    for denial, reason in cases:
        outcome = outcome_of([], [denial, deny("gamma")])
        assert outcome.state == "pending", reason
        (refusal,) = outcome.rejected_denials.values()
        assert reason in refusal


def test_an_approval_document_is_not_a_denial() -> None:
    outcome = outcome_of([], [full(approve("beta")), deny("gamma")])
    assert outcome.state == "pending"
    assert outcome.rejected_denials == {"beta": "the denial's reason is not a string"}


# development signatures -----------------------------------------------------------------------------------


def test_dev_signatures_never_count_when_disabled() -> None:
    dev = PeerSignature(peer_id="beta", signature="dev:beta", timestamp=float(NOW), ssh_key_id=None)
    outcome = outcome_of([dev, approve("gamma")])
    assert outcome.state == "pending"
    assert outcome.rejected == {
        "beta": "development signatures (dev:<signer>) are not allowed by this node's configuration"
    }


def test_dev_signatures_count_when_enabled_and_are_logged_each_time(caplog: pytest.LogCaptureFixture) -> None:
    config = make_config(allow_dev_signatures=True)
    dev = PeerSignature(peer_id="beta", signature="dev:beta", timestamp=float(NOW), ssh_key_id=None)
    caplog.set_level(logging.WARNING, logger="teaagent.quorum")
    caplog.clear()
    for _ in range(2):
        outcome = outcome_of([dev, approve("gamma")], config=config)
        assert (outcome.state, outcome.dev_signers) == ("approved", ("beta",))
    warnings = [record for record in caplog.records if record.name == "teaagent.quorum"]
    assert len(warnings) == 2
    assert all(record.levelno == logging.WARNING for record in warnings)
    assert "development signature of beta" in warnings[0].getMessage()
    assert outcome.approvals[0]["signature"] == "dev:beta"


def test_a_dev_signature_must_name_its_signer() -> None:
    config = make_config(allow_dev_signatures=True)
    dev = PeerSignature(peer_id="beta", signature="dev:gamma", timestamp=float(NOW), ssh_key_id=None)
    outcome = outcome_of([dev], config=config)
    assert outcome.rejected == {"beta": "a development signature of beta must read dev:beta"}
    assert outcome.dev_signers == ()


def test_a_dev_denial_counts_only_when_enabled() -> None:
    statement = denial_statement(REQUEST, "beta", NOW, "no")
    dev_denial = {"statement": statement, "signature": "dev:beta"}
    config = make_config(allow_dev_signatures=True)
    assert outcome_of([], [dev_denial, deny("gamma")], config=config).state == "denied"
    assert outcome_of([], [dev_denial, deny("gamma")]).state == "pending"


def test_evaluate_refuses_a_malformed_request() -> None:
    with pytest.raises(QuorumError, match=r"^The request lacks the field peers\.$"):
        evaluate(mutated(peers=...), [], [], CONFIG, now=NOW)
