"""The agent service's settings: where its node configuration lives, and the knobs tests turn."""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from teaagent.service import ServiceSettings

__all__ = ["Settings"]


class Settings(ServiceSettings):
    """The agent service's settings, read from the environment.

    ``config`` comes from ``TEAAGENT_CONFIG`` (shared with the other services and the CLI); the
    service's own knobs from ``TEAAGENT_AGENT_<NAME>``.

    Attributes:
        config: The node configuration file (``node.toml``); required.
        llm_script: The script the ``scripted`` model plays, from its first turn in every run: a
            bundled script's name or a file; None for node.toml's ``[agent] script``, else
            ``$TEAAGENT_LLM_SCRIPT``, else the bundled ``demo``.
        self_compaction: Whether a session whose conversation would fill its model's window past
            the model's ``compact_percent`` is compacted before a run, when the session has made
            no choice of its own.
    """

    model_config = SettingsConfigDict(env_prefix="TEAAGENT_AGENT_")

    llm_script: str | None = None
    self_compaction: bool = False
