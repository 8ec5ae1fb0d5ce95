"""create_llm_adapter: a provider's name in, a ready adapter out."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from typing import Final

import httpx

from teaagent._urls import shown_url, split_url
from teaagent.errors import ConfigError
from teaagent.llm._http import MAX_ATTEMPTS, Sleep
from teaagent.llm._providers import require_provider
from teaagent.llm._types import LLMAdapter

__all__ = ["SCRIPT_PATH_ENV", "create_llm_adapter"]

#: The variable naming the script the ``scripted`` provider replays (a bundled name or a file), when
#: none is passed.
SCRIPT_PATH_ENV: Final = "TEAAGENT_LLM_SCRIPT"


def create_llm_adapter(
    provider: str,
    model: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    http_client: httpx.AsyncClient | None = None,
    timeout: httpx.Timeout | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    sleep: Sleep = asyncio.sleep,
    script_path: str | os.PathLike[str] | None = None,
    base_url: str | None = None,
) -> LLMAdapter:
    """Instantiate an adapter for the given provider.

    The API key comes from the provider's ``api_key_env`` variable; the base URL is ``base_url``
    when given (a node's ``[agent] base_url``), else the provider's ``base_url_env`` variable when
    that is set, else its own (see :class:`ProviderConfig`). Nothing is sent until the adapter is
    first called.

    Args:
        provider: Provider name (must be in :func:`available_providers`).
        model: Model override. If None, uses ``ProviderConfig.default_model``.
        environ: The environment to read the key and URL from; ``os.environ`` when None.
        http_client: An httpx client for the HTTP providers to send with (its owner closes it).
        timeout: Timeouts for each HTTP request; the adapters' connect and read defaults when None.
        max_attempts: How many times an HTTP call is sent before its failure is final.
        sleep: Waits between attempts (tests inject a fast one).
        script_path: For ``scripted``, the script to replay: a bundled script's name
            (:data:`~teaagent.llm.BUNDLED_SCRIPTS`) or a file; when None, the one
            :data:`SCRIPT_PATH_ENV` names, or the bundled ``demo`` when that is unset too.
        base_url: The API's base URL, over the environment's and the provider's own.

    Returns:
        An adapter, not yet connected.

    Raises:
        ValueError: Unknown provider (the message lists the available ones).
        MissingAPIKeyError: Required environment variable not set (the message names it).
        ConfigError: ``base_url`` or the base URL variable is not an http(s) URL, ``base_url`` is
            given for the offline ``scripted`` provider, or that provider's script file cannot be
            read or is malformed.
    """
    config = require_provider(provider)
    env = os.environ if environ is None else environ
    chosen = model or config.default_model
    if provider == "scripted":
        if base_url is not None:
            raise ConfigError("the scripted provider calls no server, so it takes no base URL.")
        return _scripted(chosen, env, script_path)
    api_key = config.resolve_api_key(env)
    if base_url is None:
        base_url = config.resolve_base_url(env)
    else:
        parts = split_url(base_url.strip())  # None: an unclosed IPv6 bracket...
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"the base URL must be an http or https URL, not {shown_url(base_url)!r}.")
        base_url = base_url.strip().rstrip("/")
    from teaagent.llm._anthropic import AnthropicAdapter
    from teaagent.llm._openai import OpenAIAdapter, OpenAICompatibleAdapter

    adapters: dict[str, Callable[..., LLMAdapter]] = {
        "anthropic": AnthropicAdapter,
        "openai": OpenAIAdapter,
        "openai-compatible": OpenAICompatibleAdapter,
    }
    adapter_class = adapters.get(provider)
    if adapter_class is not None:
        return adapter_class(
            model=chosen,
            api_key=api_key,
            base_url=base_url,
            api_key_env=config.api_key_env,
            http_client=http_client,
            timeout=timeout,
            max_attempts=max_attempts,
            sleep=sleep,
        )
    # A provider added to PROVIDER_CONFIGS at run time has a configuration but no adapter.
    raise ValueError(f"The LLM provider {provider!r} is configured but has no adapter.")


def _scripted(model: str, env: Mapping[str, str], script_path: str | os.PathLike[str] | None) -> LLMAdapter:
    # Imported here: the scripted adapter is another module's, and the HTTP providers never need it.
    from teaagent.llm._scripted import ScriptedAdapter, load_script

    script = script_path if script_path is not None else env.get(SCRIPT_PATH_ENV, "").strip()
    if not script:
        return ScriptedAdapter.demo(model=model)
    return load_script(script, model=model)
