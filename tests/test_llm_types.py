"""teaagent.llm (types part): providers, price tables and the override file, the call shapes, LLMAdapter."""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

import teaagent.errors
from teaagent.errors import ConfigError
from teaagent.llm import (
    MESSAGE_ROLES,
    PRICE_UNIT,
    PRICES_FILE_ENV,
    PROVIDER_CONFIGS,
    PROVIDER_COST_PER_1K_INPUT,
    PROVIDER_COST_PER_1K_OUTPUT,
    STOP_REASONS,
    LLMAdapter,
    LLMMessage,
    LLMRequest,
    LLMResponse,
    LLMToolCall,
    MissingAPIKeyError,
    ModelPrice,
    ProviderConfig,
    available_providers,
    estimate_cost_preflight,
    price_for,
)

PROVIDERS = ["openai", "anthropic", "openai-compatible", "scripted"]


def vendored_prices() -> dict[str, Any]:
    text = resources.files("teaagent.llm").joinpath("prices.json").read_text(encoding="utf-8")
    document: dict[str, Any] = json.loads(text)
    return document


@pytest.fixture(autouse=True)
def no_price_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from the vendored table, whatever the developer's shell exports."""
    monkeypatch.delenv(PRICES_FILE_ENV, raising=False)


def write_prices(path: Path, providers: dict[str, Any], **extra: Any) -> Path:
    path.write_text(json.dumps({"format": 1, "unit": PRICE_UNIT, "providers": providers, **extra}))
    return path


# --- providers -------------------------------------------------------------------------------


def test_the_four_providers_are_configured() -> None:
    assert list(PROVIDER_CONFIGS) == PROVIDERS
    assert available_providers() == PROVIDERS
    assert all(config.name == name for name, config in PROVIDER_CONFIGS.items())


def test_provider_config_has_the_spec_fields_in_order() -> None:
    names = [field.name for field in dataclasses.fields(ProviderConfig)]
    assert names[:5] == ["name", "api_key_env", "default_model", "base_url", "base_url_env"]


