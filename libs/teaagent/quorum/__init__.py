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
from teaagent.errors import QuorumError, StatementError, StatementMismatchError, StatementTimeError
from teaagent.quorum._certificate import MAX_CERTIFICATE_APPROVALS, build_certificate, verify_certificate
from teaagent.quorum._counting import (
    MAX_CLOCK_SKEW_SECONDS,
    QuorumOutcome,
    QuorumState,
    describe_outcome,
    evaluate,
    policy_mismatch,
    policy_view,
)
from teaagent.quorum._documents import (
    APPROVAL_NAMESPACE,
    APPROVAL_TYPE,
    DENIAL_NAMESPACE,
    DENIAL_TYPE,
    DEV_SIGNATURE_PREFIX,
    POLICY_VERSION,
    PROTOCOL_VERSION,
    REQUEST_NAMESPACE,
    REQUEST_TYPE,
    WITHDRAWAL_NAMESPACE,
    WITHDRAWAL_TYPE,
    dev_signature_allowed,
    dev_signature_passes,
    is_dev_signature,
    request_statement,
    statement_bytes,
    wire_signature,
)
from teaagent.quorum._keys import signing_key
from teaagent.quorum._request import (
    build_request,
    request_policy,
    request_problem,
    request_time_problem,
    sign_request,
    validate_request,
    verify_request_signature,
)
from teaagent.quorum._settlement import SETTLEMENT_OUTCOMES, Settlement, verify_settlement
from teaagent.quorum._shown import ShownPolicy, describe_needs, shown_policy
from teaagent.quorum._statements import (
    DecisionKind,
    approval_statement,
    check_rebuilt,
    check_signing_time,
    decision_kind,
    denial_statement,
    rebuild_decision,
    sign_approval,
    sign_denial,
    stated_kind,
    verify_decision,
)
from teaagent.quorum._tally import Tally, is_expired, quorum_state
from teaagent.quorum._verified import VerifiedRequest, verify_request
from teaagent.quorum._withdrawal import (
    check_withdrawal_time,
    sign_withdrawal,
    verify_withdrawal,
    withdrawal_problem,
    withdrawal_statement,
)

__all__ = [
    "APPROVAL_NAMESPACE",
    "APPROVAL_TYPE",
    "DENIAL_NAMESPACE",
    "DENIAL_TYPE",
    "DEV_SIGNATURE_PREFIX",
    "MAX_CERTIFICATE_APPROVALS",
    "MAX_CLOCK_SKEW_SECONDS",
    "POLICY_VERSION",
    "PROTOCOL_VERSION",
    "REQUEST_NAMESPACE",
    "REQUEST_TYPE",
    "SETTLEMENT_OUTCOMES",
    "WITHDRAWAL_NAMESPACE",
    "WITHDRAWAL_TYPE",
    "DecisionKind",
    "QuorumError",
    "QuorumOutcome",
    "QuorumState",
    "Settlement",
    "ShownPolicy",
    "StatementError",
    "StatementMismatchError",
    "StatementTimeError",
    "Tally",
    "VerifiedRequest",
    "approval_statement",
    "build_certificate",
    "build_request",
    "canonical",
    "check_rebuilt",
    "check_signing_time",
    "check_withdrawal_time",
    "decision_kind",
    "denial_statement",
    "describe_needs",
    "describe_outcome",
    "dev_signature_allowed",
    "dev_signature_passes",
    "evaluate",
    "is_dev_signature",
    "is_expired",
    "payload_digest",
    "policy_mismatch",
    "policy_view",
    "quorum_state",
    "rebuild_decision",
    "request_policy",
    "request_problem",
    "request_statement",
    "request_time_problem",
    "shown_policy",
    "sign_approval",
    "sign_denial",
    "sign_request",
    "sign_withdrawal",
    "signing_key",
    "stated_kind",
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
