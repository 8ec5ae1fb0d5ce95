"""The quorum protocol of PROTOCOL.md: signed documents, counting, certificates.

Documents are plain JSON objects. The origin builds and signs a request
(:func:`build_request`, :func:`sign_request`); each peer signs an approval or a denial statement
(:func:`sign_approval`, :func:`sign_denial`, or ``ssh-keygen -Y sign -n teaagent-approval`` over
:func:`statement_bytes` of :func:`approval_statement`); an origin that no longer waits withdraws
its request (:func:`sign_withdrawal`, checked by :func:`verify_withdrawal`); the origin's relay counts them
(:func:`evaluate`, which never raises for a bad signature) and the origin checks the resulting
certificate (:func:`build_certificate`, :func:`verify_certificate`, which raises
:class:`~teaagent.errors.QuorumError`) before it runs anything. :class:`Tally` is the counting
rules alone, as a fold over verified decisions: the reference that ``evaluate`` and the relay's
counting script both follow.
"""

from __future__ import annotations

from teaagent._canonical import canonical, payload_digest
from teaagent.errors import QuorumError
from teaagent.quorum._counting import (
    MAX_CERTIFICATE_APPROVALS,
    MAX_CLOCK_SKEW_SECONDS,
    QuorumOutcome,
    QuorumState,
    describe_outcome,
    evaluate,
    policy_mismatch,
    policy_view,
    verify_certificate,
)
from teaagent.quorum._documents import (
    APPROVAL_NAMESPACE,
    APPROVAL_TYPE,
    DENIAL_NAMESPACE,
    DENIAL_TYPE,
    POLICY_VERSION,
    PROTOCOL_VERSION,
    REQUEST_NAMESPACE,
    REQUEST_TYPE,
    WITHDRAWAL_NAMESPACE,
    WITHDRAWAL_TYPE,
    approval_statement,
    build_certificate,
    build_request,
    denial_statement,
    request_policy,
    request_problem,
    request_statement,
    sign_approval,
    sign_denial,
    sign_request,
    sign_withdrawal,
    signing_key,
    statement_bytes,
    validate_request,
    verify_decision,
    verify_request_signature,
    verify_withdrawal,
    wire_signature,
    withdrawal_problem,
    withdrawal_statement,
)
from teaagent.quorum._settlement import SETTLEMENT_OUTCOMES, Settlement, verify_settlement
from teaagent.quorum._tally import Tally, is_expired, quorum_state
from teaagent.quorum._verified import VerifiedRequest, verify_request

__all__ = [
    "APPROVAL_NAMESPACE",
    "APPROVAL_TYPE",
    "DENIAL_NAMESPACE",
    "DENIAL_TYPE",
    "MAX_CERTIFICATE_APPROVALS",
    "MAX_CLOCK_SKEW_SECONDS",
    "POLICY_VERSION",
    "PROTOCOL_VERSION",
    "REQUEST_NAMESPACE",
    "REQUEST_TYPE",
    "SETTLEMENT_OUTCOMES",
    "WITHDRAWAL_NAMESPACE",
    "WITHDRAWAL_TYPE",
    "QuorumError",
    "QuorumOutcome",
    "QuorumState",
    "Settlement",
    "Tally",
    "VerifiedRequest",
    "approval_statement",
    "build_certificate",
    "build_request",
    "canonical",
    "denial_statement",
    "describe_outcome",
    "evaluate",
    "is_expired",
    "payload_digest",
    "policy_mismatch",
    "policy_view",
    "quorum_state",
    "request_policy",
    "request_problem",
    "request_statement",
    "sign_approval",
    "sign_denial",
    "sign_request",
    "sign_withdrawal",
    "signing_key",
    "statement_bytes",
    "validate_request",
    "verify_certificate",
    "verify_decision",
    "verify_request",
    "verify_request_signature",
    "verify_settlement",
    "verify_withdrawal",
    "wire_signature",
    "withdrawal_problem",
    "withdrawal_statement",
]
