"""The withdrawal document of PROTOCOL.md: built from the request, signed by the origin, checked exactly."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from relay_support import shell_request

from teaagent.errors import QuorumError, SignatureError, StatementTimeError
from teaagent.quorum import (
    WITHDRAWAL_NAMESPACE,
    WITHDRAWAL_TYPE,
    check_signing_time,
    check_withdrawal_time,
    request_time_problem,
    sign_withdrawal,
    statement_bytes,
    verify_withdrawal,
    withdrawal_problem,
    withdrawal_statement,
)
from teaagent.signing import SSHPrivateKey, parse_sshsig, signature_to_wire, sshsig_sign
from teaagent.trust import MultiSigQuorumConfig, SignerKey

NOW = 1_764_570_000
KEYS = {
    name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate()) for name in ("alpha", "beta", "gamma")
}


def keys_of(name: str) -> tuple[SignerKey, ...]:
    return (SignerKey(line=KEYS[name].public_key.to_line(), source=f"peers.{name}"),)


CONFIG = MultiSigQuorumConfig(
    enabled=True,
    required_approvals=2,
    peer_agent_ids=["beta", "gamma"],
    peer_public_keys={name: KEYS[name].public_key.to_line() for name in ("beta", "gamma")},
    peer_relay_urls={"beta": "http://127.0.0.1:8702", "gamma": "http://127.0.0.1:8703"},
    local_relay_base_url="http://127.0.0.1:8701",
    high_risk_patterns=["shell.*"],
    timeout_seconds=120,
)
REQUEST = shell_request(
    CONFIG, "rm -rf build", reason="stale", now=NOW, request_id="0123456789abcdef0123456789abcdef"
)


def test_the_withdrawal_has_exactly_the_protocol_fields() -> None:
    statement = withdrawal_statement(REQUEST, NOW + 10)
    assert statement == {
        "v": 1,
        "type": WITHDRAWAL_TYPE,
        "request_id": REQUEST["request_id"],
        "origin": "alpha",
        "payload_digest": REQUEST["payload_digest"],
        "expires_at": NOW + 120,
        "withdrawn_at": NOW + 10,
    }
    assert statement_bytes(statement) == (
        b'{"expires_at":1764570120,"origin":"alpha","payload_digest":"'
        + REQUEST["payload_digest"].encode()
        + b'","request_id":"0123456789abcdef0123456789abcdef","type":"teaagent.withdrawal","v":1,'
        b'"withdrawn_at":1764570010}'
    )
    with pytest.raises(ValueError, match=r"withdrawn_at 1\.5 is not an integer Unix time"):
        withdrawal_statement(REQUEST, 1.5)  # type: ignore[arg-type]


def test_a_withdrawal_verifies_with_the_origin_key_and_nothing_else() -> None:
    signed = sign_withdrawal(REQUEST, KEYS["alpha"], withdrawn_at=NOW + 10)
    assert parse_sshsig(signed["signature"]).namespace == WITHDRAWAL_NAMESPACE
    # Genuine: passes, and the statement returned is the one rebuilt from the request.
    assert (
        verify_withdrawal(REQUEST, signed["statement"], signed["signature"], keys_of("alpha"))
        == signed["statement"]
    )
    # Wrong key: another node cannot withdraw alpha's request.
    forged = sign_withdrawal(REQUEST, KEYS["beta"], withdrawn_at=NOW + 10)
    with pytest.raises(SignatureError, match="was made by key"):
        verify_withdrawal(REQUEST, forged["statement"], forged["signature"], keys_of("alpha"))
    # Tampered time: the signature no longer covers the statement.
    later = dict(signed["statement"], withdrawn_at=NOW + 11)
    with pytest.raises(SignatureError, match="bad signature"):
        verify_withdrawal(REQUEST, later, signed["signature"], keys_of("alpha"))
    # Another namespace: an approval-namespace signature over the same bytes is no withdrawal.
    replayed = signature_to_wire(
        sshsig_sign(statement_bytes(signed["statement"]), KEYS["alpha"], "teaagent-request")
    )
    with pytest.raises(SignatureError, match="namespace"):
        verify_withdrawal(REQUEST, signed["statement"], replayed, keys_of("alpha"))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"payload_digest": "sha256:" + "0" * 64}, "the withdrawal's payload_digest does not match request"),
        ({"expires_at": NOW + 121}, "the withdrawal's expires_at does not match request"),
        ({"origin": "beta"}, "the withdrawal's origin does not match request"),
        ({"v": True}, "the withdrawal's v does not match request"),
        ({"type": "teaagent.approval"}, "the statement's type is not teaagent.withdrawal"),
        ({"withdrawn_at": "1764570010"}, "the withdrawal's withdrawn_at is not an integer Unix time"),
        ({"extra": 1}, "the withdrawal has the unknown field extra"),
    ],
)
def test_a_withdrawal_that_does_not_match_its_request_is_refused(
    change: dict[str, Any], problem: str
) -> None:
    signed = sign_withdrawal(REQUEST, KEYS["alpha"], withdrawn_at=NOW + 10)
    statement = dict(signed["statement"], **change)
    assert withdrawal_problem(REQUEST, statement) is not None
    assert problem in str(withdrawal_problem(REQUEST, statement))
    with pytest.raises(QuorumError, match=problem[:1].upper() + problem[1:]):
        verify_withdrawal(REQUEST, statement, signed["signature"], keys_of("alpha"))


def test_a_withdrawal_lacking_a_field_is_refused() -> None:
    statement = withdrawal_statement(REQUEST, NOW + 10)
    del statement["payload_digest"]
    assert withdrawal_problem(REQUEST, statement) == "the withdrawal lacks the field payload_digest"


def test_a_withdrawal_may_be_dated_up_to_the_clock_skew_ahead_and_no_further() -> None:
    check_withdrawal_time(NOW + 60, NOW)  # rule 4's skew, inclusive
    check_withdrawal_time(NOW + 10_000, NOW + 9_990)  # long after its request expired: no bound
    with pytest.raises(StatementTimeError) as raised:
        check_withdrawal_time(NOW + 61, NOW)
    assert str(raised.value) == (
        "The withdrawal is dated 2025-12-01 06:21:01Z, in 1m 01s, more than 60 seconds in the future."
    )


def test_a_request_created_beyond_the_clock_skew_ahead_is_refused() -> None:
    created = REQUEST["created_at"]
    assert request_time_problem(REQUEST, created - 60) is None
    assert request_time_problem(REQUEST, created - 61) == (
        f"request {REQUEST['request_id']} was created at 2025-12-01 06:20:00Z, in 1m 01s, more than 60 "
        "seconds ahead of this node's clock"
    )
    with pytest.raises(StatementTimeError, match=r"^It is dated .*, in 1m 01s, more than 60 seconds in the"):
        check_signing_time(created + 61, REQUEST, created, subject="it")


def test_ssh_keygen_verifies_a_withdrawal(tmp_path: Path) -> None:
    signed = sign_withdrawal(REQUEST, KEYS["alpha"], withdrawn_at=NOW + 10)
    data = tmp_path / "withdrawal.json"
    data.write_bytes(statement_bytes(signed["statement"]))
    (tmp_path / "allowed").write_text(f"alpha {KEYS['alpha'].public_key.to_line()}\n")
    sig = tmp_path / "withdrawal.sig"
    body = signed["signature"]
    lines = [body[i : i + 70] for i in range(0, len(body), 70)]
    sig.write_text("-----BEGIN SSH SIGNATURE-----\n" + "\n".join(lines) + "\n-----END SSH SIGNATURE-----\n")
    result = subprocess.run(
        [
            "ssh-keygen",
            "-Y",
            "verify",
            "-f",
            str(tmp_path / "allowed"),
            "-I",
            "alpha",
            "-n",
            WITHDRAWAL_NAMESPACE,
            "-s",
            str(sig),
        ],
        stdin=data.open("rb"),
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
