"""Which request an operator's typed id names: its full id, or a prefix unique among all they have seen.

Every command that takes a request id (``teaagent approvals show|approve|deny|statement|submit``,
``approvals watch``'s keys, the TUI's ``/approve`` and ``/deny``) resolves it here, one way.

A prefix is resolved against every request the command has seen, never only those pending now:
an origin can withdraw the request an operator read and send another whose id starts the same,
and a prefix resolved against what is pending when it is typed would name the newcomer, which the
operator never saw (issue 25). So a prefix that fits two requests seen, settled or not, names
neither. What the operator confirmed then goes with the decision
(:class:`~teaagent.approver_client.Expected`), and the approver signs nothing for a request that
differs from it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from teaagent.approver_client._client import ApproverClient
from teaagent.approver_client._models import ApprovalItem

__all__ = ["LISTED_FOR_PREFIX", "MIN_PREFIX_CHARS", "REQUEST_ID_CHARS", "resolve_request"]

REQUEST_ID_CHARS: Final = 32  # 128 random bits, lowercase hex (PROTOCOL.md)
MIN_PREFIX_CHARS: Final = 4  # a shorter prefix of a request id is too easy to get wrong
LISTED_FOR_PREFIX: Final = 1000  # the approver's longest listing: every request it can name
_HEX: Final = re.compile(r"[0-9a-f]+")


def _names(items: Iterable[ApprovalItem]) -> str:
    return ", ".join(f"{item.request_id} of {item.origin}" for item in items)


def resolve_request(
    client: ApproverClient,
    typed: str,
    *,
    seen: Iterable[ApprovalItem] | None = None,
    origin: str | None = None,
    among: str = "listed by this node's approver",
) -> ApprovalItem:
    """The request ``typed`` names: a full id, or a prefix of exactly one request seen.

    Args:
        client: The node's approver.
        typed: What the operator typed: 32 hexadecimal characters, or at least
            :data:`MIN_PREFIX_CHARS` of them.
        seen: Every request the command has shown (``watch``, the TUI), settled ones included; None
            for a one-shot command, which has seen every request the approver lists, in any state.
        origin: Only this origin's requests (``--origin``).
        among: The requests ``seen`` holds, in the words of a refusal (``shown by this watch``).

    Returns:
        The request as the command saw it (what the operator was shown), or, for a full id it
        never saw, as the approver holds it now.

    Raises:
        ValueError: ``typed`` is not an id or a prefix of one, names no request seen, or names
            several (the sentence lists them).
        RelayError: The approver refused or failed (a full id it does not know: ``not_found``).
    """
    wanted = typed.strip().lower()
    if not (_HEX.fullmatch(wanted) and MIN_PREFIX_CHARS <= len(wanted) <= REQUEST_ID_CHARS):
        raise ValueError(
            f"{typed!r} is not a request id: type its {REQUEST_ID_CHARS} hexadecimal characters, or "
            f"at least its first {MIN_PREFIX_CHARS}."
        )
    full = len(wanted) == REQUEST_ID_CHARS
    if seen is None and not full:
        seen = client.list_requests("all", origin=origin, limit=LISTED_FOR_PREFIX)
    known: dict[tuple[str, str], ApprovalItem] = {}
    for item in seen or ():
        if origin is None or item.origin == origin:
            known.setdefault((item.origin, item.request_id), item)  # the first shown is what was read
    fitting = sorted(
        (item for item in known.values() if item.request_id.startswith(wanted)),
        key=lambda item: (item.request_id, item.origin),
    )
    if len(fitting) == 1:
        return fitting[0]
    if not fitting:
        if full:
            return client.get_request(wanted, origin=origin)  # the approver knows it, or says not
        raise ValueError(f"no request {among} has an id starting with {wanted}.")
    if len({item.request_id for item in fitting}) == 1:
        raise ValueError(
            f"{len(fitting)} origins sent a request {fitting[0].request_id} ({_names(fitting)}); "
            "name one with --origin."
        )
    raise ValueError(
        f"{wanted} starts the ids of {len(fitting)} requests {among} ({_names(fitting)}), so it names "
        "none of them; type more of the id."
    )
