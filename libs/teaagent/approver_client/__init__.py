"""A client of a node's approver service: the operators' inbox (``teaagent approvals``, the TUI).

The approver, not the relay, is what operators talk to: it is the node's signing authority, records
each decision atomically (never two different decisions for one request), audits it with the key
that signed it, and forwards it through the relay, which only carries signed documents.
:class:`ApproverClient` (and its asyncio twin :class:`AsyncApproverClient`) speaks its HTTP API;
every failure is a :class:`~teaagent.errors.RelayError` with the approver's status, its stable
``ErrorOut`` code and one sentence.
"""

from __future__ import annotations

from teaagent.approver_client._client import (
    DEFAULT_TIMEOUT,
    MAX_WAIT_SECONDS,
    ApprovalItem,
    ApproverClient,
    AsyncApproverClient,
    DecisionResult,
    MatchingRule,
    OwnDecision,
    StatementToSign,
)
from teaagent.errors import RelayError

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_WAIT_SECONDS",
    "ApprovalItem",
    "ApproverClient",
    "AsyncApproverClient",
    "DecisionResult",
    "MatchingRule",
    "OwnDecision",
    "RelayError",
    "StatementToSign",
]
