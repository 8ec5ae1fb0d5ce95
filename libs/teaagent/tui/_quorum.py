"""This session's high-risk calls as the TUI shows them: who signed so far, the time left, the outcome.

The board is fed from three places, all on the TUI's own thread: the run's ``approval_waiting``
event (``via="quorum"``: the request and its peers), every status the node's relay reports while the
request waits (``RelayQuorumGate``'s ``on_status``: the counted signers and deniers), and the run's
``approval_granted`` / ``approval_denied`` events. The relay's word is for display only: the policy
verifies the certificate itself before anything runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from teaagent._words import approvals_of, needed_from, time_left

if TYPE_CHECKING:
    from teaagent.relay_client import RequestStatus

__all__ = ["QUORUM_STATES", "QuorumBoard", "QuorumCall", "time_left"]

#: What a high-risk call of the session may be: waiting for its peers, then one of the others.
QUORUM_STATES: Final = ("waiting", "approved", "denied", "expired", "withdrawn", "failed")


@dataclass
class QuorumCall:
    """One high-risk call of the session and its quorum request.

    Attributes:
        request_id: The quorum request's id.
        call_id: The tool call's id in its run.
        run_id: The run.
        tool_name: The tool.
        arguments: The call's arguments.
        peers: Every peer asked, sorted.
        required: Approvals needed.
        expires_at: Unix seconds when the request expires.
        state: One of :data:`QUORUM_STATES`.
        signers: Peers whose approval the relay counted.
        denied_by: Peers whose denial the relay counted.
        reasons: The reason each denier gave.
        started_at: Unix seconds when the wait began.
        ended_at: Unix seconds when it ended, or None.
        outcome: The sentence that ended it (the policy's or the gate's), or "".
    """

    request_id: str
    call_id: str
    run_id: str
    tool_name: str
    arguments: dict[str, Any]
    peers: tuple[str, ...]
    required: int
    expires_at: int
    state: str = "waiting"
    signers: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    outcome: str = ""

    @property
    def waiting(self) -> bool:
        """Whether the call still waits for its peers."""
        return self.state == "waiting"

    def opening(self) -> str:
        """The line that says a call waits, for whom and how long."""
        peers = ", ".join(self.peers)
        return (
            f"{self.tool_name} needs {needed_from(self.required, len(self.peers))} ({peers}); "
            f"request {self.request_id[:12]}, {time_left(self.expires_at - time.time())} left. "
            "Ctrl-C withdraws it."
        )

    def live_line(self, now: float | None = None) -> str:
        """The status line while it waits: each peer's mark, the count, the time left."""
        now = time.time() if now is None else now
        marks = []
        for peer in self.peers:
            if peer in self.denied_by:
                marks.append(f"✗ {peer}")
            elif peer in self.signers:
                marks.append(f"✓ {peer}")
            else:
                marks.append(f"… {peer}")
        return (
            f"{self.tool_name}: {approvals_of(len(self.signers), self.required)}  "
            f"[{'  '.join(marks)}]  {time_left(self.expires_at - now)} left · Ctrl-C withdraws"
        )

    def summary(self) -> str:
        """One phrase for the signers and deniers so far."""
        signed = ", ".join(self.signers) or "nobody"
        text = f"{approvals_of(len(self.signers), self.required)} ({signed})"
        if self.denied_by:
            text += f", denied by {', '.join(self.denied_by)}"
        return text


class QuorumBoard:
    """The session's quorum requests, in the order they were made."""

    def __init__(self) -> None:
        self.calls: list[QuorumCall] = []

    def clear(self) -> None:
        """Forget every call (a new session)."""
        self.calls.clear()

    @property
    def current(self) -> QuorumCall | None:
        """The call that waits now, if one does."""
        for call in reversed(self.calls):
            if call.waiting:
                return call
        return None

    def begin(self, data: Mapping[str, Any]) -> QuorumCall:
        """Record a call the run now waits on (the ``approval_waiting`` event's data, ``via="quorum"``)."""
        call = QuorumCall(
            request_id=str(data["request_id"]),
            call_id=str(data["call_id"]),
            run_id=str(data.get("run_id") or ""),
            tool_name=str(data["tool_name"]),
            arguments=dict(data.get("arguments") or {}),
            peers=tuple(sorted(str(peer) for peer in data["peers"])),
            required=int(data["required_approvals"]),
            expires_at=int(data["expires_at"]),
        )
        self.calls.append(call)
        return call

    def _by_request(self, request_id: str) -> QuorumCall | None:
        for call in reversed(self.calls):
            if call.request_id == request_id:
                return call
        return None

    def _by_call(self, call_id: str) -> QuorumCall | None:
        for call in reversed(self.calls):
            if call.call_id == call_id:
                return call
        return None

    def update(self, status: RequestStatus) -> list[tuple[str, str, str]]:
        """Take a status the relay reported; return the decisions it counted since the last one.

        Returns:
            ``(peer, "approved" | "denied", reason)`` for each newly counted decision, in order.
        """
        call = self._by_request(status.request_id)
        if call is None:
            return []
        news: list[tuple[str, str, str]] = []
        for peer in status.denied_by:
            if peer not in call.denied_by:
                news.append((peer, "denied", str(status.denial_reasons.get(peer, ""))))
        for peer in status.signers:
            if peer not in call.signers:
                news.append((peer, "approved", ""))
        call.signers = tuple(status.signers)
        call.denied_by = tuple(status.denied_by)
        call.reasons = {str(peer): str(reason) for peer, reason in status.denial_reasons.items()}
        if status.state == "expired" and call.waiting:
            call.state = "expired"
        return news

    def granted(self, call_id: str) -> QuorumCall | None:
        """The quorum was reached for ``call_id`` (the policy verifies the certificate next)."""
        call = self._by_call(call_id)
        if call is not None and call.state in ("waiting", "expired"):
            call.state, call.ended_at = "approved", time.time()
        return call

    def denied(self, call_id: str, reason: str) -> QuorumCall | None:
        """The call was refused: by its peers, by expiry, by a stop, or because its certificate failed."""
        call = self._by_call(call_id)
        if call is None:
            return None
        if call.state == "withdrawn":
            pass  # the user's Ctrl-C said it first
        elif "expired" in reason or call.state == "expired":
            call.state = "expired"
        elif call.denied_by and " denied by " in f" {reason}":
            call.state = "denied"
        elif call.state == "approved":
            call.state = "failed"  # the quorum was reached but its certificate did not verify
        else:
            call.state = "denied" if call.denied_by else "failed"
        call.ended_at = call.ended_at or time.time()
        call.outcome = reason
        return call

    def withdraw(self) -> QuorumCall | None:
        """The user stopped the current wait (Ctrl-C)."""
        call = self.current
        if call is not None:
            call.state, call.ended_at = "withdrawn", time.time()
        return call

    def rows(self, now: float | None = None) -> list[Sequence[str]]:
        """The ``/quorum`` table's rows."""
        now = time.time() if now is None else now
        rows: list[Sequence[str]] = []
        for call in self.calls:
            if call.waiting:
                when = f"{time_left(call.expires_at - now)} left"
            else:
                when = time.strftime("%H:%M:%S", time.localtime(call.ended_at or now))
            rows.append(
                [
                    call.request_id[:12],
                    call.tool_name,
                    call.state,
                    ", ".join(call.signers) or "-",
                    ", ".join(call.denied_by) or "-",
                    needed_from(call.required, len(call.peers)),
                    when,
                ]
            )
        return rows
