"""Counting approvals and denials (PROTOCOL.md, Counting).

:func:`evaluate` is the python-tuf ``get_verification_result()`` of this project: it never raises for
a bad signature, it reports. ``verify_certificate`` (in ``_certificate``) runs the same
:class:`Counter` and raises :class:`~teaagent.errors.QuorumError` unless the quorum is proven.
Both loop over the authorised signers, never over the submitted signatures (STYLE.md 3).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from teaagent._fields import json_fields
from teaagent._words import approvals_of, needed_from, plural
from teaagent.errors import QuorumError, SignatureError, StatementError
from teaagent.quorum._documents import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    MAX_CLOCK_SKEW_SECONDS,
    SIGNED_DECISION_FIELDS,
    clause,
    dev_signature_allowed,
    is_dev_signature,
    is_int,
    statement_bytes,
    wire_signature,
)
from teaagent.quorum._keys import signing_key
from teaagent.quorum._request import request_policy, validate_request
from teaagent.quorum._statements import (
    approval_statement,
    check_rebuilt,
    check_signing_time,
    denial_statement,
    signed_at_of,
)
from teaagent.quorum._tally import QuorumState, is_expired, quorum_state
from teaagent.trust import MultiSigQuorumConfig, PeerSignature, QuorumPolicy

__all__ = [
    "MAX_CLOCK_SKEW_SECONDS",
    "Counter",
    "QuorumOutcome",
    "QuorumState",
    "clock",
    "counter_for",
    "describe_outcome",
    "evaluate",
    "policy_mismatch",
    "policy_view",
]

logger = logging.getLogger("teaagent.quorum")


def policy_view(policy: QuorumPolicy, signers: Sequence[str], denied_by: Sequence[str]) -> dict[str, Any]:
    """A policy with each term's count, JSON-ready: the rule, the mode, and per term who counted."""
    return {
        "rule": policy.rule,
        "mode": policy.mode,
        "terms": [
            {
                "group": term.term.group,
                "peers": list(term.term.peers),
                "required": term.term.required,
                "approved_by": list(term.approvers),
                "denied_by": list(term.deniers),
                "met": term.met,
                "missing": term.missing,
                "described": term.describe(),
            }
            for term in policy.progress(signers, denied_by)
        ],
        "described": policy.describe(signers, denied_by),
    }


@dataclass(frozen=True, kw_only=True)
class QuorumOutcome:
    """What the approvals and denials of one request prove at one moment.

    Attributes:
        state: ``pending`` (not decided yet), ``approved`` (distinct valid approvals reached the
            threshold), ``denied`` (so many distinct valid denials that the threshold can no longer
            be reached) or ``expired`` (``now > expires_at``).
        request_id: The request's id.
        origin: The request's origin.
        tool_name: The request's tool name.
        payload_digest: The request's payload digest: what exactly was approved.
        required: The threshold applied: the larger of the request's ``required_approvals`` and
            the verifier's own configured ``required_approvals``.
        peers: The authorised signers, in the request's (sorted) peer order: the peers of the
            request that are also in the verifier's configuration, never the origin.
        signers: The counted approvers, in ``peers`` order.
        denied_by: The peers with a counted denial, in ``peers`` order.
        denial_reasons: The reason each counted denier gave.
        rejected: Why each submitted approval that did not count was refused, by the peer id it
            claimed (unknown signer ids included). A peer with a counted approval is never here:
            extra or duplicate submissions of a counted peer are ignored, not errors.
        rejected_denials: The same for denials.
        approvals: The counted approvals as ``{"statement", "signature"}`` (statement rebuilt from
            the request, signature in wire form), one per signer, in ``signers`` order: what
            :func:`build_certificate` carries.
        dev_signers: The signers (approving or denying) whose ``dev:<signer>`` signature was counted
            without cryptography because ``allow_dev_signatures`` is set; the audit log marks them.
    """

    state: QuorumState
    request_id: str
    origin: str
    tool_name: str
    payload_digest: str
    required: int
    peers: tuple[str, ...]
    signers: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    denial_reasons: Mapping[str, str] = field(default_factory=dict)
    rejected: Mapping[str, str] = field(default_factory=dict)
    rejected_denials: Mapping[str, str] = field(default_factory=dict)
    approvals: tuple[dict[str, Any], ...] = ()
    dev_signers: tuple[str, ...] = ()
    policy: QuorumPolicy | None = None

    @property
    def decided(self) -> bool:
        """Whether the outcome is final (anything but ``pending``)."""
        return self.state != "pending"

    def to_dict(self) -> dict[str, Any]:
        """Return the outcome as a JSON-ready dict (for the relay's responses and the audit log)."""
        view = {} if self.policy is None else {"policy": self.policy_view()}
        return json_fields(self, leave_out=("policy",)) | view

    def policy_view(self) -> dict[str, Any]:
        """The version 2 policy and its terms' counts, JSON-ready (empty for version 1)."""
        if self.policy is None:
            return {}
        return policy_view(self.policy, self.signers, self.denied_by)

    def describe(self) -> str:
        """Return the outcome as one phrase, such as ``approved by beta (1 approval of the 1 needed)``."""
        return describe_outcome(self)


