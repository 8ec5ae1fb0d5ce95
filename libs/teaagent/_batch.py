"""Concurrent calls coalesced into batches: one round trip for the calls of one moment.

A service answering many requests at once makes the same kind of Redis or HTTP call for each;
sent one by one, the client's per-call overhead costs more than the work itself on a small host.
:class:`Coalescer` queues the calls that arrive while a batch is in flight and sends them together
as the next batch. Nothing waits for a timer: a lone call goes out on the next turn of the event
loop (so the calls made in one turn, such as a gathered batch's, share one send). With
``in_flight`` above 1, a full batch waiting goes out beside the ones in flight (up to that many),
for a receiver that does useful work while another batch of it waits on its own round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Generic, TypeVar

__all__ = ["DEFAULT_MAX_BATCH", "Coalescer"]

DEFAULT_MAX_BATCH: Final = 256  # calls per send: bounds one reply's size and one batch's latency

_In = TypeVar("_In")
_Out = TypeVar("_Out")


class Coalescer(Generic[_In, _Out]):
    """Sends the calls of one moment together through ``send``.

    ``send(items)`` returns one answer per item, in order; an answer that is an ``Exception`` is
    raised to that item's caller alone. An exception raised by ``send`` itself reaches every caller
    of the batch, wrapped by ``wrap`` when given (to turn a surprise into the caller's error type).
    """

    def __init__(
        self,
        send: Callable[[list[_In]], Awaitable[Sequence[_Out | Exception]]],
        name: str,
        *,
        max_batch: int = DEFAULT_MAX_BATCH,
        wrap: Callable[[Exception], Exception] | None = None,
        in_flight: int = 1,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self._in_flight = in_flight
        self._send = send
        self._name = name
        self._max_batch = max_batch
        self._wrap = wrap
        self._queue: list[tuple[_In, asyncio.Future[_Out]]] = []
        self._tasks: set[asyncio.Task[None]] = set()  # held: the loop keeps only a weak reference

    async def call(self, item: _In) -> _Out:
        """Queue ``item`` for the next batch and return its answer (or raise its error)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Out] = loop.create_future()
        self._queue.append((item, future))
        # A sender for the first call; while batches are out, one more (up to in_flight) for
        # each full batch waiting, so that a full batch does not wait for the last one's answer.
        live = sum(1 for task in self._tasks if not task.done())
        if live < self._in_flight and len(self._queue) >= self._max_batch * live:
            task = loop.create_task(self._flush(), name=self._name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the callers of this turn queue theirs
        while self._queue:
            batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            # A caller that went away (cancelled, timed out) before its call was sent: never send it.
            batch = [(item, future) for item, future in batch if not future.done()]
            if not batch:
                continue
            try:
                answers = await self._send([item for item, _future in batch])
            except Exception as exc:  # every waiter must hear about it, whatever it was
                error = self._wrap(exc) if self._wrap is not None else exc
                for _item, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_item, future), answer in zip(batch, answers, strict=True):
                if future.done():
                    continue  # the caller went away (cancelled)
                if isinstance(answer, Exception):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
