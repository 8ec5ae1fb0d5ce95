"""The quorum certificate of PROTOCOL.md: assembling it, and verifying that it proves the quorum.

:func:`verify_certificate` counts the certificate's approvals and denials by the rules of
:func:`~teaagent.quorum.evaluate` (one :class:`~teaagent.quorum._counting.Counter`) and raises
:class:`~teaagent.errors.QuorumError` unless the quorum is proven.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from teaagent._words import approvals_of
from teaagent.errors import QuorumError, SignatureError
from teaagent.quorum._counting import QuorumOutcome, clock, counter_for
from teaagent.quorum._documents import (
    CERTIFICATE_DENIALS,
    CERTIFICATE_FIELDS,
    clause,
    dev_signature_passes,
    wire_signature,
)
from teaagent.quorum._request import request_problem, verify_request_signature
from teaagent.quorum._statements import approval_statement, signed_at_of
from teaagent.trust import MultiSigQuorumConfig, PeerSignature, SignerKey

__all__ = ["MAX_CERTIFICATE_APPROVALS", "build_certificate", "verify_certificate"]

MAX_CERTIFICATE_APPROVALS: Final = 1024  # far beyond any real cluster; bounds the work one certificate causes


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


def verify_certificate(
    cert: Mapping[str, Any],
    config: MultiSigQuorumConfig,
    *,
    origin_public_key: str | Sequence[SignerKey] | None = None,
    now: float | None = None,
) -> QuorumOutcome:
    """Verify that a quorum certificate proves the quorum under the verifier's configuration.

    The counting rules are those of :func:`evaluate`, with one difference: a certificate stays
    verifiable long after its request expired, so ``now > expires_at`` is not applied (each
    approval must still be signed no earlier than ``created_at`` less the clock skew, no later
    than ``expires_at``, and no later than ``now`` plus the clock skew). Each approval's statement
    must equal the one rebuilt from the request; its fields are never trusted on their own.

    The certificate may also carry ``denials``, the signed denials the origin's relay counted
    (``{"statement", "signature"}`` each). Each is checked as :func:`evaluate` checks a denial
    (rules 1 to 4); one that does not verify counts for nothing and is reported in
    ``rejected_denials``. A signer with a valid denial has its approval refused (rule 6: it counts
    as a denial only), so a certificate that reaches the threshold only with such a signer does not
    verify. A denial that was never put in the certificate cannot be applied: what an origin relay
    withholds is beyond any verifier (docs/protocol.md, "What a hostile origin relay can still do").

    Args:
        cert: ``{"request", "request_signature", "approvals"}`` and optionally ``"denials"``, as
            :func:`build_certificate` makes it.
        config: The verifier's quorum configuration.
        origin_public_key: The origin's keys (a public key line, or its configured keys with
            their ``allowed_signers`` limits); when given, the origin's signature over the request
            is checked too, at its ``created_at`` (required wherever the request came from someone
            else).
        now: The time of the verification in Unix seconds; the clock when None.

    Returns:
        The outcome, whose ``state`` is ``approved``; ``denied_by`` names the signers whose carried
        denial counted.

    Raises:
        QuorumError: The certificate is malformed, its request is malformed, the request signature
            does not verify with ``origin_public_key``, or fewer distinct authorised peers than
            required signed valid approvals without also signing a valid denial (the message names
            each refusal).
    """
    if not (
        isinstance(cert, Mapping)
        and CERTIFICATE_FIELDS <= set(cert) <= CERTIFICATE_FIELDS | {CERTIFICATE_DENIALS}
    ):
        raise QuorumError(
            "The quorum certificate is not a JSON object with exactly "
            "request, request_signature and approvals, and optionally denials."
        )
    request, approvals = cert["request"], cert["approvals"]
    denials = cert.get(CERTIFICATE_DENIALS, [])
    problem = request_problem(request)
    if problem is not None:
        raise QuorumError(f"The certificate's request is malformed: {problem}.")
    for kind, documents in (("approvals", approvals), ("denials", denials)):
        if not isinstance(documents, list):
            raise QuorumError(f"The certificate's {kind} are not a list.")
        if len(documents) > MAX_CERTIFICATE_APPROVALS:
            raise QuorumError(
                f"The certificate carries {len(documents)} {kind}, "
                f"more than the limit of {MAX_CERTIFICATE_APPROVALS}."
            )
    if origin_public_key is not None:
        _check_request_signature(request, cert["request_signature"], origin_public_key, config)
    counter = counter_for(request, config, clock(now))
    # The denials first (rules 1 to 4), the approvals (rules 1 to 5), and rule 6: a signer that
    # denied is no approver, whatever the relay that built this says.
    votes = counter.votes(approvals, denials)
    signers = votes.signers
    refusals = "; ".join(f"{peer}: {reason}" for peer, reason in votes.rejected.items())
    if counter.policy is not None and counter.policy.state(signers, ()) != "approved":
        raise QuorumError(
            f"The certificate does not meet its policy ({counter.policy.describe(signers)}"
            + (f"; refused: {refusals})." if refusals else ").")
        )
    if counter.policy is None and len(signers) < counter.required:
        counted = ", ".join(signers) if signers else "nobody"
        raise QuorumError(
            f"The certificate proves {approvals_of(len(signers), counter.required)} "
            f"(counted: {counted}" + (f"; refused: {refusals})." if refusals else ").")
        )
    return counter.outcome_of("approved", votes)


def _check_request_signature(
    request: Mapping[str, Any],
    signature: object,
    origin_public_key: str | Sequence[SignerKey],
    config: MultiSigQuorumConfig,
) -> None:
    if not isinstance(signature, str):
        raise QuorumError("The certificate's request_signature is not a string.")
    origin = request["origin"]
    try:
        if dev_signature_passes(
            signature,
            origin,
            allow_dev=config.allow_dev_signatures,
            subject="The request signature",
            whose=f"{origin}'s key",
            on=f"request {request['request_id']}",
        ):
            return
    except SignatureError as exc:
        raise QuorumError(str(exc)) from None
    try:
        verify_request_signature(request, signature, origin_public_key)
    except (SignatureError, ValueError) as exc:
        raise QuorumError(
            f"The request signature does not verify with the origin {origin}'s key: {clause(exc)}."
        ) from exc
