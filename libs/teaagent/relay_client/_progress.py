"""What the asking side shows while a high-risk call waits for its quorum, worded once for every surface.

``RelayQuorumGate`` hands its ``on_wait`` callback a :class:`WaitProgress` when the request is sent,
when what verifies of it changes (a peer's relay received it, a peer signed or denied), at the
reminder marks of :func:`next_reminder` (from the local clock: the relay is not asked more), and
when it is decided. ``teaagent tools call``, ``teaagent run``, the TUI, the agent HTTP API's
``quorum_progress`` events and MCP progress notifications all word it with :func:`describe_wait`
and :func:`wait_news`, so they say the same thing the same way.

The signers and deniers are the ones whose signed decisions verify on this node (the gate counts
them under its own configuration, never on the relay's word). Who received the request is the
relay's report of its deliveries (nothing signs a delivery); a peer that answered received it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from teaagent._words import approvals_of, moment, time_left
from teaagent.errors import SignatureError
from teaagent.quorum import policy_view
from teaagent.relay_client._models import RequestStatus
from teaagent.signing import parse_sshsig
from teaagent.trust import QuorumPolicy

__all__ = [
    "SHORT_ID_CHARS",
    "WaitProgress",
    "WaitWhy",
    "describe_wait",
    "expiry_sentence",
    "next_reminder",
    "wait_news",
]

SHORT_ID_CHARS: Final = 8  # of a request id in a command to type: unique among what a peer has seen
WaitWhy = Literal["sent", "changed", "reminder", "decided"]


def next_reminder(left: float) -> float | None:
    """The next time left (seconds) at which a wait is shown again though nothing changed, or None.

    Every 5 minutes above 10 minutes left, every minute down to one, then at 30 and 10 seconds:
    a long wait is not a wall of lines, the last minute is not silent.
    """
    if left > 600:
        return float(max((int(left) - 1) // 300 * 300, 600))
    if left > 60:
        return float(max((int(left) - 1) // 60 * 60, 60))
    for last in (30.0, 10.0):
        if left > last:
            return last
    return None


def _names(peers: tuple[str, ...] | list[str]) -> str:
    return ", ".join(peers) if peers else "nobody"


def _key_of(documents: tuple[dict[str, Any], ...], signer: str) -> str | None:
    """The fingerprint of the key embedded in ``signer``'s signed document, if one is there."""
    for document in documents:
        statement = document.get("statement")
        if isinstance(statement, Mapping) and statement.get("signer") == signer:
            try:
                return parse_sshsig(str(document.get("signature", ""))).signer_fingerprint
            except SignatureError:
                return None
    return None


