"""Approval and denial statements (PROTOCOL.md): building, signing, and the rules a carried one must keep.

A receiver never trusts a carried statement's fields: it rebuilds the statement from the request
it holds (:func:`approval_statement`, :func:`denial_statement`), requires the carried one to equal
it field by field, JSON types included (:func:`check_rebuilt`, rule 3), and dated within the
request's life (:func:`check_signing_time`, rule 4); then it verifies the signature over the
rebuilt bytes. Each rule raises a :class:`~teaagent.errors.StatementError` that a service maps to
its own answer (the relay and the approver: 422 ``invalid``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from teaagent._words import moment
from teaagent.errors import SignatureError, StatementMismatchError, StatementTimeError
from teaagent.quorum._documents import (
    APPROVAL_NAMESPACE,
    APPROVAL_TYPE,
    DENIAL_NAMESPACE,
    DENIAL_TYPE,
    MAX_CLOCK_SKEW_SECONDS,
    copied,
    dated_ahead,
    is_agent_id,
    is_int,
    is_time,
    signing_time,
    statement_bytes,
    wire_signature,
)
from teaagent.quorum._keys import signing_key
from teaagent.quorum._request import validate_request
from teaagent.signing import Signer, fingerprint, sshsig_sign
from teaagent.trust import PeerSignature, SignerKey

__all__ = [
    "DecisionKind",
    "approval_statement",
    "check_rebuilt",
    "check_signing_time",
    "decision_kind",
    "denial_statement",
    "rebuild_decision",
    "sign_approval",
    "sign_denial",
    "signed_at_of",
    "stated_kind",
    "verify_decision",
]

DecisionKind = Literal["approval", "denial"]
_KINDS: Final = {APPROVAL_TYPE: "approval", DENIAL_TYPE: "denial"}


def check_rebuilt(
    carried: object, rebuilt: Mapping[str, Any], *, noun: str = "statement", against: str | None = None
) -> None:
    """Require a carried statement to be the one rebuilt from its request (PROTOCOL.md rule 3).

    Every field is compared, its JSON type included (``1 == True == 1.0`` in Python, not in a
    signed document); a field too many or too few is a mismatch as well.

    Args:
        carried: The statement as received, parsed from JSON.
        rebuilt: The statement rebuilt from the request this node holds.
        noun: What the statement is, for the message (``statement``, ``withdrawal``).
        against: The request, for the message; ``request <its id>`` when None.

    Raises:
        StatementMismatchError: Naming the first field that differs, such as ``The statement's
            tool_name does not match request 0f3c....``
    """
    if not isinstance(carried, Mapping):
        raise StatementMismatchError(f"the {noun} is not a JSON object")
    for name in sorted(set(carried) | set(rebuilt)):
        if name not in rebuilt:
            raise StatementMismatchError(f"the {noun} has the unknown field {name}")
        if name not in carried:
            raise StatementMismatchError(f"the {noun} lacks the field {name}")
        mine, theirs = rebuilt[name], carried[name]
        if type(mine) is not type(theirs) or mine != theirs:
            request = f"request {rebuilt['request_id']}" if against is None else against
            raise StatementMismatchError(f"the {noun}'s {name} does not match {request}")


def decision_kind(statement: Mapping[str, Any]) -> DecisionKind:
    """The kind of decision a carried statement declares by its ``type``.

    Raises:
        StatementMismatchError: The type is neither ``teaagent.approval`` nor ``teaagent.denial``.
    """
    declared = statement.get("type")
    kind = _KINDS.get(declared) if isinstance(declared, str) else None
    if kind is None:
        raise StatementMismatchError(f"the statement's type is neither {APPROVAL_TYPE} nor {DENIAL_TYPE}")
    return kind  # type: ignore[return-value]


def stated_kind(statement: Mapping[str, Any]) -> DecisionKind:
    """The kind a statement states, for words only: ``denial`` for a denial's type, else ``approval``.

    Never a check: :func:`decision_kind` refuses any other type, and the rebuilt statement of the
    kind said here is what a check compares.
    """
    return "denial" if statement.get("type") == DENIAL_TYPE else "approval"


def rebuild_decision(
    request: Mapping[str, Any], statement: Mapping[str, Any], kind: DecisionKind, signer: str
) -> dict[str, Any]:
    """Rebuild ``signer``'s statement of ``kind`` from the request; require the carried one equal to it.

    Args:
        request: The request this node holds (well formed; for an approving node, verified).
        statement: The carried statement.
        kind: Its kind (:func:`decision_kind`).
        signer: Who it must be signed as, already checked against the request's peers.

    Returns:
        The rebuilt statement: what the signature must cover, and what is kept.

    Raises:
        StatementMismatchError: ``signed_at`` is not an integer, a denial's ``reason`` is not a
            string, the statement cannot be built, or it differs from the carried one.
    """
    signed_at = statement.get("signed_at")
    if not is_int(signed_at):
        raise StatementMismatchError("the statement's signed_at is not an integer Unix time")
    assert isinstance(signed_at, int)
    reason = statement.get("reason")
    try:
        if kind == "denial":
            if not isinstance(reason, str):
                raise StatementMismatchError("the denial's reason is not a string")
            rebuilt = denial_statement(request, signer, signed_at, reason)
        else:
            rebuilt = approval_statement(request, signer, signed_at)
    except ValueError as exc:
        raise StatementMismatchError(str(exc)) from exc
    check_rebuilt(statement, rebuilt)
    return rebuilt


def check_signing_time(
    signed_at: int, request: Mapping[str, Any], now: float, *, subject: str = "the statement"
) -> None:
    """Require a statement signed within its request's life and not ahead of this clock (PROTOCOL.md rule 4).

    From the request's creation less the clock skew to its expiry, and no more than the clock
    skew in ``now``'s future. The lower bound keeps a key whose valid-before has passed from
    back-dating its way into a request made after it.

    Args:
        signed_at: The statement's signing time.
        request: The request (its ``created_at`` and ``expires_at``).
        now: This node's clock.
        subject: The statement, for the message (``the statement``, ``it``).

    Raises:
        StatementTimeError: Saying which bound it crosses, with both times.
    """
    created_at, expires_at = request["created_at"], request["expires_at"]
    if signed_at < created_at - MAX_CLOCK_SKEW_SECONDS:
        raise StatementTimeError(
            f"{subject} was signed at {moment(signed_at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} "
            f"seconds before the request was created at {moment(created_at, now)}"
        )
    if signed_at > expires_at:
        raise StatementTimeError(
            f"{subject} was signed at {moment(signed_at, now)}, after the request expired at "
            f"{moment(expires_at, now)}"
        )
    ahead = dated_ahead(signed_at, now, subject=subject)
    if ahead is not None:
        raise StatementTimeError(ahead)


def verify_decision(statement: Mapping[str, Any], signature: str, keys: Sequence[SignerKey]) -> SignerKey:
    """Check a signed approval or denial statement against the keys of its signer.

    The namespace follows the statement's ``type`` and the key's limits its ``signed_at``. The
    statement itself is not compared with a request here: rebuild it from the request
    (:func:`approval_statement`, :func:`denial_statement`) and compare, as the relay does.

    Args:
        statement: The statement as signed.
        signature: The SSHSIG over its canonical bytes, bare base64 or armored.
        keys: The keys that may sign for the statement's signer.

    Returns:
        The key that signed.

    Raises:
        SignatureError: The statement is neither an approval nor a denial, has no integer
            ``signed_at``, cannot be written as canonical JSON, or its signature does not verify
            with any of ``keys`` (or was made by one that may not sign it then).
    """
    kind = statement.get("type")
    if kind == APPROVAL_TYPE:
        namespace = APPROVAL_NAMESPACE
    elif kind == DENIAL_TYPE:
        namespace = DENIAL_NAMESPACE
    else:
        raise SignatureError(f"the statement's type is neither {APPROVAL_TYPE} nor {DENIAL_TYPE}.")
    signed_at = statement.get("signed_at")
    if not isinstance(signed_at, int) or isinstance(signed_at, bool):
        raise SignatureError("the statement's signed_at is not an integer Unix time.")
    if not isinstance(signature, str):
        raise SignatureError("the signature is not a string.")
    try:
        data = statement_bytes(statement)
    except ValueError as exc:
        raise SignatureError(str(exc)) from None
    signer = statement.get("signer")
    return signing_key(data, signature, keys, namespace, signed_at, whose=f"the keys of {signer}")


def _statement(request: Mapping[str, Any], kind: str, signer: str, signed_at: int) -> dict[str, Any]:
    if not is_agent_id(signer):
        raise ValueError(f"the signer {signer!r} is not a valid agent id")
    if not is_time(signed_at):
        raise ValueError(f"signed_at {signed_at!r} is not an integer Unix time")
    return copied(
        kind, request, {"signer": signer, "tool_name": request["tool_name"]}, {"signed_at": signed_at}
    )


def approval_statement(request: Mapping[str, Any], signer: str, signed_at: int) -> dict[str, Any]:
    """Build the approval statement a peer signs (PROTOCOL.md, Approval statement).

    Every field but ``signer`` and ``signed_at`` is copied from the request, so a receiver rebuilds
    the statement from the request and needs only the signer, the time and the signature.

    Args:
        request: The request document (assumed well formed; see :func:`validate_request`).
        signer: The approving peer's agent id.
        signed_at: The signing time, integer Unix seconds.

    Returns:
        The statement object; its signed bytes are :func:`statement_bytes` of it.

    Raises:
        ValueError: ``signer`` is not an agent id or ``signed_at`` is not an integer time.
    """
    return _statement(request, APPROVAL_TYPE, signer, signed_at)


def denial_statement(request: Mapping[str, Any], signer: str, signed_at: int, reason: str) -> dict[str, Any]:
    """Build the denial statement a peer signs: the approval statement as ``teaagent.denial`` plus ``reason``.

    Args:
        request: The request document (assumed well formed; see :func:`validate_request`).
        signer: The denying peer's agent id.
        signed_at: The signing time, integer Unix seconds.
        reason: Why the peer denies the call; may be empty.

    Returns:
        The statement object.

    Raises:
        ValueError: ``signer`` is not an agent id, ``signed_at`` is not an integer time, or
            ``reason`` is not a string.
    """
    if not isinstance(reason, str):
        raise ValueError("the denial reason is not a string")
    statement = _statement(request, DENIAL_TYPE, signer, signed_at)
    statement["reason"] = reason
    return statement


def sign_approval(
    request: Mapping[str, Any], signer: str, key: Signer, signed_at: int | None = None
) -> PeerSignature:
    """Approve a request as peer ``signer``: sign its approval statement, namespace ``teaagent-approval``.

    Args:
        request: The request document.
        signer: This peer's agent id.
        key: This peer's signing key, as :func:`teaagent.signing.load_private_key` returns it.
        signed_at: The signing time in integer Unix seconds; the clock when None.

    Returns:
        The compact approval: ``PeerSignature(peer_id=signer, signature=<bare base64>,
        timestamp=float(signed_at), ssh_key_id=<the key's fingerprint>)``.

    Raises:
        QuorumError: The request is malformed.
        ValueError: ``signer`` or ``signed_at`` is malformed.
        SignatureError: The key cannot sign.
    """
    validate_request(request)
    when = signing_time(signed_at)
    statement = approval_statement(request, signer, when)
    signature = sshsig_sign(statement_bytes(statement), key, APPROVAL_NAMESPACE)
    return PeerSignature(
        peer_id=signer,
        signature=wire_signature(signature),
        timestamp=float(when),
        ssh_key_id=fingerprint(key),
    )


def sign_denial(
    request: Mapping[str, Any], signer: str, key: Signer, reason: str, signed_at: int | None = None
) -> dict[str, Any]:
    """Deny a request as peer ``signer``: sign its denial statement, namespace ``teaagent-denial``.

    Args:
        request: The request document.
        signer: This peer's agent id.
        key: This peer's signing key.
        reason: Why the call is denied; the origin shows it to its user.
        signed_at: The signing time in integer Unix seconds; the clock when None.

    Returns:
        ``{"statement": <denial statement>, "signature": <bare base64>}``.

    Raises:
        QuorumError: The request is malformed.
        ValueError: ``signer``, ``signed_at`` or ``reason`` is malformed.
        SignatureError: The key cannot sign.
    """
    validate_request(request)
    statement = denial_statement(request, signer, signing_time(signed_at), reason)
    signature = sshsig_sign(statement_bytes(statement), key, DENIAL_NAMESPACE)
    return {"statement": statement, "signature": wire_signature(signature)}


def signed_at_of(approval: PeerSignature) -> int | None:
    """Return the integer ``signed_at`` a compact approval carries, or None when its timestamp is not one."""
    stamp = approval.timestamp
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        return None
    if isinstance(stamp, float) and not (math.isfinite(stamp) and stamp.is_integer()):
        return None
    value = int(stamp)
    return value if is_time(value) else None
