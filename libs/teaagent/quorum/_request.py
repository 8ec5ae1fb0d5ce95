"""The request of PROTOCOL.md: its shape, building and signing it, and checking the origin's signature."""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from teaagent._canonical import payload_digest
from teaagent._json import MAX_ARGUMENTS_DEPTH, JSONDepthError
from teaagent.errors import QuorumError, SignatureError
from teaagent.quorum._documents import (
    DIGEST_PATTERN,
    MAX_LABEL_CHARS,
    MAX_PEERS,
    MAX_REQUEST_LIFETIME_SECONDS,
    POLICY_FIELD,
    POLICY_VERSION,
    PROTOCOL_VERSION,
    REQUEST_FIELDS,
    REQUEST_FIELDS_V2,
    REQUEST_ID_PATTERN,
    REQUEST_NAMESPACE,
    REQUEST_TYPE,
    dated_ahead,
    is_agent_id,
    is_int,
    is_time,
    request_statement,
    wire_signature,
)
from teaagent.quorum._keys import keys_given, signing_key
from teaagent.signing import Signer, sshsig_sign
from teaagent.trust import QuorumPolicy, SignerKey, policy_problem

if TYPE_CHECKING:
    from teaagent.trust import MultiSigQuorumConfig

__all__ = [
    "build_request",
    "request_policy",
    "request_problem",
    "request_time_problem",
    "sign_request",
    "validate_request",
    "verify_checked_request_signature",
    "verify_request_signature",
]


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
    if not (is_time(created_at) and is_time(expires_at)):
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


def request_time_problem(request: Mapping[str, Any], now: float) -> str | None:
    """Why a well-formed request is created too far in this node's future, as a clause; else None.

    A request from the future would hold its place (and its keys) at a peer until then, so a peer
    refuses one created beyond PROTOCOL.md rule 4's clock skew. Whether it is expired at ``now``
    is :func:`~teaagent.quorum.is_expired`'s question, answered apart (another refusal).
    """
    return dated_ahead(
        request["created_at"],
        now,
        subject=f"request {request['request_id']}",
        verb="was created at",
        beyond="ahead of this node's clock",
    )


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
    return verify_checked_request_signature(request, signature, origin_keys)


def verify_checked_request_signature(
    request: Mapping[str, Any], signature: str, origin_keys: Sequence[SignerKey] | str
) -> SignerKey:
    """:func:`verify_request_signature` for a request its caller has just found well formed.

    For a caller that refuses a malformed request in words of its own first (a relay's ``422``,
    from :func:`request_problem`): the same check of the signature, without the document's
    structure checked a second time.

    Raises:
        SignatureError: As :func:`verify_request_signature`.
    """
    if not isinstance(signature, str):
        raise SignatureError("The request signature is not a string.")
    keys = keys_given(origin_keys)
    return signing_key(
        request_statement(request),
        signature,
        keys,
        REQUEST_NAMESPACE,
        request["created_at"],
        whose=f"the keys of {request['origin']}",
    )