def _deniers(outcome: _Described) -> str:
    """Who denied, each with their reason when they gave one: ``beta: too risky; gamma``."""
    return "; ".join(
        f"{peer}: {outcome.denial_reasons[peer]}" if outcome.denial_reasons.get(peer) else peer
        for peer in outcome.denied_by
    )


def _decided_by(outcome: _Described) -> str:
    """The state as the phrase before its counts: ``approved by beta``, ``denied by gamma: no``..."""
    if outcome.state == "approved":
        return f"approved by {', '.join(outcome.signers)}"
    if outcome.state == "denied":
        return f"denied by {_deniers(outcome)}"
    if outcome.state == "withdrawn":
        return "withdrawn by its origin"
    return "waiting" if outcome.state == "pending" else outcome.state


class _Described(Protocol):
    """What :func:`describe_outcome` reads (``QuorumOutcome`` and the relay client's ``RequestStatus``)."""

    @property
    def state(self) -> str: ...
    @property
    def required(self) -> int: ...
    @property
    def peers(self) -> Sequence[str]: ...
    @property
    def signers(self) -> Sequence[str]: ...
    @property
    def denied_by(self) -> Sequence[str]: ...
    @property
    def denial_reasons(self) -> Mapping[str, str]: ...


def describe_outcome(outcome: _Described) -> str:
    """Return a counting state as one phrase, such as ``approved by beta (1 approval of the 1 needed)``.

    Counts are worded by :mod:`teaagent._words`: ``1 approval of the 2 needed``, never ``1 of 2``.
    """
    policy = getattr(outcome, "policy", None)
    if isinstance(policy, QuorumPolicy):
        # Version 2: the state, then the rule and each term (``needs 1 more of security: ...``).
        return f"{_decided_by(outcome)} ({policy.describe(outcome.signers, outcome.denied_by)})"
    count = approvals_of(len(outcome.signers), outcome.required)
    if outcome.state == "denied":
        return f"{_decided_by(outcome)} ({needed_from(outcome.required, len(outcome.peers))} needed)"
    if outcome.state in ("expired", "withdrawn"):
        return f"{_decided_by(outcome)} with {count}"
    if outcome.state == "approved":
        return f"{_decided_by(outcome)} ({count})"
    return f"waiting: {count} (asked of {plural(len(outcome.peers), 'peer')})"


@dataclass(frozen=True)
class _Submission:
    """One submitted approval or denial, reduced to what counting needs."""

    claimed: str  # the peer id it claims, or "#<index>" when it claims none
    signed_at: int | None
    signature: object
    ssh_key_id: object
    statement: object  # the carried statement (full form) or None (compact form)
    reason: object  # a denial's reason


