"""What the engine is asked to decide and what became of it; the notifier the engine hands items to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from teaagent_approver._ledger import DecisionKind, Record

__all__ = ["Notifies", "Outcome", "Proposal"]


class Notifies(Protocol):
    """What the engine needs of the notifier (``teaagent_approver._notify.Notifier``)."""

    async def notify(self, item: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """A decision someone wants this node to make.

    Attributes:
        kind: ``approval`` or ``denial``.
        reason: The reason (a denial signs it).
        by: ``rule N`` or ``operator``.
        statement: The statement, when it was signed elsewhere; None to build it now.
        signature: Its signature, when signed elsewhere; None to sign with the node key.
        key_fingerprint: The fingerprint of the key that signed it elsewhere.
    """

    kind: DecisionKind
    reason: str
    by: str
    statement: dict[str, Any] | None = None
    signature: str | None = None
    key_fingerprint: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What became of a proposal: the decision that stands for the request, and where it is.

    Attributes:
        record: The standing decision (the proposal's, or one recorded before it).
        won: True when this call recorded it.
        forwarded: True when the relay took it.
        deferred: True when another process recorded it a moment ago and is finishing it.
    """

    record: Record
    won: bool
    forwarded: bool
    deferred: bool = False
