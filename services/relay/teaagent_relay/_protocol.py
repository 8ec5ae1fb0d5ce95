"""The relay's checks of signed documents, each refusal with its HTTP status and stable code.

The counting authority is :func:`teaagent.quorum.evaluate`; the checks here run before it, so that
a refusal carries the right code (a stranger is ``forbidden``, a statement that does not match its
request is ``invalid``, a signature that does not verify is ``bad_signature``), and they keep
the numbered rules of PROTOCOL.md "Counting".
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, NamedTuple

from teaagent.errors import SignatureError, StatementError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    DecisionKind,
    check_signing_time,
    decision_kind,
    dev_signature_passes,
    rebuild_decision,
    signing_key,
    statement_bytes,
    wire_signature,
)
from teaagent.quorum._request import verify_checked_request_signature
from teaagent.trust import SignerKey
from teaagent_relay._errors import ApiError

__all__ = [
    "REQUEST_ID",
    "DecisionKind",
    "VerifiedDecision",
    "check_path_request_id",
    "check_request_signature",
    "check_statement",
    "decision_bytes",
    "sentence",
    "verify_decision",
]


class VerifiedDecision(NamedTuple):
    """A decision whose signature verified (:func:`verify_decision`)."""

    wire: str  # the signature in wire form: bare base64, one line
    stored: bytes  # the decision as the store keeps it (:func:`decision_bytes`)


REQUEST_ID: Final = re.compile(r"[0-9a-f]{32}")  # PROTOCOL.md "Request": 32 lowercase hex characters


def check_path_request_id(request_id: str) -> None:
    """Refuse a request id in a path that is not one (the decisions' routes take any segment there).

    Raises:
        ApiError: 422 ``invalid``, not 32 lowercase hex characters.
    """
    if not REQUEST_ID.fullmatch(request_id):
        raise ApiError(422, "invalid", "The request id in the path is not 32 lowercase hex characters.")


def sentence(text: str) -> str:
    """Return ``text`` as one sentence: capitalised, one final period."""
    text = text.strip().rstrip(".")
    return text[:1].upper() + text[1:] + "."


def _clause(error: BaseException) -> str:
    text = str(error).strip().rstrip(".") or type(error).__name__
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _dev_passes(signature: str, signer: str, subject: str, *, whose: str, on: str, allow_dev: bool) -> bool:
    """Whether ``signature`` is a development signature this node accepts for ``signer``
    (:func:`teaagent.quorum.dev_signature_passes`); False for a real signature.

    Raises:
        ApiError: 403 ``bad_signature``: a development signature this node does not accept.
    """
    try:
        return dev_signature_passes(
            signature, signer, allow_dev=allow_dev, subject=subject, whose=whose, on=on
        )
    except SignatureError as exc:
        raise ApiError(403, "bad_signature", str(exc)) from None


def check_request_signature(
    request: Mapping[str, Any], signature: str, keys: Sequence[SignerKey], *, allow_dev: bool, whose: str
) -> str:
    """Verify the origin's signature over a well-formed request; return the signature in wire form.

    The caller has refused a malformed request already (``request_problem``), in its own words.

    PROTOCOL.md "Keys of the origin": any of ``keys`` (all the origin's keys in this node's
    configuration) may have signed, if its namespaces and validity allow ``teaagent-request`` at
    the request's ``created_at`` (:func:`teaagent.quorum.verify_request_signature`).

    Raises:
        ApiError: 403 ``bad_signature`` when it does not verify with any of ``keys``, or was made
            by one that may not sign it (``whose`` names the keys in the message).
    """
    on = f"request {request['request_id']}"
    if _dev_passes(
        signature, request["origin"], "The request signature", whose=whose, on=on, allow_dev=allow_dev
    ):
        return signature
    try:
        verify_checked_request_signature(request, signature, keys)
        return wire_signature(signature)
    except (SignatureError, ValueError) as exc:
        raise ApiError(
            403,
            "bad_signature",
            sentence(f"the request signature does not verify with {whose}: {_clause(exc)}"),
        ) from exc


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
    try:
        kind = decision_kind(statement)
    except StatementError as exc:
        raise ApiError(422, "invalid", str(exc)) from exc
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
    try:
        rebuilt = rebuild_decision(request, statement, kind, signer)  # rule 3 (fields)
        check_signing_time(rebuilt["signed_at"], request, now)  # rule 4
    except StatementError as exc:
        raise ApiError(422, "invalid", str(exc)) from exc
    return kind, signer, rebuilt


def verify_decision(
    kind: DecisionKind,
    rebuilt: Mapping[str, Any],
    signature: str,
    keys: Sequence[SignerKey],
    *,
    allow_dev: bool,
    whose: str,
) -> VerifiedDecision:
    """Verify a signer's signature over the statement rebuilt from the request; return the signature
    in wire form and the decision in its stored form (:func:`decision_bytes`).

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
    on = f"the {kind} of request {rebuilt['request_id']}"
    try:
        data = statement_bytes(rebuilt)
    except ValueError as exc:
        raise ApiError(422, "invalid", sentence(_clause(exc))) from exc
    if _dev_passes(signature, rebuilt["signer"], f"The {kind}", whose=whose, on=on, allow_dev=allow_dev):
        return VerifiedDecision(signature, _stored(data, signature))
    namespace = DENIAL_NAMESPACE if kind == "denial" else APPROVAL_NAMESPACE
    try:
        signing_key(data, signature, keys, namespace, rebuilt["signed_at"], whose=whose)
        wire = wire_signature(signature)
    except (SignatureError, ValueError, TypeError) as exc:
        raise ApiError(
            403, "bad_signature", sentence(f"the {kind} does not verify with {whose}: {_clause(exc)}")
        ) from exc
    return VerifiedDecision(wire, _stored(data, wire))


def decision_bytes(statement: Mapping[str, Any], signature: str) -> bytes:
    """Return the stored form of a verified decision, ``{"signature", "statement"}`` as JSON bytes.

    The statement is written as the canonical JSON its signer signed (:func:`statement_bytes`), so
    the stored form is the compact, key-sorted JSON of the decision; readers parse it.

    Raises:
        ValueError: The statement cannot be written as canonical JSON.
    """
    return _stored(statement_bytes(statement), signature)


def _stored(statement: bytes, signature: str) -> bytes:
    """The stored form of a decision from its statement's canonical bytes, already encoded once
    for the verification: the two members in key order around them."""
    return b'{"signature":' + json.dumps(signature).encode() + b',"statement":' + statement + b"}"
