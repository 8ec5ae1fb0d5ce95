"""The relay's checks of signed documents, each refusal with its HTTP status and stable code.

The counting authority is :func:`teaagent.quorum.evaluate`; the checks here run before it, so that
a refusal carries the right code (a stranger is ``forbidden``, a statement that does not match its
request is ``invalid``, a signature that does not verify is ``bad_signature``), and they keep
the numbered rules of PROTOCOL.md "Counting".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from teaagent._words import moment
from teaagent.errors import SignatureError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    APPROVAL_TYPE,
    DENIAL_NAMESPACE,
    DENIAL_TYPE,
    MAX_CLOCK_SKEW_SECONDS,
    approval_statement,
    denial_statement,
    signing_key,
    statement_bytes,
    verify_request_signature,
    wire_signature,
)
from teaagent.trust import SignerKey
from teaagent_relay._errors import ApiError

__all__ = [
    "DEV_SIGNATURE_PREFIX",
    "DecisionKind",
    "check_request_signature",
    "check_statement",
    "decision_bytes",
    "sentence",
    "verify_decision",
]

logger = logging.getLogger("teaagent.relay")

DecisionKind = Literal["approval", "denial"]
DEV_SIGNATURE_PREFIX = "dev:"  # PROTOCOL.md allow_dev_signatures: "dev:<signer>", never by default
_KINDS: dict[object, DecisionKind] = {APPROVAL_TYPE: "approval", DENIAL_TYPE: "denial"}


def sentence(text: str) -> str:
    """Return ``text`` as one sentence: capitalised, one final period."""
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:] + "."


def _clause(error: BaseException) -> str:
    text = str(error).strip().rstrip(".") or type(error).__name__
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def check_request_signature(
    request: Mapping[str, Any], signature: str, keys: Sequence[SignerKey], *, allow_dev: bool, whose: str
) -> str:
    """Verify the origin's signature over a well-formed request; return the signature in wire form.

    PROTOCOL.md "Keys of the origin": any of ``keys`` (all the origin's keys in this node's
    configuration) may have signed, if its namespaces and validity allow ``teaagent-request`` at
    the request's ``created_at`` (:func:`teaagent.quorum.verify_request_signature`).

    Raises:
        ApiError: 403 ``bad_signature`` when it does not verify with any of ``keys``, or was made
            by one that may not sign it (``whose`` names the keys in the message).
    """
    origin = request["origin"]
    if signature.startswith(DEV_SIGNATURE_PREFIX):
        if allow_dev and signature == DEV_SIGNATURE_PREFIX + origin:
            logger.warning(
                "accepting the development signature of %s on request %s without any cryptography",
                origin,
                request["request_id"],
            )
            return signature
        raise ApiError(
            403,
            "bad_signature",
            f"The request signature is a development signature, which {whose} cannot verify.",
        )
    try:
        verify_request_signature(request, signature, keys)
        return wire_signature(signature)
    except (SignatureError, ValueError) as exc:
        raise ApiError(
            403,
            "bad_signature",
            sentence(f"the request signature does not verify with {whose}: {_clause(exc)}"),
        ) from exc


def _mismatch(carried: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> str | None:
    for name in sorted(set(carried) | set(rebuilt)):
        if name not in rebuilt:
            return f"the statement has the unknown field {name}"
        if name not in carried:
            return f"the statement lacks the field {name}"
        mine, theirs = rebuilt[name], carried[name]
        # type() as well as ==: 1 == True == 1.0 in Python, but not in a signed document.
        if type(mine) is not type(theirs) or mine != theirs:
            return f"the statement's {name} does not match request {rebuilt['request_id']}"
    return None


def check_statement(
    request: Mapping[str, Any],
    statement: Mapping[str, Any],
    *,
    configured: Collection[str],
    now: float,
) -> tuple[DecisionKind, str, dict[str, Any]]:
    """Check a carried statement against its request: who signs it, its fields, its times.

    The signature is not checked here. Returns the kind, the signer and the statement rebuilt
    from the request (what the signature must cover).

    Raises:
        ApiError: 422 ``invalid`` (not a statement of this request, a bad time) or 403 ``forbidden``
            (rule 1: the signer is the origin, not a peer of the request, or not in ``configured``).
    """
    declared = statement.get("type")
    kind = _KINDS.get(declared) if isinstance(declared, str) else None
    if kind is None:
        raise ApiError(422, "invalid", f"The statement's type is neither {APPROVAL_TYPE} nor {DENIAL_TYPE}.")
    signer = statement.get("signer")
    if not isinstance(signer, str):
        raise ApiError(422, "invalid", "The statement's signer is not a string.")
    # Rule 1: in the request's peers and in our configured peers, never the origin.
    if signer == request["origin"]:
        raise ApiError(403, "forbidden", "The origin cannot approve or deny its own request.")
    if signer not in request["peers"]:
        raise ApiError(
            403, "forbidden", sentence(f"{signer!r} is not a peer of request {request['request_id']}")
        )
    if signer not in configured:
        raise ApiError(403, "forbidden", sentence(f"{signer} is not a configured peer of this node"))
    # Rule 3 (fields): the statement rebuilt from the request must equal the carried one.
    signed_at = statement.get("signed_at")
    if isinstance(signed_at, bool) or not isinstance(signed_at, int):
        raise ApiError(422, "invalid", "The statement's signed_at is not an integer Unix time.")
    reason = statement.get("reason")
    try:
        if kind == "denial":
            if not isinstance(reason, str):
                raise ApiError(422, "invalid", "The denial's reason is not a string.")
            rebuilt = denial_statement(request, signer, signed_at, reason)
        else:
            rebuilt = approval_statement(request, signer, signed_at)
    except ValueError as exc:
        raise ApiError(422, "invalid", sentence(_clause(exc))) from exc
    mismatch = _mismatch(statement, rebuilt)
    if mismatch is not None:
        raise ApiError(422, "invalid", sentence(mismatch))
    # Rule 4: signed within the request's life (from its creation, less the clock skew, to its
    # expiry), and not beyond the clock skew in our future. The lower bound keeps a key whose
    # valid-before has passed from back-dating its way into a request made after it.
    created_at, expires_at = request["created_at"], request["expires_at"]
    if signed_at < created_at - MAX_CLOCK_SKEW_SECONDS:
        raise ApiError(
            422,
            "invalid",
            f"The statement was signed at {moment(signed_at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} "
            f"seconds before the request was created at {moment(created_at, now)}.",
        )
    if signed_at > expires_at:
        raise ApiError(
            422,
            "invalid",
            f"The statement was signed at {moment(signed_at, now)}, after the request expired at "
            f"{moment(expires_at, now)}.",
        )
    if signed_at > now + MAX_CLOCK_SKEW_SECONDS:
        raise ApiError(
            422,
            "invalid",
            f"The statement is dated {moment(signed_at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} seconds "
            "in the future.",
        )
    return kind, signer, rebuilt


def verify_decision(
    kind: DecisionKind,
    rebuilt: Mapping[str, Any],
    signature: str,
    keys: Sequence[SignerKey],
    *,
    allow_dev: bool,
    whose: str,
) -> str:
    """Verify a signer's signature over the statement rebuilt from the request; return it in wire form.

    PROTOCOL.md rules 2 and 3: the key embedded in the SSHSIG must be one of ``keys`` (the signer's
    keys in this node's configuration: its node key, its operators' keys), allowed by its
    ``allowed_signers`` options for this namespace at the statement's ``signed_at``; the namespace
    exactly the decision's, the algorithms allowed, and the signature must verify over the
    canonical statement (:func:`teaagent.quorum.signing_key` checks all of it).

    Raises:
        ApiError: 403 ``bad_signature`` when it does not verify with any of ``keys`` (``whose``
            names them in the message), 422 ``invalid`` when the statement cannot be written as
            canonical JSON.
    """
    signer = rebuilt["signer"]
    if signature.startswith(DEV_SIGNATURE_PREFIX):
        if allow_dev and signature == DEV_SIGNATURE_PREFIX + signer:
            logger.warning("accepting the development signature of %s without any cryptography", signer)
            return signature
        raise ApiError(
            403, "bad_signature", f"The {kind} is a development signature, which {whose} cannot verify."
        )
    try:
        data = statement_bytes(rebuilt)
    except ValueError as exc:
        raise ApiError(422, "invalid", sentence(_clause(exc))) from exc
    namespace = DENIAL_NAMESPACE if kind == "denial" else APPROVAL_NAMESPACE
    try:
        signing_key(data, signature, keys, namespace, rebuilt["signed_at"], whose=whose)
        return wire_signature(signature)
    except (SignatureError, ValueError, TypeError) as exc:
        raise ApiError(
            403, "bad_signature", sentence(f"the {kind} does not verify with {whose}: {_clause(exc)}")
        ) from exc


def decision_bytes(statement: Mapping[str, Any], signature: str) -> bytes:
    """Return the stored form of a verified decision, ``{"statement", "signature"}`` as JSON bytes."""
    return json.dumps(
        {"signature": signature, "statement": dict(statement)}, sort_keys=True, separators=(",", ":")
    ).encode()
