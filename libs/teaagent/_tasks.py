"""Stopping asyncio tasks for certain, for the services' lifespans."""

from __future__ import annotations

import asyncio
from typing import Any, Final

__all__ = ["CANCEL_RETRY_SECONDS", "cancel_and_wait"]

CANCEL_RETRY_SECONDS: Final = 0.5  # how long a cancelled task may run on before it is cancelled again


async def cancel_and_wait(task: asyncio.Task[Any], *, retry_seconds: float = CANCEL_RETRY_SECONDS) -> None:
    """Cancel ``task`` and return once it has finished, cancelling it again while it runs on.

    One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for`` returns its inner
    result instead of raising when the cancellation arrives just as that result is ready (CPython
    gh-86296, fixed in 3.12), and redis-py writes every command through it. A worker loop that loses
    its one cancellation there runs on forever, and the service's shutdown waits for it forever.

    Args:
        task: The task to stop; it may be finished already.
        retry_seconds: How long to wait after each cancellation before the next.

    Raises:
        ValueError: ``retry_seconds`` is not positive.
        Exception: What the task raised, when it ended by an error of its own rather than the
            cancellation (as awaiting it would).
    """
    if retry_seconds <= 0:
        raise ValueError(f"retry_seconds must be positive, not {retry_seconds}")
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_seconds)
    if not task.cancelled():
        error = task.exception()
        if error is not None:
            raise error
