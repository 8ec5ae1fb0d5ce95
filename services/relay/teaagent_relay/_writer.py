"""Counting verified decisions many per round trip: the store's ``record_decision`` script, pipelined.

One relay worker receives decisions concurrently; each needs one atomic script call. Sent one by
one, the Redis client's per-command overhead costs more than the signature verification on a small
host. Here the calls that arrive while a batch is in flight wait for it and go out together as the
next batch (one pipeline, no transaction: each script call is atomic on its own, and they touch
different requests' keys). Nothing waits for a timer: a lone decision goes out at once.

The script, its arguments and its answer are exactly those of
:meth:`teaagent.store.RequestBook.record_decision`, which stays the reference.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Final

import redis.exceptions

from teaagent.errors import RequestNotFoundError, StoreError
from teaagent.store import DecisionKind, DecisionResult, RequestState, Store
from teaagent.store._requests import MAX_EVENTS
from teaagent.store._scripts import script_source

__all__ = ["MAX_BATCH", "DecisionWriter"]

logger = logging.getLogger("teaagent.relay")

MAX_BATCH: Final = 256  # script calls per pipeline; bounds one reply's size and one batch's latency
_STATES: Final[dict[bytes, RequestState]] = {
    b"pending": "pending",
    b"approved": "approved",
    b"denied": "denied",
    b"expired": "expired",
}


@dataclass
class _Pending:
    request_id: str
    arguments: tuple[Any, ...]
    future: asyncio.Future[DecisionResult]


class DecisionWriter:
    """Counts verified decisions on this node's requests, batching concurrent calls."""

    def __init__(self, store: Store) -> None:
        self._client = store.client
        self._keys = store.keys
        self._url = store.url
        self._source = script_source("record_decision")
        self._sha = hashlib.sha1(self._source.encode(), usedforsecurity=False).hexdigest()
        self._queue: list[_Pending] = []
        self._flushing = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference

    async def record(
        self, request_id: str, *, kind: DecisionKind, signer: str, decision: bytes, now: int
    ) -> DecisionResult:
        """Count one decision whose signature was verified (see ``RequestBook.record_decision``).

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
        """
        keys = self._keys.request(request_id)
        arguments = (keys.outcome, keys.decisions, keys.events, kind, signer, decision, now, MAX_EVENTS)
        future: asyncio.Future[DecisionResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(request_id, arguments, future))
        if not self._flushing:
            self._flushing = True
            self._task = asyncio.get_running_loop().create_task(
                self._flush(), name="teaagent-relay-decisions"
            )
        return await future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                try:
                    await self._run(batch)
                except Exception as exc:  # every waiter must hear about it, whatever it was
                    error = (
                        exc
                        if isinstance(exc, StoreError)
                        else StoreError(f"Redis at {self._url} failed: {exc}")
                    )
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(error)
        finally:
            self._flushing = False

    async def _execute(self, batch: list[_Pending]) -> list[Any]:
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for pending in batch:
                    pipe.evalsha(self._sha, 3, *pending.arguments)
                return list(await pipe.execute(raise_on_error=False))
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis at {self._url} failed: {exc}") from exc

    async def _run(self, batch: list[_Pending]) -> None:
        replies = await self._execute(batch)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            # A restarted or flushed server lost the script: none of the calls ran; load, then run them.
            try:
                await self._client.script_load(self._source)
            except redis.exceptions.RedisError as exc:
                raise StoreError(f"Redis at {self._url} failed: {exc}") from exc
            again = [
                p
                for p, r in zip(batch, replies, strict=True)
                if isinstance(r, redis.exceptions.NoScriptError)
            ]
            for pending, reply in zip(again, await self._execute(again), strict=True):
                replies[batch.index(pending)] = reply
        for pending, reply in zip(batch, replies, strict=True):
            if pending.future.done():
                continue  # the caller went away (cancelled)
            if isinstance(reply, Exception):
                pending.future.set_exception(StoreError(f"Redis at {self._url} refused a command: {reply}"))
                continue
            state, approvals, denials, counted, decided = reply
            if state == b"unknown":
                pending.future.set_exception(
                    RequestNotFoundError(
                        f"request {pending.request_id} is not stored here (it never arrived, or it expired)"
                    )
                )
                continue
            pending.future.set_result(
                DecisionResult(
                    state=_STATES[state],
                    approvals=int(approvals),
                    denials=int(denials),
                    counted=bool(counted),
                    decided=bool(decided),
                )
            )