@dataclass(frozen=True, kw_only=True)
class _Counted:
    """A submission that counts, with the statement rebuilt from the request that it signs."""

    submission: _Submission
    statement: dict[str, Any]

    def carried(self) -> dict[str, Any]:
        """The full ``{"statement", "signature"}`` form a certificate carries."""
        assert isinstance(self.submission.signature, str)  # checked before it counted
        return {"statement": self.statement, "signature": wire_signature(self.submission.signature)}


def _compact(index: int, approval: PeerSignature) -> _Submission:
    return _Submission(
        claimed=approval.peer_id if isinstance(approval.peer_id, str) else f"#{index}",
        signed_at=signed_at_of(approval),
        signature=approval.signature,
        ssh_key_id=approval.ssh_key_id,
        statement=None,
        reason=None,
    )


def _full(index: int, document: object) -> _Submission:
    if not (isinstance(document, Mapping) and set(document) == SIGNED_DECISION_FIELDS):
        return _Submission(f"#{index}", None, None, None, None, None)
    statement = document["statement"]
    signer = statement.get("signer") if isinstance(statement, Mapping) else None
    signed_at = statement.get("signed_at") if isinstance(statement, Mapping) else None
    return _Submission(
        claimed=signer if isinstance(signer, str) else f"#{index}",
        signed_at=signed_at if is_int(signed_at) else None,
        signature=document["signature"],
        ssh_key_id=None,
        statement=statement,
        reason=statement.get("reason") if isinstance(statement, Mapping) else None,
    )


def _group(submissions: Sequence[_Submission]) -> dict[str, list[_Submission]]:
    groups: dict[str, list[_Submission]] = {}
    for submission in submissions:
        group = groups.setdefault(submission.claimed, [])
        # A resent decision is checked once: duplicates are ignored, not errors (rule 5).
        if submission not in group:
            group.append(submission)
    return groups


@dataclass(frozen=True)
class Votes:
    """What one count found: the counted approvals and denials by peer, and why the others were refused."""

    approved: dict[str, _Counted]
    rejected: dict[str, str]
    denied: dict[str, _Counted]
    rejected_denials: dict[str, str]
    signers: tuple[str, ...]  # the counted approvers, in the peers' order
    denied_by: tuple[str, ...]  # the counted deniers, in the peers' order


