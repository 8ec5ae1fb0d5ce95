"""How times and counts read wherever a person sees them: one wording for every screen and sentence.

- :func:`span`: a length of time, ``1h 02m``, ``1m 58s``, ``45s``;
- :func:`time_left`: the same, or ``expired``;
- :func:`moment`: a Unix time as a date with a relative part, ``2026-12-06 01:02:03Z, 3m 05s ago``;
- :func:`approvals_of`: approvals counted against those needed, ``1 approval of the 2 needed``;
- :func:`needed_from`: what a quorum needs, ``2 approvals from 3 peers``.

``approved by beta (1 of 2)`` read as half an approval; ``expired at 1796518906`` read as nothing
(issue 28): these helpers are the one place such phrases are made.
"""

from __future__ import annotations

import time

__all__ = ["approvals_of", "moment", "needed_from", "plural", "span", "time_left"]


def plural(number: int, noun: str) -> str:
    """``1 approval``, ``2 approvals``, ``0 approvals``."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def span(seconds: float) -> str:
    """A length of time: ``1h 02m``, ``1m 58s``, ``45s`` (``0s`` for nothing or less)."""
    whole = max(0, int(seconds))
    if whole >= 3600:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole}s"


def time_left(seconds: float) -> str:
    """``1h 02m``, ``1m 58s``, ``45s``, or ``expired``."""
    return "expired" if seconds <= 0 else span(seconds)


def moment(when: float, now: float | None = None) -> str:
    """A Unix time as a person reads it: ``2026-12-06 01:02:03Z, 3m 05s ago`` (or ``in 1m 58s``, ``now``).

    The date is UTC (the ``Z``), as every node of a cluster shows the same instant the same way.
    """
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(int(when)))
    delta = int(when) - int(now)
    if delta == 0:
        return f"{stamp}, now"
    return f"{stamp}, in {span(delta)}" if delta > 0 else f"{stamp}, {span(-delta)} ago"


def approvals_of(counted: int, needed: int) -> str:
    """Approvals counted against those needed: ``1 approval of the 2 needed``, never ``1 of 2``."""
    return f"{plural(counted, 'approval')} of the {needed} needed"


def needed_from(needed: int, peers: int) -> str:
    """What a quorum needs: ``2 approvals from 3 peers`` (``1 approval from 1 peer``)."""
    return f"{plural(needed, 'approval')} from {plural(peers, 'peer')}"
