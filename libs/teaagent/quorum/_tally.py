"""The counting rules of PROTOCOL.md "Counting" as one fold over verified decisions: the reference.

Two counters apply these rules and must agree with this module at every step:
:func:`~teaagent.quorum.evaluate`, a pure function of every decision submitted so far, which takes
its state from :func:`quorum_state` and :func:`is_expired` here; and the relay's
``record_decision.lua``, which counts one decision at a time, atomically, in Redis: it is
:meth:`Tally.step` written in Lua (keep the two together). ``tests/test_quorum_parity.py`` drives
random sequences of decisions through all three and requires the same state and the same signers.

What is folded here is a decision that already passed rules 1 to 4 (its signer is an authorised
peer, its signature verifies, it was signed in time); this module applies the rest: expiry at
``now``, each signer once (rule 5), a signer that denied counts as a denial only (rule 6), the two
thresholds, and "once decided, the outcome never changes".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from teaagent.trust import QuorumPolicy

__all__ = ["DecisionKind", "QuorumState", "Tally", "is_expired", "quorum_state"]

QuorumState = Literal["pending", "approved", "denied", "expired"]
DecisionKind = Literal["approval", "denial"]


def is_expired(now: float, expires_at: int) -> bool:
    """Whether a request is expired at ``now``: ``now > expires_at`` (at ``expires_at`` it still counts)."""
    return now > expires_at


def quorum_state(*, approvals: int, denials: int, peers: int, required: int) -> QuorumState:
    """The state that distinct counted approvals and denials prove, expiry aside.

    ``denied`` as soon as the denials exceed ``peers - required`` (the quorum can no longer be
    reached), ``approved`` when the approvals reach ``required``, ``pending`` otherwise. With each
    signer counted on one side only, ``approvals + denials <= peers``, so both can never hold.

    Args:
        approvals: Distinct signers with a counted approval (none of whom denied).
        denials: Distinct signers with a counted denial.
        peers: The authorised signers of the request.
        required: The approvals needed.
    """
    if denials > peers - required:
        return "denied"
    if approvals >= required:
        return "approved"
    return "pending"


@dataclass(frozen=True, kw_only=True)
class Tally:
    """The counting state of one request after some verified decisions, in the order they came.

    Attributes:
        peers: The number of authorised signers (the request's peers configured here, never the origin).
        required: The approvals needed, ``1 <= required <= peers``.
        expires_at: The request's expiry, Unix seconds.
        state: ``pending`` until decided; then final.
        approvers: The signers whose approval counts (never one that denied).
        deniers: The signers whose denial counts.
        policy: A version 2 request's policy (its terms limited to the authorised signers): then
            it decides instead of ``required`` of ``peers`` (PROTOCOL.md, "Version 2", Counting).
    """

    peers: int
    required: int
    expires_at: int
    state: QuorumState = "pending"
    approvers: frozenset[str] = frozenset()
    deniers: frozenset[str] = frozenset()
    policy: QuorumPolicy | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.required <= self.peers:
            raise ValueError(f"required must be between 1 and peers ({self.peers}), not {self.required}")

    @property
    def decided(self) -> bool:
        """Whether the outcome is final (anything but ``pending``)."""
        return self.state != "pending"

    def step(self, kind: DecisionKind | None, signer: str = "", *, now: float) -> Tally:
        """Fold one verified decision in, received at ``now``; ``kind=None`` only settles expiry.

        In order: a decided tally never changes; ``now > expires_at`` settles ``expired`` (the
        decision does not count); a signer's repeat is ignored (rule 5); an approval of a signer
        that denied is ignored, and a denial of a signer that approved takes its approval away
        (rule 6); then the thresholds decide.

        Raises:
            ValueError: ``kind`` is neither ``approval``, ``denial`` nor None.
        """
        if self.decided:
            return self
        if is_expired(now, self.expires_at):
            return replace(self, state="expired")
        if kind is None:
            return self
        if kind == "denial":
            if signer in self.deniers:
                return self
            approvers, deniers = self.approvers - {signer}, self.deniers | {signer}
        elif kind == "approval":
            if signer in self.approvers or signer in self.deniers:
                return self
            approvers, deniers = self.approvers | {signer}, self.deniers
        else:
            raise ValueError(f"decision kind must be 'approval', 'denial' or None, not {kind!r}")
        if self.policy is not None:
            state: QuorumState = self.policy.state(approvers, deniers)
        else:
            state = quorum_state(
                approvals=len(approvers), denials=len(deniers), peers=self.peers, required=self.required
            )
        return replace(self, state=state, approvers=approvers, deniers=deniers)
