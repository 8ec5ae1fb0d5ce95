"""A request whose origin signature verified: the one thing an approving node decides on.

PROTOCOL.md "What an approving node decides on": whatever an approver matches a rule against,
shows an operator, hands a webhook or puts in a statement comes from the signed request, after
its signature verified against the origin's keys in this node's own configuration. Never from
what a relay says beside it.

:class:`VerifiedRequest` makes that the only thing that can be written. Nobody can build one but
:func:`verify_request`, which verifies the origin's signature over the request's canonical bytes
and keeps its own deep copy of the document whose canonical bytes verified: what the object answers
is what was signed, and no caller's dict is shared with it. The approving side (rules, views, statements,
notifications) takes a ``VerifiedRequest``, never a raw document or a relay's item, so code that
would read a relay's description of a request does not type-check.

:meth:`VerifiedRequest.disagreement` compares a relay's description of the item (its ``tool_name``,
``arguments``, ``payload_digest``...) with the request: an approver refuses an item whose relay
says anything else than the request it carries (a lying or broken relay), rather than choose.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn, final

from teaagent.errors import QuorumError, SignatureError
from teaagent.quorum._documents import (
    REQUEST_FIELDS,
    REQUEST_NAMESPACE,
    clause,
    dev_signature_allowed,
    is_dev_signature,
    request_statement,
    wire_signature,
)
from teaagent.quorum._keys import signing_key
from teaagent.quorum._request import request_problem
from teaagent.quorum._statements import DecisionKind, approval_statement, denial_statement, rebuild_decision
from teaagent.trust import SignerKey

__all__ = ["VerifiedRequest", "verify_request"]

logger = logging.getLogger("teaagent.quorum")

# Every field of a request a relay may describe beside it; the constant ones (v, type) it never does.
_FIELDS: Final = tuple(sorted(REQUEST_FIELDS - {"v", "type"}))
_SEAL: Final = object()  # held by this module alone: the proof that verify_request built the object


@final
class VerifiedRequest:
    """A request document whose origin signature verified (build it with :func:`verify_request`).

    Immutable. Each field of the request is an attribute; ``arguments`` and :meth:`document` answer
    fresh copies, so nothing a caller does changes what the object holds.

    Attributes:
        request_id: The request's id.
        origin: The node that signed it.
        run_id: The origin's run.
        call_id: The call's id in that run.
        tool_name: The tool it asks to call.
        payload_digest: ``sha256:...`` of the tool name and arguments (checked against them).
        reason: The origin model's reasoning.
        required_approvals: Approvals the origin needs.
        peers: Every peer asked, sorted.
        created_at: Unix seconds.
        expires_at: Unix seconds.
        signature: The origin's signature, wire form (bare base64, or ``dev:<origin>``).
        development: True when only ``allow_dev_signatures`` let it through.
    """

    __slots__ = (
        "_document",
        "call_id",
        "created_at",
        "development",
        "expires_at",
        "origin",
        "payload_digest",
        "peers",
        "reason",
        "request_id",
        "required_approvals",
        "run_id",
        "signature",
        "tool_name",
    )

    request_id: str
    origin: str
    run_id: str
    call_id: str
    tool_name: str
    payload_digest: str
    reason: str
    required_approvals: int
    peers: tuple[str, ...]
    created_at: int
    expires_at: int
    signature: str
    development: bool
    _document: dict[str, Any]

    def __init__(self, seal: object, request: Mapping[str, Any], signature: str) -> None:
        """Only :func:`verify_request` calls this.

        Raises:
            TypeError: Called by anyone else.
        """
        if seal is not _SEAL:
            raise TypeError("a VerifiedRequest is built only by teaagent.quorum.verify_request().")
        document = copy.deepcopy(dict(request))  # our own copy of what verified: nobody else holds it
        put = object.__setattr__
        put(self, "_document", document)
        for name in _FIELDS:
            if name not in ("arguments", "peers"):
                put(self, name, document[name])
        put(self, "peers", tuple(document["peers"]))
        put(self, "signature", signature)
        put(self, "development", is_dev_signature(signature))

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a VerifiedRequest is immutable; {name} cannot be set")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"a VerifiedRequest is immutable; {name} cannot be deleted")

    def __repr__(self) -> str:
        return f"VerifiedRequest({self.request_id!r}, origin={self.origin!r}, tool_name={self.tool_name!r})"

    @property
    def arguments(self) -> dict[str, Any]:
        """The call's arguments, as signed (a fresh copy)."""
        return copy.deepcopy(self._document["arguments"])

    def document(self) -> dict[str, Any]:
        """The request document, as signed (a fresh copy)."""
        return copy.deepcopy(self._document)

    def is_document(self, request: object) -> bool:
        """Whether ``request`` is this very document (same fields, same values, same JSON types)."""
        return _same(request, self._document)

    def approval(self, signer: str, signed_at: int) -> dict[str, Any]:
        """The approval statement ``signer`` signs for this request (PROTOCOL.md).

        Raises:
            ValueError: ``signer`` is not an agent id or ``signed_at`` is not an integer time.
        """
        return approval_statement(self._document, signer, signed_at)

    def denial(self, signer: str, signed_at: int, reason: str) -> dict[str, Any]:
        """The denial statement ``signer`` signs for this request, with its reason.

        Raises:
            ValueError: ``signer`` is not an agent id, ``signed_at`` is not an integer time, or
                ``reason`` is not a string.
        """
        return denial_statement(self._document, signer, signed_at, reason)

    def rebuild_decision(
        self, statement: Mapping[str, Any], kind: DecisionKind, signer: str
    ) -> dict[str, Any]:
        """``signer``'s statement of ``kind`` rebuilt from this request; the carried one must equal it.

        :func:`~teaagent.quorum.rebuild_decision` over the document that verified.

        Raises:
            StatementMismatchError: The carried statement is not that statement.
        """
        return rebuild_decision(self._document, statement, kind, signer)

    def disagreement(self, described: Mapping[str, Any]) -> str | None:
        """Where a relay's description of this request differs from it; None when it does not.

        Every field of ``described`` that names a field of the request must equal it, types
        included (``1 == True == 1.0`` in Python, not in a signed document); fields it leaves out
        are not compared, and names that are not request fields are ignored.

        Args:
            described: What a relay says of the item beside the request it carries.

        Returns:
            A clause naming the first field that differs (``the relay says tool_name is 'x', the
            signed request says 'y'``), or None.
        """
        for name in _FIELDS:
            if name not in described:
                continue
            said, signed = described[name], self._document[name]
            if name == "peers" and isinstance(said, tuple):
                said = list(said)
            if not _same(said, signed):
                return (
                    f"the relay says its {name} is {_short(said)}, the signed request says {_short(signed)}"
                )
        return None