@pytest.mark.parametrize(
    ("provider", "key_env", "url_env", "url"),
    [
        ("openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", "https://api.openai.com/v1"),
        ("anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
        (
            "openai-compatible",
            "OPENAI_COMPATIBLE_API_KEY",
            "OPENAI_COMPATIBLE_BASE_URL",
            "http://127.0.0.1:11434/v1",
        ),
        ("scripted", "", "", ""),
    ],
)
def test_provider_endpoints_and_variables(provider: str, key_env: str, url_env: str, url: str) -> None:
    config = PROVIDER_CONFIGS[provider]
    assert (config.api_key_env, config.base_url_env, config.base_url) == (key_env, url_env, url)
    assert config.default_model


def test_a_missing_or_blank_key_raises_for_a_provider_that_needs_one() -> None:
    openai = PROVIDER_CONFIGS["openai"]
    with pytest.raises(MissingAPIKeyError, match=r"^Set OPENAI_API_KEY to use the openai provider\.$"):
        openai.resolve_api_key({})
    with pytest.raises(MissingAPIKeyError, match=r"^Set ANTHROPIC_API_KEY to use the anthropic provider\.$"):
        PROVIDER_CONFIGS["anthropic"].resolve_api_key({"ANTHROPIC_API_KEY": "  "})
    assert openai.resolve_api_key({"OPENAI_API_KEY": " sk-test\n"}) == "sk-test"
    assert MissingAPIKeyError is teaagent.errors.MissingAPIKeyError


def test_keyless_providers_need_no_key() -> None:
    assert PROVIDER_CONFIGS["scripted"].resolve_api_key({}) == ""
    compatible = PROVIDER_CONFIGS["openai-compatible"]
    assert compatible.resolve_api_key({}) == ""
    assert compatible.resolve_api_key({"OPENAI_COMPATIBLE_API_KEY": "k"}) == "k"


def test_base_url_variable_overrides_the_default() -> None:
    config = PROVIDER_CONFIGS["openai-compatible"]
    assert config.resolve_base_url({}) == "http://127.0.0.1:11434/v1"
    assert config.resolve_base_url({"OPENAI_COMPATIBLE_BASE_URL": ""}) == "http://127.0.0.1:11434/v1"
    env = {"OPENAI_COMPATIBLE_BASE_URL": "https://llm.internal:8443/v1/"}
    assert config.resolve_base_url(env) == "https://llm.internal:8443/v1"
    with pytest.raises(
        ConfigError, match=r"^OPENAI_COMPATIBLE_BASE_URL must be an http or https URL, not 'ftp://x'\.$"
    ):
        config.resolve_base_url({"OPENAI_COMPATIBLE_BASE_URL": "ftp://x"})
    assert PROVIDER_CONFIGS["scripted"].resolve_base_url({"OPENAI_BASE_URL": "http://x"}) == ""


# --- the vendored price table ----------------------------------------------------------------


def test_price_table_ships_inside_the_package() -> None:
    assert resources.files("teaagent.llm").joinpath("prices.json").is_file()
    assert vendored_prices()["unit"] == PRICE_UNIT


def test_cost_tables_price_every_provider_and_only_them() -> None:
    assert set(PROVIDER_COST_PER_1K_INPUT) == set(PROVIDERS) == set(PROVIDER_COST_PER_1K_OUTPUT)


def test_offline_and_local_providers_are_free() -> None:
    for provider in ("scripted", "openai-compatible"):
        assert PROVIDER_COST_PER_1K_INPUT[provider] == PROVIDER_COST_PER_1K_OUTPUT[provider] == 0.0
        assert price_for(provider, PROVIDER_CONFIGS[provider].default_model) == ModelPrice(0.0, 0.0)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_paid_providers_price_their_default_model_and_default_to_their_dearest_rate(provider: str) -> None:
    table = vendored_prices()["providers"][provider]
    models = table["models"]
    assert PROVIDER_CONFIGS[provider].default_model in models
    # An unlisted model is never charged less than any listed one: a cap cannot be under-counted.
    assert PROVIDER_COST_PER_1K_INPUT[provider] == max(price["input"] for price in models.values())
    assert PROVIDER_COST_PER_1K_OUTPUT[provider] == max(price["output"] for price in models.values())
    assert table["default"] == {
        "input": PROVIDER_COST_PER_1K_INPUT[provider],
        "output": PROVIDER_COST_PER_1K_OUTPUT[provider],
    }


@pytest.mark.parametrize(
    ("provider", "model", "price"),
    [
        ("openai", "gpt-4.1", ModelPrice(0.002, 0.008)),
        ("openai", "gpt-4.1-2025-04-14", ModelPrice(0.002, 0.008)),
        ("openai", "gpt-4.1-mini", ModelPrice(0.0004, 0.0016)),
        ("anthropic", "claude-sonnet-4-5-20250929", ModelPrice(0.003, 0.015)),
        ("anthropic", "claude-3-7-sonnet-latest", ModelPrice(0.003, 0.015)),
        ("anthropic", "claude-haiku-4-5", ModelPrice(0.001, 0.005)),
    ],
)
def test_price_for_listed_models_and_their_snapshots(provider: str, model: str, price: ModelPrice) -> None:
    assert price_for(provider, model) == price


def test_price_for_an_unlisted_model_is_the_provider_default() -> None:
    assert price_for("anthropic", "claude-next") == ModelPrice(0.015, 0.075)
    # Only a date or -latest suffix is stripped: an unlisted variant is not priced as its base model.
    assert price_for("openai", "gpt-4.1-turbo") == ModelPrice(0.0025, 0.01)


def test_price_for_an_unknown_provider_raises() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Unknown LLM provider 'azure'; choose one of: "
        r"openai, anthropic, openai-compatible, scripted\.$",
    ):
        price_for("azure", "gpt-4.1")


# --- the override file -----------------------------------------------------------------------


def test_override_file_prices_a_new_model_and_wins_over_the_vendored_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_prices(
        tmp_path / "prices.json",
        {
            "openai": {
                "models": {"gpt-9": {"input": 0.01, "output": 0.02}, "gpt-4.1": {"input": 1, "output": 2}}
            }
        },
    )
    monkeypatch.setenv(PRICES_FILE_ENV, str(path))

    assert price_for("openai", "gpt-9") == ModelPrice(0.01, 0.02)
    assert price_for("openai", "gpt-9-2030-01-01") == ModelPrice(0.01, 0.02)
    assert price_for("openai", "gpt-4.1") == ModelPrice(1.0, 2.0)
    # What the override does not list falls through to the vendored table, then the default.
    assert price_for("openai", "gpt-4o-mini") == ModelPrice(0.00015, 0.0006)
    assert price_for("openai", "gpt-unknown") == ModelPrice(0.0025, 0.01)


def test_override_default_prices_unlisted_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_prices(
        tmp_path / "p.json", {"openai-compatible": {"default": {"input": 0.0005, "output": 0.0015}}}
    )
    monkeypatch.setenv(PRICES_FILE_ENV, str(path))
    assert price_for("openai-compatible", "meta-llama/Llama-3.3-70B") == ModelPrice(0.0005, 0.0015)
    assert estimate_cost_preflight("openai-compatible", "x", 1000, 1000)["total_max_cents"] == pytest.approx(
        0.2
    )


