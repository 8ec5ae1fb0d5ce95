"""Every failure leaves the relay as ``ErrorOut {error, message}`` with a stable code.

======================  ======  ===============================================================
code                    status  meaning
======================  ======  ===============================================================
``invalid``             400     the body is not JSON, cannot be read, or nests deeper than ``MAX_JSON_DEPTH``
``invalid``             422     the JSON is not the document the call takes, or breaks a rule
``expired``             422     a peer's request that expired before it arrived (never stored)
``unauthorized``        401     no bearer token, or the wrong one (calls of the node itself)
``forbidden``           403     unknown origin, not our request, a signer that may not sign it
``bad_signature``       403     a document's signature does not verify with the configured key
``not_found``           404     no such request (never arrived, or expired and removed)
``method_not_allowed``  405     the path exists, the method does not
``conflict``            409     another document holds that id, or the signer decided otherwise
``already_decided``     409     a withdrawal of a request approved, denied or expired first
``withdrawn``           409     a decision on a request its origin withdrew
``reload_failed``       422     ``POST /v1/reload``: the files do not load; the old trust is kept
``too_large``           413     the body is larger than ``MAX_BODY_BYTES`` (the sentence names it)
``rate_limited``        429     the origin's window is full; ``Retry-After`` says when to retry
``origin_full``         429     the origin already holds its cap of pending requests in this inbox
``unavailable``         503     Redis is unreachable
``disconnected``        499     the client closed the connection before its body was read (answered
                                to nobody; counted in the metrics, not logged as a failure)
``internal``            500     a bug; the message says no more than that
======================  ======  ===============================================================

``bad_signature`` is 403, not 422: the document is well formed, its sender is not who it claims to
be. A delivering relay treats every 4xx but 408, 425 and 429 as permanent (dead letter), and 5xx
as temporary (retry); an answer nested deeper than ``MAX_JSON_DEPTH`` is permanent whatever its
status (no relay sends one).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.service import (
    CODES_BY_STATUS,
    ApiError,
    ErrorOut,
    ErrorTable,
    error_response,
    validation_message,
)

__all__ = ["ERRORS", "ApiError", "ErrorOut", "error_response", "invalid_body", "validation_message"]


def invalid_body(errors: Sequence[Any]) -> ApiError:
    """The refusal of a body that is not the document its call takes, from pydantic's ``errors``:
    ``invalid``, 400 or 422 with the sentence FastAPI's own validation gives (``validation_message``)."""
    status, message = validation_message(errors)
    return ApiError(status, "invalid", message)


#: The relay's answers to the failures its routes do not raise as ``ApiError`` (the table above).
ERRORS: Final = ErrorTable(
    service="relay",
    codes_by_status={**CODES_BY_STATUS, 429: "rate_limited"},
    exceptions={
        RequestNotFoundError: (404, "not_found"),
        RequestConflictError: (409, "conflict"),
        StoreError: (503, "unavailable"),
    },
    logger=logging.getLogger("teaagent.relay"),
)
