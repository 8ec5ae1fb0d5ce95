"""What the approver client returns: the approver's answers as frozen dataclasses.

An approval item (a peer's request as this node's approver sees it: this node's decision, the first
rule that matches, the outcome at its origin), the statement an operator signs elsewhere, the
result of a decision, and what an operator confirmed of a request (:class:`Expected`). Each is
built from the approver's JSON by ``from_json``, which raises KeyError, TypeError or ValueError
for what is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from teaagent._service_client import ITEM_STATES, ItemState, ListState

__all__ = [
    "ApprovalItem",
    "DecisionKind",
    "DecisionResult",
    "Expected",
    "ItemState",
    "ListState",
    "MatchingRule",
    "OwnDecision",
    "Settled",
    "StatementToSign",
    "signed_by",
]

DecisionKind = Literal["approval", "denial"]
LIST_STATES: Final = (*ITEM_STATES, "all")


def _text(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    return value


def _integer(data: Mapping[str, Any], name: str) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} is not a number")
    return int(value)


def _object(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = data[name]
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} is not a JSON object")
    return dict(value)


class _FieldsAsJSON:
    """An answer whose JSON form is its fields, in their order."""

    def to_dict(self) -> dict[str, Any]:
        """Return it as the approver's JSON."""
        return dict(vars(self))


def signed_by(by: str, key_fingerprint: str, node_key: str | None) -> str:
    """Who signed a decision and with which key, as a person reads it.

    ``with the node key SHA256:...`` (an operator's command the approver signed with the node
    key), ``by rule 1 with the node key SHA256:...``, ``with an operator's own key SHA256:...``.
    """
    own = node_key is not None and key_fingerprint == node_key
    key = f"the node key {key_fingerprint}" if own else f"key {key_fingerprint}"
    if by == "operator":
        return f"with {key}" if own else f"with an operator's own key {key_fingerprint}"
    if by:
        return f"by {by} with {key}"
    return f"with {key}"


@dataclass(frozen=True, kw_only=True)
class OwnDecision(_FieldsAsJSON):
    """This node's own decision on a request, as its approver recorded it.

    Attributes:
        kind: ``approval`` or ``denial``.
        reason: The reason signed with it (a denial's; may be empty).
        by: Who decided: a rule (``rule 1``) or an operator.
        key_fingerprint: The fingerprint of the key that signed it.
        at: Unix seconds when it was decided.
    """

    kind: DecisionKind
    reason: str
    by: str
    key_fingerprint: str
    at: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OwnDecision:
        """Build it from the approver's JSON.

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: ``kind`` is neither approval nor denial.
        """
        kind = data["kind"]
        if kind not in ("approval", "denial"):
            raise ValueError(f"the decision kind {kind!r} is neither approval nor denial")
        return cls(
            kind=kind,
            reason=str(data.get("reason") or ""),
            by=str(data.get("by") or ""),
            key_fingerprint=str(data.get("key_fingerprint") or ""),
            at=_integer(data, "at"),
        )


@dataclass(frozen=True, kw_only=True)
class MatchingRule(_FieldsAsJSON):
    """The first ``[[approver.rules]]`` entry that matches a request.

    Attributes:
        index: Its position among the rules, as the approver numbers it.
        tool: Its fnmatch pattern on the tool name.
        arguments: Its fnmatch patterns on string arguments.
        decision: ``approve``, ``deny`` or ``ask``.
    """

    index: int
    tool: str
    arguments: dict[str, str]
    decision: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MatchingRule:
        """Build it from the approver's JSON.

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
        """
        arguments = data.get("arguments") or {}
        if not isinstance(arguments, Mapping):
            raise TypeError("the rule's arguments are not a JSON object")
        return cls(
            index=_integer(data, "index"),
            tool=_text(data, "tool"),
            arguments={str(name): str(pattern) for name, pattern in arguments.items()},
            decision=_text(data, "decision"),
        )


