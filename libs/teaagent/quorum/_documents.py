"""The signed documents of PROTOCOL.md, what they have in common: types, namespaces, fields, bytes.

The documents themselves are built and checked next door: the request in ``_request``, approval
and denial statements in ``_statements``, the withdrawal in ``_withdrawal``, the certificate in
``_certificate``. Every builder returns plain JSON objects (dicts of strings, integers and lists)
and every signature covers the canonical bytes of such an object, built once by
:func:`request_statement` or :func:`statement_bytes` and never by re-serialising something a peer
sent (STYLE.md 4).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Final

from teaagent._canonical import canonical
from teaagent._words import moment
from teaagent.errors import SignatureError
from teaagent.signing import signature_to_wire
from teaagent.trust import AGENT_ID_PATTERN, MAX_QUORUM_TIMEOUT_SECONDS

__all__ = [
    "APPROVAL_NAMESPACE",
    "APPROVAL_TYPE",
    "DENIAL_NAMESPACE",
    "DENIAL_TYPE",
    "DEV_SIGNATURE_PREFIX",
    "PROTOCOL_VERSION",
    "REQUEST_NAMESPACE",
    "REQUEST_TYPE",
    "WITHDRAWAL_NAMESPACE",
    "WITHDRAWAL_TYPE",
    "dev_signature_allowed",
    "dev_signature_passes",
    "is_dev_signature",
    "request_statement",
    "statement_bytes",
    "wire_signature",
]

PROTOCOL_VERSION: Final = 1  # requests without a version 2 rule, and every signed statement
POLICY_VERSION: Final = 2  # requests that carry a policy (PROTOCOL.md, "Version 2")
REQUEST_TYPE: Final = "teaagent.request"
APPROVAL_TYPE: Final = "teaagent.approval"
DENIAL_TYPE: Final = "teaagent.denial"
REQUEST_NAMESPACE: Final = "teaagent-request"
APPROVAL_NAMESPACE: Final = "teaagent-approval"
DENIAL_NAMESPACE: Final = "teaagent-denial"
WITHDRAWAL_TYPE: Final = "teaagent.withdrawal"
WITHDRAWAL_NAMESPACE: Final = "teaagent-withdrawal"

REQUEST_ID_PATTERN: Final = re.compile(r"[0-9a-f]{32}")
DIGEST_PATTERN: Final = re.compile(r"sha256:[0-9a-f]{64}")
MAX_LABEL_CHARS: Final = 256  # run ids, call ids and tool names are identifiers, not text
MAX_REQUEST_LIFETIME_SECONDS: Final = (
    MAX_QUORUM_TIMEOUT_SECONDS  # the longest timeout a configuration may set
)
MAX_SAFE_INTEGER: Final = 2**53 - 1  # I-JSON: larger integers are not exact in every JSON reader
MAX_CLOCK_SKEW_SECONDS: Final = 60  # PROTOCOL.md rule 4: how far a peer's clock may run ahead of ours
MAX_PEERS: Final = 256  # far beyond any real cluster; bounds the work one request can cause

REQUEST_FIELDS: Final = frozenset(
    {
        "v",
        "type",
        "request_id",
        "origin",
        "run_id",
        "call_id",
        "tool_name",
        "arguments",
        "payload_digest",
        "reason",
        "required_approvals",
        "peers",
        "created_at",
        "expires_at",
    }
)
POLICY_FIELD: Final = "policy"
REQUEST_FIELDS_V2: Final = REQUEST_FIELDS | {POLICY_FIELD}
CERTIFICATE_FIELDS: Final = frozenset({"request", "request_signature", "approvals"})
# Written only when the origin's relay counted a denial, so that a verifier applies rule 6 itself;
# without one a certificate is byte for byte what it was before the field existed.
CERTIFICATE_DENIALS: Final = "denials"
SIGNED_DECISION_FIELDS: Final = frozenset({"statement", "signature"})

logger = logging.getLogger("teaagent.quorum")

DEV_SIGNATURE_PREFIX: Final = "dev:"  # PROTOCOL.md allow_dev_signatures: "dev:<signer>", never by default


def is_dev_signature(signature: str) -> bool:
    """Whether ``signature`` is in the development form (``dev:<signer>``), which no key verifies."""
    return signature.startswith(DEV_SIGNATURE_PREFIX)


def dev_signature_allowed(signature: str, signer: str, *, allow_dev: bool) -> bool:
    """Whether a development signature passes for ``signer``: allowed here, and exactly ``dev:<signer>``.

    PROTOCOL.md ``allow_dev_signatures``: never by default; the caller logs each one it accepts.
    """
    return allow_dev and signature == DEV_SIGNATURE_PREFIX + signer


def dev_signature_passes(
    signature: str, signer: str, *, allow_dev: bool, subject: str, whose: str, on: str
) -> bool:
    """Whether ``signature`` is a development signature that stands here for ``signer``'s.

    Args:
        signature: The signature as carried.
        signer: Who must have signed.
        allow_dev: This node's ``allow_dev_signatures``.
        subject: The signature, for the refusal (``The request signature``, ``The approval``).
        whose: The keys that would verify it, for the refusal (``the keys configured for beta``).
        on: What it signs, for the log (``request 0f3c...``).

    Returns:
        False for any other signature (verify it); True for exactly ``dev:<signer>`` when
        ``allow_dev`` is set, logged at WARNING: nothing was verified.

    Raises:
        SignatureError: It is in the development form but refused here:
            ``{subject} is a development signature, which {whose} cannot verify.``
    """
    if not is_dev_signature(signature):
        return False
    if not dev_signature_allowed(signature, signer, allow_dev=allow_dev):
        raise SignatureError(f"{subject} is a development signature, which {whose} cannot verify.")
    logger.warning("accepting the development signature of %s on %s without any cryptography", signer, on)
    return True


def clause(error: BaseException) -> str:
    """An exception's sentence as a clause inside a longer message (no final period)."""
    return str(error).strip().rstrip(".") or type(error).__name__


