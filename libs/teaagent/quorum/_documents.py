"""The signed documents of PROTOCOL.md: request, approval and denial statements, withdrawal, certificate.

Every builder here returns plain JSON objects (dicts of strings, integers and lists) and every
signature covers the canonical bytes of such an object, built once by :func:`request_statement` or
:func:`statement_bytes` and never by re-serialising something a peer sent (STYLE.md 4).
"""

from __future__ import annotations

import copy
import math
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from teaagent._canonical import canonical, payload_digest
from teaagent._json import MAX_ARGUMENTS_DEPTH, JSONDepthError
from teaagent.errors import QuorumError, SignatureError
from teaagent.signing import Signer, fingerprint, parse_sshsig, signature_to_wire, sshsig_sign, sshsig_verify
from teaagent.trust import (
    AGENT_ID_PATTERN,
    MAX_QUORUM_TIMEOUT_SECONDS,
    PeerSignature,
    QuorumPolicy,
    SignerKey,
    policy_problem,
)

if TYPE_CHECKING:
    from teaagent.trust import MultiSigQuorumConfig

__all__ = [
    "APPROVAL_NAMESPACE",
    "APPROVAL_TYPE",
    "DENIAL_NAMESPACE",
    "DENIAL_TYPE",
    "PROTOCOL_VERSION",
    "REQUEST_NAMESPACE",
    "REQUEST_TYPE",
    "WITHDRAWAL_NAMESPACE",
    "WITHDRAWAL_TYPE",
    "approval_statement",
    "build_certificate",
    "build_request",
    "denial_statement",
    "request_problem",
    "request_statement",
    "sign_approval",
    "sign_denial",
    "sign_request",
    "sign_withdrawal",
    "signing_key",
    "statement_bytes",
    "validate_request",
    "verify_decision",
    "verify_request_signature",
    "verify_withdrawal",
    "wire_signature",
    "withdrawal_problem",
    "withdrawal_statement",
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

DEV_SIGNATURE_PREFIX: Final = "dev:"  # PROTOCOL.md allow_dev_signatures: "dev:<signer>", never by default


def is_int(value: object) -> bool:
    """Whether ``value`` is a JSON integer (a Python ``int`` that is not a ``bool``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: object) -> bool:
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
    if signature.startswith(DEV_SIGNATURE_PREFIX):
        return signature
    return signature_to_wire(signature)


def request_problem(request: object) -> str | None:
    """Return why ``request`` is not a well-formed version 1 request, or None when it is.

    The checks are the structural ones of PROTOCOL.md: exact field set, version and type, id and
    agent-id formats, integer times with ``created_at < expires_at``, a lifetime of at most
    ``MAX_REQUEST_LIFETIME_SECONDS``, peers sorted, unique and without the origin, a threshold
    between 1 and the number of peers, and a ``payload_digest`` that matches the tool call.
    ``expires_at - created_at`` is not compared with a local ``timeout_seconds``: peers may be
    configured with other timeouts than the origin.

    Args:
        request: The candidate request document.

    Returns:
        One sentence naming the first problem, or None.
    """
    if not isinstance(request, Mapping):
        return "the request is not a JSON object"
    version = request.get("v")
    known = REQUEST_FIELDS_V2 if is_int(version) and version == POLICY_VERSION else REQUEST_FIELDS
    fields = set(request)
    if fields != known:
        missing = sorted(known - fields)
        if missing:
            return f"the request lacks the field {missing[0]}"
        return f"the request has the unknown field {sorted(str(f) for f in fields - known)[0]}"
    if not (is_int(version) and version in (PROTOCOL_VERSION, POLICY_VERSION)):
        return f"the request has version {version!r}, but only versions 1 and 2 are known"
    if request["type"] != REQUEST_TYPE:
        return f"the request has type {request['type']!r} instead of {REQUEST_TYPE!r}"
    if not (isinstance(request["request_id"], str) and REQUEST_ID_PATTERN.fullmatch(request["request_id"])):
        return "the request_id is not 32 lowercase hexadecimal characters"
    origin = request["origin"]
    if not is_agent_id(origin):
        return f"the origin {origin!r} is not a valid agent id"
    for name in ("run_id", "call_id", "tool_name"):
        value = request[name]
        if not isinstance(value, str) or len(value) > MAX_LABEL_CHARS:
            return f"the request's {name} is not a string of at most {MAX_LABEL_CHARS} characters"
    if not request["tool_name"]:
        return "the request's tool_name is empty"
    if not isinstance(request["arguments"], Mapping):
        return "the request's arguments are not a JSON object"
    if not isinstance(request["reason"], str):
        return "the request's reason is not a string"
    created_at, expires_at = request["created_at"], request["expires_at"]
    if not (_is_time(created_at) and _is_time(expires_at)):
        return "the request's created_at and expires_at are not integer Unix times"
    if not 0 < expires_at - created_at <= MAX_REQUEST_LIFETIME_SECONDS:
        return (
            f"the request's expires_at is not between 1 and {MAX_REQUEST_LIFETIME_SECONDS} seconds "
            "after its created_at"
        )
    peers = request["peers"]
    if not (isinstance(peers, list) and peers and all(is_agent_id(peer) for peer in peers)):
        return "the request's peers are not a non-empty list of agent ids"
    if len(peers) > MAX_PEERS:
        return f"the request names {len(peers)} peers, more than the limit of {MAX_PEERS}"
    if peers != sorted(set(peers)):
        return "the request's peers are not sorted and unique"
    if origin in peers:
        return f"the request's origin {origin} is among its own peers"
    required = request["required_approvals"]
    if not (is_int(required) and 1 <= required <= len(peers)):
        return f"the request's required_approvals is not an integer between 1 and {len(peers)}"
    if version == POLICY_VERSION:
        problem = _policy_problem(request)
        if problem is not None:
            return problem
    digest = request["payload_digest"]
    if not (isinstance(digest, str) and DIGEST_PATTERN.fullmatch(digest)):
        return "the request's payload_digest is not sha256: followed by 64 lowercase hexadecimal characters"
    try:
        expected = payload_digest(request["tool_name"], dict(request["arguments"].items()))
    except JSONDepthError:
        return f"the request's arguments nest arrays and objects more than {MAX_ARGUMENTS_DEPTH} levels deep"
    except ValueError:
        return "the request's arguments cannot be written as canonical JSON"
    if digest != expected:
        return "the request's payload_digest does not match its tool_name and arguments"
    return None


def _policy_problem(request: Mapping[str, Any]) -> str | None:
    """A version 2 request's policy: well formed, its peers the request's, its readers' threshold kept."""
    problem = policy_problem(request[POLICY_FIELD])
    if problem is not None:
        return problem
    policy = QuorumPolicy.from_document(request[POLICY_FIELD])
    if list(policy.peers) != request["peers"]:
        return "the request's peers are not the sorted union of its policy's peers"
    if request["required_approvals"] != policy.required:
        return "the request's required_approvals is not the largest required of its policy's terms"
    return None


def request_policy(request: Mapping[str, Any]) -> QuorumPolicy | None:
    """The policy of a well-formed request: its ``policy`` field (version 2), or None (version 1)."""
    if request.get("v") != POLICY_VERSION:
        return None
    return QuorumPolicy.from_document(request[POLICY_FIELD])


def validate_request(request: object) -> None:
    """Check that ``request`` is a well-formed version 1 request document (see :func:`request_problem`).

    Args:
        request: The candidate request document, as parsed from JSON.

    Raises:
        QuorumError: The document is malformed; the message names the first problem.
    """
    problem = request_problem(request)
    if problem is not None:
        raise QuorumError(problem[0].upper() + problem[1:] + ".")


def build_request(
    *,
    origin: str,
    run_id: str,
    call_id: str,
    tool_name: str,
    arguments: Mapping[str, Any],
    reason: str,
    config: MultiSigQuorumConfig,
    now: float | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """Build the request document for one high-risk tool call (PROTOCOL.md, Request).

    Args:
        origin: This node's agent id.
        run_id: The agent run that wants the call.
        call_id: The tool call's id within the run.
        tool_name: The tool's registered name.
        arguments: The call's arguments (deep-copied into the request).
        reason: The model's reasoning, shown to the peers' operators; may be empty.
        config: The origin's quorum configuration: its peers, threshold and timeout.
        now: The creation time in Unix seconds (truncated to an integer); the clock when None.
        request_id: A fixed id (32 lowercase hex characters), for tests; random when None.

    Returns:
        The request document, ready for :func:`sign_request`.

    Raises:
        ValueError: An argument is malformed, the origin is among the configured peers, or the
            configured threshold cannot be met by the configured peers.
    """
    if is_agent_id(origin) and origin in config.peer_agent_ids:
        raise ValueError(f"the origin {origin} is among the configured peers")
    created_at = int(time.time() if now is None else now)
    policy = config.policy_for(tool_name) if isinstance(tool_name, str) and config.enabled else None
    timeout = config.timeout_for(tool_name) if isinstance(tool_name, str) else config.timeout_seconds
    request: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "type": REQUEST_TYPE,
        "request_id": secrets.token_hex(16) if request_id is None else request_id,
        "origin": origin,
        "run_id": run_id,
        "call_id": call_id,
        "tool_name": tool_name,
        "arguments": copy.deepcopy(dict(arguments)),
        "payload_digest": "",
        "reason": reason,
        "required_approvals": config.required_approvals,
        "peers": sorted(config.peer_agent_ids),
        "created_at": created_at,
        "expires_at": created_at + timeout,
    }
    if policy is not None:
        # Version 2: the first matching rule's terms, the groups expanded; peers their union.
        request["v"] = POLICY_VERSION
        request[POLICY_FIELD] = policy.document()
        request["peers"] = list(policy.peers)
        request["required_approvals"] = policy.required
    if isinstance(tool_name, str):
        request["payload_digest"] = payload_digest(tool_name, request["arguments"])
    problem = request_problem(request)
    if problem is not None:
        raise ValueError(f"cannot build the request: {problem}")
    return request


def sign_request(request: Mapping[str, Any], key: Signer) -> str:
    """Sign a request as its origin, over :func:`request_statement`, namespace ``teaagent-request``.

    Args:
        request: The request document (see :func:`build_request`).
        key: The origin's signing key, as :func:`teaagent.signing.load_private_key` returns it.

    Returns:
        The signature in wire form (bare base64).

    Raises:
        QuorumError: The request is malformed.
        SignatureError: The key cannot sign.
    """
    validate_request(request)
    return wire_signature(sshsig_sign(request_statement(request), key, REQUEST_NAMESPACE))


def verify_request_signature(
    request: Mapping[str, Any], signature: str, origin_keys: Sequence[SignerKey] | str
) -> SignerKey:
    """Check the origin's signature over a request, with every key of the origin and its limits.

    PROTOCOL.md "Keys of the origin": the key embedded in the SSHSIG must be one of the origin's
    keys in the verifier's own configuration, allowed by its ``allowed_signers`` options to sign
    in ``teaagent-request`` at the request's ``created_at`` (:func:`signing_key`), never the first
    listed key alone: a rotated origin keeps working, and a retired or approve-only key
    originates nothing.

    Args:
        request: The request document.
        signature: The origin's SSHSIG signature, bare base64 or armored.
        origin_keys: The origin's keys (``NodeConfig.peers[origin].keys``,
            ``MultiSigQuorumConfig.keys_of(origin)``), or one public key line without limits.

    Returns:
        The key that signed.

    Raises:
        QuorumError: The request is malformed.
        SignatureError: The signature is malformed, was made by a key that is not one of
            ``origin_keys`` or that may not sign requests at ``created_at``, is for another
            namespace, or does not verify over the request's canonical bytes (one sentence).
    """
    validate_request(request)
    if not isinstance(signature, str):
        raise SignatureError("The request signature is not a string.")
    keys = _origin_keys(origin_keys)
    return signing_key(
        request_statement(request),
        signature,
        keys,
        REQUEST_NAMESPACE,
        request["created_at"],
        whose=f"the keys of {request['origin']}",
    )


def _origin_keys(keys: Sequence[SignerKey] | str) -> Sequence[SignerKey]:
    """The keys as given, or a key line as one key without limits (a SignatureError when unusable)."""
    if not isinstance(keys, str):
        return keys
    try:
        return (SignerKey(line=keys, source="the origin's key"),)
    except ValueError as exc:
        raise SignatureError(str(exc)) from None


def signing_key(
    data: bytes, signature: str, keys: Sequence[SignerKey], namespace: str, signed_at: int, *, whose: str
) -> SignerKey:
    """Return which of a signer's ``keys`` made ``signature`` over ``data``, checking everything.

    PROTOCOL.md rules 2 and 3: the key embedded in the SSHSIG must be one of the signer's keys
    (an exact key, as ``ssh-keygen -Y verify`` compares them), allowed to sign in ``namespace``
    at ``signed_at`` by its ``allowed_signers`` options; then the SSHSIG is verified with it. A
    key listed several times (two ``allowed_signers`` lines with other namespaces or validity)
    may sign when any of its entries allows it, as ``ssh-keygen -Y verify`` reads every line.

    Args:
        data: The exact bytes that were signed.
        signature: The SSHSIG, bare base64 or armored.
        keys: The signer's keys, from the verifier's own configuration.
        namespace: The namespace the signature must carry.
        signed_at: The signing time the signed document claims.
        whose: The keys as a phrase for messages (``beta's configured key``).

    Returns:
        The key that signed.

    Raises:
        SignatureError: No key is configured, the signature is by another key, that key may not
            sign in ``namespace`` at ``signed_at``, or the signature does not verify (one sentence).
    """
    if not keys:
        raise SignatureError(f"no public key is configured as {whose}.")
    entries: Sequence[SignerKey] = keys
    if len(keys) > 1:
        embedded = parse_sshsig(signature).public_key_blob
        entries = [key for key in keys if key.key.blob == embedded]
        if not entries:
            made_by = parse_sshsig(signature).signer_fingerprint
            raise SignatureError(f"it was made by the key {made_by}, which is not one of {whose}.")
    chosen = next((key for key in entries if key.limit(namespace, signed_at) is None), None)
    if chosen is None:
        raise SignatureError(_refusal(entries, namespace, signed_at))
    sshsig_verify(data, signature, chosen.key, namespace)
    return chosen


def _refusal(entries: Sequence[SignerKey], namespace: str, signed_at: int) -> str:
    """One sentence: why no entry of one key may sign in ``namespace`` at ``signed_at``."""
    first = entries[0]
    if len(entries) == 1:
        return f"the key {first.fingerprint} {first.limit(namespace, signed_at)}."
    reasons = "; ".join(
        f"{f'at {entry.source}' if entry.source else f'in entry {number}'} it "
        f"{entry.limit(namespace, signed_at)}"
        for number, entry in enumerate(entries, 1)
    )
    return (
        f"the key {first.fingerprint} is listed {len(entries)} times and no entry allows this "
        f"signature: {reasons}."
    )


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
    if not _is_time(signed_at):
        raise ValueError(f"signed_at {signed_at!r} is not an integer Unix time")
    return {
        "v": PROTOCOL_VERSION,
        "type": kind,
        "request_id": request["request_id"],
        "origin": request["origin"],
        "signer": signer,
        "tool_name": request["tool_name"],
        "payload_digest": request["payload_digest"],
        "expires_at": request["expires_at"],
        "signed_at": signed_at,
    }


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


def _signing_time(signed_at: int | None) -> int:
    return int(time.time()) if signed_at is None else signed_at


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
    when = _signing_time(signed_at)
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
    statement = denial_statement(request, signer, _signing_time(signed_at), reason)
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
    return value if _is_time(value) else None


def build_certificate(
    request: Mapping[str, Any],
    request_signature: str,
    approvals: Sequence[PeerSignature | Mapping[str, Any]],
    denials: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """Assemble a quorum certificate (PROTOCOL.md, Quorum certificate).

    Use the approvals of an approved :class:`QuorumOutcome` (``outcome.approvals``); compact
    :class:`PeerSignature` approvals are expanded to ``{"statement", "signature"}`` by rebuilding
    their statement from the request. Nothing is verified here: :func:`verify_certificate` does that.

    Args:
        request: The request document.
        request_signature: The origin's signature over the request (armored or bare base64).
        approvals: The approvals to carry, compact or full.
        denials: The denials counted on the request, ``{"statement", "signature"}`` each, carried so
            that a verifier applies rule 6 itself (a signer that denied counts as a denial only).

    Returns:
        ``{"request", "request_signature", "approvals": [{"statement", "signature"}, ...]}``, the
        signatures in wire form, and ``"denials"`` in the same form when there are any.

    Raises:
        ValueError: A compact approval has a timestamp that is not an integer time, or a peer id
            that is not an agent id.
        SignatureError: A signature is not armored or bare base64 SSHSIG text.
    """
    carried: list[dict[str, Any]] = []
    for approval in approvals:
        if isinstance(approval, PeerSignature):
            signed_at = signed_at_of(approval)
            if signed_at is None:
                raise ValueError(
                    f"the approval of {approval.peer_id} has a timestamp that is not an integer time"
                )
            statement = approval_statement(request, approval.peer_id, signed_at)
            carried.append({"statement": statement, "signature": wire_signature(approval.signature)})
        else:
            carried.append(
                {"statement": dict(approval["statement"]), "signature": wire_signature(approval["signature"])}
            )
    certificate: dict[str, Any] = {
        "request": dict(request),
        "request_signature": wire_signature(request_signature),
        "approvals": carried,
    }
    if denials:
        certificate[CERTIFICATE_DENIALS] = [
            {"statement": dict(denial["statement"]), "signature": wire_signature(denial["signature"])}
            for denial in denials
        ]
    return certificate


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
    if not _is_time(withdrawn_at):
        raise ValueError(f"withdrawn_at {withdrawn_at!r} is not an integer Unix time")
    return {
        "v": PROTOCOL_VERSION,
        "type": WITHDRAWAL_TYPE,
        "request_id": request["request_id"],
        "origin": request["origin"],
        "payload_digest": request["payload_digest"],
        "expires_at": request["expires_at"],
        "withdrawn_at": withdrawn_at,
    }


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
    statement = withdrawal_statement(request, _signing_time(withdrawn_at))
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
    if not _is_time(withdrawn_at):
        return "the withdrawal's withdrawn_at is not an integer Unix time"
    assert isinstance(withdrawn_at, int)
    rebuilt = withdrawal_statement(request, withdrawn_at)
    for name in sorted(set(statement) | set(rebuilt)):
        if name not in rebuilt:
            return f"the withdrawal has the unknown field {name}"
        if name not in statement:
            return f"the withdrawal lacks the field {name}"
        mine, theirs = rebuilt[name], statement[name]
        if type(mine) is not type(theirs) or mine != theirs:
            return f"the withdrawal's {name} does not match request {request['request_id']}"
    return None


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
        _origin_keys(keys),
        WITHDRAWAL_NAMESPACE,
        rebuilt["withdrawn_at"],
        whose=f"the keys of {request['origin']}",
    )
    return rebuilt