@dataclass(frozen=True, kw_only=True)
class Settled:
    """A request's outcome at its origin, as the approver verified its evidence.

    Attributes:
        outcome: ``approved`` or ``denied``.
        decided_by: The counted approvers, or deniers.
        at: The latest ``signed_at`` of those decisions, Unix seconds.
    """

    outcome: str
    decided_by: tuple[str, ...]
    at: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Settled:
        """Build it from the approver's JSON (``Item.settled``).

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: The outcome is unknown.
        """
        outcome, decided_by = _text(data, "outcome"), data["decided_by"]
        if outcome not in ("approved", "denied"):
            raise ValueError(f"the settled outcome {outcome!r} is not approved or denied")
        if not isinstance(decided_by, list) or not all(isinstance(peer, str) for peer in decided_by):
            raise TypeError("decided_by is not a list of agent ids")
        return cls(outcome=outcome, decided_by=tuple(decided_by), at=_integer(data, "at"))

    def to_dict(self) -> dict[str, Any]:
        """The approver's JSON form."""
        return {"outcome": self.outcome, "decided_by": list(self.decided_by), "at": self.at}

    def phrase(self, origin: str, now: float) -> str:
        """``approved at alpha by beta, gamma 12s ago``: what operators' screens print."""
        ago = max(0, int(now - self.at))
        if ago >= 3600:
            when = f"{ago // 3600}h {ago % 3600 // 60:02d}m ago"
        elif ago >= 60:
            when = f"{ago // 60}m {ago % 60:02d}s ago"
        else:
            when = f"{ago}s ago"
        return f"{self.outcome} at {origin} by {', '.join(self.decided_by)} {when}"


@dataclass(frozen=True, kw_only=True)
class ApprovalItem:
    """A request that reached this node from a peer origin, as its approver sees it.

    Attributes:
        request_id: The request's id.
        origin: The peer that asks.
        tool_name: The tool it wants to call.
        arguments: The call's arguments, whole.
        reason: The origin model's reasoning.
        payload_digest: ``sha256:...`` of the call.
        run_id: The origin's run.
        call_id: The call's id in that run.
        required_approvals: Approvals the origin needs.
        peers: Every peer asked.
        created_at: Unix seconds.
        expires_at: Unix seconds.
        seconds_left: Seconds until it expires, when the approver answered.
        state: This node's view: ``pending``, ``approved``/``denied`` (by this node), ``expired``,
            ``withdrawn`` (by its origin: never to be signed) or ``settled`` (decided at its
            origin first, on evidence the approver verified: never to be signed).
        settled: The outcome at its origin, once the approver verified its evidence, or None.
        decision: This node's own decision, or None.
        rule: The first rule that matches it, or None (an operator decides).
        request: The request document.
        signature: The origin's signature over it.
    """

    request_id: str
    origin: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    payload_digest: str
    run_id: str
    call_id: str
    required_approvals: int
    peers: tuple[str, ...]
    created_at: int
    expires_at: int
    seconds_left: int
    state: ItemState
    decision: OwnDecision | None
    rule: MatchingRule | None
    request: dict[str, Any]
    signature: str
    settled: Settled | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ApprovalItem:
        """Build it from the approver's JSON (``Item``).

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: The state or the decision kind is unknown.
        """
        state = data["state"]
        if state not in ITEM_STATES:
            raise ValueError(f"the state {state!r} is not one of {', '.join(ITEM_STATES)}")
        decision, rule, peers = data.get("decision"), data.get("rule"), data["peers"]
        if not isinstance(peers, list) or not all(isinstance(peer, str) for peer in peers):
            raise TypeError("peers is not a list of agent ids")
        if decision is not None and not isinstance(decision, Mapping):
            raise TypeError("decision is not a JSON object")
        if rule is not None and not isinstance(rule, Mapping):
            raise TypeError("rule is not a JSON object")
        settled = data.get("settled")
        if settled is not None and not isinstance(settled, Mapping):
            raise TypeError("settled is not a JSON object")
        return cls(
            request_id=_text(data, "request_id"),
            origin=_text(data, "origin"),
            tool_name=_text(data, "tool_name"),
            arguments=_object(data, "arguments"),
            reason=_text(data, "reason"),
            payload_digest=_text(data, "payload_digest"),
            run_id=_text(data, "run_id"),
            call_id=_text(data, "call_id"),
            required_approvals=_integer(data, "required_approvals"),
            peers=tuple(peers),
            created_at=_integer(data, "created_at"),
            expires_at=_integer(data, "expires_at"),
            seconds_left=_integer(data, "seconds_left"),
            state=state,
            decision=None if decision is None else OwnDecision.from_json(decision),
            rule=None if rule is None else MatchingRule.from_json(rule),
            request=_object(data, "request"),
            signature=_text(data, "signature"),
            settled=None if settled is None else Settled.from_json(settled),
        )

    def to_dict(self, *, documents: bool = True) -> dict[str, Any]:
        """Return the item as JSON-ready data (``approvals list --json``, ``approvals show --json``).

        Args:
            documents: Include the signed request document and the origin's signature.
        """
        data: dict[str, Any] = {
            "request_id": self.request_id,
            "origin": self.origin,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "reason": self.reason,
            "payload_digest": self.payload_digest,
            "run_id": self.run_id,
            "call_id": self.call_id,
            "required_approvals": self.required_approvals,
            "peers": list(self.peers),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "seconds_left": self.seconds_left,
            "state": self.state,
            "decision": None if self.decision is None else self.decision.to_dict(),
            "rule": None if self.rule is None else self.rule.to_dict(),
            "settled": None if self.settled is None else self.settled.to_dict(),
        }
        if documents:
            data["request"] = self.request
            data["signature"] = self.signature
        return data


