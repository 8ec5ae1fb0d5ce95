"""teaagent.quorum: the documents of PROTOCOL.md (requests, statements, their bytes and signatures).

Keys are made in-process (``cryptography``) so these tests start no process; the interop with
OpenSSH's own ``ssh-keygen`` is in ``test_quorum_interop.py``. The counting rules are in
``test_quorum_counting.py``, quorum certificates in ``test_quorum_certificate.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
import rfc8785
from hypothesis import given
from hypothesis import strategies as st
from quorum_support import (
    CONFIG,
    KEYS,
    NOW,
    REQUEST,
    TIMEOUT,
    approve,
    deny,
    full,
    line,
    make_request,
    mutated,
)

from teaagent.errors import QuorumError, SignatureError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    REQUEST_NAMESPACE,
    approval_statement,
    build_certificate,
    build_request,
    canonical,
    denial_statement,
    payload_digest,
    request_statement,
    sign_request,
    statement_bytes,
    validate_request,
    verify_request_signature,
    wire_signature,
)
from teaagent.signing import armor, parse_sshsig, sshsig_sign

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


@pytest.mark.parametrize(
    ("request_doc", "message"),
    [
        ([], "The request is not a JSON object."),
        (mutated(reason=...), "The request lacks the field reason."),
        (mutated(extra=1), "The request has the unknown field extra."),
        (mutated(v=3), "The request has version 3, but only versions 1 and 2 are known."),
        (mutated(v=True), "The request has version True, but only versions 1 and 2 are known."),
        # Version 2 carries a policy; version 1 none.
        (mutated(v=2), "The request lacks the field policy."),
        (mutated(policy={}), "The request has the unknown field policy."),
        (
            mutated(type="teaagent.approval"),
            "The request has type 'teaagent.approval' instead of 'teaagent.request'.",
        ),
        (mutated(request_id="abc"), "The request_id is not 32 lowercase hexadecimal characters."),
        (mutated(origin="Alpha"), "The origin 'Alpha' is not a valid agent id."),
        (mutated(run_id=7), "The request's run_id is not a string of at most 256 characters."),
        (mutated(call_id="x" * 257), "The request's call_id is not a string of at most 256 characters."),
        (mutated(tool_name=""), "The request's tool_name is empty."),
        (mutated(arguments=[]), "The request's arguments are not a JSON object."),
        (mutated(reason=None), "The request's reason is not a string."),
        (
            mutated(created_at=float(NOW)),
            "The request's created_at and expires_at are not integer Unix times.",
        ),
        (
            mutated(expires_at=NOW),
            "The request's expires_at is not between 1 and 86400 seconds after its created_at.",
        ),
        (
            mutated(expires_at=NOW + 86401),
            "The request's expires_at is not between 1 and 86400 seconds after its created_at.",
        ),
        (mutated(peers=[]), "The request's peers are not a non-empty list of agent ids."),
        (mutated(peers=["beta", "Gamma"]), "The request's peers are not a non-empty list of agent ids."),
        (mutated(peers=["gamma", "beta"]), "The request's peers are not sorted and unique."),
        (mutated(peers=["beta", "beta", "gamma"]), "The request's peers are not sorted and unique."),
        (mutated(peers=["alpha", "beta"]), "The request's origin alpha is among its own peers."),
        (
            mutated(required_approvals=0),
            "The request's required_approvals is not an integer between 1 and 3.",
        ),
        (
            mutated(required_approvals=4),
            "The request's required_approvals is not an integer between 1 and 3.",
        ),
        (
            mutated(required_approvals=2.0),
            "The request's required_approvals is not an integer between 1 and 3.",
        ),
        (
            mutated(payload_digest="sha256:XYZ"),
            "The request's payload_digest is not sha256: followed by 64 lowercase hexadecimal characters.",
        ),
        (
            mutated(payload_digest="sha256:" + "0" * 64),
            "The request's payload_digest does not match its tool_name and arguments.",
        ),
        (
            mutated(arguments={"command": "rm -rf /"}),
            "The request's payload_digest does not match its tool_name and arguments.",
        ),
        (
            mutated(arguments={"x": float("nan")}),
            "The request's arguments cannot be written as canonical JSON.",
        ),
    ],
)
def test_validate_request_names_the_first_problem(request_doc: Any, message: str) -> None:
    with pytest.raises(QuorumError, match="^" + re.escape(message) + "$"):
        validate_request(request_doc)


def test_validate_request_accepts_the_limits() -> None:
    validate_request(mutated(expires_at=NOW + 1))
    validate_request(mutated(expires_at=NOW + 86400))
    validate_request(mutated(required_approvals=3))
    validate_request(mutated(call_id="x" * 256))


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
