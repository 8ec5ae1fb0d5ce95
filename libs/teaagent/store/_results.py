"""What the request books answer: a stored request, the result of each step, and how a reply reads.

The books (``_request_book.RequestBook``, ``_inbox_book.InboxBook``) return these frozen
dataclasses; the functions below turn the scripts' and reads' raw replies into them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from teaagent.errors import RequestNotFoundError

if TYPE_CHECKING:
    from teaagent.store._queue import DeliveryQueue
    from teaagent.store._ratelimit import AsyncRedisRateLimiter, RateLimitSpec
    from teaagent.tools import RateDecision

__all__ = [
    "DELIVERY_STATES",
    "MAX_PENDING_PER_ORIGIN",
    "STATES",
    "AcceptResult",
    "DecisionKind",
    "DecisionResult",
    "DecisionToCount",
    "DeliveryState",
    "DeliveryStateName",
    "Intake",
    "QueuedDecision",
    "ReceiveResult",
    "RequestState",
    "SettleResult",
    "StoredRequest",
    "WithdrawResult",
    "counted",
    "decision_result",
    "delivery_state",
    "not_stored",
    "received",
    "request_state",
    "settled",
    "stored_request",
]

# withdrawn: the origin withdrew it (PROTOCOL.md, Withdrawal); final, as the other decided states are
# settled: an inbox item its origin decided (approved or denied) before this node did, on verified
# evidence (docs/protocol.md, Settlement); final too
RequestState = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]
DecisionKind = Literal["approval", "denial"]
DeliveryStateName = Literal["pending", "delivered", "failing", "given_up"]

STATES: tuple[RequestState, ...] = ("pending", "approved", "denied", "expired", "withdrawn", "settled")
DELIVERY_STATES: tuple[DeliveryStateName, ...] = ("pending", "delivered", "failing", "given_up")
# Pending requests one origin may hold in this node's inbox: more than any operator works through,
# and a hundred origins at it still leave room in the approver's queue (MAX_QUEUE_LENGTH, 100,000),
# so one peer, however fast its window lets it send, cannot crowd the others out.
MAX_PENDING_PER_ORIGIN = 1_000


@dataclass(frozen=True)
class AcceptResult:
    """What storing a request did: ``created`` is False when the very same document was stored before.

    ``stored`` is the request as this very call stored it, when it created it pending: what a read
    right after would return (no decision yet, no delivery tried), without that read. None
    otherwise: a repeat or a request accepted already decided is read from the store.
    """

    created: bool
    state: RequestState
    stored: StoredRequest | None = None


@dataclass(frozen=True)
class Intake:
    """Where :meth:`InboxBook.receive` charges a received request and queues it.

    ``window`` of ``limiter`` (``origin:<id>``) allows ``limit``; the request goes to ``target``
    (``approver``) on ``queue``; its origin may hold at most ``max_pending`` pending requests in
    the inbox.
    """

    limiter: AsyncRedisRateLimiter
    window: str
    limit: RateLimitSpec
    queue: DeliveryQueue
    target: str
    max_pending: int = MAX_PENDING_PER_ORIGIN


@dataclass(frozen=True)
class ReceiveResult:
    """What :meth:`InboxBook.receive` did with a peer's request.

    ``stored_before``: the request (or another document under its id) was stored already; nothing
    was charged or written, and the caller reads it to answer a repeat. ``held`` (with ``full``
    True): its origin already holds that many pending requests here, its cap; nothing was charged
    or written. Otherwise ``decision`` is the origin's window's answer; when it allowed the call,
    ``accepted`` says how the request was stored and ``entry_id`` is its entry on the approver's
    queue (None when it was not pending).
    """

    stored_before: bool
    decision: RateDecision | None = None
    accepted: AcceptResult | None = None
    entry_id: str | None = None
    full: bool = False
    held: int | None = None


@dataclass(frozen=True)
class DecisionResult:
    """The counting state after one decision was recorded.

    ``counted`` is True when this decision changed the count: a signer's first approval (unless it
    denied), or its first denial (which takes its approval away, PROTOCOL.md rule 6);
    ``decided`` is True when this very call settled the outcome (exactly one call ever sees it).
    """

    state: RequestState
    approvals: int
    denials: int
    counted: bool
    decided: bool


@dataclass(frozen=True)
class WithdrawResult:
    """What a withdrawal did: ``withdrawn`` is True when this very call withdrew the request.

    ``state`` is the request's state after it: ``withdrawn`` (by this call, or before: a repeat),
    or the final state it had reached first (``approved``, ``denied``, ``expired``).
    """

    state: RequestState
    withdrawn: bool


@dataclass(frozen=True)
class SettleResult:
    """What recording a settlement did: ``changed`` is True when this very call wrote it.

    ``state`` is the item's state after it: ``settled`` (by this call, or before), this node's own
    decision (``approved``, ``denied``, which keep it), or ``withdrawn``/``expired``.
    """

    state: RequestState
    changed: bool


@dataclass(frozen=True)
class DecisionToCount:
    """One verified decision for :meth:`RequestBook.record_decisions` (``record_decision``'s arguments)."""

    request_id: str
    kind: DecisionKind
    signer: str
    decision: bytes
    now: int | None = None  # Unix seconds; None is the current time
    # A version 2 request's policy as the script reads it (QuorumPolicy.script_form); "" for version 1.
    policy: str = ""


@dataclass(frozen=True)
class QueuedDecision:
    """This node's own decision on a received request, recorded, and queued for the request's origin
    when that call counted it (``InboxBook.record_and_queue``)."""

    result: DecisionResult
    entry_id: str | None  # the delivery's queue entry; None when the call did not count it


@dataclass(frozen=True)
class DeliveryState:
    """How the delivery of one own request to one peer's relay went, as the delivery worker saw it.

    ``state`` is ``pending`` (queued, not tried yet), ``delivered`` (the peer's relay answered
    2xx), ``failing`` (the last attempt failed; another is scheduled) or ``given_up`` (refused
    for good, or the request expires before another attempt). ``attempts`` counts the attempts
    made; ``error`` is the last failure's sentence, or None; ``at`` the Unix time of the record.
    """

    state: DeliveryStateName
    attempts: int
    error: str | None
    at: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``GET /v1/requests/{id}``'s ``deliveries`` values)."""
        return {"state": self.state, "attempts": self.attempts, "error": self.error, "at": self.at}


def delivery_state(raw: bytes) -> DeliveryState | None:
    """Read a stored delivery record; None when it is not one (it is display, never a failure)."""
    try:
        data = json.loads(raw)
        state = data["state"]
        if state not in DELIVERY_STATES:
            return None
        error = data.get("error")
        return DeliveryState(
            state=state,
            attempts=int(data.get("attempts", 0)),
            error=str(error) if error is not None else None,
            at=float(data.get("at", 0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class StoredRequest:
    """A stored request with its counting state and the decisions counted for it, bytes verbatim."""

    request_id: str
    origin: str | None  # the sending peer for an inbox item; None for the node's own requests
    document: bytes
    state: RequestState
    required: int
    peers: int
    expires_at: int
    accepted_at: int
    decided_at: int | None
    approvals: dict[str, bytes] = field(default_factory=dict)  # signer -> bytes; never one that denied
    denials: dict[str, bytes] = field(default_factory=dict)
    queued: bool = False  # an inbox item queued for the approver (InboxBook.mark_queued)
    withdrawal: bytes | None = None  # the origin's verified withdrawal, verbatim, once withdrawn
    settlement: bytes | None = None  # the origin's verified outcome evidence, verbatim (inbox items)
    # peer -> how the request's delivery to its relay went (own requests, RequestBook.get only)
    deliveries: dict[str, DeliveryState] = field(default_factory=dict)

    @property
    def decided(self) -> bool:
        """True once the outcome is settled (it never changes afterwards)."""
        return self.state != "pending"


def request_state(raw: bytes | str | None) -> RequestState:
    """A stored state, read.

    Raises:
        ValueError: it is none of ``STATES``.
    """
    text = raw.decode() if isinstance(raw, bytes) else raw
    for state in STATES:
        if text == state:
            return state
    raise ValueError(f"stored state {text!r} is not a request state")


def not_stored(label: str) -> RequestNotFoundError:
    """The error for a request the store does not hold (``label`` names it: ``request <id>``)."""
    return RequestNotFoundError(f"{label} is not stored here (it never arrived, or it expired)")


def stored_request(
    request_id: str,
    origin: str | None,
    document: bytes | None,
    outcome: dict[bytes, bytes],
    decisions: dict[bytes, bytes],
) -> StoredRequest | None:
    """A request read back (its document, outcome and decisions), or None when it is not stored."""
    if document is None or not outcome:
        return None
    approvals: dict[str, bytes] = {}
    denials: dict[str, bytes] = {}
    for name, value in decisions.items():
        kind, _, signer = name.decode().partition(":")
        (approvals if kind == "approval" else denials)[signer] = value
    decided_at = outcome.get(b"decided_at")
    return StoredRequest(
        request_id=request_id,
        origin=origin,
        document=document,
        state=request_state(outcome[b"state"]),
        required=int(outcome[b"required"]),
        peers=int(outcome[b"peers"]),
        expires_at=int(outcome[b"expires_at"]),
        accepted_at=int(outcome[b"accepted_at"]),
        decided_at=int(decided_at) if decided_at is not None else None,
        approvals=approvals,
        denials=denials,
        queued=b"queued" in outcome,
        withdrawal=outcome.get(b"withdrawal"),
        settlement=outcome.get(b"settlement"),
    )


def decision_result(reply: Any, label: str) -> DecisionResult:
    """Read ``record_decision``'s answer: state, approvals, denials, counted, decided.

    Raises:
        RequestNotFoundError: the script found no request (``label`` names it in the message).
    """
    state, approvals, denials, counted, decided = reply
    if state == b"unknown":
        raise not_stored(label)
    return DecisionResult(
        state=request_state(state),
        approvals=int(approvals),
        denials=int(denials),
        counted=bool(counted),
        decided=bool(decided),
    )


def _recorded(reply: Any) -> DecisionResult | None:
    """A raw ``record_decision`` reply read; None for an error, an unknown request or a bad reply."""
    if isinstance(reply, Exception):
        return None
    try:
        return decision_result(reply, "")
    except (RequestNotFoundError, ValueError, TypeError):
        return None


def settled(reply: Any) -> bool:
    """True when a raw ``record_decision`` reply says that call settled the outcome."""
    result = _recorded(reply)
    return result is not None and result.decided


def counted(reply: Any) -> bool:
    """True when a raw ``record_decision`` reply says that call counted the decision."""
    result = _recorded(reply)
    return result is not None and result.counted


def received(decision: RateDecision, accepted: AcceptResult, entry_id: str | None) -> ReceiveResult:
    """A request taken in by ``InboxBook.receive``; ``accepted.stored`` is marked queued when it was."""
    if entry_id is not None and accepted.stored is not None:
        accepted = dataclasses.replace(accepted, stored=dataclasses.replace(accepted.stored, queued=True))
    return ReceiveResult(stored_before=False, decision=decision, accepted=accepted, entry_id=entry_id)