@dataclass(frozen=True, kw_only=True)
class WaitProgress:
    """One high-risk call's wait for its quorum, as this node can vouch for it.

    Attributes:
        request_id: The quorum request's id.
        tool_name: The tool the call runs once approved.
        why: What made it shown: ``sent``, ``changed``, ``reminder`` or ``decided``.
        state: ``pending``, ``approved``, ``denied``, ``expired`` or ``withdrawn``.
        required: Approvals needed.
        peers: Every peer asked, in the request's order.
        signers: Peers whose approval verifies here.
        denied_by: Peers whose denial verifies here.
        denial_reasons: Each verified denier's signed reason.
        keys: The fingerprint of the key in each verified signer's or denier's signed decision.
        received: Peers whose relay took the request (the relay's report), or who answered.
        unreachable: Peers the relay could not reach, with its last error.
        attempts: How many deliveries the relay tried to each unreachable peer.
        given_up: Of those, the ones the relay stopped trying.
        untried: Peers the relay reports it has not tried to reach yet.
        expires_at: Unix seconds when the request expires.
        asked_at: Unix seconds when it was sent.
        policy: A version 2 request's policy (from the signed request), whose terms the count
            shows instead of ``required``.
    """

    request_id: str
    tool_name: str
    why: WaitWhy
    state: str
    required: int
    peers: tuple[str, ...]
    signers: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    denial_reasons: Mapping[str, str] = field(default_factory=dict)
    keys: Mapping[str, str] = field(default_factory=dict)
    received: tuple[str, ...] = ()
    unreachable: Mapping[str, str] = field(default_factory=dict)
    attempts: Mapping[str, int] = field(default_factory=dict)
    given_up: tuple[str, ...] = ()
    untried: tuple[str, ...] = ()
    expires_at: int
    asked_at: float
    policy: QuorumPolicy | None = None

    @classmethod
    def of(cls, verified: RequestStatus, *, tool_name: str, why: WaitWhy, asked_at: float) -> WaitProgress:
        """Build it from a status whose signers and deniers were verified here (the gate's).

        Args:
            verified: The status, its signers, deniers and signed documents the verified ones only.
            tool_name: The call's tool.
            why: What made it shown.
            asked_at: Unix seconds when the request was sent.
        """
        certificate = tuple((verified.certificate or {}).get("approvals") or ())
        keys: dict[str, str] = {}
        for peer in verified.signers:
            key = _key_of(verified.approvals, peer) or _key_of(certificate, peer)
            if key:
                keys[peer] = key
        for peer in verified.denied_by:
            key = _key_of(verified.denials, peer)
            if key:
                keys[peer] = key
        answered = set(verified.signers) | set(verified.denied_by)
        received: list[str] = []
        unreachable: dict[str, str] = {}
        attempts: dict[str, int] = {}
        given_up: list[str] = []
        untried: list[str] = []
        for peer in verified.peers:
            delivery = verified.deliveries.get(peer)
            if peer in answered or (delivery is not None and delivery.state == "delivered"):
                received.append(peer)
            elif delivery is not None and delivery.unreachable:
                unreachable[peer] = delivery.error or "no answer"
                attempts[peer] = delivery.attempts
                if delivery.state == "given_up":
                    given_up.append(peer)
            elif delivery is not None and delivery.state == "pending":
                untried.append(peer)
        return cls(
            request_id=verified.request_id,
            tool_name=tool_name,
            why=why,
            state=verified.state,
            required=verified.required,
            peers=tuple(verified.peers),
            signers=tuple(verified.signers),
            denied_by=tuple(verified.denied_by),
            denial_reasons={str(k): str(v) for k, v in verified.denial_reasons.items()},
            keys=keys,
            received=tuple(received),
            unreachable=unreachable,
            attempts=attempts,
            given_up=tuple(given_up),
            untried=tuple(untried),
            expires_at=verified.expires_at,
            asked_at=asked_at,
            policy=verified.policy,
        )

    @property
    def short_id(self) -> str:
        """The request id's first characters, as a peer's operator types it."""
        return self.request_id[:SHORT_ID_CHARS]

    @property
    def approve_command(self) -> str:
        """The command a peer's operator runs to approve it."""
        return f"teaagent approvals approve {self.short_id} --config <their node.toml>"

    @property
    def waiting(self) -> bool:
        """Whether it still waits for its peers."""
        return self.state == "pending"

    @property
    def not_reached(self) -> tuple[str, ...]:
        """Peers not known to have received it yet (not tried yet, or unreachable)."""
        return tuple(peer for peer in self.peers if peer not in self.received)

    def seconds_left(self, now: float | None = None) -> int:
        """Whole seconds until it expires (0 once expired)."""
        now = time.time() if now is None else now
        return max(0, int(self.expires_at - now))

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """Its JSON form for an event stream, with the sentence of :func:`describe_wait`."""
        return {
            "request_id": self.request_id,
            "tool_name": self.tool_name,
            "why": self.why,
            "state": self.state,
            "required": self.required,
            "peers": list(self.peers),
            "signers": list(self.signers),
            "denied_by": list(self.denied_by),
            "received": list(self.received),
            "unreachable": dict(self.unreachable),
            "expires_at": self.expires_at,
            "seconds_left": self.seconds_left(now),
            "approve_command": self.approve_command,
            "text": describe_wait(self, now),
        } | (
            {} if self.policy is None else {"policy": policy_view(self.policy, self.signers, self.denied_by)}
        )

    def count(self) -> str:
        """The count: ``1 approval of the 2 needed``, or a policy's rule and terms (version 2)."""
        if self.policy is not None:
            return self.policy.describe(self.signers, self.denied_by)
        return approvals_of(len(self.signers), self.required)


