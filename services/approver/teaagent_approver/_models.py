"""The approver's HTTP shapes (pydantic only here, at the edge; the library's plain objects inside).

Signed documents travel as plain JSON objects (``dict[str, Any]``): their exact values, types
included, are what the signatures cover, so the edge checks only their outer shape and the
engine checks the rest against the request (PROTOCOL.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from teaagent.service import SettledOut

__all__ = [
    "AGENT_ID",
    "ApproveIn",
    "DecisionIn",
    "DecisionOut",
    "DenyIn",
    "HealthOut",
    "ItemOut",
    "ItemsOut",
    "OwnDecisionOut",
    "RuleOut",
    "StatementOut",
]

AGENT_ID = "^[a-z0-9][a-z0-9._-]{0,63}$"
MAX_REASON_CHARS = 4096  # a sentence or a paragraph; the origin shows it to its user
MAX_TOOL_NAME_CHARS = 256  # a tool's name; the request's own bound is checked against the request
PAYLOAD_DIGEST = "^sha256:[0-9a-f]{64}$"
State = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]
Kind = Literal["approval", "denial"]


class OwnDecisionOut(BaseModel):
    """This node's own decision on a request (never the request's outcome, which its origin counts)."""

    kind: Kind
    reason: str
    by: str = Field(
        description="Who decided: `rule N` (the N-th [[approver.rules]], from 1), `operator`, "
        "or `relay` (decided through the relay, not this approver)."
    )
    key_fingerprint: str = Field(description="SHA256 fingerprint of the key that signed it.")
    at: int = Field(description="The statement's signed_at (Unix seconds).")


class RuleOut(BaseModel):
    """The first ``[[approver.rules]]`` entry that matches a request."""

    index: int = Field(description="Its position among the rules, from 1 (file order).")
    tool: str
    arguments: dict[str, str]
    decision: Literal["approve", "deny", "ask"]


class ItemOut(BaseModel):
    """A request that reached this node from a peer origin, as this node's approver sees it."""

    request_id: str
    origin: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    payload_digest: str
    run_id: str
    call_id: str
    required_approvals: int
    peers: list[str]
    created_at: int
    expires_at: int
    seconds_left: int = Field(description="Seconds until it expires (0 once expired).")
    state: State = Field(
        description="This node's view: pending, approved or denied (by this node), expired, "
        "withdrawn (by its origin: never signed), or settled (approved or denied at its origin "
        "first, on evidence this approver verified: never signed). "
        "Not the request's outcome: its origin counts that from every peer's decision."
    )
    decision: OwnDecisionOut | None = Field(description="This node's own decision, once made.")
    settled: SettledOut | None = Field(
        default=None,
        description="Its outcome at its origin, once this approver verified the evidence "
        "(the quorum certificate, or the denials) its relay received.",
    )
    rule: RuleOut | None = Field(description="The first rule that matches (None: an operator decides).")
    request: dict[str, Any] = Field(description="The request document, exactly as its origin signed it.")
    signature: str = Field(description="The origin's signature over the request.")


class ItemsOut(BaseModel):
    """A listing, pending requests first."""

    items: list[ItemOut]


class StatementOut(BaseModel):
    """The statement to sign elsewhere (``ssh-keygen -Y sign -n teaagent-approval``) and its bytes."""

    statement: dict[str, Any]
    bytes: str = Field(description="The canonical JSON to sign, exactly (UTF-8, no trailing newline).")


class _Confirmed(BaseModel):
    """What the operator was shown and confirmed: the approver signs nothing for a request that differs."""

    model_config = ConfigDict(extra="forbid")

    expect_tool_name: str | None = Field(
        default=None,
        max_length=MAX_TOOL_NAME_CHARS,
        description="The tool the operator confirmed: 409 `changed` when the signed request calls another.",
    )
    expect_payload_digest: str | None = Field(
        default=None,
        pattern=PAYLOAD_DIGEST,
        description="The payload digest the operator confirmed: 409 `changed` when the signed request's "
        "differs.",
    )


class ApproveIn(_Confirmed):
    """Approve with the node key."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=MAX_REASON_CHARS, description="Kept in the audit log.")
    origin: str | None = Field(
        default=None, pattern=AGENT_ID, description="The origin, when several sent a request of this id."
    )


class DenyIn(_Confirmed):
    """Deny with the node key."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=MAX_REASON_CHARS, description="Signed; the origin shows it.")
    origin: str | None = Field(
        default=None, pattern=AGENT_ID, description="The origin, when several sent a request of this id."
    )

    @field_validator("reason")
    @classmethod
    def _not_blank(cls, reason: str) -> str:
        # As the web inbox and the command line ask: blanks tell the origin's operators nothing.
        if not reason.strip():
            raise ValueError("a denial needs a reason for the origin's operators, not only blanks")
        return reason


class DecisionIn(_Confirmed):
    """A decision signed elsewhere (an operator's own key): the statement and its SSHSIG."""

    model_config = ConfigDict(extra="forbid")

    statement: dict[str, Any] = Field(description="The approval or denial statement, exactly as signed.")
    signature: str = Field(description="The SSHSIG over its canonical bytes, base64 or armored.")


class DecisionOut(BaseModel):
    """This node's decision on one request: never the request's outcome."""

    request_id: str
    origin: str
    decision: Kind
    reason: str
    this_node: Literal["approved", "denied"] = Field(
        description="This node's own decision; the origin counts the outcome from every peer's."
    )
    by: str
    key_fingerprint: str
    forwarded: bool = Field(
        description="The node's relay took it on its way to the origin. False: it is recorded and is "
        "sent again until the relay takes it or the request expires."
    )
    note: str


class HealthOut(BaseModel):
    """Liveness: the approver answers and its Redis answers."""

    status: Literal["ok"]
    service: Literal["approver"]
    version: str
    agent_id: str
    redis_ms: float
    engine: bool = Field(description="Whether the rules are applied by this process.")
