"""A client of the relay HTTP API, and the quorum gate that uses it.

The agent's policy obtains quorum certificates with :class:`RelayQuorumGate`; the approver, the
CLI and tests talk to a relay with :class:`RelayClient` (or :class:`AsyncRelayClient`). Every
failure is a :class:`~teaagent.errors.RelayError` carrying the relay's status and stable
``ErrorOut`` code; a denied or expired request is an :class:`~teaagent.errors.ApprovalDeniedError`.
While a call waits, every surface words the gate's :class:`WaitProgress` with :func:`describe_wait`
and :func:`wait_news`.
"""

from __future__ import annotations

from teaagent.errors import RelayError
from teaagent.relay_client._client import DEFAULT_TIMEOUT, MAX_WAIT_SECONDS, AsyncRelayClient, RelayClient
from teaagent.relay_client._gate import EXPIRY_GRACE_SECONDS, RelayQuorumGate
from teaagent.relay_client._models import (
    DecisionReceipt,
    InboxDecision,
    InboxItem,
    PeerDelivery,
    RequestStatus,
)
from teaagent.relay_client._progress import (
    WaitProgress,
    describe_wait,
    expiry_sentence,
    next_reminder,
    wait_news,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXPIRY_GRACE_SECONDS",
    "MAX_WAIT_SECONDS",
    "AsyncRelayClient",
    "DecisionReceipt",
    "InboxDecision",
    "InboxItem",
    "PeerDelivery",
    "RelayClient",
    "RelayError",
    "RelayQuorumGate",
    "RequestStatus",
    "WaitProgress",
    "describe_wait",
    "expiry_sentence",
    "next_reminder",
    "wait_news",
]
