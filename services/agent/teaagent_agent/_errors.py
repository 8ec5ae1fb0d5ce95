"""Every failure leaves the agent service as ``ErrorOut {error, message}`` with a stable code.

================  ======  ====================================================================
code              status  meaning
================  ======  ====================================================================
``invalid``       400     the body is not JSON, cannot be read, or nests deeper than ``MAX_JSON_DEPTH``
``invalid``       422     the JSON is not what the call takes, or breaks a rule of the call
``invalid``       409     the call contradicts the state (a model that exists, no model to run)
``invalid``       405     the path exists, the method does not
``invalid``       413     the body is larger than ``MAX_BODY_BYTES``
``unauthorized``  401     no bearer token, or the wrong one (every route but ``/health``)
``not_found``     404     no such route, session, model, run or pending answer
``busy``          409     the session already has a run going
``locked``        423     another process holds the workspace (``teaagent.mcp_server``)
``timeout``       504     a model did not answer within the time the call allowed
``run``           502     the model failed (its provider refused, or went away)
``disconnected``  499     the client closed the connection before its body was read (answered to
                          nobody; counted in the metrics, not logged as a failure)
``internal``      500     a bug; the message says no more than that
================  ======  ====================================================================

A run that has started streams its own ending instead (the ``result`` frame, and an ``error``
frame before it when the run timed out); these codes are for the calls that never started one.
"""

from __future__ import annotations

import logging
from typing import Final

from teaagent.service import ApiError, ErrorOut, ErrorTable, sentence

__all__ = ["ERRORS", "ApiError", "ErrorOut", "sentence"]

#: The agent service's answers to the failures its routes do not raise as ``ApiError`` (the table
#: above): a refusal of the framework is ``invalid`` unless named here.
ERRORS: Final = ErrorTable(
    service="agent service",
    codes_by_status={401: "unauthorized", 404: "not_found"},
    logger=logging.getLogger("teaagent.agent"),
)