class Counter:
    """The per-call state of one count: the request, the verifier's configuration, the clock."""

    def __init__(self, request: Mapping[str, Any], config: MultiSigQuorumConfig, now: float) -> None:
        self.request = request
        self.config = config
        self.now = now
        self.expires_at: int = request["expires_at"]
        self.dev_signers: list[str] = []
        configured = set(config.peer_agent_ids)
        origin = request["origin"]
        # Rule 1: in the request's peers, in our own configured peers, and not the origin.
        self.peers = tuple(peer for peer in request["peers"] if peer in configured and peer != origin)
        self.required = max(request["required_approvals"], config.required_approvals, 1)
        # Version 2: the request's policy counts, each term limited to the authorised peers; its
        # terms named after this node's groups for display. Whether the policy is the one this
        # node's rules give the tool is policy_mismatch's question, asked by the origin's gate.
        policy = request_policy(request)
        self.policy = None if policy is None else policy.only(self.peers).named(config.groups)
        if self.policy is not None:
            self.required = self.policy.required
        self.unauthorised: dict[str, str] = {}

    def state(self, signers: Sequence[str], denied_by: Sequence[str]) -> QuorumState:
        """What the counted signers prove, expiry aside: the policy's terms, or N of the peers."""
        if self.policy is not None:
            return self.policy.state(signers, denied_by)
        return quorum_state(
            approvals=len(signers), denials=len(denied_by), peers=len(self.peers), required=self.required
        )

    def refusal_for_stranger(self, claimed: str) -> str:
        if claimed.startswith("#"):
            return "the submission is malformed: it names no signer"
        if claimed == self.request["origin"]:
            return "the origin cannot approve or deny its own request"
        if claimed not in self.request["peers"]:
            return f"{claimed} is not a peer of this request"
        return f"{claimed} is not a configured peer of this node"

    def check(self, peer: str, submission: _Submission, *, denial: bool) -> str | dict[str, Any]:
        """Return why ``submission`` does not count for ``peer``, or, when it counts, its statement."""
        # Rule 3 (fields): the statement is rebuilt from the request; a carried one must equal it.
        signed_at = submission.signed_at
        if signed_at is None:
            return "its signing time is not an integer Unix time"
        try:
            if denial:
                if not isinstance(submission.reason, str):
                    return "the denial's reason is not a string"
                rebuilt = denial_statement(self.request, peer, signed_at, submission.reason)
            else:
                rebuilt = approval_statement(self.request, peer, signed_at)
        except ValueError as exc:
            return clause(exc)
        try:
            if submission.statement is not None or denial:
                check_rebuilt(submission.statement, rebuilt, against="the request")
            check_signing_time(signed_at, self.request, self.now, subject="it")  # rule 4
        except StatementError as exc:
            return exc.clause
        signature = submission.signature
        if not isinstance(signature, str):
            return "its signature is not a string"
        if is_dev_signature(signature):
            refusal = self._check_dev(peer, signature, denial=denial)
            return rebuilt if refusal is None else refusal
        keys = self.config.keys_of(peer)
        if not keys:
            return f"no public key is configured for {peer}"
        # Key identity comes from our configuration; a claimed fingerprint is informative and must match.
        claimed = submission.ssh_key_id
        if claimed is not None and all(claimed != key.fingerprint for key in keys):
            return f"its ssh_key_id is not the fingerprint of the key configured for {peer}"
        try:
            data = statement_bytes(rebuilt)
        except ValueError as exc:
            return clause(exc)
        namespace = DENIAL_NAMESPACE if denial else APPROVAL_NAMESPACE
        whose = f"{peer}'s configured key" if len(keys) == 1 else f"the keys configured for {peer}"
        # Rules 2 and 3: one of the peer's keys, allowed for this namespace at this time, and the
        # signing module checks the SSHSIG form, the namespace, the algorithms and the signature.
        try:
            used = signing_key(data, signature, keys, namespace, signed_at, whose=whose)
        except (SignatureError, ValueError, TypeError) as exc:
            return f"the signature does not verify with {whose}: {clause(exc)}"
        if claimed is not None and claimed != used.fingerprint:
            return f"its ssh_key_id is not the fingerprint of the key configured for {peer} that signed it"
        return rebuilt

    def _check_dev(self, peer: str, signature: str, *, denial: bool) -> str | None:
        if not self.config.allow_dev_signatures:
            return "development signatures (dev:<signer>) are not allowed by this node's configuration"
        if not dev_signature_allowed(signature, peer, allow_dev=True):
            return f"a development signature of {peer} must read dev:{peer}"
        logger.warning(
            "counting the development signature of %s on the %s of request %s without any cryptography",
            peer,
            "denial" if denial else "approval",
            self.request["request_id"],
        )
        self.dev_signers.append(peer)
        return None

    def count(
        self, submissions: Sequence[_Submission], *, denial: bool
    ) -> tuple[dict[str, _Counted], dict[str, str]]:
        """Return the counted submission of each authorised peer, and why the others were refused."""
        groups = _group(submissions)
        counted: dict[str, _Counted] = {}
        refused: dict[str, str] = {}
        for peer in self.peers:
            for submission in groups.get(peer, ()):
                result = self.check(peer, submission, denial=denial)
                if not isinstance(result, str):
                    counted[peer] = _Counted(submission=submission, statement=result)
                    break
                # The first refusal is reported: deterministic, and usually the informative one.
                refused.setdefault(peer, result)
            if peer in counted:
                refused.pop(peer, None)
        authorised = set(self.peers)
        for claimed in groups:
            if claimed not in authorised:
                refused[claimed] = self.refusal_for_stranger(claimed)
        return counted, refused

    def outcome(self, state: QuorumState, **fields: Any) -> QuorumOutcome:
        return QuorumOutcome(
            state=state,
            request_id=self.request["request_id"],
            origin=self.request["origin"],
            tool_name=self.request["tool_name"],
            payload_digest=self.request["payload_digest"],
            required=self.required,
            peers=self.peers,
            policy=self.policy,
            **fields,
        )

    def votes(self, approvals: Sequence[object], denials: Sequence[object]) -> Votes:
        """Count the denials (rules 1 to 4), then the approvals (rules 1 to 5), then apply rule 6."""
        denied, rejected_denials = self.count(_submissions(denials), denial=True)
        approved, rejected = self.count(_submissions(approvals), denial=False)
        _veto(approved, rejected, denied)
        return Votes(
            approved=approved,
            rejected=rejected,
            denied=denied,
            rejected_denials=rejected_denials,
            signers=tuple(peer for peer in self.peers if peer in approved),
            denied_by=tuple(peer for peer in self.peers if peer in denied),
        )

    def outcome_of(self, state: QuorumState, votes: Votes) -> QuorumOutcome:
        """The outcome ``state`` with everything ``votes`` counted and refused."""
        reasons = {peer: votes.denied[peer].submission.reason for peer in votes.denied_by}
        counted = votes.signers + votes.denied_by
        return self.outcome(
            state,
            signers=votes.signers,
            denied_by=votes.denied_by,
            denial_reasons={peer: reason for peer, reason in reasons.items() if isinstance(reason, str)},
            rejected=votes.rejected,
            rejected_denials=votes.rejected_denials,
            approvals=tuple(votes.approved[peer].carried() for peer in votes.signers),
            dev_signers=tuple(dict.fromkeys(peer for peer in self.dev_signers if peer in counted)),
        )


