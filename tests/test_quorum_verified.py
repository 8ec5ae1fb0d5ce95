"""``teaagent.quorum.VerifiedRequest``: built only by ``verify_request``, immutable, the judge of a relay.

PROTOCOL.md "What an approving node decides on": whatever an approver shows, matches or signs comes
from the request after its signature verified against the origin's keys. The type makes that the
only thing that can be written: these tests hold its three promises (nobody else builds it, nobody
changes it, and it says where a relay's description differs from it).

The statement rules follow (written once in teaagent.quorum): a carried statement must be the one
rebuilt from its request (rule 3) and signed within the request's life (rule 4); each refusal is a
typed StatementError that the relay and the approver map to their answers.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from relay_support import public_line, signer

from teaagent.errors import (
    QuorumError,
    SignatureError,
    StatementError,
    StatementMismatchError,
    StatementTimeError,
)
from teaagent.quorum import (
    DEV_SIGNATURE_PREFIX,
    MAX_CLOCK_SKEW_SECONDS,
    VerifiedRequest,
    approval_statement,
    build_request,
    check_rebuilt,
    check_signing_time,
    decision_kind,
    denial_statement,
    dev_signature_allowed,
    dev_signature_passes,
    is_dev_signature,
    rebuild_decision,
    sign_request,
    stated_kind,
    verify_request,
    withdrawal_problem,
    withdrawal_statement,
)
from teaagent.trust import MultiSigQuorumConfig, SignerKey

ALPHA = (SignerKey(line=public_line("alpha")),)


def a_request(now: float | None = None, request_id: str | None = None) -> dict[str, Any]:
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=1,
        peer_agent_ids=["beta", "gamma"],
        peer_public_keys={"beta": public_line("beta"), "gamma": public_line("gamma")},
        peer_relay_urls={"beta": "http://127.0.0.1:1", "gamma": "http://127.0.0.1:2"},
        high_risk_patterns=["shell.*"],
    )
    return build_request(
        origin="alpha",
        run_id="run-1",
        call_id="call-1",
        tool_name="shell.run",
        arguments={"command": "rm -rf /", "flags": ["-v"]},
        reason="clean up",
        config=config,
        now=now,
        request_id=request_id,
    )


def test_only_verify_request_builds_one() -> None:
    request = a_request()
    with pytest.raises(
        TypeError, match=r"^a VerifiedRequest is built only by teaagent\.quorum\.verify_request\(\)\.$"
    ):
        VerifiedRequest(object(), request, "sig")
    verified = verify_request(request, sign_request(request, signer("alpha")), ALPHA, recipient="beta")
    assert verified.tool_name == "shell.run"
    assert verified.arguments == request["arguments"]
    assert verified.document() == request
    assert verified.peers == ("beta", "gamma")


def test_what_it_holds_cannot_be_changed_through_it_or_through_the_dict_it_came_from() -> None:
    request = a_request()
    verified = verify_request(request, sign_request(request, signer("alpha")), ALPHA)
    request["arguments"]["command"] = "echo hello"  # the caller's dict, changed after
    shown = verified.arguments
    shown["command"] = "echo hello"  # a copy handed out, changed
    verified.document()["tool_name"] = "fs.read"
    with pytest.raises(AttributeError, match="immutable"):
        verified.tool_name = "fs.read"  # type: ignore[misc]
    assert verified.arguments == {"command": "rm -rf /", "flags": ["-v"]}
    assert verified.document()["tool_name"] == "shell.run"
    assert verified.approval("beta", 5) == approval_statement(verified.document(), "beta", 5)
    assert verified.denial("beta", 5, "no") == denial_statement(verified.document(), "beta", 5, "no")


def test_it_is_refused_unless_signed_by_a_key_of_the_origin_and_addressed_here() -> None:
    request = a_request()
    good = sign_request(request, signer("alpha"))
    with pytest.raises(SignatureError, match=r"does not verify with the keys configured for alpha"):
        verify_request(request, sign_request(request, signer("gamma")), ALPHA)
    with pytest.raises(QuorumError, match=r"is not addressed to delta\.$"):
        verify_request(request, good, ALPHA, recipient="delta")
    with pytest.raises(QuorumError, match=r"is not addressed to alpha\.$"):
        verify_request(request, good, ALPHA, recipient="alpha")
    tampered = copy.deepcopy(request)
    tampered["arguments"]["command"] = "echo hello"
    with pytest.raises(QuorumError, match="payload_digest does not match"):
        verify_request(tampered, good, ALPHA)
    with pytest.raises(SignatureError, match="development signature"):
        verify_request(request, "dev:alpha", ALPHA)
    assert verify_request(request, "dev:alpha", ALPHA, allow_dev=True).development


@pytest.mark.parametrize(
    ("said", "clause"),
    [
        (
            {"tool_name": "fs.read"},
            'the relay says its tool_name is "fs.read", the signed request says "shell.run"',
        ),
        ({"arguments": {"command": "echo hello", "flags": ["-v"]}}, "the relay says its arguments is"),
        ({"peers": ["gamma", "beta"]}, "the relay says its peers is"),
        ({"required_approvals": True}, "the relay says its required_approvals is true"),
        ({"created_at": 1.5}, "the relay says its created_at is 1.5"),
        ({"request_id": "0" * 32}, "the relay says its request_id is"),
    ],
)
def test_a_relay_description_that_differs_in_any_field_or_type_is_named(
    said: dict[str, Any], clause: str
) -> None:
    request = a_request()
    verified = verify_request(request, sign_request(request, signer("alpha")), ALPHA)
    assert (verified.disagreement(said) or "").startswith(clause)


def test_a_relay_description_that_agrees_or_says_nothing_is_no_disagreement() -> None:
    request = a_request()
    verified = verify_request(request, sign_request(request, signer("alpha")), ALPHA)
    described = {name: value for name, value in request.items() if name not in ("v", "type")}
    assert verified.disagreement(described) is None
    assert verified.disagreement({"state": "approved", "seconds_left": 3}) is None
    assert verified.disagreement({}) is None
    assert verified.is_document(copy.deepcopy(request))
    assert not verified.is_document({**request, "reason": "other"})


# -- the statement rules ----------------------------------------------------------------------------

REQUEST = a_request(now=1_764_570_000, request_id="0123456789abcdef0123456789abcdef")  # fixed: in test ids
NOW = REQUEST["created_at"]
RID = REQUEST["request_id"]
EXPIRES = REQUEST["expires_at"]


def test_a_statement_equal_to_the_one_rebuilt_passes() -> None:
    rebuilt = approval_statement(REQUEST, "beta", NOW + 5)

    check_rebuilt(dict(rebuilt), rebuilt)  # no exception
    assert rebuild_decision(REQUEST, dict(rebuilt), "approval", "beta") == rebuilt


@pytest.mark.parametrize(
    ("change", "clause"),
    [
        ({"tool_name": "shell.other"}, f"the statement's tool_name does not match request {RID}"),
        ({"v": True}, f"the statement's v does not match request {RID}"),  # 1 == True, but not in JSON
        ({"expires_at": float(EXPIRES)}, f"the statement's expires_at does not match request {RID}"),
        ({"note": "x"}, "the statement has the unknown field note"),
        ({"payload_digest": None}, "the statement lacks the field payload_digest"),
    ],
)
def test_a_tampered_statement_fails_with_the_typed_error_naming_the_field(
    change: dict[str, Any], clause: str
) -> None:
    rebuilt = approval_statement(REQUEST, "beta", NOW + 5)
    carried = {**rebuilt, **change}
    carried = {name: value for name, value in carried.items() if value is not None}

    with pytest.raises(StatementMismatchError) as raised:
        check_rebuilt(carried, rebuilt)

    assert raised.value.clause == clause
    assert str(raised.value) == clause[0].upper() + clause[1:] + "."
    assert isinstance(raised.value, StatementError)
    assert isinstance(raised.value, QuorumError)  # the quorum error family


def test_the_mismatch_names_the_request_and_the_document_as_the_caller_says() -> None:
    rebuilt = withdrawal_statement(REQUEST, NOW + 5)

    with pytest.raises(
        StatementMismatchError, match=r"^The withdrawal's origin does not match the request\.$"
    ):
        check_rebuilt({**rebuilt, "origin": "beta"}, rebuilt, noun="withdrawal", against="the request")
    with pytest.raises(StatementMismatchError, match=r"^The statement is not a JSON object\.$"):
        check_rebuilt(["not", "an", "object"], rebuilt)
    # withdrawal_problem reads the same rule and answers its clause.
    assert withdrawal_problem(REQUEST, {**rebuilt, "origin": "beta"}) == (
        f"the withdrawal's origin does not match request {RID}"
    )


def test_the_kind_is_read_from_the_type_only_when_it_is_one_of_the_two() -> None:
    assert decision_kind(approval_statement(REQUEST, "beta", NOW)) == "approval"
    assert decision_kind(denial_statement(REQUEST, "beta", NOW, "no")) == "denial"
    for declared in ("teaagent.request", None, ["teaagent.approval"]):
        with pytest.raises(StatementMismatchError, match=r"type is neither teaagent\.approval nor"):
            decision_kind({"type": declared})


def test_the_kind_a_statement_states_names_a_denial_by_the_protocols_type() -> None:
    from teaagent.approver_client._client import _Calls

    denial = denial_statement(REQUEST, "beta", NOW, "no")
    assert (stated_kind(denial), stated_kind(approval_statement(REQUEST, "beta", NOW))) == (
        "denial",
        "approval",
    )
    assert stated_kind({"type": "teaagent.request"}) == "approval"  # words only: decision_kind checks
    submitted = _Calls.submit_decision(REQUEST["request_id"], denial, "sig", None)
    assert submitted.what == f"the signed denial of request {REQUEST['request_id']}"


@pytest.mark.parametrize(
    ("carried", "kind", "message"),
    [
        ({"signed_at": True}, "approval", "The statement's signed_at is not an integer Unix time."),
        ({"signed_at": float(NOW)}, "approval", "The statement's signed_at is not an integer Unix time."),
        ({"signed_at": NOW, "reason": 3}, "denial", "The denial's reason is not a string."),
        ({"signed_at": -1}, "approval", "Signed_at -1 is not an integer Unix time."),
        ({"signed_at": NOW}, "denial", "The denial's reason is not a string."),
    ],
)
def test_rebuild_decision_refuses_what_cannot_be_rebuilt(
    carried: dict[str, Any], kind: Any, message: str
) -> None:
    with pytest.raises(StatementMismatchError) as raised:
        rebuild_decision(REQUEST, carried, kind, "beta")

    assert str(raised.value) == message


def test_rebuild_decision_keeps_a_denials_reason_and_refuses_one_on_an_approval() -> None:
    signed = denial_statement(REQUEST, "beta", NOW, "too risky")
    approval_with_reason = {**approval_statement(REQUEST, "beta", NOW), "reason": "x"}

    assert rebuild_decision(REQUEST, signed, "denial", "beta") == signed
    with pytest.raises(StatementMismatchError, match=r"^The statement has the unknown field reason\.$"):
        rebuild_decision(REQUEST, approval_with_reason, "approval", "beta")
    with pytest.raises(StatementMismatchError, match=r"^The statement's signer does not match request"):
        rebuild_decision(REQUEST, signed, "denial", "gamma")


def test_a_verified_request_rebuilds_from_the_document_that_verified() -> None:
    request = dict(REQUEST)
    verified = verify_request(request, sign_request(request, signer("alpha")), ALPHA, recipient="beta")
    request["tool_name"] = "shell.changed-after-verification"  # the caller's dict is not what verified
    signed = approval_statement(REQUEST, "beta", NOW + 1)

    assert verified.rebuild_decision(signed, "approval", "beta") == signed
    with pytest.raises(StatementMismatchError, match="tool_name"):
        verified.rebuild_decision(approval_statement(request, "beta", NOW + 1), "approval", "beta")


@pytest.mark.parametrize(
    ("signed_at", "now", "words"),
    [
        (NOW - MAX_CLOCK_SKEW_SECONDS - 1, NOW, "more than 60 seconds before the request was created at"),
        (EXPIRES + 1, EXPIRES + 80, "after the request expired at"),
        (NOW + 100, NOW + 100 - MAX_CLOCK_SKEW_SECONDS - 1, "more than 60 seconds in the future"),
    ],
)
def test_a_statement_signed_outside_the_requests_life_fails_with_the_time_error(
    signed_at: int, now: int, words: str
) -> None:
    with pytest.raises(StatementTimeError, match=words) as raised:
        check_signing_time(signed_at, REQUEST, now)
    assert str(raised.value).startswith("The statement ")

    with pytest.raises(StatementTimeError) as as_clause:
        check_signing_time(signed_at, REQUEST, now, subject="it")
    assert as_clause.value.clause.startswith("it ")


def test_a_statement_signed_within_the_requests_life_passes() -> None:
    for signed_at in (NOW - MAX_CLOCK_SKEW_SECONDS, NOW, EXPIRES):
        check_signing_time(signed_at, REQUEST, EXPIRES)  # no exception


def test_a_development_signature_passes_only_when_allowed_and_exactly_for_its_signer() -> None:
    assert DEV_SIGNATURE_PREFIX == "dev:"
    assert is_dev_signature("dev:beta")
    assert not is_dev_signature("U1NIU0lH")
    assert dev_signature_allowed("dev:beta", "beta", allow_dev=True)
    assert not dev_signature_allowed("dev:beta", "beta", allow_dev=False)  # never by default
    assert not dev_signature_allowed("dev:gamma", "beta", allow_dev=True)
    assert not dev_signature_allowed("dev:", "", allow_dev=False)


def test_dev_signature_passes_says_verify_pass_or_refuse(caplog: pytest.LogCaptureFixture) -> None:
    words = {"subject": "The approval", "whose": "beta's configured key", "on": f"request {RID}"}

    assert not dev_signature_passes("U1NIU0lH", "beta", allow_dev=True, **words)  # a real one: verify it
    with caplog.at_level("WARNING", logger="teaagent.quorum"):
        assert dev_signature_passes("dev:beta", "beta", allow_dev=True, **words)
    assert f"development signature of beta on request {RID} without any cryptography" in caplog.text
    for signature, allow_dev in (("dev:beta", False), ("dev:gamma", True)):
        with pytest.raises(
            SignatureError,
            match=r"^The approval is a development signature, which beta's configured key cannot verify\.$",
        ):
            dev_signature_passes(signature, "beta", allow_dev=allow_dev, **words)
