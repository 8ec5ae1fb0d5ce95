"""The LLM providers teaagent knows: where each one lives and which variable holds its key."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from teaagent._urls import shown_url, split_url
from teaagent.errors import ConfigError, MissingAPIKeyError

__all__ = ["PROVIDER_CONFIGS", "ProviderConfig", "available_providers", "require_provider"]


@dataclass
class ProviderConfig:
    """How to reach one LLM provider.

    Attributes:
        name: The provider's name, the key of :data:`PROVIDER_CONFIGS`.
        api_key_env: The environment variable holding the API key; ``""`` when the provider takes none.
        default_model: The model used when a run names none.
        base_url: The API's base URL when ``base_url_env`` is not set; ``""`` for an offline provider.
        base_url_env: The environment variable that overrides ``base_url``; ``""`` when there is none.
        api_key_required: Whether a run must refuse to start without the key. False for servers that
            ignore keys (a local Ollama), where the key is sent only when it is set.
    """

    name: str
    api_key_env: str
    default_model: str
    base_url: str
    base_url_env: str
    api_key_required: bool = field(default=True, kw_only=True)

    def resolve_base_url(self, environ: Mapping[str, str] | None = None) -> str:
        """Return the base URL to call: the ``base_url_env`` variable when set, else ``base_url``.

        Args:
            environ: The environment to read; ``os.environ`` when None.

        Returns:
            The URL without a trailing slash, or ``""`` for an offline provider.

        Raises:
            ConfigError: The variable holds something other than an http(s) URL with a host.
        """
        env = os.environ if environ is None else environ
        override = env.get(self.base_url_env, "").strip() if self.base_url_env else ""
        if not override:
            return self.base_url.rstrip("/")
        parts = split_url(override)  # None: an unclosed IPv6 bracket...
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"{self.base_url_env} must be an http or https URL, not {shown_url(override)!r}."
            )
        return override.rstrip("/")

    def resolve_api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """Return the API key from ``api_key_env``, or ``""`` when the provider can do without one.

        Args:
            environ: The environment to read; ``os.environ`` when None.

        Returns:
            The key with surrounding white space removed; ``""`` when the provider takes no key,
            or when its key is optional and not set.

        Raises:
            MissingAPIKeyError: The provider requires a key and the variable is unset or blank.
        """
        if not self.api_key_env:
            return ""
        env = os.environ if environ is None else environ
        key = env.get(self.api_key_env, "").strip()
        if not key and self.api_key_required:
            raise MissingAPIKeyError(f"Set {self.api_key_env} to use the {self.name} provider.")
        return key


PROVIDER_CONFIGS: dict[str, ProviderConfig] = {
    "openai": ProviderConfig(
        name="openai",
        api_key_env="OPENAI_API_KEY",
        # Takes temperature 0 and function tools on Chat Completions; the gpt-5 family refuses temperature.
        default_model="gpt-4.1",
        base_url="https://api.openai.com/v1",
        base_url_env="OPENAI_BASE_URL",
    ),
    "anthropic": ProviderConfig(
        name="anthropic",
        api_key_env="ANTHROPIC_API_KEY",
        default_model="claude-sonnet-4-5",
        base_url="https://api.anthropic.com",
        base_url_env="ANTHROPIC_BASE_URL",
    ),
    "openai-compatible": ProviderConfig(
        name="openai-compatible",
        api_key_env="OPENAI_COMPATIBLE_API_KEY",
        # A coding model that Ollama serves with tool calling.
        default_model="qwen2.5-coder:7b",
        base_url="http://127.0.0.1:11434/v1",
        base_url_env="OPENAI_COMPATIBLE_BASE_URL",
        api_key_required=False,
    ),
    "scripted": ProviderConfig(
        name="scripted",
        api_key_env="",
        default_model="scripted",
        base_url="",
        base_url_env="",
    ),
}


def available_providers() -> list[str]:
    """Return the names of all configured providers, in the order of :data:`PROVIDER_CONFIGS`."""
    return list(PROVIDER_CONFIGS)


def require_provider(provider: str) -> ProviderConfig:
    """Return the configuration of ``provider``.

    Args:
        provider: A provider name.

    Returns:
        Its :class:`ProviderConfig`.

    Raises:
        ValueError: No provider of that name is configured.
    """
    config = PROVIDER_CONFIGS.get(provider)
    if config is None:
        choices = ", ".join(PROVIDER_CONFIGS)
        raise ValueError(f"Unknown LLM provider {provider!r}; choose one of: {choices}.")
    return config