def _veto(approved: dict[str, _Counted], rejected: dict[str, str], denied: Mapping[str, _Counted]) -> None:
    """Rule 6: a signer with a counted denial counts as a denial only; its approval is refused."""
    for peer in denied:
        # Nobody outvotes their own veto, whichever of the two came first.
        if approved.pop(peer, None) is not None:
            rejected[peer] = f"{peer} also denied the request, so its approval is not counted"


def _submissions(items: Sequence[object]) -> list[_Submission]:
    return [
        _compact(index, item) if isinstance(item, PeerSignature) else _full(index, item)
        for index, item in enumerate(items)
    ]


def clock(now: float | None) -> float:
    """``now``, or the clock when None."""
    return time.time() if now is None else now


def counter_for(request: Mapping[str, Any], config: MultiSigQuorumConfig, now: float) -> Counter:
    """The count of one request under ``config`` at ``now``; a QuorumError when its bar cannot be met here."""
    counter = Counter(request, config, now)
    for term in counter.policy.terms if counter.policy is not None else ():
        if term.required > len(term.peers):
            raise QuorumError(
                f"Request {request['request_id']} needs {term.required} approvals of a term whose "
                f"configured peers here are only {len(term.peers)} ({', '.join(term.peers) or 'none'})."
            )
    if counter.required > len(counter.peers):
        raise QuorumError(
            f"Request {request['request_id']} needs {counter.required} approvals, but only "
            f"{len(counter.peers)} of its peers are configured peers of this node."
        )
    return counter


