"""The agent service of a teaagent node: ``create_app(settings)`` builds its FastAPI application.

It serves the agent HTTP API (the seed's ``agent-http-api-schemas.py``): runs streamed as
server-sent events, sessions, models, settings, usage; ``teaagent agent serve`` runs it.
"""

from __future__ import annotations

from teaagent_agent._app import MAX_BODY_BYTES, create_app
from teaagent_agent._errors import ErrorOut
from teaagent_agent._settings import Settings

__all__ = ["MAX_BODY_BYTES", "ErrorOut", "Settings", "create_app"]
