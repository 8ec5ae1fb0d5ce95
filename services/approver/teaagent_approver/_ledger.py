"""The approver's decision records in the node's Redis: each written once, before anything is signed.

For each received request (``origin``, ``request_id``) there are three keys (``Keys.approver_item``,
one hash tag, the inbox item's own):

- ``decision``: the :class:`Record` of this node's decision, JSON. Written with ``SET NX`` before
  the node key signs anything, so of two approver processes (or a process and its restarted
  self) exactly one records a decision, and the other finds it and never signs a different one.
  A decision signed elsewhere (an operator's key) is recorded with its signature inline.
- ``signature``: the node key's signature over the recorded statement, ``SET NX`` as well: if two
  processes sign the same statement (a takeover after a crash), the first signature stands and
  both send that one, so the relay never sees two (an ECDSA key signs differently each time).
- ``notified``: set once the request was handed to the notifier.

Recording a decision and storing a signature are one command each, ``SET ... NX GET`` (Redis 7.0
and later, as the store's ``PEXPIRE ... NX``): written when it answers nothing, else it answers the
value that stands. A decision that lost the race costs one more read, of the signature. Concurrent
callers share pipelines (:class:`teaagent._batch.Coalescer`), so the engine's batch of decisions
costs two round trips, not two per decision. Every key lives until the request's ``expires_at``
plus ``REQUEST_RETENTION_SECONDS``, as the inbox item does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import redis.exceptions
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline

from teaagent._batch import Coalescer
from teaagent.errors import StoreError
from teaagent.store import REQUEST_RETENTION_SECONDS, Store
from teaagent.store._keys import ApproverKeys

__all__ = ["MAX_BATCH", "Claim", "DecisionKind", "Ledger", "Record"]

DecisionKind = Literal["approval", "denial"]
MAX_BATCH: Final = 256  # commands' worth of calls per pipeline; bounds one reply and one batch's latency
RECORD_VERSION: Final = 1


@dataclass(frozen=True, kw_only=True)
class Record:
    """This node's decision on one received request, as recorded before it was signed.

    Attributes:
        kind: ``approval`` or ``denial``.
        reason: The reason given (a denial signs it; an approval's is kept here and audited).
        by: Who decided: ``rule N`` (the N-th of ``[[approver.rules]]``, from 1) or ``operator``.
        key_fingerprint: The fingerprint of the key that signs (or signed) it.
        statement: The approval or denial statement, exactly what is signed.
        signature: The signature, when it was made elsewhere and recorded with the decision; None
            when the node key signs after recording (see the ``signature`` key).
        instance: The approver process that recorded it (random per process start).
        recorded_at: Unix seconds, with a fraction.
    """

    kind: DecisionKind
    reason: str
    by: str
    key_fingerprint: str
    statement: dict[str, Any]
    signature: str | None
    instance: str
    recorded_at: float

    @property
    def signed_at(self) -> int:
        """The statement's ``signed_at``."""
        return int(self.statement["signed_at"])

    def to_bytes(self) -> bytes:
        """The stored form (compact JSON)."""
        return json.dumps(
            {
                "v": RECORD_VERSION,
                "kind": self.kind,
                "reason": self.reason,
                "by": self.by,
                "key_fingerprint": self.key_fingerprint,
                "statement": self.statement,
                "signature": self.signature,
                "instance": self.instance,
                "recorded_at": self.recorded_at,
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Record:
        """Read the stored form.

        Raises:
            ValueError: The bytes are not a record of this version.
        """
        try:
            parsed = json.loads(data)
            if not isinstance(parsed, dict) or parsed.get("v") != RECORD_VERSION:
                raise ValueError("not a version 1 record")
            kind = parsed["kind"]
            if kind not in ("approval", "denial"):
                raise ValueError(f"its kind {kind!r} is neither approval nor denial")
            statement = parsed["statement"]
            signature = parsed["signature"]
            if not isinstance(statement, dict) or not (signature is None or isinstance(signature, str)):
                raise ValueError("its statement or signature has the wrong type")
            return cls(
                kind=kind,
                reason=str(parsed["reason"]),
                by=str(parsed["by"]),
                key_fingerprint=str(parsed["key_fingerprint"]),
                statement=statement,
                signature=signature,
                instance=str(parsed["instance"]),
                recorded_at=float(parsed["recorded_at"]),
            )
        except (KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"the stored decision record is malformed: {exc}") from None


@dataclass(frozen=True)
class Claim:
    """What recording a decision found: the record that stands, and whether this call wrote it.

    Attributes:
        record: The standing record (ours when ``won``, else the one recorded first).
        won: True when this call recorded it.
        signature: The standing signature: the record's own, or the node key's (None: not yet).
    """

    record: Record
    won: bool
    signature: str | None


@dataclass(frozen=True)
class _ClaimCall:
    origin: str
    request_id: str
    expires_at: int
    record: Record


@dataclass(frozen=True)
class _AttachCall:
    origin: str
    request_id: str
    expires_at: int
    signature: str


_Pipe = Pipeline | ClusterPipeline  # one server's, or a cluster's


def _ttl(expires_at: int, now: float) -> int:
    """Seconds a key of a request lives: until its expiry plus the inbox's retention."""
    return max(int(expires_at - now), 0) + REQUEST_RETENTION_SECONDS


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class Ledger:
    """The approver's records of one node's decisions, in its Redis (see the module)."""

    def __init__(self, store: Store) -> None:
        self._client = store.client
        self._keys = store.keys
        self._url = store.url
        self._claims: Coalescer[_ClaimCall, Claim] = Coalescer(
            self._claim_many, "teaagent-approver-claims", max_batch=MAX_BATCH
        )
        self._attaches: Coalescer[_AttachCall, str] = Coalescer(
            self._attach_many, "teaagent-approver-signatures", max_batch=MAX_BATCH
        )

    def _failed(self, exc: redis.exceptions.RedisError) -> StoreError:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreError(f"Redis at {self._url} failed: {detail.rstrip('.')}")

    async def claim(self, origin: str, request_id: str, expires_at: int, record: Record) -> Claim:
        """Record ``record`` as this node's decision unless one is recorded; return the one that stands.

        Raises:
            StoreError: Redis failed (nothing is known to be recorded; calling again is safe).
            ValueError: A malformed origin or id, or a stored record that cannot be read.
        """
        return await self._claims.call(_ClaimCall(origin, request_id, expires_at, record))

    async def attach(self, origin: str, request_id: str, expires_at: int, signature: str) -> str:
        """Store the node key's signature over the recorded statement unless one is stored; return
        the one that stands (send that one, not your own, when they differ).

        Raises:
            StoreError: Redis failed.
            ValueError: A malformed origin or id.
        """
        return await self._attaches.call(_AttachCall(origin, request_id, expires_at, signature))

    async def _pipelined(
        self,
        refs: Sequence[tuple[str, str]],
        queue: Callable[[_Pipe, ApproverKeys, int], object],
    ) -> list[list[Any]]:
        """Queue ``queue(pipe, keys, index)`` for each ``(origin, request_id)`` in one pipeline (no
        transaction); return each one's replies.

        Raises:
            StoreError: Redis failed.
            ValueError: A malformed origin or id.
        """
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for index, (origin, request_id) in enumerate(refs):
                    queue(pipe, self._keys.approver_item(origin, request_id), index)
                replies = await pipe.execute()
        except redis.exceptions.RedisError as exc:
            raise self._failed(exc) from exc
        each = len(replies) // len(refs)
        return [replies[each * index : each * index + each] for index in range(len(refs))]

    async def _claim_many(self, calls: list[_ClaimCall]) -> list[Claim | Exception]:
        now = time.time()

        def queue(pipe: _Pipe, keys: ApproverKeys, index: int) -> None:
            call = calls[index]
            # One command: None when ours is written, else the record that stands.
            pipe.set(keys.decision, call.record.to_bytes(), nx=True, ex=_ttl(call.expires_at, now), get=True)

        refs = [(call.origin, call.request_id) for call in calls]
        found: list[Record | Exception] = []
        for call, (stored,) in zip(calls, await self._pipelined(refs, queue), strict=True):
            try:
                found.append(call.record if stored is None else Record.from_bytes(stored))
            except ValueError as exc:
                found.append(exc)
        # A record just written has no signature of the node key yet (that is stored after it); one
        # that stood before ours may have, unless it carries its own: those are read, in one more trip.
        unsigned = [
            index
            for index, (call, record) in enumerate(zip(calls, found, strict=True))
            if isinstance(record, Record) and record is not call.record and record.signature is None
        ]
        signatures: dict[int, str | None] = {}
        if unsigned:

            def read(pipe: _Pipe, keys: ApproverKeys, _index: int) -> None:
                pipe.get(keys.signature)

            replies = await self._pipelined([refs[index] for index in unsigned], read)
            signatures = {
                index: _text(signature) for index, (signature,) in zip(unsigned, replies, strict=True)
            }
        return [
            record
            if isinstance(record, Exception)
            else Claim(record, record is call.record, record.signature or signatures.get(index))
            for index, (call, record) in enumerate(zip(calls, found, strict=True))
        ]

    async def _attach_many(self, calls: list[_AttachCall]) -> list[str | Exception]:
        now = time.time()

        def queue(pipe: _Pipe, keys: ApproverKeys, index: int) -> None:
            # One command: None when ours is stored, else the signature that stands.
            pipe.set(
                keys.signature,
                calls[index].signature,
                nx=True,
                ex=_ttl(calls[index].expires_at, now),
                get=True,
            )

        replies = await self._pipelined([(call.origin, call.request_id) for call in calls], queue)
        return [_text(stored) or call.signature for call, (stored,) in zip(calls, replies, strict=True)]

    async def read(self, refs: Sequence[tuple[str, str]]) -> list[tuple[Record | None, str | None]]:
        """Return the recorded decision and the standing signature of each ``(origin, request_id)``.

        Raises:
            StoreError: Redis failed.
            ValueError: A malformed origin or id, or a stored record that cannot be read.
        """
        if not refs:
            return []

        def queue(pipe: _Pipe, keys: ApproverKeys, _index: int) -> None:
            pipe.get(keys.decision)
            pipe.get(keys.signature)

        found: list[tuple[Record | None, str | None]] = []
        for stored, signature in await self._pipelined(refs, queue):
            record = None if stored is None else Record.from_bytes(stored)
            found.append((record, (record.signature if record else None) or _text(signature)))
        return found

    async def mark_notified(self, origin: str, request_id: str, expires_at: int) -> bool:
        """Note that the request was handed to the notifier; True only for the first call ever.

        Raises:
            StoreError: Redis failed.
            ValueError: A malformed origin or id.
        """
        keys = self._keys.approver_item(origin, request_id)
        try:
            written = await self._client.set(keys.notified, b"1", nx=True, ex=_ttl(expires_at, time.time()))
        except redis.exceptions.RedisError as exc:
            raise self._failed(exc) from exc
        return bool(written)