def test_override_file_is_read_again_when_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "prices.json"
    monkeypatch.setenv(PRICES_FILE_ENV, str(path))
    write_prices(path, {"openai": {"models": {"gpt-9": {"input": 0.01, "output": 0.02}}}})
    assert price_for("openai", "gpt-9") == ModelPrice(0.01, 0.02)

    write_prices(path, {"openai": {"models": {"gpt-9": {"input": 0.03, "output": 0.04}}}})
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert price_for("openai", "gpt-9") == ModelPrice(0.03, 0.04)


def test_a_missing_override_file_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "absent.json"
    monkeypatch.setenv(PRICES_FILE_ENV, str(missing))
    with pytest.raises(ConfigError, match=rf"^TEAAGENT_PRICES_FILE names {missing}, which cannot be read: "):
        price_for("openai", "gpt-4.1")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("not json", r"is not valid JSON"),
        ("[]", r"must hold a JSON object\.$"),
        ('{"format": 2, "unit": "USD per 1000 tokens", "providers": {}}', r'must say "format": 1\.$'),
        (
            '{"format": 1, "unit": "USD per 1M tokens", "providers": {}}',
            r'must say "unit": "USD per 1000 tokens"\.$',
        ),
        ('{"format": 1, "unit": "USD per 1000 tokens"}', r'must have a "providers" object\.$'),
        (
            '{"format": 1, "unit": "USD per 1000 tokens", "providers": {}, "extra": 1}',
            r"has unknown keys: extra\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens", "providers": {"azure": {}}}',
            r"prices an unknown provider 'azure'\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens", "providers": {"openai": {"model": {}}}}',
            r"providers\.openai may hold only 'default' and 'models'\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens", "providers": {"openai": {"models": []}}}',
            r"providers\.openai\.models must be an object\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens",'
            ' "providers": {"openai": {"models": {"m": {"input": 1}}}}}',
            r"providers\.openai\.models\.m must be an object with exactly the keys 'input' and 'output'\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens",'
            ' "providers": {"openai": {"default": {"input": -1, "output": 0}}}}',
            r"providers\.openai\.default\.input must be a finite number of dollars >= 0, not -1\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens",'
            ' "providers": {"openai": {"default": {"input": 0, "output": true}}}}',
            r"providers\.openai\.default\.output must be a finite number of dollars >= 0, not True\.$",
        ),
        (
            '{"format": 1, "unit": "USD per 1000 tokens",'
            ' "providers": {"openai": {"default": {"input": 0, "output": NaN}}}}',
            r"providers\.openai\.default\.output must be a finite number of dollars >= 0, not nan\.$",
        ),
    ],
)
def test_a_malformed_override_file_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, document: str, message: str
) -> None:
    path = tmp_path / "prices.json"
    path.write_text(document)
    monkeypatch.setenv(PRICES_FILE_ENV, str(path))
    with pytest.raises(ConfigError, match=message):
        price_for("openai", "gpt-4.1")


def test_an_oversized_override_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_prices(tmp_path / "big.json", {}, note="x" * (1024 * 1024))
    monkeypatch.setenv(PRICES_FILE_ENV, str(path))
    with pytest.raises(ConfigError, match=r"is larger than 1048576 bytes\.$"):
        price_for("openai", "gpt-4.1")


# --- estimate_cost_preflight -----------------------------------------------------------------


def test_estimate_is_in_cents_with_exactly_the_spec_keys() -> None:
    estimate = estimate_cost_preflight("openai", "gpt-4.1", 1000, 1000)
    # $0.002 and $0.008 per 1,000 tokens are 0.2 and 0.8 cents.
    assert estimate == {"input_cost_cents": 0.2, "max_output_cost_cents": 0.8, "total_max_cents": 1.0}


def test_estimate_of_nothing_is_zero_and_scripted_is_free() -> None:
    zero = {"input_cost_cents": 0.0, "max_output_cost_cents": 0.0, "total_max_cents": 0.0}
    assert estimate_cost_preflight("anthropic", "claude-sonnet-4-5", 0, 0) == zero
    assert estimate_cost_preflight("scripted", "scripted", 10**6, 10**6) == zero


def test_estimate_refuses_unknown_providers_and_bad_counts() -> None:
    with pytest.raises(ValueError, match=r"^Unknown LLM provider 'gemini'; "):
        estimate_cost_preflight("gemini", "m", 1, 1)
    with pytest.raises(ValueError, match=r"^prompt_tokens must be >= 0, not -1\.$"):
        estimate_cost_preflight("openai", "gpt-4.1", -1, 1)
    with pytest.raises(TypeError, match=r"^max_output_tokens must be an int, not bool\.$"):
        estimate_cost_preflight("openai", "gpt-4.1", 1, True)
    with pytest.raises(TypeError, match=r"^prompt_tokens must be an int, not float\.$"):
        estimate_cost_preflight("openai", "gpt-4.1", 1.5, 1)  # type: ignore[arg-type]


