"""What the relay client returns: the relay's answers as frozen dataclasses, read leniently or refused.

A request status (one of this node's own requests, as its relay counts it), an inbox item (a peer's
request, as the relay hands it over: not yet trusted), and the receipts of decisions. Each is
built from the relay's JSON by ``from_json``, which refuses what is not one with ValueError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from teaagent._display import visible
from teaagent._service_client import ITEM_STATES, ItemState, ListState
from teaagent.quorum import describe_outcome
from teaagent.trust import QuorumPolicy

__all__ = [
    "DecisionReceipt",
    "InboxDecision",
    "InboxItem",
    "InboxState",
    "PeerDelivery",
    "RequestStatus",
    "State",
]

State = ItemState
InboxState = ListState
_INBOX_STATES: Final = frozenset(ITEM_STATES)
_REQUEST_STATES: Final = ("pending", "approved", "denied", "expired", "withdrawn")
DeliveryStateName = Literal["pending", "delivered", "failing", "given_up"]
_DELIVERY_STATES: Final = ("pending", "delivered", "failing", "given_up")
MAX_DELIVERY_ERROR_CHARS: Final = 300  # what a relay says of a peer it cannot reach, as shown
# The fields of an inbox item that the client reads; the relay's other fields are its description.
_CARRIED: Final = ("request_id", "origin", "state", "request", "signature", "decision", "settlement")


@dataclass(frozen=True, kw_only=True)
class PeerDelivery:
    """How the relay's delivery of a request to one peer's relay went (the relay's word, for display).

    Attributes:
        state: ``pending`` (not tried yet), ``delivered`` (the peer's relay took it), ``failing``
            (the last attempt failed, another is scheduled) or ``given_up`` (refused for good, or
            no attempt is left before the request expires).
        attempts: Attempts made so far.
        error: The last failure's sentence, or None.
    """

    state: DeliveryStateName
    attempts: int = 0
    error: str | None = None

    @property
    def unreachable(self) -> bool:
        """True when the last attempt failed (``failing`` or ``given_up``)."""
        return self.state in ("failing", "given_up")


def _one_line(text: str) -> str:
    """``text`` with every character a terminal would not show as itself escaped, line breaks
    included, and cut to ``MAX_DELIVERY_ERROR_CHARS``."""
    shown = visible(text)
    return shown if len(shown) <= MAX_DELIVERY_ERROR_CHARS else shown[:MAX_DELIVERY_ERROR_CHARS] + "…"


def _deliveries(raw: object) -> dict[str, PeerDelivery]:
    """Read ``deliveries`` leniently: an entry this client cannot read is left out (display only)."""
    out: dict[str, PeerDelivery] = {}
    if not isinstance(raw, Mapping):
        return out
    for peer, entry in raw.items():
        if not isinstance(entry, Mapping):
            continue
        state = entry.get("state")
        if state not in _DELIVERY_STATES:
            continue
        error = entry.get("error")
        attempts = entry.get("attempts")
        out[str(peer)] = PeerDelivery(
            state=state,
            attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
            # The relay's own words, shown on one line: a line break or an escape sequence in them
            # could draw lines of their own ("✓ beta approved...") under the ones that verified.
            error=_one_line(str(error)) if error is not None else None,
        )
    return out


@dataclass(frozen=True, kw_only=True)
class RequestStatus:
    """One of this node's own requests as its relay counts it.

    Attributes:
        request_id: The request's id.
        state: ``pending``, ``approved``, ``denied`` or ``expired``; once decided it never changes.
        required: Approvals needed.
        peers: The request's peers that the relay counts.
        signers: Peers whose approval was counted.
        denied_by: Peers whose denial was counted.
        denial_reasons: The reason each denier signed.
        expires_at: Unix seconds after which the request is expired.
        accepted_at: Unix seconds when the relay stored it.
        decided_at: Unix seconds when it was decided, or None.
        certificate: The quorum certificate once approved (verify it: the relay is not trusted);
            it carries the denials the relay counted as well (``"denials"``), for rule 6.
        denials: The signed denials ``{"statement", "signature"}`` the relay counted, so that the
            origin can check who really denied (the relay's ``denied_by`` is only its word).
        approvals: The signed approvals ``{"statement", "signature"}`` the relay counted so far
            (empty from a relay that does not send them).
        deliveries: Per peer, how the relay's delivery of the request went: who received it, who
            could not be reached (empty from a relay that does not report it).
        withdrawal: The origin's signed withdrawal ``{"statement", "signature"}`` once withdrawn.
    """

    request_id: str
    state: State
    required: int
    peers: tuple[str, ...]
    signers: tuple[str, ...]
    denied_by: tuple[str, ...]
    denial_reasons: Mapping[str, str] = field(default_factory=dict)
    expires_at: int
    accepted_at: int
    decided_at: int | None
    certificate: dict[str, Any] | None
    denials: tuple[dict[str, Any], ...] = ()
    approvals: tuple[dict[str, Any], ...] = ()
    deliveries: Mapping[str, PeerDelivery] = field(default_factory=dict)
    withdrawal: dict[str, Any] | None = None
    # A version 2 request's policy, set only by the gate from the request it signed (never the
    # relay's word): its terms limited to the peers configured here, named after this node's groups.
    policy: QuorumPolicy | None = None

    @property
    def decided(self) -> bool:
        """Whether the outcome is final."""
        return self.state != "pending"

    def describe(self) -> str:
        """Return the state as one phrase: ``approved by beta (1 approval of the 1 needed)`` and the like."""
        return describe_outcome(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestStatus:
        """Build it from the relay's JSON (``RequestStatusOut``).

        Raises:
            ValueError: The JSON is not a request status (a field is missing or of the wrong kind).
        """
        try:
            state = data["state"]
            if state not in _REQUEST_STATES:
                raise ValueError(f"its state {state!r} is not a request state")
            certificate = data.get("certificate")
            denials = data.get("denials") or ()
            if certificate is not None and not isinstance(certificate, dict):
                raise ValueError("its certificate is not a JSON object")
            if not all(isinstance(denial, dict) for denial in denials):
                raise ValueError("its denials are not JSON objects")
            withdrawal = data.get("withdrawal")
            if withdrawal is not None and not isinstance(withdrawal, dict):
                raise ValueError("its withdrawal is not a JSON object")
            approvals = data.get("approvals") or ()
            if not all(isinstance(approval, dict) for approval in approvals):
                raise ValueError("its approvals are not JSON objects")
            return cls(
                request_id=str(data["request_id"]),
                state=state,
                required=int(data["required"]),
                peers=tuple(data["peers"]),
                signers=tuple(data["signers"]),
                denied_by=tuple(data["denied_by"]),
                denial_reasons=dict(data.get("denial_reasons") or {}),
                expires_at=int(data["expires_at"]),
                accepted_at=int(data["accepted_at"]),
                decided_at=data.get("decided_at"),
                certificate=certificate,
                denials=tuple(denials),
                approvals=tuple(approvals),
                deliveries=_deliveries(data.get("deliveries")),
                withdrawal=withdrawal,
            )
        except KeyError as exc:
            raise ValueError(f"it has no field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"a field has the wrong type ({exc})") from None


@dataclass(frozen=True, kw_only=True)
class InboxItem:
    """A request received from a peer origin, as this node's relay hands it over: not yet trusted.

    The relay is not trusted (PROTOCOL.md "What an approving node decides on"): the request it
    carries counts only once :func:`teaagent.quorum.verify_request` has verified it against the
    origin's keys, and what the relay says of the item beside it (its tool, arguments, digest,
    times...) is kept apart, in ``described``, only to be compared with the verified request
    (:meth:`teaagent.quorum.VerifiedRequest.disagreement`). Nothing here is shown, matched or signed
    as it stands.

    Attributes:
        request_id: The id the relay files it under.
        origin: The origin the relay files it under.
        state: ``pending``, ``approved``/``denied`` (by this node), ``expired``, or ``withdrawn``
            (by its origin: it is never to be signed), as the relay says.
        request: The request document it carries, unverified.
        signature: The origin's signature over it, as carried.
        decision: This node's signed decision ``{"statement", "signature"}``, as the relay holds it.
        described: Every other field of the relay's answer (its own description of the request).
        settlement: The evidence of its outcome at its origin, ``{"certificate"}`` or
            ``{"denials"}``, as the relay holds it: believed only once verified
            (:func:`teaagent.quorum.verify_settlement`).
    """

    request_id: str
    origin: str
    state: State
    request: dict[str, Any]
    signature: str
    decision: dict[str, Any] | None
    described: dict[str, Any] = field(default_factory=dict)
    settlement: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InboxItem:
        """Build it from the relay's JSON (``InboxItemOut``).

        Raises:
            ValueError: The answer is not an inbox item (not an object, or its id, origin, state,
                request, signature or decision has the wrong type); the sentence says which.
        """
        if not isinstance(data, Mapping):
            raise ValueError("an inbox item is not a JSON object")
        request_id, origin, state = data.get("request_id"), data.get("origin"), data.get("state")
        request, signature, decision = data.get("request"), data.get("signature"), data.get("decision")
        if not isinstance(request_id, str) or not isinstance(origin, str):
            raise ValueError("an inbox item has no string request_id and origin")
        if state not in _INBOX_STATES:
            raise ValueError(f"inbox item {request_id} has the state {state!r}, which is not an inbox state")
        if not isinstance(request, dict) or not isinstance(signature, str):
            raise ValueError(f"inbox item {request_id} carries no request object and signature string")
        if decision is not None and not isinstance(decision, dict):
            raise ValueError(f"inbox item {request_id} has a decision that is not a JSON object")
        settlement = data.get("settlement")
        if settlement is not None and not isinstance(settlement, dict):
            raise ValueError(f"inbox item {request_id} has a settlement that is not a JSON object")
        return cls(
            request_id=request_id,
            origin=origin,
            state=state,
            request=request,
            signature=signature,
            decision=decision,
            described={name: value for name, value in data.items() if name not in _CARRIED},
            settlement=settlement,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the item as the relay's JSON."""
        return {**self.described, **{name: getattr(self, name) for name in _CARRIED}}


@dataclass(frozen=True, kw_only=True)
class DecisionReceipt:
    """What a relay did with one signed decision.

    Attributes:
        request_id: The request decided on.
        origin: The request's origin.
        signer: Who signed the decision.
        kind: ``approval`` or ``denial``.
        state: The request's state after it.
        counted: False when the same signer's decision was counted before (a repeat).
        decided: True when this very decision settled the outcome.
        approvals: Approvals counted so far.
        denials: Denials counted so far.
    """

    request_id: str
    origin: str
    signer: str
    kind: Literal["approval", "denial"]
    state: State
    counted: bool
    decided: bool
    approvals: int
    denials: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionReceipt:
        """Build it from the relay's JSON (``DecisionReceiptOut``).

        Raises:
            KeyError: A field is missing.
        """
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True)
class InboxDecision:
    """This node's own decision on a peer's request, as its relay recorded it (not the outcome).

    Attributes:
        request_id: The request decided on.
        origin: The request's origin, which counts the outcome.
        signer: This node.
        kind: ``approval`` or ``denial``.
        this_node: ``approved`` or ``denied``: this node's vote alone.
        counted: False when the same decision was recorded before (a repeat).
        note: The relay's reminder that the outcome is the origin's to count.
    """

    request_id: str
    origin: str
    signer: str
    kind: Literal["approval", "denial"]
    this_node: Literal["approved", "denied"]
    counted: bool
    note: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InboxDecision:
        """Build it from the relay's JSON (``InboxDecisionOut``).

        Raises:
            KeyError: A field is missing.
        """
        return cls(
            request_id=data["request_id"],
            origin=data["origin"],
            signer=data["signer"],
            kind=data["kind"],
            this_node=data["this_node"],
            counted=data["counted"],
            note=str(data.get("note", "")),
        )
