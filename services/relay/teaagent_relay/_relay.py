"""One node's relay, apart from HTTP: its origin side and its inbox side over one store and trust.

:class:`Relay` joins :class:`~teaagent_relay._origin.OwnRequests` (this node's own requests:
stored, fanned out, counted) and :class:`~teaagent_relay._inbox.Inbox` (peers' requests, kept for
this node's approver), both over :class:`~teaagent_relay._base.RelayBase` (the trust, the store,
the delivery queue and the stored forms, described there).
"""

from __future__ import annotations

from teaagent_relay._base import MAX_WAIT_SECONDS
from teaagent_relay._inbox import APPROVER_TARGET, Inbox
from teaagent_relay._origin import KnownRequest, OwnRequests

__all__ = ["APPROVER_TARGET", "MAX_WAIT_SECONDS", "KnownRequest", "Relay"]


class Relay(OwnRequests, Inbox):
    """One node's relay: its configuration, its store, and the rules of PROTOCOL.md."""
