"""A stored request's reads that must see one instant, as scripts: they share their moment's round trip.

A MULTI of reads is one round trip of its own; the same reads as a script are atomic too, and go out
in the batch of their moment with every other script call (``CommandBatches``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from teaagent.store._keys import RequestKeys
from teaagent.store._scripts import AsyncScripts

__all__ = ["RequestRead", "WaitStart", "read_request", "read_wait_start", "request_read"]


@dataclass(frozen=True)
class RequestRead:
    """A request's keys as read at one instant: ``document`` None when it is not stored."""

    document: bytes | None
    outcome: dict[bytes, bytes]
    decisions: dict[bytes, bytes]
    deliveries: dict[bytes, bytes] | None  # None unless asked for


@dataclass(frozen=True)
class WaitStart:
    """Where a wait for a request's outcome starts: its state and counts, and its last event's id."""

    state: bytes | None  # None: no request is stored
    expires_at: bytes | None
    approvals: bytes | None
    denials: bytes | None
    last_id: bytes | None  # None: no event yet


def _mapping(pairs: list[Any]) -> dict[bytes, bytes]:
    """A hash read by HGETALL inside a script (its fields and values in turn) as a dict."""
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


async def read_request(scripts: AsyncScripts, keys: RequestKeys, *, deliveries: bool = False) -> RequestRead:
    """Read a request's document, counting state and decisions (and delivery report) at one instant.

    Raises:
        redis.exceptions.RedisError: the server failed (callers convert it).
    """
    names = [keys.doc, keys.outcome, keys.decisions] + ([keys.deliveries] if deliveries else [])
    return request_read(await scripts.run("read_request", names, []))


def request_read(reply: list[Any]) -> RequestRead:
    """The reply of one ``read_request`` call as a :class:`RequestRead`."""
    document, outcome, decisions, *delivered = reply
    return RequestRead(
        document=document,
        outcome=_mapping(outcome),
        decisions=_mapping(decisions),
        deliveries=_mapping(delivered[0]) if delivered else None,
    )


async def read_wait_start(scripts: AsyncScripts, keys: RequestKeys) -> WaitStart:
    """Read a request's state, expiry and counts with its last event's id, at one instant.

    Raises:
        redis.exceptions.RedisError: the server failed (callers convert it).
    """
    state, expires_at, approvals, denials, last_id = await scripts.run(
        "read_wait", [keys.outcome, keys.events], []
    )
    return WaitStart(state, expires_at, approvals, denials, last_id)
