"""A client of a node's approver service: the operators' inbox (``teaagent approvals``, the TUI).

The approver, not the relay, is what operators talk to: it is the node's signing authority, records
each decision atomically (never two different decisions for one request), audits it with the key
that signed it, and forwards it through the relay, which only carries signed documents.
:class:`ApproverClient` (and its asyncio twin :class:`AsyncApproverClient`) speaks its HTTP API;
every failure is a :class:`~teaagent.errors.RelayError` with the approver's status, its stable
``ErrorOut`` code and one sentence.

:func:`resolve_request` is how every operator's command turns a typed id into a request: the full
id, or a prefix unique among every request the command has seen; :class:`Expected` (what the
operator was shown) goes with the decision, and the approver signs nothing for a request that
differs from it. :func:`decide` is an operator's decision, :func:`check_before_signing` the check of a
statement before an operator's own key signs it, and :func:`unconfirmed` the comparison of what is
signed with what the operator confirmed, which the approver makes too.
"""

from __future__ import annotations

from teaagent.approver_client._client import (
    DEFAULT_TIMEOUT,
    MAX_WAIT_SECONDS,
    ApproverClient,
    AsyncApproverClient,
)
from teaagent.approver_client._models import (
    ApprovalItem,
    DecisionResult,
    Expected,
    MatchingRule,
    OwnDecision,
    Settled,
    StatementToSign,
    signed_by,
)
from teaagent.approver_client._operator import check_before_signing, decide, node_approver, unconfirmed
from teaagent.approver_client._resolve import MIN_PREFIX_CHARS, REQUEST_ID_CHARS, resolve_request
from teaagent.errors import RelayError

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_WAIT_SECONDS",
    "MIN_PREFIX_CHARS",
    "REQUEST_ID_CHARS",
    "ApprovalItem",
    "ApproverClient",
    "AsyncApproverClient",
    "DecisionResult",
    "Expected",
    "MatchingRule",
    "OwnDecision",
    "RelayError",
    "Settled",
    "StatementToSign",
    "check_before_signing",
    "decide",
    "node_approver",
    "resolve_request",
    "signed_by",
    "unconfirmed",
]
