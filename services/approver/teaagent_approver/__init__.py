"""The approver service of a teaagent node: ``create_app(settings)`` builds its FastAPI application.

The approver is the node's signing authority: it applies the node's ``[[approver.rules]]`` to the
requests that reach its relay's inbox, signs approvals and denials with the node key (or accepts
ones an operator signed with a key of their own), records each decision atomically in the node's
Redis before anything is signed, audits it in its own hash-chained log, and hands it to the relay.
Operators decide the rest through its HTTP API (``teaagent approvals``). Run it with
``teaagent approver serve --config node.toml``; its API (under ``/v1``) is documented by the
application's OpenAPI schema (``/openapi.json``, ``/docs``).
"""

from __future__ import annotations

from teaagent_approver._app import create_app
from teaagent_approver._audit import AUDIT_FILE_NAME, DECISION_EVENT
from teaagent_approver._errors import ErrorOut
from teaagent_approver._settings import MAX_BODY_BYTES, Settings

__all__ = ["AUDIT_FILE_NAME", "DECISION_EVENT", "MAX_BODY_BYTES", "ErrorOut", "Settings", "create_app"]
