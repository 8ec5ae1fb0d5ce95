"""Every failure leaves the approver as ``ErrorOut {error, message}`` with a stable code.

======================  ======  ===============================================================
code                    status  meaning
======================  ======  ===============================================================
``invalid``             400     the body is not JSON, cannot be read, or nests deeper than ``MAX_JSON_DEPTH``
``invalid``             422     malformed: a parameter, a body, a statement that does not match
                                its request, a request whose origin signature does not verify
``unauthorized``        401     no bearer token, or the wrong one
``forbidden``           403     a key that may not sign for this node, a statement signed as
                                another node
``not_found``           404     no such request in this node's inbox, or no such route
``method_not_allowed``  405     the path exists, the method does not
``expired``             409     the request expired: this node signs nothing for it any more
``withdrawn``           409     its origin withdrew the request: this node signs nothing for it
``ambiguous``           409     several origins sent a request of this id: name the origin
``conflict``            409     this node already decided otherwise
``changed``             409     the request under this id is not the one the operator confirmed
                                (another tool or payload digest): nothing is signed
``too_large``           413     the body is larger than ``MAX_BODY_BYTES`` (the sentence names it)
``reload_failed``       422     ``POST /v1/reload``: the files do not load; the old trust is kept
``unavailable``         503     the relay or Redis is down (or the service is starting)
``disconnected``        499     the client closed the connection before its body was read (answered
                                to nobody; counted in the metrics, not logged as a failure)
``internal``            500     a bug; the message says no more than that
======================  ======  ===============================================================
"""

from __future__ import annotations

import logging
from typing import Final

from teaagent.errors import StoreError
from teaagent.service import ApiError, ErrorOut, ErrorTable, error_response, sentence

__all__ = ["ERRORS", "ApiError", "ErrorOut", "error_response", "sentence"]

#: The approver's answers to the failures its routes do not raise as ``ApiError`` (the table above).
ERRORS: Final = ErrorTable(
    service="approver",
    exceptions={StoreError: (503, "unavailable")},
    logger=logging.getLogger("teaagent.approver"),
)
