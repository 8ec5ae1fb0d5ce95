"""``teaagent.quorum.VerifiedRequest``: built only by ``verify_request``, immutable, the judge of a relay.

PROTOCOL.md "What an approving node decides on": whatever an approver shows, matches or signs comes
from the request after its signature verified against the origin's keys. The type makes that the
only thing that can be written: these tests hold its three promises (nobody else builds it, nobody
changes it, and it says where a relay's description differs from it).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from relay_support import public_line, signer

from teaagent.errors import QuorumError, SignatureError
from teaagent.quorum import (
    VerifiedRequest,
    approval_statement,
    build_request,
    denial_statement,
    sign_request,
    verify_request,
)
from teaagent.trust import MultiSigQuorumConfig, SignerKey

ALPHA = (SignerKey(line=public_line("alpha")),)


def a_request(**arguments: Any) -> dict[str, Any]:
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
        arguments=arguments or {"command": "rm -rf /", "flags": ["-v"]},
        reason="clean up",
        config=config,
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
