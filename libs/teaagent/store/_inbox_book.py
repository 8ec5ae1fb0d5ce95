"""The approving side's book: requests received from peer origins, and this node's decision on each."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from teaagent.store._book import Answer, Book
from teaagent.store._connection import converting
from teaagent.store._keys import Keys
from teaagent.store._refs import Acceptance, Ref, check_decision
from teaagent.store._results import (
    AcceptResult,
    DecisionKind,
    DecisionResult,
    DecisionToCount,
    Intake,
    QueuedDecision,
    ReceiveResult,
    SettleResult,
    StoredRequest,
    WithdrawResult,
)
from teaagent.store._shapes import Outgoing

if TYPE_CHECKING:
    from teaagent.store._queue import DeliveryQueue

__all__ = ["InboxBook"]


class InboxBook(Book):
    """Requests received from peer origins, keyed by ``(origin, request_id)``, and this node's decision.

    The node's own decision is counted with ``required = peers = 1``: its first approval settles
    ``approved``, its first denial ``denied``, so a decided item leaves the pending listing, and
    nothing recorded after that changes it (rule 6 never applies here: a decided item counts no more).
    """

    def _sets(self, keys: Keys) -> tuple[str, str]:
        return keys.inbox_index(), keys.inbox_pending()

    def _ref(self, member: str) -> Ref:
        origin, _, request_id = member.partition("/")
        return self._at(origin, request_id)

    def _at(self, origin: str, request_id: str) -> Ref:
        """The ref of the request ``request_id`` from ``origin``: its member is ``<origin>/<id>``.

        Raises:
            ValueError: a malformed origin or id.
        """
        return Ref(self._keys.inbox_item(origin, request_id), f"{origin}/{request_id}", request_id, origin)

    def _held(self, members: list[str]) -> dict[str, list[str]]:
        held: dict[str, list[str]] = {}
        for member in members:
            try:
                key = self._keys.inbox_held(member.partition("/")[0])
            except ValueError:
                continue  # no ref of a request this inbox took in
            held.setdefault(key, []).append(member)
        return held

    async def accept(
        self, origin: str, request_id: str, document: bytes, *, expires_at: int, now: int | None = None
    ) -> AcceptResult:
        """Store a verified request from ``origin`` once; the same bytes again are the same request.

        Raises:
            RequestConflictError: other bytes are already stored for this origin and id.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id, or a document too large.
            TypeError: ``document`` is not bytes.
        """
        return await self._accept(self._item(origin, request_id, document, expires_at=expires_at, now=now))

    def _item(
        self, origin: str, request_id: str, document: bytes, *, expires_at: int, now: int | None
    ) -> Acceptance:
        """One received request's accept, checked and encoded (:meth:`accept`, :meth:`receive`)."""
        return self._acceptance(self._at(origin, request_id), document, expires_at, now)

    async def receive(
        self,
        origin: str,
        request_id: str,
        document: bytes,
        *,
        expires_at: int,
        intake: Intake,
        payload: bytes,
        now: int | None = None,
    ) -> ReceiveResult:
        """Take a verified request from ``origin`` in: hold, charge, store, queue and mark it; or say why not.

        A peer relay's steps for a new request, in their order: nothing when the request is stored
        already (``stored_before``: the caller reads it and answers a repeat, and no window is
        charged); else the request is counted against what its origin may hold pending in this
        inbox, ``intake.max_pending`` (``full`` when it holds that many already: nothing is
        charged or written); else one call against the intake's window (a refusal writes
        nothing: the hold is taken back); else :meth:`accept`, then, while it is pending, one entry
        ``payload`` for the intake's target on its queue, and :meth:`mark_queued`. A request leaves
        its origin's count when it is decided, withdrawn or expires. On one server the five are
        one script (``receive_request.lua``): one round trip and one sync, and no crash between
        two of them. On a cluster their keys have several hash tags, so they run one by one, as
        their own methods do; a crash between two leaves the item unqueued or unmarked, and the
        origin's repeat completes it (a hold left behind counts the request once until it expires,
        and a charge is made once per request: a repeat after a failed step is not charged again).

        Raises:
            StoreError: Redis is unreachable or failed, or the queue is full (the request is stored
                then, not queued).
            ValueError: a malformed origin, id, window or limit, a document too large, or an entry
                the queue refuses.
            TypeError: ``document`` or ``payload`` is not bytes.
        """
        one = self._item(origin, request_id, document, expires_at=expires_at, now=now)
        if intake.max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {intake.max_pending}")
        return await self._shape.receive(self, one, intake, payload, now, self._keys.inbox_held(origin))

    async def get(self, origin: str, request_id: str) -> StoredRequest | None:
        """Return the received request, or None when it is not (or no longer) stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        return await self._get(self._at(origin, request_id))

    async def exists(self, origin: str, request_id: str) -> bool:
        """True when a request from ``origin`` is stored under ``request_id``: one EXISTS, cheaper
        than :meth:`get` on the path of every new request.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        return await self._exists(self._at(origin, request_id))

    async def mark_queued(self, origin: str, request_id: str, entry_id: str) -> bool:
        """Note that the received request was queued for the approver (``StoredRequest.queued``).

        Queue the entry first, then mark: an unmarked item is queued again by the next repeat
        of the request, a marked one never (a captured request re-posted cannot fill the queue).

        Returns:
            True when marked; False when no such request is stored.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        return await self._mark_queued(self._at(origin, request_id), entry_id)

    async def record_decision(
        self,
        origin: str,
        request_id: str,
        *,
        kind: DecisionKind,
        signer: str,
        decision: bytes,
        now: int | None = None,
    ) -> DecisionResult:
        """Record this node's signed decision on a received request (the first one settles it).

        Raises:
            RequestNotFoundError: no such request was received (or it expired and was removed).
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin, id, kind or signer, or a decision too large.
            TypeError: ``decision`` is not bytes.
        """
        check_decision(kind, signer, decision)
        ref = self._at(origin, request_id)
        return await self._record(ref, kind=kind, signer=signer, decision=decision, now=now)

    async def settle(
        self, origin: str, request_id: str, *, settlement: bytes, now: int | None = None
    ) -> SettleResult:
        """Mark a received request ``settled`` on its origin's verified evidence (``settle_elsewhere``).

        A pending item becomes ``settled`` (final); an item this node decided keeps its decision and
        gains the evidence; a withdrawn, expired or already settled one is left as it is.

        Raises:
            RequestNotFoundError: no such request was received (or it expired and was removed).
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id, or evidence too large.
            TypeError: ``settlement`` is not bytes.
        """
        return await self._settle_elsewhere(self._at(origin, request_id), settlement, now)

    async def withdraw(
        self, origin: str, request_id: str, *, withdrawal: bytes, now: int | None = None
    ) -> WithdrawResult:
        """Mark a received request ``withdrawn`` by its origin (see :meth:`RequestBook.withdraw`).

        An item this node decided first keeps its decision (``approved``/``denied``).

        Raises:
            RequestNotFoundError: no such request was received (or it expired and was removed).
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id, or a withdrawal too large.
            TypeError: ``withdrawal`` is not bytes.
        """
        return await self._withdraw(self._at(origin, request_id), withdrawal, now)

    async def get_many(self, refs: Sequence[tuple[str, str]]) -> list[StoredRequest | None]:
        """:meth:`get` for many ``(origin, request_id)`` in one round trip (a pipeline, in order).

        Each item is one ``read_request`` call, its document, outcome and decisions read at one
        instant; no transaction holds the batch (on a cluster, the client splits the pipeline by
        node), so two items may be read at two instants.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed origin or id.
        """
        items = [self._at(origin, request_id) for origin, request_id in refs]
        with converting(self._url):
            return await self._get_many(items)

    async def record_and_queue(
        self,
        decisions: Sequence[tuple[str, DecisionToCount, Outgoing]],
        queue: DeliveryQueue,
        inbox: DeliveryQueue,
    ) -> list[QueuedDecision | Exception]:
        """This node's own decisions, each ``(origin, decision, (target, payload, expires_at))``:
        recorded as :meth:`record_decisions` records them, and each one a call counted queued on
        ``queue`` for ``target`` (its request's origin), in one round trip on one server (one
        ``record_send`` script each: no crash between the record and the queueing). An item a call
        settled and queued leaves the approver's queue, ``inbox`` (``Store.inbox_queue``): it
        waits for nobody any more.

        A decision that did not count (a repeat, a contrary one, a closed request) is not queued:
        its caller decides whether a repeat goes again. The answer for each is a
        :class:`QueuedDecision`, or the error recording it alone would have raised, or the
        ``StoreError`` of a full queue (the decision is recorded, not queued).

        Raises:
            StoreError: Redis is unreachable or failed (recording and queueing again is harmless).
            ValueError: an entry the queue refuses (nothing is sent then).
        """
        return await self._record_queue_batch(
            [
                (item, functools.partial(self._at, origin, item.request_id), outgoing)
                for origin, item, outgoing in decisions
            ],
            queue,
            inbox,
        )

    async def record_decisions(self, decisions: Sequence[tuple[str, DecisionToCount]]) -> list[Answer]:
        """:meth:`record_decision` for many ``(origin, decision)`` in one round trip, pipelined.

        Each is recorded exactly as :meth:`record_decision` records it alone; the answer for each
        is its result or the error it alone would have raised (see ``RequestBook.record_decisions``).

        Raises:
            StoreError: Redis is unreachable or failed (recording again is harmless).
        """
        return await self._record_batch(
            [(item, functools.partial(self._at, origin, item.request_id)) for origin, item in decisions]
        )