@dataclass(frozen=True, kw_only=True)
class StatementToSign:
    """The statement an operator signs elsewhere, and its canonical text.

    Attributes:
        statement: The approval or denial statement (signer = this node, ``signed_at`` = now).
        text: Its canonical JSON: the exact bytes to sign, as text (``data`` encodes them).
    """

    statement: dict[str, Any]
    text: str

    @property
    def data(self) -> bytes:
        """The exact bytes to sign (UTF-8 of :attr:`text`, no trailing newline)."""
        return self.text.encode("utf-8")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatementToSign:
        """Build it from the approver's JSON ``{"statement", "bytes"}``.

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
        """
        return cls(statement=_object(data, "statement"), text=_text(data, "bytes"))


@dataclass(frozen=True, kw_only=True)
class DecisionResult(_FieldsAsJSON):
    """What the approver did with this node's decision on one request.

    It names this node's own decision (``this_node``), never the request's outcome: that is counted
    by the origin from every peer's decision.

    Attributes:
        request_id: The request decided on.
        origin: The request's origin.
        decision: ``approval`` or ``denial``.
        reason: The reason signed with it.
        this_node: ``approved`` or ``denied``: this node's decision, not the quorum's outcome.
        by: Who decided.
        key_fingerprint: The fingerprint of the key that signed it.
        forwarded: Whether the node's relay has taken it on its way to the origin.
        note: The approver's own reminder of what this is.
    """

    request_id: str
    origin: str
    decision: DecisionKind
    reason: str
    this_node: Literal["approved", "denied"]
    by: str
    key_fingerprint: str
    forwarded: bool
    note: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionResult:
        """Build it from the approver's JSON (``Decision``).

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: ``decision`` or ``this_node`` is of an unknown kind.
        """
        decision, this_node = data["decision"], data["this_node"]
        if decision not in ("approval", "denial"):
            raise ValueError(f"the decision {decision!r} is neither approval nor denial")
        if this_node not in ("approved", "denied"):
            raise ValueError(f"this_node {this_node!r} is neither approved nor denied")
        return cls(
            request_id=_text(data, "request_id"),
            origin=_text(data, "origin"),
            decision=decision,
            reason=str(data.get("reason") or ""),
            this_node=this_node,
            by=str(data.get("by") or ""),
            key_fingerprint=str(data.get("key_fingerprint") or ""),
            forwarded=bool(data.get("forwarded")),
            note=str(data.get("note") or ""),
        )


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What an operator confirmed of a request: the approver signs nothing for a request that differs.

    Sent with a decision (``expect_tool_name``, ``expect_payload_digest``); the approver compares them
    with the request its origin signed and refuses with 409 ``changed`` when either differs, so a
    request swapped in under the id or prefix the operator typed is never signed.

    Attributes:
        tool_name: The tool the operator was shown.
        payload_digest: The payload digest (``sha256:...``) the operator was shown.
    """

    tool_name: str
    payload_digest: str

    @classmethod
    def of(cls, item: ApprovalItem) -> Expected:
        """What ``item`` shows: the tool and digest an operator reads in ``show`` and ``watch``."""
        return cls(tool_name=item.tool_name, payload_digest=item.payload_digest)
