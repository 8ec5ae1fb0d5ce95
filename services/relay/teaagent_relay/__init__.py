"""The relay service of a teaagent node: ``create_app(settings)`` builds its FastAPI application."""

from __future__ import annotations

from teaagent_relay._app import Settings, create_app

__all__ = ["Settings", "create_app"]
