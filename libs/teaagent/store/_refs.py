"""How a request book names a request (``Ref``), and one accept, checked and encoded (``Acceptance``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from teaagent.errors import RequestConflictError
from teaagent.store._keys import AGENT_ID_PATTERN, MAX_DOCUMENT_BYTES, RequestKeys
from teaagent.store._results import AcceptResult, StoredRequest, request_state

__all__ = ["MAX_EVENTS", "Acceptance", "Ref", "check_decision", "check_document", "now_seconds"]

MAX_EVENTS = 1000  # a request sees one event per decision plus two; the bound only guards against abuse
_DECISION_KINDS = ("approval", "denial")


@dataclass(frozen=True)
class Ref:
    """One request as its book names it: its keys, its member in the index and pending sets, its id
    and origin (None: this node's own)."""

    keys: RequestKeys
    member: str
    request_id: str
    origin: str | None

    @property
    def label(self) -> str:
        """How an error names it: ``request <id>``, or ``request <id> from <origin>``."""
        if self.origin is None:
            return f"request {self.request_id}"
        return f"request {self.request_id} from {self.origin}"


def now_seconds(now: int | None) -> int:
    """``now``, or the system clock's Unix seconds when None."""
    return int(time.time()) if now is None else now


def check_document(name: str, document: bytes) -> None:
    """Refuse what no script should store as ``name``: not bytes, empty, or above ``MAX_DOCUMENT_BYTES``.

    Raises:
        TypeError: ``document`` is not non-empty bytes.
        ValueError: it is too large.
    """
    if not isinstance(document, bytes) or not document:
        raise TypeError(f"{name} must be non-empty bytes")
    if len(document) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"{name} is {len(document)} bytes, above the limit of {MAX_DOCUMENT_BYTES}")


def check_decision(kind: str, signer: str, decision: bytes) -> None:
    """Refuse a decision ``record_decision`` could not count.

    Raises:
        ValueError: a kind that is neither approval nor denial, a malformed signer, a decision too large.
        TypeError: ``decision`` is not bytes.
    """
    if kind not in _DECISION_KINDS:
        raise ValueError(f"decision kind must be 'approval' or 'denial', not {kind!r}")
    if not AGENT_ID_PATTERN.fullmatch(signer):
        raise ValueError(f"signer {signer!r} is not a valid agent id")
    check_document("decision", decision)


@dataclass(frozen=True)
class Acceptance:
    """One accept, checked and encoded (``Book._acceptance``), and how its reply reads."""

    ref: Ref
    document: bytes
    required: int
    peers: int
    expires_at: int
    at: int
    ttl_ms: int  # the index entries' TTL
    args: list[Any]

    @property
    def keys(self) -> list[str]:
        """The ``accept_request`` script's keys."""
        keys = self.ref.keys
        return [keys.doc, keys.outcome, keys.events]

    @property
    def held_ms(self) -> int:
        """How long what counts this request must live: until it expires (an origin's held set)."""
        return (max(self.expires_at - self.at, 0) + 1) * 1000

    def result(self, status: bytes, state: bytes) -> AcceptResult:
        """The ``accept_request`` script's ``{status, state}``, read.

        Raises:
            RequestConflictError: other bytes hold the id (``conflict``).
        """
        if status == b"conflict":
            raise RequestConflictError(
                f"{self.ref.label} already exists with a different document; the new one is refused"
            )
        created, accepted = status == b"created", request_state(state)
        stored = None
        if created and accepted == "pending":
            # What accept_request.lua wrote, field for field (tests/test_store_requests.py holds
            # it to a read of the store).
            stored = StoredRequest(
                request_id=self.ref.request_id,
                origin=self.ref.origin,
                document=self.document,
                state="pending",
                required=self.required,
                peers=self.peers,
                expires_at=self.expires_at,
                accepted_at=self.at,
                decided_at=None,
            )
        return AcceptResult(created=created, state=accepted, stored=stored)
