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

from typing import Final

from teaagent._batch import Coalescer
from teaagent.errors import StoreError
from teaagent.store import DecisionKind, DecisionResult, DecisionToCount, Store

__all__ = ["MAX_BATCH", "DecisionWriter"]

MAX_BATCH: Final = 256  # script calls per pipeline; bounds one reply's size and one batch's latency


def store_error(exc: Exception) -> StoreError:
    """A batch's failure as the store's error (what a caller of one call expects)."""
    return exc if isinstance(exc, StoreError) else StoreError(f"counting failed: {exc}")


class DecisionWriter:
    """Counts verified decisions on this node's requests, batching concurrent calls."""

    def __init__(self, store: Store) -> None:
        self._batches: Coalescer[DecisionToCount, DecisionResult] = Coalescer(
            store.requests.record_decisions,
            "teaagent-relay-decisions",
            max_batch=MAX_BATCH,
            wrap=store_error,
        )

    async def record(
        self, request_id: str, *, kind: DecisionKind, signer: str, decision: bytes, now: int, policy: str = ""
    ) -> DecisionResult:
        """Count one decision whose signature was verified (see ``RequestBook.record_decision``).

        Raises:
            RequestNotFoundError: no request is stored under ``request_id``.
            StoreError: Redis is unreachable or failed.
            ValueError: a malformed id, kind or signer, or a decision too large.
        """
        return await self._batches.call(DecisionToCount(request_id, kind, signer, decision, now, policy))
