"""The relay service's application factory."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic_settings import BaseSettings, SettingsConfigDict

import teaagent


class Settings(BaseSettings):
    """Where the service finds its node configuration (``TEAAGENT_CONFIG``)."""

    model_config = SettingsConfigDict(env_prefix="TEAAGENT_")

    config: str | None = None


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the relay service's application.

    Args:
        settings: The service settings; read from the environment when None.

    Returns:
        The FastAPI application.
    """
    app = FastAPI(title="teaagent relay", version=teaagent.__version__)
    app.state.settings = settings or Settings()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "service": "relay", "version": teaagent.__version__}

    return app
