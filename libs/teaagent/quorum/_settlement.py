"""A request's outcome at its origin, proven to a peer by its evidence (docs/protocol.md, Settlement).

When its origin's relay records a request approved or denied, it tells every peer's relay, which
marks the item settled so that nobody there is asked to decide it any more. The origin's relay is
not trusted by its peers, so the news travels with its evidence and every reader verifies it
itself, under its own configuration:

- approved: the quorum certificate of exactly that request (:func:`verify_certificate`, with the
  origin's keys configured here);
- denied: the signed denials that made it fail (:func:`evaluate` over them says ``denied``).

A settlement a node cannot verify (a forged one, another request's, or one signed by a peer it
does not know) is refused: it can only hide nothing, and delay. An expiry needs no evidence: every
node knows ``expires_at`` from the verified request and its own clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from teaagent._canonical import canonical
from teaagent.errors import QuorumError
from teaagent.quorum._certificate import MAX_CERTIFICATE_APPROVALS, verify_certificate
from teaagent.quorum._counting import evaluate
from teaagent.quorum._documents import clause
from teaagent.trust import MultiSigQuorumConfig, SignerKey

__all__ = ["SETTLEMENT_OUTCOMES", "Settlement", "verify_settlement"]

SettledOutcome = Literal["approved", "denied"]
SETTLEMENT_OUTCOMES: Final = ("approved", "denied")


@dataclass(frozen=True, slots=True)
class Settlement:
    """What verified evidence proves of a request's outcome at its origin.

    Attributes:
        outcome: ``approved`` or ``denied``.
        decided_by: The counted approvers (approved) or deniers (denied), in the request's peer order.
        at: The latest ``signed_at`` of those decisions: when the outcome was reached, as signed.
    """

    outcome: SettledOutcome
    decided_by: tuple[str, ...]
    at: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the ``settled`` field of an inbox item)."""
        return {"outcome": self.outcome, "decided_by": list(self.decided_by), "at": self.at}


def _latest(documents: Sequence[Mapping[str, Any]], signers: Sequence[str]) -> int:
    times = [
        document["statement"]["signed_at"]
        for document in documents
        if document["statement"].get("signer") in signers
    ]
    return max(times, default=0)


def verify_settlement(
    request: Mapping[str, Any],
    evidence: object,
    config: MultiSigQuorumConfig,
    origin_keys: Sequence[SignerKey],
    *,
    now: float,
) -> Settlement:
    """Verify the evidence of a request's outcome at its origin under this node's configuration.

    Steps:

    1. ``evidence`` is ``{"certificate": {...}}`` or ``{"denials": [...]}``, nothing else.
    2. A certificate's request is exactly ``request`` (the verified request this node holds), and
       it verifies (:func:`verify_certificate`) with the origin's keys configured here.
    3. Denials count (:func:`evaluate`, as of ``now`` or the request's expiry, whichever is
       earlier) to ``denied``, and they are more than ``len(peers) - required`` of the request's
       own peers (this node among them: it never counts itself).

    Args:
        request: The request, as this node verified it.
        evidence: The settlement as carried.
        config: This node's quorum configuration.
        origin_keys: The keys configured here for the request's origin.
        now: This node's clock, Unix seconds.

    Raises:
        QuorumError: The evidence is malformed, of another request, or does not prove the outcome;
            the sentence says which.
    """
    request_id = request["request_id"]
    if (
        not isinstance(evidence, Mapping)
        or len(evidence) != 1
        or not {"certificate", "denials"} & set(evidence)
    ):
        raise QuorumError(
            f"The settlement of request {request_id} is not exactly one of certificate and denials."
        )
    certificate = evidence.get("certificate")
    if certificate is not None:
        if not isinstance(certificate, Mapping) or not isinstance(certificate.get("request"), Mapping):
            raise QuorumError(f"The certificate settling request {request_id} is not a certificate.")
        try:
            carried = canonical(certificate["request"])
        except ValueError:  # a NaN, a lone surrogate, too deep: JSON no request document holds
            raise QuorumError(
                f"The certificate settling request {request_id} carries a request that is not canonical JSON."
            ) from None
        if carried != canonical(request):
            raise QuorumError(f"The certificate settling request {request_id} is another request's.")
        try:
            outcome = verify_certificate(certificate, config, origin_public_key=origin_keys, now=now)
        except QuorumError as exc:
            text = clause(exc)
            raise QuorumError(
                f"The certificate settling request {request_id} does not verify here: "
                f"{text[:1].lower() + text[1:]}."
            ) from None
        return Settlement("approved", outcome.signers, _latest(outcome.approvals, outcome.signers))
    denials = evidence["denials"]
    if not isinstance(denials, list) or not all(isinstance(denial, Mapping) for denial in denials):
        raise QuorumError(f"The denials settling request {request_id} are not a list of objects.")
    if len(denials) > MAX_CERTIFICATE_APPROVALS:
        raise QuorumError(
            f"The settlement of request {request_id} carries {len(denials)} denials, more than the "
            f"limit of {MAX_CERTIFICATE_APPROVALS}."
        )
    counted = evaluate(request, [], denials, config, now=min(now, request["expires_at"]))
    # evaluate counts over the peers this node knows, never itself: alone it would call a request
    # denied that this node's own approval could still carry. The request's own peer set decides.
    required = max(request["required_approvals"], config.required_approvals, 1)
    if counted.state != "denied" or len(counted.denied_by) <= len(request["peers"]) - required:
        refused = "; ".join(f"{peer}: {why}" for peer, why in counted.rejected_denials.items())
        raise QuorumError(
            f"The denials settling request {request_id} do not deny it here (counted: "
            f"{', '.join(counted.denied_by) or 'nobody'}" + (f"; refused: {refused})." if refused else ").")
        )
    return Settlement("denied", counted.denied_by, _latest(denials, counted.denied_by))