def _same(left: object, right: object) -> bool:
    """JSON equality with types: ``True`` is not ``1``, ``1`` is not ``1.0``, order of lists counts."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        assert isinstance(right, dict)
        return left.keys() == right.keys() and all(_same(left[key], right[key]) for key in left)
    if isinstance(left, list):
        assert isinstance(right, list)
        return len(left) == len(right) and all(_same(a, b) for a, b in zip(left, right, strict=True))
    return left == right


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=True, default=repr)
    return text if len(text) <= 80 else text[:77] + "..."


def verify_request(
    request: object,
    signature: object,
    keys: Sequence[SignerKey],
    *,
    recipient: str | None = None,
    allow_dev: bool = False,
) -> VerifiedRequest:
    """Verify a request and its origin's signature; return the request as a :class:`VerifiedRequest`.

    Steps (PROTOCOL.md "What an approving node decides on", "Keys of the origin"):

    1. The request is a well-formed request (:func:`request_problem`), its digest included.
    2. When ``recipient`` is given, it is one of the request's peers and not its origin.
    3. The signature verifies over the request's canonical bytes, in namespace
       ``teaagent-request``, with one of ``keys`` (the origin's keys in this node's own
       configuration) allowed to sign requests at its ``created_at``; or, with ``allow_dev``, it is
       exactly ``dev:<origin>`` (logged at WARNING).

    Args:
        request: The request document, as parsed from JSON.
        signature: The origin's SSHSIG, bare base64 or armored.
        keys: The keys configured for the request's origin.
        recipient: This node's agent id, when it is asked to decide.
        allow_dev: Whether ``dev:<origin>`` passes without cryptography (never by default).

    Returns:
        The verified request.

    Raises:
        QuorumError: The request is malformed or not addressed to ``recipient``.
        SignatureError: The signature is malformed, by a key that is not the origin's (or may not
            sign requests at ``created_at``), or does not verify.
    """
    problem = request_problem(request)  # step 1
    if problem is not None:
        raise QuorumError(problem[0].upper() + problem[1:] + ".")
    assert isinstance(request, Mapping)
    origin = request["origin"]
    if recipient is not None and (recipient == origin or recipient not in request["peers"]):  # step 2
        raise QuorumError(f"Request {request['request_id']} of {origin} is not addressed to {recipient}.")
    if not isinstance(signature, str):
        raise SignatureError("The request signature is not a string.")
    if is_dev_signature(signature):  # step 3, the development form
        if not dev_signature_allowed(signature, origin, allow_dev=allow_dev):
            raise SignatureError(f"The development signature of request {request['request_id']} is refused.")
        logger.warning("request %s of %s passes on a development signature", request["request_id"], origin)
        return VerifiedRequest(_SEAL, request, signature)
    try:
        signing_key(
            request_statement(request),
            signature,
            keys,
            REQUEST_NAMESPACE,
            request["created_at"],
            whose=f"the keys configured for {origin}",
        )
        wire = wire_signature(signature)
    except SignatureError as exc:
        raise SignatureError(
            f"The origin signature of request {request['request_id']} does not verify with the keys "
            f"configured for {origin}: {clause(exc)}."
        ) from None
    except ValueError as exc:
        raise SignatureError(
            f"The origin signature of request {request['request_id']} is malformed: {clause(exc)}."
        ) from None
    return VerifiedRequest(_SEAL, request, wire)
