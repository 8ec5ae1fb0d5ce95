"""What the asking side shows while a quorum is awaited: who got the request, who answered, and why not.

:class:`QuorumWatch` is the quorum gate's ``on_status`` callback for ``teaagent tools call`` and
``teaagent run``. From each status the node's relay reports it writes one line per change:

- a peer's relay received the request, or could not be reached (the relay's last error), or the
  relay gave up delivering to it;
- a peer's approval or denial, as it arrives: the signer, the fingerprint of the key in its
  signature, the time since asking;
- on expiry, why: who received the request and never answered, and who was never reached.

It is the relay's word, for display only: the certificate is verified by the policy before
anything runs, whatever was shown here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from teaagent.errors import SignatureError
from teaagent.relay_client import PeerDelivery, RequestStatus
from teaagent.signing import parse_sshsig

__all__ = ["QuorumWatch", "expiry_sentence"]


def _names(peers: list[str]) -> str:
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


def _reached(delivery: PeerDelivery | None) -> bool:
    return delivery is not None and delivery.state == "delivered"


def expiry_sentence(status: RequestStatus) -> str:
    """Why a request expired: who approved, who never answered, who was never reached (and why).

    Peers whose delivery state the relay does not report count as never answering.
    """
    answered = set(status.signers) | set(status.denied_by)
    silent = [
        p
        for p in status.peers
        if p not in answered and (_reached(status.deliveries.get(p)) or not status.deliveries)
    ]
    unreached = [p for p in status.peers if p not in answered and p not in silent]
    parts = [
        f"approved by {_names(list(status.signers))} ({len(status.signers)} of {status.required} needed)"
    ]
    if status.denied_by:
        parts.append(f"denied by {_names(list(status.denied_by))}")
    parts.append(f"never answered: {_names(silent)}")
    if unreached:
        reasons = []
        for peer in unreached:
            delivery = status.deliveries.get(peer)
            if delivery is not None and delivery.error:
                reasons.append(f"{peer} ({delivery.error}; {delivery.attempts} attempts)")
            else:
                reasons.append(f"{peer} (not tried yet)")
        parts.append(f"unreachable: {'; '.join(reasons)}")
    return f"request {status.request_id} expired: " + "; ".join(parts) + "."


@dataclass
class _Seen:
    """What was already said about one request."""

    asked_at: float
    deliveries: dict[str, str] = field(default_factory=dict)
    signers: set[str] = field(default_factory=set)
    deniers: set[str] = field(default_factory=set)
    decided: bool = False


class QuorumWatch:
    """Writes one line per change of a quorum request's status (the gate's ``on_status``)."""

    def __init__(self, write: Callable[[str], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        """Args:
        write: Called with each line (no newline), such as a command line's stderr writer.
        clock: Monotonic seconds, for the time since asking.
        """
        self._write = write
        self._clock = clock
        self._seen: dict[str, _Seen] = {}

    def __call__(self, status: RequestStatus) -> None:
        seen = self._seen.get(status.request_id)
        if seen is None:
            # The first status is the submission's: the time of asking, within one round trip.
            seen = self._seen[status.request_id] = _Seen(asked_at=self._clock())
        if seen.decided:
            return
        self._deliveries(status, seen)
        elapsed = self._clock() - seen.asked_at
        for signer in status.signers:
            if signer not in seen.signers:
                seen.signers.add(signer)
                key = _key_of(status.approvals, signer) or _key_of(
                    tuple((status.certificate or {}).get("approvals") or ()), signer
                )
                shown = f"key {key}, " if key else ""
                self._write(
                    f"✓ {signer} approved ({shown}{elapsed:.1f} s after asking): "
                    f"{len(status.signers)} of {status.required} needed."
                )
        for denier in status.denied_by:
            if denier not in seen.deniers:
                seen.deniers.add(denier)
                key = _key_of(status.denials, denier)
                shown = f"key {key}, " if key else ""
                reason = status.denial_reasons.get(denier)
                because = f": {reason}" if reason else ""
                self._write(f"✗ {denier} denied ({shown}{elapsed:.1f} s after asking){because}.")
        if status.decided:
            seen.decided = True
            if status.state == "expired":
                self._write(expiry_sentence(status))

    def _deliveries(self, status: RequestStatus, seen: _Seen) -> None:
        for peer in status.peers:
            delivery = status.deliveries.get(peer)
            if delivery is None or delivery.state == "pending":
                continue
            if seen.deliveries.get(peer) == delivery.state:
                continue
            seen.deliveries[peer] = delivery.state
            if delivery.state == "delivered":
                self._write(f"{peer}'s relay received the request.")
            elif delivery.state == "failing":
                self._write(
                    f"{peer} could not be reached: {delivery.error}; retrying until the request expires."
                )
            else:
                self._write(f"{peer} could not be reached, and the relay gave up: {delivery.error}.")
