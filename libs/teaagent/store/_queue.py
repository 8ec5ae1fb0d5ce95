"""Work queues on Redis Streams: deliveries to peer relays and inbox items, with retries and dead letters."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.exceptions

from teaagent.errors import StoreError
from teaagent.store._connection import (
    AsyncClient,
    StoreOptions,
    converting,
    describe_redis_error,
    send_pipeline,
)
from teaagent.store._keys import MAX_DOCUMENT_BYTES, REQUEST_ID_PATTERN, REQUEST_RETENTION_SECONDS, QueueKeys
from teaagent.store._scripts import AsyncScripts

__all__ = [
    "CONSUMER_RETENTION_SECONDS",
    "DEFAULT_GROUP",
    "DeadLetter",
    "Delivery",
    "DeliveryQueue",
    "QueueStats",
    "RetryResult",
    "backoff_delay",
]

DEFAULT_GROUP = "workers"
MIN_IDLE_SECONDS = 60.0  # longer than a delivery's HTTP timeout, so a live worker never loses its entry
MAX_ATTEMPTS = 12  # the default bound; the relay's deliveries pass None: they retry until the request expires
RETRY_BASE_SECONDS = 0.5  # the first retry comes soon: most failures are a peer restarting
RETRY_CAP_SECONDS = 30.0  # never wait longer than this between two attempts
MAX_QUEUE_LENGTH = 100_000  # backpressure: a queue this long means its consumers are gone
MAX_DEAD_LETTERS = 10_000  # history kept for operators; older dead letters are trimmed
MAX_CLAIM = 100  # entries one claim may take; a worker handles them before its min-idle runs out
MAX_PAGE = MAX_CLAIM * 10  # entries one read may return without claiming them (entries, wait_after)
MAX_ERROR_CHARS = 500  # an error is one sentence, not a traceback
MAX_TARGET_CHARS = 256  # a peer's agent id or a URL, not a document
# A consumer silent this long is gone: a live one reads at least every few seconds (a blocking claim).
CONSUMER_RETENTION_SECONDS = 3600.0
# How often a claim also promotes due retries and takes over idle entries when nothing says it must
# sooner (at most a quarter of min_idle_seconds): the rest of the time it is one round trip.
HOUSEKEEPING_EVERY_SECONDS = 1.0


@dataclass(frozen=True)
class Delivery:
    """One queue entry handed to a consumer; ``attempts`` counts the failed attempts before this one."""

    entry_id: str
    target: str
    request_id: str
    payload: bytes
    expires_at: int
    attempts: int
    enqueued_at: int
    last_error: str | None


@dataclass(frozen=True)
class RetryResult:
    """What ``retry_later`` did: ``retry`` (scheduled at ``not_before``), ``dead``, or ``gone``.

    ``gone`` means another consumer had already finished the entry; nothing changed.
    """

    action: Literal["retry", "dead", "gone"]
    attempts: int
    not_before: float | None


@dataclass(frozen=True)
class DeadLetter:
    """A delivery that kept failing or whose request expired first, kept for operators."""

    entry_id: str
    delivery: Delivery  # as it last was; its entry_id is the id it had on the queue
    error: str
    dead_at: float


@dataclass(frozen=True)
class QueueStats:
    """Sizes of a queue, for metrics: waiting or in flight, in flight, scheduled, dead."""

    length: int
    pending: int
    scheduled: int
    dead: int


_JITTER = random.SystemRandom()  # jitter only spreads retries apart, but the OS source costs nothing here


def _check_count(count: int) -> None:
    """Refuse a listing of fewer than one entry (``dead_letters``, ``scheduled``).

    Raises:
        ValueError: ``count`` is below 1.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, not {count}")


def backoff_delay(
    failures: int,
    *,
    base: float = RETRY_BASE_SECONDS,
    cap: float = RETRY_CAP_SECONDS,
    rng: random.Random | None = None,
) -> float:
    """Return the wait in seconds before the attempt that follows ``failures`` failed ones.

    Exponential with equal jitter: the ceiling doubles per failure up to ``cap``; the delay lies in
    ``[ceiling / 2, ceiling]``, so delays grow while workers that failed together drift apart.

    Raises:
        ValueError: ``failures`` is below 1, or ``base``/``cap`` are not positive.
    """
    if failures < 1:
        raise ValueError(f"failures must be >= 1, not {failures}")
    if base <= 0 or cap <= 0:
        raise ValueError("base and cap must be positive")
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 62))
    return ceiling / 2 + (rng or _JITTER).uniform(0, ceiling / 2)


