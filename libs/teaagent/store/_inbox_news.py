"""What is new in a node's inbox for its approver: a cursor over the inbox queue's stream.

The relay appends one entry to the inbox queue (``Store.inbox_queue``) for each request it takes in
pending, and removes it once the request is decided or expired. An approver that reads the
stream from where it stopped, a page at a time, reads only what arrived since: one round costs the
same with ten pending requests as with ten thousand, where listing the pending set read up to a
thousand of them each time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from teaagent.store._queue import Delivery
from teaagent.store._results import StoredRequest

if TYPE_CHECKING:
    from teaagent.store._store import Store

__all__ = ["NEWS_PAGE", "InboxNews"]

NEWS_PAGE: Final = 100  # inbox queue entries read per call at most: a backlog is read a page at a time
WAKE_BLOCK_SECONDS: Final = 2.0  # one XREAD block, well under the store client's socket timeout


class InboxNews:
    """The pending requests queued for the approver since the last read, and those asked for again.

    ``cursor`` is the id of the last inbox queue entry read ("0-0" at first: the whole queue, a
    page per read, is news to a new approver).
    """

    def __init__(self, store: Store, *, page: int = NEWS_PAGE) -> None:
        if page < 1:
            raise ValueError(f"page must be at least 1, not {page}")
        self._store = store
        self._page = page
        self.cursor = "0-0"
        self.caught_up = False  # True once a read found less than a page: the cursor is at the end
        self._arrived: list[Delivery] = []  # what the last wait brought, read by the next read

    async def read(self, again: Sequence[tuple[str, str]] = ()) -> list[StoredRequest]:
        """The pending requests of the next page of the queue, then those of ``again`` (origin, id).

        Costs one XRANGE (none when the last :meth:`wait` brought the page) and one pipeline of
        one script call per request, whatever the inbox holds. An entry the relay did not write (no
        origin in its payload) is passed over.

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        entries = self._arrived or await self._store.inbox_queue.entries(
            self._page, after=None if self.cursor == "0-0" else self.cursor
        )
        refs: dict[tuple[str, str], None] = {}
        for entry in entries:
            origin = _origin(entry.payload)
            if origin is not None:
                refs[(origin, entry.request_id)] = None
        refs.update(dict.fromkeys(again))
        stored = await self._store.inbox.get_many(list(refs))
        # Past these entries only once they are read: a failed read leaves them news.
        if entries:
            self.cursor = entries[-1].entry_id
        self._arrived = []
        self.caught_up = len(entries) < self._page
        return [item for item in stored if item is not None and item.state == "pending"]

    async def wait(self, seconds: float) -> bool:
        """Block until the relay queues a request past the cursor, or ``seconds`` pass; True on news.

        The news itself (a page of entries past the cursor, read by the same XREAD) is kept for the
        next :meth:`read`, which then sends no XRANGE: an approver woken by one request makes one
        round trip to learn of it, not two.

        Raises:
            StoreError: Redis is unreachable or failed.
        """
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            block = max(1, int(min(remaining, WAKE_BLOCK_SECONDS) * 1000))
            arrived = await self._store.inbox_queue.wait_after(self.cursor, self._page, block)
            if arrived:  # entries past the cursor (a timeout answers none)
                self._arrived = arrived
                return True
        return False


def _origin(payload: bytes) -> str | None:
    try:
        origin: Any = json.loads(payload).get("origin")
    except (ValueError, AttributeError):
        return None
    return origin if isinstance(origin, str) else None
