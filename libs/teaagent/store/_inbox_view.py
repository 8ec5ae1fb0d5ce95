"""A received request as the relay hands it to its node's approver (``InboxItemOut``), from the store.

One function builds the item both where the relay answers ``GET /v1/inbox`` and where the approver
reads its inbox's news from the node's store itself (``teaagent.store._inbox_news``): the two read
the same stored request, and hand over the same item.
"""

from __future__ import annotations

import json
from typing import Any

from teaagent.store._results import RequestState, StoredRequest

__all__ = ["inbox_item_view"]


def inbox_item_view(stored: StoredRequest, now: float) -> dict[str, Any]:
    """The JSON of the inbox item ``stored`` is at ``now``: pending past its expiry reads ``expired``.

    ``decision`` is this node's recorded decision (only this node decides its inbox), ``settlement``
    the origin's evidence of its outcome, each as stored; neither is verified here.

    Raises:
        ValueError: the stored document is not a signed request envelope.
    """
    parsed = json.loads(stored.document)
    request, signature = parsed["request"], parsed["signature"]
    raw = next(iter(stored.approvals.values()), None) or next(iter(stored.denials.values()), None)
    state: RequestState = stored.state
    if state == "pending" and now > stored.expires_at:
        state = "expired"
    return {
        "request_id": stored.request_id,
        "origin": request["origin"],
        "tool_name": request["tool_name"],
        "arguments": request["arguments"],
        "reason": request["reason"],
        "run_id": request["run_id"],
        "call_id": request["call_id"],
        "payload_digest": request["payload_digest"],
        "required_approvals": request["required_approvals"],
        "peers": request["peers"],
        "created_at": request["created_at"],
        "expires_at": request["expires_at"],
        "state": state,
        "request": request,
        "signature": signature,
        "decision": json.loads(raw) if raw is not None else None,
        "settlement": json.loads(stored.settlement) if stored.settlement is not None else None,
    }
