"""The withdrawal of PROTOCOL.md: the origin's signed word that it no longer waits for a request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from teaagent.errors import QuorumError, SignatureError, StatementMismatchError, StatementTimeError
from teaagent.quorum._documents import (
    WITHDRAWAL_NAMESPACE,
    WITHDRAWAL_TYPE,
    copied,
    dated_ahead,
    is_time,
    signing_time,
    statement_bytes,
    wire_signature,
)
from teaagent.quorum._keys import keys_given, signing_key
from teaagent.quorum._request import validate_request
from teaagent.quorum._statements import check_rebuilt
from teaagent.signing import Signer, sshsig_sign
from teaagent.trust import SignerKey

__all__ = [
    "check_withdrawal_time",
    "sign_withdrawal",
    "verify_withdrawal",
    "withdrawal_problem",
    "withdrawal_statement",
]


def withdrawal_statement(request: Mapping[str, Any], withdrawn_at: int) -> dict[str, Any]:
    """Build the withdrawal the origin signs when it no longer waits for a request (PROTOCOL.md, Withdrawal).

    Every field but ``withdrawn_at`` is copied from the request, so a receiver rebuilds the
    statement from the request it holds and compares it with the carried one.

    Args:
        request: The request document (assumed well formed; see :func:`validate_request`).
        withdrawn_at: The time of the withdrawal, integer Unix seconds.

    Returns:
        ``{"v", "type": "teaagent.withdrawal", "request_id", "origin", "payload_digest",
        "expires_at", "withdrawn_at"}``; its signed bytes are :func:`statement_bytes` of it.

    Raises:
        ValueError: ``withdrawn_at`` is not an integer Unix time.
    """
    if not is_time(withdrawn_at):
        raise ValueError(f"withdrawn_at {withdrawn_at!r} is not an integer Unix time")
    return copied(WITHDRAWAL_TYPE, request, {}, {"withdrawn_at": withdrawn_at})


def sign_withdrawal(
    request: Mapping[str, Any], key: Signer, withdrawn_at: int | None = None
) -> dict[str, Any]:
    """Withdraw a request as its origin: sign its withdrawal, namespace ``teaagent-withdrawal``.

    Args:
        request: The request document the origin signed.
        key: The origin's signing key (the key that signed the request).
        withdrawn_at: The time of the withdrawal in integer Unix seconds; the clock when None.

    Returns:
        ``{"statement": <withdrawal>, "signature": <bare base64>}``.

    Raises:
        QuorumError: The request is malformed.
        ValueError: ``withdrawn_at`` is malformed.
        SignatureError: The key cannot sign.
    """
    validate_request(request)
    statement = withdrawal_statement(request, signing_time(withdrawn_at))
    signature = sshsig_sign(statement_bytes(statement), key, WITHDRAWAL_NAMESPACE)
    return {"statement": statement, "signature": wire_signature(signature)}


def withdrawal_problem(request: Mapping[str, Any], statement: object) -> str | None:
    """Return why ``statement`` is not a withdrawal of ``request``, or None when it is one.

    The statement is rebuilt from the request with the carried ``withdrawn_at`` and compared
    field by field, types included (``1 == True == 1.0`` in Python, not in a signed document).

    Args:
        request: The request as this node stores it (well formed).
        statement: The carried withdrawal, as parsed from JSON.

    Returns:
        One clause naming the first problem, or None.
    """
    if not isinstance(statement, Mapping):
        return "the withdrawal is not a JSON object"
    if statement.get("type") != WITHDRAWAL_TYPE:
        return f"the statement's type is not {WITHDRAWAL_TYPE}"
    withdrawn_at = statement.get("withdrawn_at")
    if not is_time(withdrawn_at):
        return "the withdrawal's withdrawn_at is not an integer Unix time"
    assert isinstance(withdrawn_at, int)
    try:
        check_rebuilt(statement, withdrawal_statement(request, withdrawn_at), noun="withdrawal")
    except StatementMismatchError as exc:
        return exc.clause
    return None


def check_withdrawal_time(withdrawn_at: int, now: float) -> None:
    """Require a withdrawal not dated beyond the clock skew in this node's future (PROTOCOL.md rule 4).

    A withdrawal may come after its request expired (the origin stopped waiting then), so its
    time has no other bound.

    Raises:
        StatementTimeError: ``The withdrawal is dated <when>, more than 60 seconds in the future.``
    """
    ahead = dated_ahead(withdrawn_at, now, subject="the withdrawal")
    if ahead is not None:
        raise StatementTimeError(ahead)


def verify_withdrawal(
    request: Mapping[str, Any],
    statement: Mapping[str, Any],
    signature: str,
    keys: Sequence[SignerKey] | str,
) -> dict[str, Any]:
    """Check a withdrawal of ``request`` signed by its origin; return the statement rebuilt from the request.

    Steps (PROTOCOL.md, Withdrawal):

    1. the carried statement equals the withdrawal rebuilt from the request (every field, its type);
    2. the signature is an SSHSIG in namespace ``teaagent-withdrawal`` made by one of ``keys``
       (all the origin's keys in the verifier's own configuration, never the first alone),
       allowed by its namespaces and validity to sign at ``withdrawn_at``, over the rebuilt
       statement's canonical bytes.

    Args:
        request: The request as the verifier stores it (well formed).
        statement: The carried withdrawal.
        signature: The SSHSIG over its canonical bytes, bare base64 or armored.
        keys: The keys of the request's origin (``NodeConfig.peers[origin].keys``), or one
            public key line without limits.

    Returns:
        The rebuilt statement (what the signature covers; keep it, not the carried one).

    Raises:
        QuorumError: The statement is not a withdrawal of this request.
        SignatureError: The signature is malformed, was made by a key that is not one of ``keys``
            or that may not sign withdrawals at ``withdrawn_at``, or does not verify.
    """
    problem = withdrawal_problem(request, statement)
    if problem is not None:
        raise QuorumError(problem[0].upper() + problem[1:] + ".")
    rebuilt = withdrawal_statement(request, statement["withdrawn_at"])
    if not isinstance(signature, str):
        raise SignatureError("the signature is not a string.")
    signing_key(
        statement_bytes(rebuilt),
        signature,
        keys_given(keys),
        WITHDRAWAL_NAMESPACE,
        rebuilt["withdrawn_at"],
        whose=f"the keys of {request['origin']}",
    )
    return rebuilt