def _text(value: bytes | None) -> str:
    return value.decode() if value is not None else ""


def _delivery(entry_id: bytes | str, fields: dict[bytes, bytes]) -> Delivery:
    last_error = fields.get(b"last_error")
    return Delivery(
        entry_id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        target=_text(fields.get(b"target")),
        request_id=_text(fields.get(b"request_id")),
        payload=fields.get(b"payload", b""),
        expires_at=int(fields.get(b"expires_at", b"0")),
        attempts=int(fields.get(b"attempts", b"0")),
        enqueued_at=int(fields.get(b"enqueued_at", b"0")),
        last_error=last_error.decode() if last_error is not None else None,
    )


def _entries(reply: Any) -> list[tuple[Any, dict[bytes, bytes]]]:
    """Flatten an XREAD or XREADGROUP reply (RESP2 list or RESP3 mapping) into ``[(id, fields)]``."""
    if not reply:
        return []
    streams = reply.items() if isinstance(reply, dict) else reply
    out: list[tuple[Any, dict[bytes, bytes]]] = []
    for _stream, entries in streams:
        out.extend((entry_id, fields) for entry_id, fields in entries if fields is not None)
    return out


def _check_page(count: int) -> None:
    """A page of entries read without claiming them is 1 to ``MAX_PAGE`` long (ValueError if not)."""
    if not 1 <= count <= MAX_PAGE:
        raise ValueError(f"count must be between 1 and {MAX_PAGE}, not {count}")


