"""Who may sign for a node, with which keys: the types the policy and the quorum both build on.

:class:`MultiSigQuorumConfig` (the peers, their keys and relays, the threshold and the high-risk
patterns) and :class:`PeerSignature` (one peer's approval in its compact form) live here, below
:mod:`teaagent.policy` and :mod:`teaagent.quorum`, so that neither package imports the other's
types: the policy verifies certificates with :mod:`teaagent.quorum`, and the quorum counts under
this configuration. Their seed import path, ``from teaagent.policy import MultiSigQuorumConfig``,
keeps working: :mod:`teaagent.policy` re-exports them.

A signer's several keys (PROTOCOL.md "Keys of a peer") are :class:`SignerKey` objects, read from
``allowed_signers`` files by :func:`parse_allowed_signers`, which matches principals and namespaces
as OpenSSH does (:func:`match_pattern_list`). Key identity (PROTOCOL.md "Key
identity") is key material: :attr:`teaagent.signing.SSHPublicKey.identity`,
which this package uses wherever it compares two peers' keys.
"""

from __future__ import annotations

from teaagent.trust._keys import (
    MAX_ALLOWED_SIGNERS_BYTES,
    SignerKey,
    match_pattern_list,
    parse_allowed_signers,
    unique_keys,
)
from teaagent.trust._multisig import (
    AGENT_ID_PATTERN,
    DEFAULT_QUORUM_TIMEOUT_SECONDS,
    MAX_QUORUM_TIMEOUT_SECONDS,
    MultiSigQuorumConfig,
    PeerSignature,
    check_agent_id,
)
from teaagent.trust._rules import (
    POLICY_MODES,
    PolicyMode,
    PolicyTerm,
    QuorumPolicy,
    QuorumRule,
    RuleTerm,
    TermProgress,
    policy_problem,
)

__all__ = [
    "AGENT_ID_PATTERN",
    "DEFAULT_QUORUM_TIMEOUT_SECONDS",
    "MAX_ALLOWED_SIGNERS_BYTES",
    "MAX_QUORUM_TIMEOUT_SECONDS",
    "POLICY_MODES",
    "MultiSigQuorumConfig",
    "PeerSignature",
    "PolicyMode",
    "PolicyTerm",
    "QuorumPolicy",
    "QuorumRule",
    "RuleTerm",
    "SignerKey",
    "TermProgress",
    "check_agent_id",
    "match_pattern_list",
    "parse_allowed_signers",
    "policy_problem",
    "unique_keys",
]
