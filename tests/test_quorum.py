"""teaagent.quorum: the documents of PROTOCOL.md, the counting rules, and quorum certificates.

Keys are made in-process (``cryptography``) so these tests start no process; the interop with
OpenSSH's own ``ssh-keygen`` is in ``test_quorum_interop.py``.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import re
from dataclasses import replace
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from teaagent.errors import QuorumError, SignatureError
from teaagent.policy import MultiSigQuorumConfig, PeerSignature
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    MAX_CERTIFICATE_APPROVALS,
    MAX_CLOCK_SKEW_SECONDS,
    REQUEST_NAMESPACE,
    QuorumOutcome,
    approval_statement,
    build_certificate,
    build_request,
    canonical,
    denial_statement,
    evaluate,
    payload_digest,
    request_statement,
    sign_approval,
    sign_denial,
    sign_request,
    statement_bytes,
    validate_request,
    verify_certificate,
    verify_request_signature,
    wire_signature,
)
from teaagent.signing import SSHPrivateKey, armor, parse_sshsig, signature_to_wire, sshsig_sign

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


# --- documents ----------------------------------------------------------------------------------------


def test_build_request_follows_the_protocol_fields() -> None:
    assert {
        "v": 1,
        "type": "teaagent.request",
        "request_id": "0123456789abcdef0123456789abcdef",
        "origin": "alpha",
        "run_id": "run-1",
        "call_id": "call-1",
        "tool_name": "shell.run",
        "arguments": {"command": "rm -rf build"},
        "payload_digest": payload_digest("shell.run", {"command": "rm -rf build"}),
        "reason": "the build folder is stale",
        "required_approvals": 2,
        "peers": ["beta", "delta", "gamma"],
        "created_at": NOW,
        "expires_at": NOW + TIMEOUT,
    } == REQUEST


def test_build_request_draws_a_fresh_random_request_id() -> None:
    first = build_request(
        origin="alpha", run_id="r", call_id="c", tool_name="t", arguments={}, reason="", config=CONFIG
    )
    second = build_request(
        origin="alpha", run_id="r", call_id="c", tool_name="t", arguments={}, reason="", config=CONFIG
    )
    assert re.fullmatch(r"[0-9a-f]{32}", first["request_id"])
    assert first["request_id"] != second["request_id"]


def test_build_request_copies_the_arguments() -> None:
    arguments: dict[str, Any] = {"paths": ["a"]}
    request = make_request(arguments=arguments)
    arguments["paths"].append("b")
    assert request["arguments"] == {"paths": ["a"]}
    validate_request(request)


def test_build_request_refuses_an_origin_among_the_peers() -> None:
    with pytest.raises(ValueError, match=r"^the origin beta is among the configured peers$"):
        build_request(
            origin="beta", run_id="r", call_id="c", tool_name="t", arguments={}, reason="", config=CONFIG
        )


def test_build_request_refuses_a_malformed_request_id() -> None:
    with pytest.raises(ValueError, match=r"request_id is not 32 lowercase hexadecimal characters"):
        make_request(request_id="0123456789ABCDEF0123456789ABCDEF")


def test_the_statement_bytes_are_the_canonical_json_of_the_protocol() -> None:
    statement = approval_statement(REQUEST, "beta", NOW + 3)
    assert statement == {
        "v": 1,
        "type": "teaagent.approval",
        "request_id": REQUEST["request_id"],
        "origin": "alpha",
        "signer": "beta",
        "tool_name": "shell.run",
        "payload_digest": REQUEST["payload_digest"],
        "expires_at": NOW + TIMEOUT,
        "signed_at": NOW + 3,
    }
    expected = (
        '{"expires_at":1764570120,"origin":"alpha","payload_digest":"' + REQUEST["payload_digest"] + '",'
        '"request_id":"0123456789abcdef0123456789abcdef","signed_at":1764570003,"signer":"beta",'
        '"tool_name":"shell.run","type":"teaagent.approval","v":1}'
    ).encode()
    assert statement_bytes(statement) == expected == rfc8785.dumps(statement)


def test_a_denial_statement_is_the_approval_statement_with_a_reason() -> None:
    statement = denial_statement(REQUEST, "gamma", NOW + 4, "not during the release")
    assert statement == approval_statement(REQUEST, "gamma", NOW + 4) | {
        "type": "teaagent.denial",
        "reason": "not during the release",
    }


@given(
    reason=st.text(),
    signed_at=st.integers(min_value=0, max_value=2**53 - 1),
    signer=st.from_regex(r"[a-z0-9][a-z0-9._-]{0,63}", fullmatch=True),
)
def test_the_fast_statement_encoding_equals_rfc8785(reason: str, signed_at: int, signer: str) -> None:
    statement = denial_statement(REQUEST, signer, signed_at, reason)
    try:
        expected = rfc8785.dumps(statement)
    except Exception:  # lone surrogates cannot be UTF-8 in either encoder
        with pytest.raises(ValueError, match="cannot be written as canonical JSON"):
            statement_bytes(statement)
        return
    assert statement_bytes(statement) == expected


def test_statement_bytes_falls_back_to_rfc8785_for_anything_but_strings_and_integers() -> None:
    odd: dict[str, Any] = {"b": 1.5, "a": [True, None]}
    assert statement_bytes(odd) == rfc8785.dumps(odd) == b'{"a":[true,null],"b":1.5}'


def test_the_request_bytes_survive_a_json_round_trip_even_with_floats() -> None:
    request = make_request(arguments={"timeout": 2.5, "ratio": 1e21, "small": 1e-7, "text": "é\u2028"})
    signed = request_statement(request)
    assert signed == canonical(request)
    assert request_statement(json.loads(json.dumps(request))) == signed
    assert request_statement(json.loads(signed)) == signed


def test_sign_request_is_verified_with_the_origin_key_only() -> None:
    signature = sign_request(REQUEST, KEYS["alpha"])
    assert "\n" not in signature
    assert parse_sshsig(signature).namespace == REQUEST_NAMESPACE
    verify_request_signature(REQUEST, signature, line("alpha"))
    verify_request_signature(REQUEST, armor(parse_sshsig(signature).blob), line("alpha"))
    with pytest.raises(SignatureError, match="was made by key"):
        verify_request_signature(REQUEST, signature, line("beta"))
    tampered = REQUEST | {"reason": "something else"}
    with pytest.raises(SignatureError, match="bad signature"):
        verify_request_signature(tampered, signature, line("alpha"))


def test_a_request_signature_made_in_another_namespace_does_not_verify() -> None:
    signature = sshsig_sign(request_statement(REQUEST), KEYS["alpha"], APPROVAL_NAMESPACE)
    with pytest.raises(SignatureError, match="namespace is 'teaagent-approval' but 'teaagent-request'"):
        verify_request_signature(REQUEST, signature, line("alpha"))


def test_sign_approval_gives_the_compact_form() -> None:
    approval = approve("beta", at=NOW + 7)
    assert approval.peer_id == "beta"
    assert approval.timestamp == float(NOW + 7)
    assert isinstance(approval.timestamp, float)
    assert approval.ssh_key_id == KEYS["beta"].public_key.fingerprint
    assert re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", approval.signature)
    assert parse_sshsig(approval.signature).namespace == APPROVAL_NAMESPACE


def test_sign_denial_gives_statement_and_bare_signature() -> None:
    denial = deny("gamma", at=NOW + 8, reason="too risky")
    assert denial["statement"] == denial_statement(REQUEST, "gamma", NOW + 8, "too risky")
    assert parse_sshsig(denial["signature"]).namespace == DENIAL_NAMESPACE
    assert "\n" not in denial["signature"]


def test_statement_builders_refuse_bad_signers_and_times() -> None:
    with pytest.raises(ValueError, match=r"^the signer 'Beta' is not a valid agent id$"):
        approval_statement(REQUEST, "Beta", NOW)
    with pytest.raises(ValueError, match=r"^signed_at 1\.5 is not an integer Unix time$"):
        approval_statement(REQUEST, "beta", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^signed_at True is not an integer Unix time$"):
        approval_statement(REQUEST, "beta", True)
    with pytest.raises(ValueError, match=r"^the denial reason is not a string$"):
        denial_statement(REQUEST, "beta", NOW, None)  # type: ignore[arg-type]


def test_wire_signature_unarmors_and_keeps_dev_signatures() -> None:
    signature = approve("beta").signature
    armored = armor(parse_sshsig(signature).blob)
    assert wire_signature(armored) == signature
    assert wire_signature("dev:beta") == "dev:beta"


def test_build_certificate_expands_compact_approvals() -> None:
    approvals = [approve("beta"), approve("gamma", at=NOW + 6)]
    request_signature = sign_request(REQUEST, KEYS["alpha"])
    cert = build_certificate(REQUEST, armor(parse_sshsig(request_signature).blob), approvals)
    assert cert == {
        "request": REQUEST,
        "request_signature": request_signature,
        "approvals": [full(approvals[0]), full(approvals[1])],
    }


def test_build_certificate_refuses_a_fractional_timestamp() -> None:
    approval = replace(approve("beta"), timestamp=NOW + 0.5)
    with pytest.raises(ValueError, match="has a timestamp that is not an integer time"):
        build_certificate(REQUEST, "sig", [approval])


def _mutated(**changes: Any) -> dict[str, Any]:
    request = copy.deepcopy(REQUEST)
    for name, value in changes.items():
        if value is ...:
            del request[name]
        else:
            request[name] = value
    return request


@pytest.mark.parametrize(
    ("request_doc", "message"),
    [
        ([], "The request is not a JSON object."),
        (_mutated(reason=...), "The request lacks the field reason."),
        (_mutated(extra=1), "The request has the unknown field extra."),
        (_mutated(v=3), "The request has version 3, but only versions 1 and 2 are known."),
        (_mutated(v=True), "The request has version True, but only versions 1 and 2 are known."),
        # Version 2 carries a policy; version 1 none.
        (_mutated(v=2), "The request lacks the field policy."),
        (_mutated(policy={}), "The request has the unknown field policy."),
        (
            _mutated(type="teaagent.approval"),
            "The request has type 'teaagent.approval' instead of 'teaagent.request'.",
        ),
        (_mutated(request_id="abc"), "The request_id is not 32 lowercase hexadecimal characters."),
        (_mutated(origin="Alpha"), "The origin 'Alpha' is not a valid agent id."),
        (_mutated(run_id=7), "The request's run_id is not a string of at most 256 characters."),
        (_mutated(call_id="x" * 257), "The request's call_id is not a string of at most 256 characters."),
        (_mutated(tool_name=""), "The request's tool_name is empty."),
        (_mutated(arguments=[]), "The request's arguments are not a JSON object."),
        (_mutated(reason=None), "The request's reason is not a string."),
        (
            _mutated(created_at=float(NOW)),
            "The request's created_at and expires_at are not integer Unix times.",
        ),
        (
            _mutated(expires_at=NOW),
            "The request's expires_at is not between 1 and 86400 seconds after its created_at.",
        ),
        (
            _mutated(expires_at=NOW + 86401),
            "The request's expires_at is not between 1 and 86400 seconds after its created_at.",
        ),
        (_mutated(peers=[]), "The request's peers are not a non-empty list of agent ids."),
        (_mutated(peers=["beta", "Gamma"]), "The request's peers are not a non-empty list of agent ids."),
        (_mutated(peers=["gamma", "beta"]), "The request's peers are not sorted and unique."),
        (_mutated(peers=["beta", "beta", "gamma"]), "The request's peers are not sorted and unique."),
        (_mutated(peers=["alpha", "beta"]), "The request's origin alpha is among its own peers."),
        (
            _mutated(required_approvals=0),
            "The request's required_approvals is not an integer between 1 and 3.",
        ),
        (
            _mutated(required_approvals=4),
            "The request's required_approvals is not an integer between 1 and 3.",
        ),
        (
            _mutated(required_approvals=2.0),
            "The request's required_approvals is not an integer between 1 and 3.",
        ),
        (
            _mutated(payload_digest="sha256:XYZ"),
            "The request's payload_digest is not sha256: followed by 64 lowercase hexadecimal characters.",
        ),
        (
            _mutated(payload_digest="sha256:" + "0" * 64),
            "The request's payload_digest does not match its tool_name and arguments.",
        ),
        (
            _mutated(arguments={"command": "rm -rf /"}),
            "The request's payload_digest does not match its tool_name and arguments.",
        ),
        (
            _mutated(arguments={"x": float("nan")}),
            "The request's arguments cannot be written as canonical JSON.",
        ),
    ],
)
def test_validate_request_names_the_first_problem(request_doc: Any, message: str) -> None:
    with pytest.raises(QuorumError, match="^" + re.escape(message) + "$"):
        validate_request(request_doc)


def test_validate_request_accepts_the_limits() -> None:
    validate_request(_mutated(expires_at=NOW + 1))
    validate_request(_mutated(expires_at=NOW + 86400))
    validate_request(_mutated(required_approvals=3))
    validate_request(_mutated(call_id="x" * 256))


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
        evaluate(_mutated(peers=...), [], [], CONFIG, now=NOW)


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


_JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@given(value=_JSON)
def test_canonical_equals_rfc8785_for_any_json_value(value: Any) -> None:
    try:
        expected = rfc8785.dumps(value)
    except Exception:  # a lone surrogate, an integer beyond I-JSON: refused by both
        with pytest.raises(ValueError, match="cannot be written as canonical JSON"):
            canonical(value)
        return
    assert canonical(value) == expected


def test_canonical_sorts_keys_by_utf16_code_units_where_code_points_differ() -> None:
    # U+1F600 sorts after U+FF61 by code point, before it by UTF-16 code unit (D83D < FF61),
    # which is RFC 8785's order (3.2.3): such keys take the full encoder.
    value = {"\uff61": 2, "\U0001f600": 1, "a": [1, "é", None, True]}
    assert canonical(value) == rfc8785.dumps(value)
    assert canonical(value).index("\U0001f600".encode()) < canonical(value).index("\uff61".encode())