class DeliveryQueue:
    """A work queue: a stream with one consumer group, a schedule of retries and a dead-letter stream.

    Consumers ``claim`` entries, then ``ack`` them when done or ``retry_later`` when an attempt
    failed. An entry claimed by a consumer that dies (never acks) is reclaimed by the next ``claim``
    of any consumer once it has been idle ``min_idle_seconds``. Failed entries come back after an
    exponential backoff with jitter until their request expires or ``max_attempts`` is reached, and
    then go to the dead-letter stream. Delivery is at least once: receivers must be idempotent
    (a request id stored twice is one request).
    """

    def __init__(
        self,
        client: AsyncClient,
        scripts: AsyncScripts,
        *,
        keys: QueueKeys,
        url: str,
        options: StoreOptions,
        group: str = DEFAULT_GROUP,
        min_idle_seconds: float = MIN_IDLE_SECONDS,
        max_attempts: int | None = MAX_ATTEMPTS,
        retry_base_seconds: float = RETRY_BASE_SECONDS,
        retry_cap_seconds: float = RETRY_CAP_SECONDS,
        max_length: int = MAX_QUEUE_LENGTH,
        rng: random.Random | None = None,
        blocking: AsyncClient | None = None,
        housekeeping_seconds: float = HOUSEKEEPING_EVERY_SECONDS,
    ) -> None:
        if min_idle_seconds <= 0 or (max_attempts is not None and max_attempts < 1) or max_length < 1:
            raise ValueError("min_idle_seconds must be positive, max_attempts and max_length at least 1")
        if housekeeping_seconds <= 0:
            raise ValueError(f"housekeeping_seconds must be positive, not {housekeeping_seconds}")
        self._client = client
        self._blocking = blocking or client  # the claim's XREADGROUP BLOCK waits on its own pool
        self._scripts = scripts
        self._keys = keys
        self._url = url
        self._options = options
        self._group = group
        self._min_idle_ms = int(min_idle_seconds * 1000)
        self._max_attempts = max_attempts
        self._retry_base = retry_base_seconds
        self._retry_cap = retry_cap_seconds
        self._max_length = max_length
        self._rng = rng
        self._housekeeping_every = min(housekeeping_seconds, min_idle_seconds / 4)
        self._housekeeping_at = 0.0  # time.monotonic() of the next claim's housekeeping; 0: the next
        self._next_due_ms = -1  # the earliest retry known to be scheduled, ms; -1: none known

    @property
    def name(self) -> str:
        """The queue's name (``deliveries``, ``inbox``)."""
        return self._keys.name

    @property
    def stream(self) -> str:
        """The key of the queue's stream, for a composite script that appends to it."""
        return self._keys.stream

    async def enqueue(
        self, target: str, request_id: str, payload: bytes, expires_at: int, *, now: float | None = None
    ) -> str:
        """Append one entry for ``target`` and return its entry id.

        Args:
            target: where the entry goes (a peer's agent id, ``approver``...).
            request_id: the request the entry belongs to.
            payload: UTF-8 bytes (a JSON document) carried verbatim.
            expires_at: Unix seconds; the entry is dead-lettered instead of delivered after it.
            now: Unix seconds, the caller's clock (default: the system clock).

        Raises:
            StoreError: Redis is unreachable or failed, or the queue is full.
            ValueError: an empty or long target, a malformed request id, or a payload that is not
                UTF-8 or is too large.
            TypeError: ``payload`` is not bytes.
        """
        command = self._enqueue_command(target, request_id, payload, expires_at, now)
        with converting(self._url):
            entry_id = await self._scripts.run("enqueue", [self._keys.stream], command)
        return self._entry_id(entry_id)

    async def enqueue_many(
        self, entries: Sequence[tuple[str, str, bytes, int]], *, now: float | None = None
    ) -> list[str | StoreError]:
        """:meth:`enqueue` for many ``(target, request_id, payload, expires_at)``, in one round trip.

        The entries are appended in the order given (one pipeline of the ``enqueue`` script). The
        answer for each is its entry id, or the ``StoreError`` of a full queue.

        Raises:
            StoreError: Redis is unreachable or failed (the whole pipeline; some entries may be in).
            ValueError: an entry :meth:`enqueue` would refuse (nothing is sent then).
            TypeError: a payload that is not bytes.
        """
        if not entries:
            return []
        commands = [self._enqueue_command(*entry, now) for entry in entries]
        with converting(self._url):
            replies = await self._scripts.run_many(
                "enqueue", [([self._keys.stream], args) for args in commands]
            )
        answers: list[str | StoreError] = []
        for reply in replies:
            if isinstance(reply, redis.exceptions.RedisError):
                raise StoreError(describe_redis_error(self._url, reply))
            try:
                answers.append(self._entry_id(reply))
            except StoreError as exc:
                answers.append(exc)
        return answers

    def _enqueue_command(
        self, target: str, request_id: str, payload: bytes, expires_at: int, now: float | None
    ) -> list[Any]:
        """The ``enqueue`` script's arguments for one entry, checked.

        Raises:
            ValueError: an empty or long target, a malformed request id, or a payload that is not
                UTF-8 or is too large.
            TypeError: ``payload`` is not bytes.
        """
        if not target or len(target) > MAX_TARGET_CHARS or not target.isprintable():
            raise ValueError(f"target must be 1 to {MAX_TARGET_CHARS} printable characters")
        if not REQUEST_ID_PATTERN.fullmatch(request_id):
            raise ValueError(f"request id {request_id!r} is not 32 lowercase hex characters")
        if not isinstance(payload, bytes):
            raise TypeError("payload must be bytes")
        if len(payload) > MAX_DOCUMENT_BYTES:
            raise ValueError(f"payload is {len(payload)} bytes, above the limit of {MAX_DOCUMENT_BYTES}")
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError("payload must be UTF-8 text (a JSON document)") from exc
        at = time.time() if now is None else now
        ttl_ms = int((max(expires_at - at, 0) + REQUEST_RETENTION_SECONDS) * 1000)
        fields: list[Any] = [
            "target", target, "request_id", request_id, "payload", payload,
            "expires_at", expires_at, "attempts", 0, "enqueued_at", int(at),
        ]  # fmt: skip
        return [self._group, ttl_ms, self._max_length, *fields]

    def entry(
        self, target: str, request_id: str, payload: bytes, expires_at: int, *, now: float | None = None
    ) -> list[Any]:
        """The ``enqueue`` script's arguments for one :meth:`enqueue` (its key is :attr:`stream`),
        for a composite script.

        Raises:
            ValueError: as :meth:`enqueue`.
            TypeError: as :meth:`enqueue`.
        """
        return self._enqueue_command(target, request_id, payload, expires_at, now)

    def entry_id(self, reply: Any) -> str:
        """Read the ``enqueue`` script's reply, as :meth:`enqueue` returns it.

        Raises:
            StoreError: the queue was full (the script answered "").
        """
        return self._entry_id(reply)

    def _entry_id(self, entry_id: Any) -> str:
        if not entry_id:
            raise StoreError(
                f"queue {self.name} already holds {self._max_length} entries; its consumers do not keep up"
            )
        return str(entry_id.decode() if isinstance(entry_id, bytes) else entry_id)

    async def claim(
        self, consumer: str, count: int = 10, block_ms: int = 1000, *, now: float | None = None
    ) -> list[Delivery]:
        """Take up to ``count`` entries for ``consumer``, waiting up to ``block_ms`` when none is ready.

        In order: scheduled retries that are due go back on the queue; entries idle longer than
        ``min_idle_seconds`` in a dead consumer's hands are reclaimed; then new entries are read,
        blocking (XREADGROUP BLOCK, never past the next scheduled retry). Entries whose request
        has expired are dead-lettered instead of returned.

        The first two steps (the housekeeping) are not repeated on every claim: a claim runs them
        when a retry this queue scheduled, or the earliest the last housekeeping found, is due, when
        the stream's group must be made again, and otherwise every ``housekeeping_seconds``
        (``HOUSEKEEPING_EVERY_SECONDS`` unless given; at most a quarter of ``min_idle_seconds``).
        So a worker that claims one delivery at a time makes one round trip a claim, not three,
        and a retry another process scheduled or an entry a dead consumer left is taken at most
        that much later.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: an empty consumer name, ``count`` out of range, or a negative ``block_ms``.
        """
        if not consumer or not consumer.isprintable():
            raise ValueError("consumer must be a non-empty printable name")
        if not 1 <= count <= MAX_CLAIM:
            raise ValueError(f"count must be between 1 and {MAX_CLAIM}, not {count}")
        if block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, not {block_ms}")
        at = time.time() if now is None else now
        now_ms = int(at * 1000)
        stream = self._keys.stream
        entries: list[tuple[Any, dict[bytes, bytes]]] = []
        with converting(self._url):
            if self._housekeeping_due(now_ms):
                entries = await self._housekeep(consumer, count, now_ms)
            if len(entries) < count:
                block: int | None = None
                if not entries:
                    wait_ms = min(block_ms, int(self._options.max_block_seconds * 1000))
                    if self._next_due_ms >= 0:
                        wait_ms = min(wait_ms, max(0, self._next_due_ms - now_ms))
                    block = wait_ms if wait_ms >= 1 else None  # BLOCK 0 would wait forever
                try:
                    reply = await (self._blocking if block else self._client).xreadgroup(
                        self._group, consumer, {stream: ">"}, count=count - len(entries), block=block
                    )
                except redis.exceptions.ResponseError as exc:
                    if "NOGROUP" not in str(exc):
                        raise
                    reply = None  # the stream expired under us; the next claim makes it again
                    self._housekeeping_at = 0.0
                entries.extend(_entries(reply))
        deliveries: list[Delivery] = []
        for entry_id, fields in entries:
            delivery = _delivery(entry_id, fields)
            if delivery.expires_at < at:
                await self._finish(delivery, "dead", "the request expired before it was delivered", None, at)
            else:
                deliveries.append(delivery)
        return deliveries

    async def entries(self, count: int = 100, *, after: str | None = None) -> list[Delivery]:
        """Return the queue's oldest ``count`` entries, claimed or not, without claiming them.

        ``after`` pages on: only entries after that entry id.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``count`` is out of range.
        """
        _check_page(count)
        with converting(self._url):
            reply: Any = await self._client.xrange(
                self._keys.stream, min="-" if after is None else f"({after}", count=count
            )
        return [_delivery(entry_id, fields) for entry_id, fields in reply]

    async def wait_after(self, after: str, count: int, block_ms: int) -> list[Delivery]:
        """Wait up to ``block_ms`` for entries after entry ``after`` ("0-0": any); up to ``count`` of them.

        A plain XREAD (BLOCK, on the store's blocking pool): nothing is claimed, and entries
        already there are returned at once.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``count`` or ``block_ms`` is out of range.
        """
        _check_page(count)
        if block_ms < 1:
            raise ValueError(f"block_ms must be >= 1, not {block_ms}")  # BLOCK 0 would wait forever
        with converting(self._url):
            reply = await self._blocking.xread({self._keys.stream: after}, count=count, block=block_ms)
        return [_delivery(entry_id, fields) for entry_id, fields in _entries(reply)]

    async def remove(self, entry_ids: list[str]) -> int:
        """Delete entries whose work was done elsewhere (acknowledged too, if a consumer held them).

        Returns:
            How many entries were deleted (ids already gone count for nothing).

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        if not entry_ids:
            return 0
        with converting(self._url):
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.xack(self._keys.stream, self._group, *entry_ids)
                pipe.xdel(self._keys.stream, *entry_ids)
                _acked, deleted = await pipe.execute(raise_on_error=False)
        if isinstance(deleted, Exception):
            raise StoreError(f"queue {self.name}: {deleted}")
        return int(deleted)

    async def ack(self, delivery: Delivery) -> bool:
        """Mark ``delivery`` done and remove it; False when it was no longer pending.

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        with converting(self._url):
            acked = await self._scripts.run("ack", [self._keys.stream], [self._group, delivery.entry_id])
        return bool(acked)

    def _housekeeping_due(self, now_ms: int) -> bool:
        return time.monotonic() >= self._housekeeping_at or 0 <= self._next_due_ms <= now_ms

    async def _housekeep(
        self, consumer: str, count: int, now_ms: int
    ) -> list[tuple[Any, dict[bytes, bytes]]]:
        """Promote the due retries (making the stream's group if need be) and take over idle entries.

        Returns the entries taken over for ``consumer``; notes when the next retry is due.
        """
        self._housekeeping_at = time.monotonic() + self._housekeeping_every
        stream = self._keys.stream
        _promoted, next_due = await self._scripts.run(
            "promote_due",
            [stream, self._keys.schedule],
            [self._group, now_ms, count, REQUEST_RETENTION_SECONDS * 1000],
        )
        self._next_due_ms = int(next_due)
        reclaimed = await self._client.xautoclaim(
            stream, self._group, consumer, self._min_idle_ms, start_id="0-0", count=count
        )
        deleted = reclaimed[2] if len(reclaimed) > 2 else []
        if deleted:
            # Pending ids whose entries are gone (acked elsewhere and deleted): clear them.
            await self._client.xack(stream, self._group, *deleted)
        return list(reclaimed[1]) if len(reclaimed) > 1 else []

    async def retry_later(self, delivery: Delivery, error: str, *, now: float | None = None) -> RetryResult:
        """Record a failed attempt: schedule the next one after a backoff, or dead-letter the entry.

        The entry is dead-lettered when this was attempt ``max_attempts`` (None: no such bound), or
        when the next attempt would come after the request expires. One script moves it, so a crash
        loses nothing.

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        at = time.time() if now is None else now
        failures = delivery.attempts + 1
        error = " ".join(error.split())[:MAX_ERROR_CHARS] or "unknown error"
        if self._max_attempts is not None and failures >= self._max_attempts:
            return await self._finish(
                delivery, "dead", f"{error}; gave up after {failures} attempts", None, at
            )
        not_before = at + backoff_delay(failures, base=self._retry_base, cap=self._retry_cap, rng=self._rng)
        if not_before > delivery.expires_at:
            return await self._finish(
                delivery, "dead", f"{error}; the request expires before another attempt", None, at
            )
        return await self._finish(delivery, "retry", error, not_before, at)

    async def _finish(
        self,
        delivery: Delivery,
        action: Literal["retry", "dead"],
        error: str,
        not_before: float | None,
        at: float,
    ) -> RetryResult:
        ttl_ms = int((max(delivery.expires_at - at, 0) + REQUEST_RETENTION_SECONDS) * 1000)
        with converting(self._url):
            done = await self._scripts.run(
                "retry_later",
                [self._keys.stream, self._keys.schedule, self._keys.dead],
                [
                    self._group, delivery.entry_id, action, int((not_before or 0) * 1000), error,
                    ttl_ms, MAX_DEAD_LETTERS, int(at * 1000),
                ],
            )  # fmt: skip
        taken = done.decode() if isinstance(done, bytes) else str(done)
        if taken == "retry" and not_before is not None:  # this queue's next claim promotes it when due
            due_ms = int(not_before * 1000)
            self._next_due_ms = due_ms if self._next_due_ms < 0 else min(self._next_due_ms, due_ms)
        if taken == "gone":
            return RetryResult(action="gone", attempts=delivery.attempts, not_before=None)
        return RetryResult(
            action="retry" if taken == "retry" else "dead",
            attempts=delivery.attempts + 1,
            not_before=not_before if taken == "retry" else None,
        )

    async def prune_consumers(
        self, keep: str, *, min_idle_seconds: float = CONSUMER_RETENTION_SECONDS
    ) -> list[str]:
        """Remove the group's consumers that hold no entry and have not read for ``min_idle_seconds``.

        Each worker process reads under a name of its own, so every restart leaves one behind; its
        entries are reclaimed by ``claim``, and this removes the name. A consumer still holding an
        entry is kept (its entries would become unclaimable), and so is ``keep``, the caller's own.
        Checked and removed in one script, so no entry reaches a consumer between the two.

        Returns:
            The names removed.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``min_idle_seconds`` is not positive.
        """
        if not min_idle_seconds > 0:
            raise ValueError(f"min_idle_seconds must be positive, not {min_idle_seconds}")
        with converting(self._url):
            removed: Any = await self._scripts.run(
                "prune_consumers", [self._keys.stream], [self._group, int(min_idle_seconds * 1000), keep]
            )
        return [name.decode() if isinstance(name, bytes) else str(name) for name in removed]

    async def dead_letters(self, count: int = 100, *, after: str | None = None) -> list[DeadLetter]:
        """Return up to ``count`` dead letters, oldest first; ``after`` a dead letter's id, the ones after it.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``count`` is below 1.
        """
        _check_count(count)
        with converting(self._url):
            entries: Any = await self._client.xrange(
                self._keys.dead, min="-" if after is None else f"({after}", count=count
            )
        letters = []
        for entry_id, fields in entries:
            original = fields.get(b"entry_id")
            delivery = _delivery(original if original is not None else entry_id, fields)
            letters.append(
                DeadLetter(
                    entry_id=entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id),
                    delivery=delivery,
                    error=delivery.last_error or "",
                    dead_at=int(fields.get(b"dead_at", b"0")) / 1000,
                )
            )
        return letters

    async def scheduled(self, count: int = 100) -> list[tuple[float, Delivery]]:
        """Return up to ``count`` scheduled retries as ``(not_before, delivery)``, soonest first.

        Raises:
            StoreError: Redis is unreachable or failed.
            ValueError: ``count`` is below 1.
        """
        _check_count(count)
        with converting(self._url):
            members: Any = await self._client.zrange(self._keys.schedule, 0, count - 1, withscores=True)
        out = []
        for member, score in members:
            original_id, *flat = json.loads(member)
            fields = {flat[i].encode(): flat[i + 1].encode() for i in range(0, len(flat), 2)}
            out.append((float(score) / 1000, _delivery(original_id, fields)))
        return out

    async def stats(self) -> QueueStats:
        """Return the queue's sizes (for metrics).

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        with converting(self._url):
            length, pending, scheduled, dead = await send_pipeline(
                self._client,
                [
                    ("XLEN", self._keys.stream),
                    ("XPENDING", self._keys.stream, self._group),
                    ("ZCARD", self._keys.schedule),
                    ("XLEN", self._keys.dead),
                ],
            )
            if isinstance(pending, redis.exceptions.ResponseError) and "NOGROUP" in str(pending):
                pending = {}  # no group yet: nothing claimed
            for reply in (length, pending, scheduled, dead):
                if isinstance(reply, Exception):
                    raise reply
        in_flight = pending.get("pending", 0)
        return QueueStats(
            length=int(length), pending=int(in_flight), scheduled=int(scheduled), dead=int(dead)
        )