def policy_mismatch(request: Mapping[str, Any], config: MultiSigQuorumConfig) -> str | None:
    """Why a request's policy is not the one this node's own rules give its tool, or None when it is.

    PROTOCOL.md "Who decides what the policy is": the verifier recomputes the policy from its own
    configuration (the first matching ``[[quorum.rules]]`` entry, or none: version 1) and refuses a
    request or certificate that carries another one, so that neither a relay nor a request can
    lower the bar. A version 1 request for a tool that a rule covers is refused as well.

    Args:
        request: A well-formed request document.
        config: The verifier's quorum configuration.

    Returns:
        One sentence, or None.
    """
    expected = config.policy_for(request["tool_name"])
    carried = request_policy(request)
    if expected is None and carried is None:
        return None
    if expected is not None and carried is not None and carried.document() == expected.document():
        return None

    def said(policy: QuorumPolicy | None) -> str:
        return "no rule (version 1)" if policy is None else f"rule {policy.rule!r} ({policy.summary()})"

    return (
        f"Request {request['request_id']} for {request['tool_name']} carries {said(carried)}, but this "
        f"node's configuration gives {said(expected)}: a request cannot change the bar."
    )


def evaluate(
    request: Mapping[str, Any],
    approvals: Sequence[PeerSignature | Mapping[str, Any]],
    denials: Sequence[Mapping[str, Any]],
    config: MultiSigQuorumConfig,
    now: float | None = None,
) -> QuorumOutcome:
    """Count the approvals and denials of a request under the verifier's configuration.

    The counting rules of PROTOCOL.md are applied to each authorised peer (in the request's
    sorted peer order; see :class:`QuorumOutcome`), checking that peer's submissions until one
    counts. Approvals are compact :class:`PeerSignature` objects or full
    ``{"statement", "signature"}`` documents; denials are always full documents. The threshold is
    the larger of the request's ``required_approvals`` and the configuration's, so a request cannot
    lower the verifier's own bar.

    The decision, in order: ``expired`` when ``now > expires_at`` (nothing is examined then: rule 4
    lets no approval count on an expired request); otherwise :func:`~teaagent.quorum.quorum_state`
    of the distinct counted approvals and denials: ``denied`` when the denials exceed
    ``len(peers) - required``, ``approved`` when the approvals reach ``required``, else
    ``pending``. A peer with a counted denial has its approval ignored, whichever it signed first
    (rule 6: it counts as a denial only), so approvals and denials can never both reach their
    thresholds.

    This is a pure function of its arguments: called again later it may say ``expired`` for a
    request it once called ``approved``, or ``denied`` for one whose approvals had decided before
    the denials came. PROTOCOL.md's "once decided, the outcome never changes" is the caller's to
    keep: the relay counts decisions one at a time in one atomic script (the fold of
    :class:`~teaagent.quorum.Tally`) that settles the outcome once and then counts nothing more;
    the agent keeps the certificate, which :func:`verify_certificate` checks without any expiry at
    ``now``. While the script's state is ``pending`` it agrees with this function exactly, over
    the same decisions.

    Args:
        request: The request document (validated here).
        approvals: The submitted approvals, compact or full, in any order, duplicates allowed.
        denials: The submitted denials, ``{"statement", "signature"}`` each.
        config: The verifier's quorum configuration: who may sign, with which keys, and whether
            ``dev:<signer>`` signatures may count (each is logged at WARNING and listed in
            ``outcome.dev_signers``).
        now: The time of the evaluation in Unix seconds; the clock when None.

    Returns:
        The outcome. Bad signatures never raise: they appear in ``rejected``/``rejected_denials``.

    Raises:
        QuorumError: The request document is malformed, or fewer of its peers are configured here
            than it needs approvals, so the verifier could never count a quorum for it.
    """
    validate_request(request)
    when = clock(now)
    counter = counter_for(request, config, when)
    if is_expired(when, counter.expires_at):
        return counter.outcome("expired")
    votes = counter.votes(approvals, denials)
    return counter.outcome_of(counter.state(votes.signers, votes.denied_by), votes)
