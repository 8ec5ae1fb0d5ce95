"""The relay's HTTP shapes (pydantic only here, at the edge; the library's plain objects inside).

Signed documents travel as plain JSON objects (``dict[str, Any]``): their exact values, types
included, are what the signatures cover, so the edge checks only their outer shape and the
library's protocol code checks the rest (PROTOCOL.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from teaagent.service import SettledOut

__all__ = [
    "DecisionReceiptOut",
    "DeliveryBatchIn",
    "DeliveryBatchOut",
    "DeliveryIn",
    "DeliveryOut",
    "DeliveryResultOut",
    "HealthOut",
    "InboxAcceptedOut",
    "InboxDecisionOut",
    "InboxItemOut",
    "RequestStatusOut",
    "SettlementIn",
    "SettlementReceiptOut",
    "SignedDecisionIn",
    "SignedRequestIn",
    "SignedWithdrawalIn",
    "WithdrawalReceiptOut",
]

State = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]


class SignedRequestIn(BaseModel):
    """A request document and its origin's signature (PROTOCOL.md, Request)."""

    model_config = ConfigDict(extra="forbid")

    request: dict[str, Any] = Field(description="The request document, exactly as signed.")
    signature: str = Field(
        description="The origin's SSHSIG over the request's canonical JSON (base64 or armored)."
    )


class SignedDecisionIn(BaseModel):
    """An approval or denial statement and its signer's signature (PROTOCOL.md)."""

    model_config = ConfigDict(extra="forbid")

    statement: dict[str, Any] = Field(description="The approval or denial statement, exactly as signed.")
    signature: str = Field(description="The signer's SSHSIG over the statement's canonical JSON.")


class SignedWithdrawalIn(BaseModel):
    """The origin's withdrawal of one of its requests and its signature (PROTOCOL.md, Withdrawal)."""

    model_config = ConfigDict(extra="forbid")

    statement: dict[str, Any] = Field(
        description="The withdrawal {v, type: teaagent.withdrawal, request_id, origin, payload_digest, "
        "expires_at, withdrawn_at}, exactly as signed."
    )
    signature: str = Field(
        description="The origin's SSHSIG (namespace teaagent-withdrawal) over the canonical withdrawal."
    )


class SettlementIn(BaseModel):
    """The evidence of a request's outcome at its origin (docs/protocol.md, Settlement): exactly one
    of ``certificate`` (approved) and ``denials`` (denied)."""

    model_config = ConfigDict(extra="forbid")

    origin: str = Field(description="The request's origin, whose inbox item it settles.")
    certificate: dict[str, Any] | None = Field(
        default=None, description="The quorum certificate of exactly that request (approved)."
    )
    denials: list[dict[str, Any]] | None = Field(
        default=None,
        description="The signed denials ({statement, signature}) that made it fail (denied).",
    )


class SettlementReceiptOut(BaseModel):
    """What a peer's relay did with the evidence of a request's outcome at its origin."""

    request_id: str
    origin: str
    state: State = Field(
        description="The inbox item's state after it: settled, or this node's decision, the "
        "withdrawal or the expiry that came first."
    )
    settled: SettledOut


class WithdrawalReceiptOut(BaseModel):
    """What a peer's relay did with the origin's withdrawal of a request in its inbox."""

    request_id: str
    origin: str
    state: State = Field(
        description="The inbox item's state after it: withdrawn, or the decision or expiry that came first."
    )
    withdrawn: bool = Field(description="True when this very call withdrew it (False for a repeat).")


class DeliveryOut(BaseModel):
    """How the delivery of a request to one peer's relay went (this relay's delivery worker's word)."""

    state: Literal["pending", "delivered", "failing", "given_up"] = Field(
        description="pending: not tried yet; delivered: the peer's relay took it; failing: the last "
        "attempt failed and another is scheduled; given_up: refused for good, or no attempt is left "
        "before the request expires."
    )
    attempts: int = Field(description="Attempts made so far.")
    error: str | None = Field(description="Why the last attempt failed, one sentence; None if none did.")
    at: float | None = Field(description="Unix seconds of the last attempt; None before the first.")


class RequestStatusOut(BaseModel):
    """One of this node's own requests: its counting state, and the certificate once approved."""

    request_id: str
    state: State
    required: int = Field(description="Approvals needed (the larger of the request's and this node's).")
    peers: list[str] = Field(description="The request's peers that this node counts.")
    signers: list[str] = Field(description="Peers whose approval was counted.")
    denied_by: list[str] = Field(description="Peers whose denial was counted.")
    denial_reasons: dict[str, str]
    expires_at: int
    accepted_at: int
    decided_at: int | None
    certificate: dict[str, Any] | None = Field(
        description="The quorum certificate (PROTOCOL.md) when approved; the origin verifies it itself. "
        "It carries the counted denials too (its optional denials list), so that the origin applies "
        "rule 6 itself: a signer that denied is never counted as an approver."
    )
    denials: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The counted denials as signed ({statement, signature}), so that the origin can "
        "verify who denied rather than take this relay's word for it, and apply rule 6 to the "
        "certificate with them.",
    )
    withdrawal: dict[str, Any] | None = Field(
        default=None,
        description="The origin's signed withdrawal ({statement, signature}) once withdrawn, else None.",
    )
    approvals: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The counted approvals as signed ({statement, signature}), as they arrive "
        "(the certificate carries them once approved).",
    )
    deliveries: dict[str, DeliveryOut] = Field(
        default_factory=dict,
        description="Per peer, how the request's delivery to its relay went: who received it, "
        "who could not be reached and why.",
    )


