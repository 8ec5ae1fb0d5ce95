"""LLM providers, what their models cost, and the provider-neutral shapes of a model call.

Providers (:data:`PROVIDER_CONFIGS`): ``openai``, ``anthropic``, ``openai-compatible`` (any server
speaking OpenAI's API at a configurable URL, a local Ollama by default) and ``scripted`` (offline,
deterministic replay, free). Prices are in US dollars per 1,000 tokens; estimates are in cents.
"""

from __future__ import annotations

from teaagent.errors import MissingAPIKeyError
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
    "MESSAGE_ROLES",
    "PRICES_FILE_ENV",
    "PRICE_FILE_FORMAT",
    "PRICE_UNIT",
    "PROVIDER_CONFIGS",
    "PROVIDER_COST_PER_1K_INPUT",
    "PROVIDER_COST_PER_1K_OUTPUT",
    "STOP_REASONS",
    "LLMAdapter",
    "LLMMessage",
    "LLMRequest",
    "LLMResponse",
    "LLMToolCall",
    "MissingAPIKeyError",
    "ModelPrice",
    "ProviderConfig",
    "available_providers",
    "estimate_cost_preflight",
    "price_for",
]