# --- the call shapes -------------------------------------------------------------------------


def test_request_defaults_are_the_specs() -> None:
    request = LLMRequest(messages=[LLMMessage("user", "hi")], model="gpt-4.1")
    assert (request.max_tokens, request.tools, request.tool_choice, request.temperature) == (
        None,
        None,
        None,
        0.0,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, r"^max_tokens must be None or an int >= 1, not 0\.$"),
        ({"max_tokens": True}, r"^max_tokens must be None or an int >= 1, not True\.$"),
        ({"temperature": -0.1}, r"^temperature must be a finite number >= 0, not -0\.1\.$"),
        ({"temperature": math.nan}, r"^temperature must be a finite number >= 0, not nan\.$"),
    ],
)
def test_request_refuses_bad_limits(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLMRequest(messages=[], model="m", **kwargs)


def test_request_accepts_the_smallest_limits() -> None:
    assert LLMRequest(messages=[], model="m", max_tokens=1, temperature=0.0).max_tokens == 1


def test_message_roles_are_the_specs_plus_tool_results() -> None:
    # The spec's three roles, and "tool" for the result of a tool call sent back to the model.
    assert MESSAGE_ROLES == ("user", "assistant", "system", "tool")
    assert [LLMMessage(role, "x").role for role in MESSAGE_ROLES[:3]] == list(MESSAGE_ROLES[:3])
    assert LLMMessage("tool", "x", tool_call_id="c1").tool_call_id == "c1"
    with pytest.raises(
        ValueError, match=r"^A message role must be one of user, assistant, system, tool, not 'robot'\.$"
    ):
        LLMMessage("robot", "x")


def test_response_stop_reasons_and_counts() -> None:
    assert STOP_REASONS == ("end_turn", "tool_use", "max_tokens")
    call = LLMToolCall(call_id="c1", tool_name="fs.read", arguments={"path": "a.txt"})
    response = LLMResponse("", "tool_use", [call], input_tokens=0, output_tokens=0, cost_cents=0.0)
    assert response.tool_calls[0].arguments == {"path": "a.txt"}
    with pytest.raises(
        ValueError, match=r"^A stop reason must be one of end_turn, tool_use, max_tokens, not 'stop'\.$"
    ):
        LLMResponse("", "stop", [], 0, 0, 0.0)
    with pytest.raises(ValueError, match=r"^output_tokens must be an int >= 0, not -1\.$"):
        LLMResponse("", "end_turn", [], 0, -1, 0.0)
    with pytest.raises(ValueError, match=r"^cost_cents must be a finite number >= 0, not inf\.$"):
        LLMResponse("", "end_turn", [], 0, 0, math.inf)


# --- LLMAdapter ------------------------------------------------------------------------------


class EchoAdapter(LLMAdapter):
    """A complete adapter with no network: it answers with the last message, word by word when streaming."""

    async def complete(self, request: LLMRequest) -> LLMResponse:
        text = request.messages[-1].content
        return LLMResponse(
            text, "end_turn", [], input_tokens=len(text), output_tokens=len(text), cost_cents=0.0
        )

    async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
        for word in request.messages[-1].content.split(" "):
            yield word


def test_adapter_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        LLMAdapter()  # type: ignore[abstract]

    class CompleteOnly(LLMAdapter):
        async def complete(self, request: LLMRequest) -> LLMResponse:
            raise NotImplementedError

    with pytest.raises(TypeError, match="stream"):
        CompleteOnly()  # type: ignore[abstract]


def test_stream_is_declared_async_as_in_the_seed() -> None:
    # The seed declares ``async def stream``: an async generator, like every adapter's override.
    assert inspect.isasyncgenfunction(LLMAdapter.stream)
    assert inspect.isasyncgenfunction(EchoAdapter.stream)


@pytest.mark.anyio
async def test_the_abstract_stream_raises_when_called_through_super() -> None:
    class Lazy(EchoAdapter):
        async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
            async for piece in super(EchoAdapter, self).stream(request):
                yield piece

    request = LLMRequest(messages=[LLMMessage("user", "hi")], model="echo")

    async def collect() -> list[str]:
        return [piece async for piece in Lazy().stream(request)]

    with pytest.raises(NotImplementedError):
        await collect()


@pytest.mark.anyio
async def test_adapter_completes_and_streams() -> None:
    adapter = EchoAdapter()
    request = LLMRequest(messages=[LLMMessage("user", "hello tea agent")], model="echo")

    async def collect() -> tuple[LLMResponse, list[str]]:
        return await adapter.complete(request), [piece async for piece in adapter.stream(request)]

    response, pieces = await collect()
    assert response.content == "hello tea agent"
    assert pieces == ["hello", "tea", "agent"]