def copied(
    kind: str, request: Mapping[str, Any], middle: Mapping[str, Any], last: Mapping[str, Any]
) -> dict[str, Any]:
    """A statement on ``request``: the version, its ``kind``, what it copies of the request, its own fields.

    Every statement copies the request's id, origin, payload digest and expiry (PROTOCOL.md), so
    that a receiver rebuilds it from the request it holds. The fields come in the order the
    documents show them: ``middle`` after the origin, ``last`` after the expiry.
    """
    return {
        "v": PROTOCOL_VERSION,
        "type": kind,
        "request_id": request["request_id"],
        "origin": request["origin"],
        **middle,
        "payload_digest": request["payload_digest"],
        "expires_at": request["expires_at"],
        **last,
    }


def is_int(value: object) -> bool:
    """Whether ``value`` is a JSON integer (a Python ``int`` that is not a ``bool``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_time(value: object) -> bool:
    """Whether ``value`` is an integer Unix time that every JSON reader holds exactly."""
    return is_int(value) and 0 <= value <= MAX_SAFE_INTEGER  # type: ignore[operator]


def is_agent_id(value: object) -> bool:
    """Whether ``value`` is a well-formed agent id (``[a-z0-9][a-z0-9._-]{0,63}``)."""
    return isinstance(value, str) and AGENT_ID_PATTERN.fullmatch(value) is not None


def statement_bytes(statement: Mapping[str, Any]) -> bytes:
    """Return the canonical bytes of an approval or denial statement, the bytes a peer signs.

    Statements hold only strings and integers under ASCII keys, which :func:`canonical` writes
    by its fast path (RFC 8785 equals the compact, key-sorted ``json.dumps`` there).

    Args:
        statement: The statement object.

    Returns:
        The UTF-8 canonical JSON bytes.

    Raises:
        ValueError: The statement cannot be written as canonical JSON (a lone surrogate, a NaN...).
    """
    return canonical(dict(statement))


def request_statement(request: Mapping[str, Any]) -> bytes:
    """Return the bytes the origin signs for a request: its RFC 8785 canonical JSON.

    The request holds the tool call's ``arguments``, which may hold floats, so the full RFC 8785
    encoder is used. Canonical JSON is a fixed point of parsing and re-encoding, so a relay that
    received the request as JSON obtains the very bytes the origin signed.

    Args:
        request: The request document.

    Returns:
        The canonical UTF-8 bytes.

    Raises:
        ValueError: The request cannot be written as canonical JSON.
    """
    return canonical(dict(request))


def wire_signature(signature: str) -> str:
    """Return the wire form of a signature: bare standard base64 of the SSHSIG blob, one line.

    A development signature (``dev:<signer>``) is returned unchanged.

    Args:
        signature: An armored signature (what ``ssh-keygen -Y sign`` writes) or bare base64.

    Returns:
        The bare base64 text.

    Raises:
        SignatureError: The armor or the base64 is malformed, or the blob is not an SSHSIG.
    """
    if is_dev_signature(signature):
        return signature
    return signature_to_wire(signature)


def dated_ahead(
    at: int, now: float, *, subject: str, verb: str = "is dated", beyond: str = "in the future"
) -> str | None:
    """Why a document dated ``at`` is too far in this node's future, as a clause; None when it is not.

    PROTOCOL.md rule 4's skew: a peer's clock may run at most :data:`MAX_CLOCK_SKEW_SECONDS` ahead
    of ours. The one bound for a statement's ``signed_at``, a withdrawal's ``withdrawn_at`` and a
    request's ``created_at``. ``subject`` and ``verb`` begin the clause (``the withdrawal is
    dated``, ``request 0f3c... was created at``), ``beyond`` ends it (``in the future``, ``ahead of
    this node's clock``).
    """
    if at <= now + MAX_CLOCK_SKEW_SECONDS:
        return None
    return f"{subject} {verb} {moment(at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} seconds {beyond}"


def signing_time(signed_at: int | None) -> int:
    """The time a statement is signed at: ``signed_at``, or the clock's integer seconds when None."""
    return int(time.time()) if signed_at is None else signed_at
