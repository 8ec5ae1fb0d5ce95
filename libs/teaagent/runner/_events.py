"""What a run tells its watchers as it goes: typed events, delivered to callbacks and async iterators.

Every event is a frozen :class:`RunEvent` ``(kind, data, at)`` with a sequence number. A run emits,
in this order for each model turn::

    run_started
      (steered)*                       user messages added before the model call
      model_request
      (model_delta)*                   the reply's text as it arrives (streaming runs)
      model_response
      cost                             what the call cost, and the run's total so far
      per tool call:
        question, answer               for ask_user
        tool_call
          (approval_waiting, approval_granted | approval_denied)
        tool_result                    ok, result or error
    run_finished                       always last, whatever happened

``approval_denied`` is also emitted, without ``approval_waiting`` before it, when the policy refuses
a call outright (permission mode, path outside the workspace, no quorum gate).

Sinks are called one event at a time, in order, from whichever thread emits (the run's thread, or
a worker thread that waits on an approval); a sink that raises is logged and skipped, since a broken
display must not break the run it displays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["EVENT_KINDS", "MAX_EVENT_HISTORY", "EventHub", "EventSink", "RunEvent"]

_log = logging.getLogger("teaagent.runner")

#: Every kind of event a run emits.
EVENT_KINDS: Final = (
    "run_started",
    "steered",
    "model_request",
    "model_delta",
    "model_response",
    "cost",
    "question",
    "answer",
    "tool_call",
    "approval_waiting",
    "approval_granted",
    "approval_denied",
    "tool_result",
    "validation",
    "run_finished",
)
# Enough for a long streamed run; an iterator that starts later than that misses the oldest events.
MAX_EVENT_HISTORY: Final = 20_000


@dataclass(frozen=True)
class RunEvent:
    """One thing that happened in a run.

    Attributes:
        kind: One of :data:`EVENT_KINDS`.
        data: The event's details (plain JSON values).
        at: When it happened, in seconds since the epoch.
        seq: Its place in the run's stream, from 1.
    """

    kind: str
    data: dict[str, Any]
    at: float
    seq: int = field(default=0, kw_only=True)


EventSink = Callable[[RunEvent], object]
"""A callback that receives every event of a run."""


class EventHub:
    """Hands a run's events to its sinks and to async iterators, keeping a history for late readers.

    Args:
        sinks: Callbacks called with each event, in order.
    """

    def __init__(self, sinks: Iterable[EventSink] = ()) -> None:
        self._sinks = list(sinks)
        self._lock = threading.RLock()
        self._history: list[RunEvent] = []
        self._seq = 0
        self._finished = False
        self._queues: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue[RunEvent]]] = []

    def add_sink(self, sink: EventSink) -> None:
        """Add a callback; it receives the events emitted from now on."""
        with self._lock:
            self._sinks.append(sink)

    @property
    def history(self) -> list[RunEvent]:
        """The events so far (the latest :data:`MAX_EVENT_HISTORY` of them)."""
        with self._lock:
            return list(self._history)

    @property
    def finished(self) -> bool:
        """Whether ``run_finished`` was emitted."""
        return self._finished

    def emit(self, kind: str, data: dict[str, Any]) -> RunEvent:
        """Record an event and deliver it to every sink and iterator.

        Args:
            kind: One of :data:`EVENT_KINDS`.
            data: The event's details.

        Returns:
            The event.
        """
        # One lock around numbering and delivery, so that every sink sees the events in seq order
        # even when a worker thread (waiting on an approval) emits beside the run's thread.
        with self._lock:
            self._seq += 1
            event = RunEvent(kind, data, time.time(), seq=self._seq)
            self._history.append(event)
            if len(self._history) > MAX_EVENT_HISTORY:
                del self._history[: len(self._history) - MAX_EVENT_HISTORY]
            if kind == "run_finished":
                self._finished = True
            for sink in self._sinks:
                try:
                    sink(event)
                except Exception:
                    _log.exception("a run event sink failed on %s", kind)
            for loop, queue in self._queues:
                # The loop may have ended since the iterator started; its reader is gone then.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, event)
        return event

    async def stream(self) -> AsyncIterator[RunEvent]:
        """Yield the run's events, from its first (as far as the history reaches) to ``run_finished``.

        Yields:
            Each event, in order, once.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RunEvent] = asyncio.Queue()
        entry = (loop, queue)
        with self._lock:
            backlog = list(self._history)
            finished = self._finished
            if not finished:
                self._queues.append(entry)
        try:
            for event in backlog:
                yield event
            if finished:
                return
            while True:
                event = await queue.get()
                yield event
                if event.kind == "run_finished":
                    return
        finally:
            with self._lock:
                if entry in self._queues:
                    self._queues.remove(entry)