class InboxAcceptedOut(BaseModel):
    """A peer's request as stored in this node's inbox."""

    request_id: str
    origin: str
    state: State
    created: bool


class InboxItemOut(BaseModel):
    """A request received from a peer, waiting for (or decided by) this node."""

    request_id: str
    origin: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    run_id: str
    call_id: str
    payload_digest: str
    required_approvals: int
    peers: list[str]
    created_at: int
    expires_at: int
    state: State = Field(
        description="pending, approved or denied (by this node), expired, withdrawn (by its origin), "
        "or settled (approved or denied at its origin first, on evidence this relay verified)."
    )
    request: dict[str, Any] = Field(description="The request document, to build the statement to sign.")
    signature: str = Field(description="The origin's signature over the request.")
    decision: dict[str, Any] | None = Field(description="This node's signed decision, once given.")
    settlement: dict[str, Any] | None = Field(
        default=None,
        description="The evidence of its outcome at its origin, {certificate} or {denials}, as this "
        "relay verified and stored it; an approver verifies it again before it believes it.",
    )


class InboxDecisionOut(BaseModel):
    """This node's own decision on a request of a peer, as recorded here and queued for its origin.

    It says nothing of the request's outcome: that is counted by the origin's relay, from every
    peer's decision. ``this_node`` is this node's vote alone.
    """

    request_id: str
    origin: str
    signer: str
    kind: Literal["approval", "denial"]
    this_node: Literal["approved", "denied"] = Field(description="This node's own decision, not the outcome.")
    counted: bool = Field(description="False when this node's same decision was recorded before (a repeat).")
    note: str = Field(description="A reminder, in words, that the outcome is the origin's to count.")


MAX_DECISION_BATCH = 64  # decisions per POST /v1/inbox/decisions; 64 of about 700 bytes fit the body limit


class DecisionBatchIn(BaseModel):
    """Several of this node's own signed decisions at once (its approver's, deciding by rule)."""

    decisions: list[SignedDecisionIn] = Field(
        min_length=1,
        max_length=MAX_DECISION_BATCH,
        description="Each as POST /v1/inbox/{id}/decision takes it; the request id is the statement's.",
    )


class DecisionBatchItemOut(BaseModel):
    """What became of one decision of a batch: what POST /v1/inbox/{id}/decision would have answered."""

    status: int = Field(description="The status that decision alone would have had (200, or an error's).")
    decision: InboxDecisionOut | None = Field(default=None, description="This node's decision, when 200.")
    error: str | None = Field(default=None, description="The ErrorOut code, when refused.")
    message: str | None = Field(default=None, description="The ErrorOut sentence, when refused.")


class DecisionBatchOut(BaseModel):
    """One answer per decision of the batch, in its order."""

    results: list[DecisionBatchItemOut]


MAX_DELIVERY_BATCH = 64  # deliveries per POST /v1/deliveries; the body limit bounds their bytes


class DeliveryIn(BaseModel):
    """One delivery of a peer's relay, as its queue holds it: the call it stands for."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        description=(
            "The path of the call: POST /v1/inbox, /v1/requests/{id}/decisions, "
            "/v1/inbox/{id}/withdrawal or /v1/inbox/{id}/settled."
        )
    )
    body: dict[str, Any] = Field(description="The body that call takes, exactly as it takes it.")


class DeliveryBatchIn(BaseModel):
    """Several deliveries of a peer's relay at once, each the call that its path names."""

    model_config = ConfigDict(extra="forbid")

    deliveries: list[DeliveryIn] = Field(min_length=1, max_length=MAX_DELIVERY_BATCH)


class DeliveryResultOut(BaseModel):
    """What one delivery of a batch was answered: what its call alone would have been answered."""

    status: int = Field(description="The status of that call alone (2xx, or an error's).")
    body: Any = Field(description="Its answer: the route's own answer, or an ErrorOut.")


class DeliveryBatchOut(BaseModel):
    """One answer per delivery of the batch, in its order."""

    results: list[DeliveryResultOut]


class DecisionReceiptOut(BaseModel):
    """What happened to one signed decision on one of this node's own requests."""

    request_id: str
    origin: str
    signer: str
    kind: Literal["approval", "denial"]
    state: State = Field(
        description="The request's overall state, counted here at its origin, after this decision."
    )
    counted: bool = Field(description="False when the same signer's decision was already counted.")
    decided: bool = Field(description="True when this very decision settled the outcome.")
    approvals: int
    denials: int


class DeadLetterOut(BaseModel):
    """A delivery to a peer relay that this relay gave up on, kept for operators."""

    entry_id: str = Field(description="The delivery's id on the queue.")
    target: str = Field(description="The peer it was for.")
    request_id: str = Field(description="The request it carried, or the request a decision was about.")
    path: str | None = Field(description="The peer relay's path it was posted to (None if unreadable).")
    attempts: int = Field(description="Attempts made, the last one included.")
    error: str = Field(description="Why the last attempt failed, or why there was no other.")
    enqueued_at: int = Field(description="Unix seconds when it was queued.")
    expires_at: int = Field(description="Unix seconds when its request expires.")
    dead_at: float = Field(description="Unix seconds when it was given up.")


class HealthOut(BaseModel):
    """Liveness: the relay answers and its Redis answers."""

    status: Literal["ok"]
    service: Literal["relay"]
    version: str
    agent_id: str
    redis_ms: float
