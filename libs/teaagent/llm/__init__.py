"""LLM providers, what their models cost, and the provider-neutral shapes of a model call.

Providers (:data:`PROVIDER_CONFIGS`): ``openai``, ``anthropic``, ``openai-compatible`` (any server
speaking OpenAI's API at a configurable URL, a local Ollama by default) and ``scripted`` (offline,
deterministic replay, free). Prices are in US dollars per 1,000 tokens; estimates are in cents.

:func:`create_llm_adapter` builds a provider's adapter from the environment. The HTTP adapters
(:class:`OpenAIAdapter`, :class:`OpenAICompatibleAdapter`, :class:`AnthropicAdapter`) speak the
providers' wire formats with httpx, retry 429, 5xx and connection failures, and raise the
:class:`LLMError` family; tool names are sent with ``.`` mapped to ``_`` (:class:`ToolNameMap`).
A tool round trip is carried by ``LLMMessage(..., tool_calls=...)`` on the assistant's turn and
``LLMMessage("tool", result, tool_call_id=...)`` for each result.
"""

from __future__ import annotations

from teaagent.errors import (
    LLMAuthenticationError,
    LLMError,
    LLMRateLimitError,
    LLMResponseError,
    MissingAPIKeyError,
)
from teaagent.llm._anthropic import ANTHROPIC_VERSION, DEFAULT_MAX_TOKENS, AnthropicAdapter
from teaagent.llm._factory import SCRIPT_PATH_ENV, create_llm_adapter
from teaagent.llm._http import (
    CONNECT_TIMEOUT_SECONDS,
    MAX_ATTEMPTS,
    READ_TIMEOUT_SECONDS,
    RETRY_AFTER_CAP_SECONDS,
    HTTPAdapter,
    ToolNameMap,
    wire_tool_name,
)
from teaagent.llm._openai import OpenAIAdapter, OpenAICompatibleAdapter
from teaagent.llm._pricing import (
    PRICE_FILE_FORMAT,
    PRICE_UNIT,
    PRICES_FILE_ENV,
    PROVIDER_COST_PER_1K_INPUT,
    PROVIDER_COST_PER_1K_OUTPUT,
    ModelPrice,
    estimate_cost_preflight,
    price_for,
)
from teaagent.llm._providers import PROVIDER_CONFIGS, ProviderConfig, available_providers
from teaagent.llm._scripted import BUNDLED_SCRIPTS, ScriptedAdapter, load_script
from teaagent.llm._types import (
    MESSAGE_ROLES,
    STOP_REASONS,
    LLMAdapter,
    LLMMessage,
    LLMRequest,
    LLMResponse,
    LLMToolCall,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "BUNDLED_SCRIPTS",
    "CONNECT_TIMEOUT_SECONDS",
    "DEFAULT_MAX_TOKENS",
    "MAX_ATTEMPTS",
    "MESSAGE_ROLES",
    "PRICES_FILE_ENV",
    "PRICE_FILE_FORMAT",
    "PRICE_UNIT",
    "PROVIDER_CONFIGS",
    "PROVIDER_COST_PER_1K_INPUT",
    "PROVIDER_COST_PER_1K_OUTPUT",
    "READ_TIMEOUT_SECONDS",
    "RETRY_AFTER_CAP_SECONDS",
    "SCRIPT_PATH_ENV",
    "STOP_REASONS",
    "AnthropicAdapter",
    "HTTPAdapter",
    "LLMAdapter",
    "LLMAuthenticationError",
    "LLMError",
    "LLMMessage",
    "LLMRateLimitError",
    "LLMRequest",
    "LLMResponse",
    "LLMResponseError",
    "LLMToolCall",
    "MissingAPIKeyError",
    "ModelPrice",
    "OpenAIAdapter",
    "OpenAICompatibleAdapter",
    "ProviderConfig",
    "ScriptedAdapter",
    "ToolNameMap",
    "available_providers",
    "create_llm_adapter",
    "estimate_cost_preflight",
    "load_script",
    "price_for",
    "wire_tool_name",
]
