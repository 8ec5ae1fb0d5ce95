"""Counting verified decisions many per round trip: concurrent calls share one pipeline.

One relay worker receives decisions concurrently; each needs one atomic script call. Sent one by
one, the Redis client's per-command overhead costs more than the signature verification on a small
host. Here the calls that arrive while a batch is in flight wait for it and go out together as the
next batch, through :meth:`teaagent.store.RequestBook.record_decisions` (one pipeline of the
``record_decision`` script, each call counted exactly as ``record_decision`` counts it alone, in
the order the calls came: the script alone decides what counts, rules 5 and 6 included, so a
signer's approval and its denial in one batch count as its denial, as they would one by one).
Nothing waits for a timer: a lone decision goes out at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

from teaagent.errors import StoreError
from teaagent.store import DecisionKind, DecisionResult, DecisionToCount, Store

__all__ = ["MAX_BATCH", "DecisionWriter"]

MAX_BATCH: Final = 256  # script calls per pipeline; bounds one reply's size and one batch's latency


@dataclass
class _Pending:
    decision: DecisionToCount
    future: asyncio.Future[DecisionResult]


class DecisionWriter:
    """Counts verified decisions on this node's requests, batching concurrent calls."""

    def __init__(self, store: Store) -> None:
        self._requests = store.requests
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
            ValueError: a malformed id, kind or signer, or a decision too large.
        """
        future: asyncio.Future[DecisionResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(DecisionToCount(request_id, kind, signer, decision, now), future))
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
                    answers = await self._requests.record_decisions([pending.decision for pending in batch])
                except Exception as exc:  # every waiter must hear about it, whatever it was
                    error = exc if isinstance(exc, StoreError) else StoreError(f"counting failed: {exc}")
                    for pending in batch:
                        if not pending.future.done():
                            pending.future.set_exception(error)
                    continue
                for pending, answer in zip(batch, answers, strict=True):
                    if pending.future.done():
                        continue  # the caller went away (cancelled)
                    if isinstance(answer, DecisionResult):
                        pending.future.set_result(answer)
                    else:
                        pending.future.set_exception(answer)
        finally:
            self._flushing = False