def describe_wait(progress: WaitProgress, now: float | None = None, *, command: bool = True) -> str:
    """The wait in one line: the count, who signed, who received it, the time left, how a peer approves.

    ``request 3f2a9c1e for shell.run: 1 approval of the 2 needed (beta); received by beta, gamma;
    not reached yet: delta; 1m 58s left (expires at 2026-12-06 01:02:03Z). A peer's operator
    approves it with: teaagent approvals approve 3f2a9c1e --config <their node.toml>``

    Args:
        progress: The wait.
        now: Unix seconds; the current time when None.
        command: Whether to end with the command a peer's operator runs (while it waits).
    """
    now = time.time() if now is None else now
    head = f"request {progress.short_id} for {progress.tool_name}"
    count = progress.count()
    # A policy's terms name their approvers already.
    signed = f" ({', '.join(progress.signers)})" if progress.signers and progress.policy is None else ""
    denied = ""
    if progress.denied_by:
        denied = "; denied by " + "; ".join(
            f"{peer}: {progress.denial_reasons[peer]}" if progress.denial_reasons.get(peer) else peer
            for peer in progress.denied_by
        )
    if not progress.waiting:
        return f"{head}: {progress.state} with {count}{signed}{denied}."
    parts = [f"{head}: {count}{signed}{denied}"]
    parts.append(f"received by {_names(progress.received)}")
    if progress.not_reached:
        parts.append(f"not reached yet: {', '.join(progress.not_reached)}")
    left = time_left(progress.expires_at - now)
    parts.append(f"{left} left (expires at {moment(progress.expires_at, now).split(',')[0]})")
    line = "; ".join(parts) + "."
    if command:
        line += f" A peer's operator approves it with: {progress.approve_command}"
    return line


def wait_news(before: WaitProgress | None, after: WaitProgress, now: float | None = None) -> list[str]:
    """One line per thing that changed between two views of a wait (deliveries, then decisions).

    ``beta's relay received the request.``, ``delta could not be reached: ...``,
    ``✓ beta approved (key SHA256:..., 2.5 s after asking): 1 approval of the 2 needed.``,
    ``✗ delta denied (key SHA256:..., 3.0 s after asking): not on Fridays.``
    """
    lines: list[str] = []
    old_received = set(before.received) if before is not None else set()
    old_unreachable = dict(before.unreachable) if before is not None else {}
    old_given_up = set(before.given_up) if before is not None else set()
    for peer in after.peers:
        if peer in after.received and peer not in old_received:
            lines.append(f"{peer}'s relay received the request.")
        elif peer in after.given_up and peer not in old_given_up:
            lines.append(f"{peer} could not be reached, and the relay gave up: {after.unreachable[peer]}.")
        elif peer in after.unreachable and peer not in after.given_up and peer not in old_unreachable:
            lines.append(
                f"{peer} could not be reached: {after.unreachable[peer]}; retrying until the request expires."
            )
    old_signers = set(before.signers) if before is not None else set()
    old_deniers = set(before.denied_by) if before is not None else set()
    elapsed = max(0.0, (time.time() if now is None else now) - after.asked_at)
    for peer in after.signers:
        if peer not in old_signers:
            key = f"key {after.keys[peer]}, " if peer in after.keys else ""
            lines.append(f"✓ {peer} approved ({key}{elapsed:.1f} s after asking): {after.count()}.")
    for peer in after.denied_by:
        if peer not in old_deniers:
            key = f"key {after.keys[peer]}, " if peer in after.keys else ""
            reason = after.denial_reasons.get(peer)
            because = f": {reason}" if reason else ""
            lines.append(f"✗ {peer} denied ({key}{elapsed:.1f} s after asking){because}.")
    return lines


def expiry_sentence(progress: WaitProgress) -> str:
    """Why a request expired: who approved, who never answered, who was never reached (and why)."""
    answered = set(progress.signers) | set(progress.denied_by)
    # A peer the relay reports no trouble with (or nothing about) counts as one that never answered.
    unreached = [
        p
        for p in progress.peers
        if p not in answered and (p in progress.unreachable or p in progress.untried)
    ]
    silent = [p for p in progress.peers if p not in answered and p not in unreached]
    parts = [f"approved by {_names(progress.signers)} ({progress.count()})"]
    if progress.denied_by:
        parts.append(f"denied by {_names(progress.denied_by)}")
    parts.append(f"never answered: {_names(silent)}")
    if unreached:
        reasons = [
            f"{peer} ({progress.unreachable[peer]}; {progress.attempts.get(peer, 0)} attempts)"
            if peer in progress.unreachable
            else f"{peer} (not tried yet)"
            for peer in unreached
        ]
        parts.append(f"unreachable: {'; '.join(reasons)}")
    return f"request {progress.request_id} expired: " + "; ".join(parts) + "."
