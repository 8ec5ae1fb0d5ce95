"""The relay service of a teaagent node: ``create_app(settings)`` builds its FastAPI application.

Each node's relay is its mailbox: it sends the node's approval requests to the peers' relays,
receives the peers' requests for its approver, and counts the signed decisions that come back.
Run it with ``teaagent relay serve --config node.toml``; its HTTP API (under ``/v1``) is documented
by the application's OpenAPI schema (``/openapi.json``, ``/docs``).
"""

from __future__ import annotations

from teaagent_relay._app import create_app
from teaagent_relay._errors import ErrorOut
from teaagent_relay._relay import MAX_WAIT_SECONDS
from teaagent_relay._settings import MAX_BODY_BYTES, Settings

__all__ = ["MAX_BODY_BYTES", "MAX_WAIT_SECONDS", "ErrorOut", "Settings", "create_app"]
