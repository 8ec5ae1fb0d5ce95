"""teaagent.llm (adapters part): the factory, retries and timeouts, error conversion, Retry-After,
and the API key kept out of every message.

Provider replies are recorded wire bodies under ``tests/fixtures/llm/`` served by respx; waits
between attempts go to an injected sleep that records them, so the retry tests take milliseconds.
What goes over the wire (tool names, SSE framing, the tool round-trip fields, cost) is in
``test_llm_adapters_wire.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from llm_support import (
    ANTHROPIC_URL,
    FIXTURES,
    KEY,
    OPENAI_URL,
    RecordedSleep,
    anthropic,
    ask,
    collect,
    fixture_reply,
    openai,
    run,
)
from llm_support import fixture_no_price_override as fixture_no_price_override  # the fixture

import teaagent.llm._http
from teaagent.errors import (
    ConfigError,
    LLMAuthenticationError,
    LLMError,
    LLMRateLimitError,
    LLMResponseError,
    MissingAPIKeyError,
    TeaAgentError,
)
from teaagent.llm import (
    CONNECT_TIMEOUT_SECONDS,
    MAX_ATTEMPTS,
    PROVIDER_CONFIGS,
    READ_TIMEOUT_SECONDS,
    RETRY_AFTER_CAP_SECONDS,
    SCRIPT_PATH_ENV,
    AnthropicAdapter,
    HTTPAdapter,
    OpenAIAdapter,
    OpenAICompatibleAdapter,
    ScriptedAdapter,
    create_llm_adapter,
)
from teaagent.llm._http import parse_retry_after

# --- the factory ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "environ", "adapter_class", "model", "base_url"),
    [
        ("openai", {"OPENAI_API_KEY": KEY}, OpenAIAdapter, "gpt-4.1", "https://api.openai.com/v1"),
        (
            "anthropic",
            {"ANTHROPIC_API_KEY": KEY},
            AnthropicAdapter,
            "claude-sonnet-4-5",
            "https://api.anthropic.com",
        ),
        ("openai-compatible", {}, OpenAICompatibleAdapter, "qwen2.5-coder:7b", "http://127.0.0.1:11434/v1"),
    ],
)
def test_factory_builds_each_http_provider_with_its_default_model_and_url(
    provider: str, environ: dict[str, str], adapter_class: type[Any], model: str, base_url: str
) -> None:
    adapter = create_llm_adapter(provider, environ=environ)

    assert type(adapter) is adapter_class
    assert isinstance(adapter, HTTPAdapter)
    assert (adapter.provider, adapter.model, adapter.base_url) == (provider, model, base_url)
    assert model == PROVIDER_CONFIGS[provider].default_model


def test_factory_model_override() -> None:
    adapter = create_llm_adapter("openai", "gpt-4.1-mini", environ={"OPENAI_API_KEY": KEY})

    assert isinstance(adapter, OpenAIAdapter)
    assert adapter.model == "gpt-4.1-mini"


def test_unknown_provider_is_a_value_error_listing_the_available_ones() -> None:
    with pytest.raises(
        ValueError,
        match=r"^Unknown LLM provider 'gemini'; choose one of: "
        r"openai, anthropic, openai-compatible, scripted\.$",
    ):
        create_llm_adapter("gemini", environ={})


@pytest.mark.parametrize(
    ("provider", "variable"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY")]
)
@pytest.mark.parametrize("value", [None, "", "   "])
def test_missing_key_is_missing_api_key_error_naming_the_variable(
    provider: str, variable: str, value: str | None
) -> None:
    environ = {} if value is None else {variable: value}

    with pytest.raises(MissingAPIKeyError, match=rf"^Set {variable} to use the {provider} provider\.$"):
        create_llm_adapter(provider, environ=environ)


def test_factory_reads_os_environ_when_no_environment_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError, match=r"^Set ANTHROPIC_API_KEY"):
        create_llm_adapter("anthropic")

    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/proxy")
    adapter = create_llm_adapter("anthropic")
    assert isinstance(adapter, AnthropicAdapter)
    assert adapter.endpoint == "http://127.0.0.1:9/proxy/v1/messages"


@respx.mock
def test_base_url_override_from_the_environment_is_where_requests_go() -> None:
    route = respx.post("http://127.0.0.1:8080/v1/chat/completions").mock(
        return_value=fixture_reply("openai_text.json")
    )
    adapter = create_llm_adapter(
        "openai", environ={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "http://127.0.0.1:8080/v1/"}
    )

    response = run(adapter.complete(ask()))

    assert route.call_count == 1
    assert response.content == "The workspace holds a README and a src folder."


def test_a_base_url_override_that_is_not_http_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"^OPENAI_BASE_URL must be an http or https URL, not 'ftp://x'\.$"):
        create_llm_adapter("openai", environ={"OPENAI_API_KEY": KEY, "OPENAI_BASE_URL": "ftp://x"})


def test_factory_builds_the_scripted_adapter_from_the_script_named_by_the_environment(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text('[{"content": "Done."}]')

    adapter = create_llm_adapter("scripted", environ={SCRIPT_PATH_ENV: str(script)})

    assert isinstance(adapter, ScriptedAdapter)
    response = run(adapter.complete(ask("scripted")))
    assert (response.content, response.stop_reason, response.cost_cents) == ("Done.", "end_turn", 0.0)


def test_factory_scripted_without_a_script_plays_the_bundled_demo() -> None:
    adapter = create_llm_adapter("scripted", environ={})

    assert isinstance(adapter, ScriptedAdapter)
    assert adapter.turns == ScriptedAdapter.demo().turns


# --- retries ---------------------------------------------------------------------------------------


@respx.mock
def test_429_with_retry_after_seconds_waits_that_long_then_succeeds() -> None:
    route = respx.post(OPENAI_URL).mock(
        side_effect=[
            fixture_reply("openai_error_429.json", 429, **{"retry-after": "2"}),
            fixture_reply("openai_text.json"),
        ]
    )
    sleep = RecordedSleep()

    response = run(openai(sleep).complete(ask()))

    assert response.content == "The workspace holds a README and a src folder."
    assert route.call_count == 2
    assert sleep.delays == [2.0]


@respx.mock
def test_retry_after_ms_wins_over_retry_after() -> None:
    respx.post(OPENAI_URL).mock(
        side_effect=[
            fixture_reply("openai_error_429.json", 429, **{"retry-after-ms": "1500", "retry-after": "9"}),
            fixture_reply("openai_text.json"),
        ]
    )
    sleep = RecordedSleep()

    run(openai(sleep).complete(ask()))

    assert sleep.delays == [1.5]


@respx.mock
def test_529_overloaded_is_retried_for_anthropic() -> None:
    route = respx.post(ANTHROPIC_URL).mock(
        side_effect=[fixture_reply("anthropic_error_529.json", 529), fixture_reply("anthropic_text.json")]
    )
    sleep = RecordedSleep()

    response = run(anthropic(sleep).complete(ask("claude-sonnet-4-5")))

    assert response.stop_reason == "end_turn"
    assert route.call_count == 2
    assert len(sleep.delays) == 1


@respx.mock
def test_500_on_every_attempt_fails_after_max_attempts_with_growing_jittered_backoff() -> None:
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_error_500.json", 500))
    sleep = RecordedSleep()

    with pytest.raises(
        LLMError, match=r"^The openai provider failed with HTTP 500 after 4 attempts: "
    ) as caught:
        run(openai(sleep).complete(ask()))

    assert str(caught.value) == (
        "The openai provider failed with HTTP 500 after 4 attempts: "
        "The server had an error while processing your request. Sorry about that!."
    )
    assert caught.value.status_code == 500
    assert type(caught.value) is LLMError
    assert route.call_count == MAX_ATTEMPTS == 4
    assert len(sleep.delays) == MAX_ATTEMPTS - 1
    # Equal jitter: each wait lies in [half, all] of 0.5 s doubled per attempt.
    for attempt, delay in enumerate(sleep.delays, start=1):
        ceiling = 0.5 * 2 ** (attempt - 1)
        assert ceiling / 2 <= delay <= ceiling


@respx.mock
def test_one_attempt_means_no_retry() -> None:
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_error_500.json", 503))
    sleep = RecordedSleep()

    with pytest.raises(LLMError, match=r"^The openai provider failed with HTTP 503 after 1 attempt: "):
        run(openai(sleep, max_attempts=1).complete(ask()))
    assert route.call_count == 1
    assert sleep.delays == []


@respx.mock
def test_success_on_the_last_allowed_attempt() -> None:
    failures = [fixture_reply("openai_error_500.json", 502) for _ in range(MAX_ATTEMPTS - 1)]
    route = respx.post(OPENAI_URL).mock(side_effect=[*failures, fixture_reply("openai_text.json")])

    response = run(openai(RecordedSleep()).complete(ask()))

    assert response.stop_reason == "end_turn"
    assert route.call_count == MAX_ATTEMPTS


@pytest.mark.parametrize("attempts", [0, -1])
def test_max_attempts_below_one_is_refused(attempts: int) -> None:
    with pytest.raises(ValueError, match=rf"^max_attempts must be an int >= 1, not {attempts}\.$"):
        OpenAIAdapter(model="gpt-4.1", max_attempts=attempts)


@respx.mock
def test_429_on_every_attempt_is_llm_rate_limit_error() -> None:
    route = respx.post(ANTHROPIC_URL).mock(
        return_value=fixture_reply("anthropic_error_429.json", 429, **{"retry-after": "1"})
    )
    sleep = RecordedSleep()

    with pytest.raises(
        LLMRateLimitError,
        match=r"^The anthropic provider is still rate limiting after 4 attempts \(HTTP 429\): "
        r"This request would",
    ):
        run(anthropic(sleep).complete(ask("claude-sonnet-4-5")))
    assert route.call_count == 4
    assert sleep.delays == [1.0, 1.0, 1.0]


@respx.mock
def test_401_is_not_retried_and_names_the_variable() -> None:
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_error_401.json", 401))
    sleep = RecordedSleep()
    adapter = create_llm_adapter("openai", environ={"OPENAI_API_KEY": KEY}, sleep=sleep)

    with pytest.raises(LLMAuthenticationError) as caught:
        run(adapter.complete(ask()))

    assert str(caught.value).startswith(
        "The openai provider refused the API key from OPENAI_API_KEY (HTTP 401): Incorrect API key provided"
    )
    assert caught.value.status_code == 401
    assert route.call_count == 1
    assert sleep.delays == []


@respx.mock
def test_403_is_an_authentication_error_too() -> None:
    respx.post(ANTHROPIC_URL).mock(
        return_value=httpx.Response(
            403, json={"type": "error", "error": {"type": "permission_error", "message": "Not allowed."}}
        )
    )

    with pytest.raises(
        LLMAuthenticationError,
        match=r"^The anthropic provider denied the API key access from ANTHROPIC_API_KEY \(HTTP 403\): "
        r"Not allowed\.$",
    ):
        run(anthropic(RecordedSleep()).complete(ask("claude-sonnet-4-5")))


@respx.mock
def test_401_from_a_server_without_a_key_says_which_variable_to_set() -> None:
    respx.post("http://127.0.0.1:11434/v1/chat/completions").mock(return_value=httpx.Response(401))

    with pytest.raises(
        LLMAuthenticationError,
        match=r"^The openai-compatible provider requires an API key \(HTTP 401\); "
        r"set OPENAI_COMPATIBLE_API_KEY\.$",
    ):
        run(create_llm_adapter("openai-compatible", environ={}).complete(ask("m")))


@respx.mock
def test_400_is_not_retried_and_carries_the_providers_explanation() -> None:
    route = respx.post(ANTHROPIC_URL).mock(return_value=fixture_reply("anthropic_error_400.json", 400))
    sleep = RecordedSleep()

    with pytest.raises(
        LLMError, match=r"^The anthropic provider refused the request with HTTP 400: messages\.1\.content"
    ) as caught:
        run(anthropic(sleep).complete(ask("claude-sonnet-4-5")))
    assert type(caught.value) is LLMError
    assert route.call_count == 1
    assert sleep.delays == []


@respx.mock
def test_an_error_body_that_is_not_json_gives_just_the_status() -> None:
    respx.post(OPENAI_URL).mock(return_value=httpx.Response(502, text="<html>Bad gateway</html>"))

    with pytest.raises(LLMError, match=r"^The openai provider failed with HTTP 502 after 2 attempts\.$"):
        run(openai(RecordedSleep(), max_attempts=2).complete(ask()))


@respx.mock
def test_a_long_provider_explanation_is_cut_to_one_readable_line() -> None:
    long = "word " * 200
    respx.post(OPENAI_URL).mock(return_value=httpx.Response(400, json={"error": {"message": f"Bad\n{long}"}}))

    with pytest.raises(LLMError) as caught:
        run(openai(RecordedSleep()).complete(ask()))
    message = str(caught.value)
    assert "\n" not in message
    assert message.endswith(" [...].")
    assert len(message) < 400


@respx.mock
def test_connection_errors_are_retried_then_succeed() -> None:
    route = respx.post(OPENAI_URL).mock(
        side_effect=[
            httpx.ConnectError("Connection refused"),
            httpx.ReadTimeout("timed out"),
            fixture_reply("openai_text.json"),
        ]
    )
    sleep = RecordedSleep()

    response = run(openai(sleep).complete(ask()))

    assert response.stop_reason == "end_turn"
    assert route.call_count == 3
    assert len(sleep.delays) == 2


@respx.mock
def test_connection_errors_on_every_attempt_are_an_llm_error() -> None:
    respx.post(OPENAI_URL).mock(side_effect=httpx.ConnectError("Connection refused"))

    with pytest.raises(
        LLMError,
        match=r"^Could not reach the openai provider at https://api\.openai\.com/v1 "
        r"after 4 attempts \(ConnectError\)\.$",
    ) as caught:
        run(openai(RecordedSleep()).complete(ask()))
    assert caught.value.status_code is None
    assert isinstance(caught.value.__cause__, httpx.ConnectError)


class BrokenBody(httpx.AsyncByteStream):
    """A response body that breaks after its first bytes, as a dropped connection does."""

    def __init__(self, first: bytes) -> None:
        self.first = first

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        raise httpx.ReadError("Connection reset by peer")


@respx.mock
def test_a_whole_reply_cut_off_by_the_network_is_tried_again() -> None:
    route = respx.post(OPENAI_URL).mock(
        side_effect=[
            httpx.Response(200, stream=BrokenBody(b'{"choices": [')),
            fixture_reply("openai_text.json"),
        ]
    )
    sleep = RecordedSleep()

    response = run(openai(sleep).complete(ask()))

    assert response.content == "The workspace holds a README and a src folder."
    assert route.call_count == 2
    assert len(sleep.delays) == 1


@respx.mock
def test_a_whole_reply_cut_off_on_every_attempt_is_an_llm_error() -> None:
    respx.post(OPENAI_URL).mock(side_effect=lambda request: httpx.Response(200, stream=BrokenBody(b"{")))

    with pytest.raises(
        LLMError,
        match=r"^The connection to the openai provider broke during its reply "
        r"after 2 attempts \(ReadError\)\.$",
    ):
        run(openai(RecordedSleep(), max_attempts=2).complete(ask()))


@respx.mock
def test_a_stream_cut_off_after_text_is_an_llm_error_and_is_not_retried() -> None:
    first = (FIXTURES / "openai_text_stream.sse").read_bytes().split(b"\n\n")[1] + b"\n\n"
    route = respx.post(OPENAI_URL).mock(return_value=httpx.Response(200, stream=BrokenBody(first)))
    seen: list[str] = []

    with pytest.raises(
        LLMError, match=r"^The connection to the openai provider broke during its reply \(ReadError\)\.$"
    ):
        run(openai(RecordedSleep()).complete_streaming(ask(), seen.append))
    assert seen == ["Hello"]
    assert route.call_count == 1


@respx.mock
def test_a_stream_is_retried_until_its_status_arrives() -> None:
    route = respx.post(OPENAI_URL).mock(
        side_effect=[
            fixture_reply("openai_error_429.json", 429, **{"retry-after": "0"}),
            fixture_reply("openai_text_stream.sse", 200, **{"content-type": "text/event-stream"}),
        ]
    )
    sleep = RecordedSleep()

    pieces = run(collect(openai(sleep).stream(ask())))

    assert "".join(pieces) == "Hello! The workspace looks tidy."
    assert route.call_count == 2
    assert sleep.delays == [0.0]


@respx.mock
def test_a_reply_larger_than_the_limit_is_an_llm_response_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teaagent.llm._http, "MAX_RESPONSE_BYTES", 100)
    respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_text.json"))

    with pytest.raises(LLMResponseError, match=r"^The openai provider's reply is longer than 100 bytes\.$"):
        run(openai(RecordedSleep()).complete(ask()))


def test_timeouts_are_the_named_constants() -> None:
    adapter = OpenAIAdapter(model="gpt-4.1")

    assert adapter._timeout.connect == CONNECT_TIMEOUT_SECONDS == 10.0
    assert adapter._timeout.read == READ_TIMEOUT_SECONDS == 300.0


@respx.mock
def test_an_injected_client_is_used_and_left_open() -> None:
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_text.json"))

    async def scenario() -> bool:
        async with httpx.AsyncClient() as client:
            adapter = OpenAIAdapter(model="gpt-4.1", api_key=KEY, http_client=client)
            await adapter.complete(ask())
            await adapter.aclose()
            return client.is_closed

    assert run(scenario()) is False
    assert route.call_count == 1


@respx.mock
def test_an_adapter_works_across_event_loops() -> None:
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_text.json"))
    adapter = OpenAIAdapter(model="gpt-4.1", api_key=KEY)

    run(adapter.complete(ask()))
    run(adapter.complete(ask()))

    assert route.call_count == 2


# --- Retry-After -------------------------------------------------------------------------------------

NOW = datetime(2025, 11, 25, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after": "2.5"}, 2.5),
        ({"retry-after": format_datetime(NOW + timedelta(seconds=7), usegmt=True)}, 7.0),
        ({"retry-after": format_datetime(NOW - timedelta(seconds=7), usegmt=True)}, 0.0),
        ({"retry-after": str(RETRY_AFTER_CAP_SECONDS)}, RETRY_AFTER_CAP_SECONDS),
        ({"retry-after": str(RETRY_AFTER_CAP_SECONDS + 1)}, RETRY_AFTER_CAP_SECONDS),
        ({"retry-after": format_datetime(NOW + timedelta(hours=1), usegmt=True)}, RETRY_AFTER_CAP_SECONDS),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "4"}, 4.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(httpx.Headers(headers), now=NOW) == expected


# --- the API key stays secret ----------------------------------------------------------------------


def test_the_key_is_not_in_any_repr() -> None:
    for adapter in (
        OpenAIAdapter(model="gpt-4.1", api_key=KEY),
        AnthropicAdapter(model="claude-sonnet-4-5", api_key=KEY),
        OpenAICompatibleAdapter(model="m", api_key=KEY, base_url="https://user:pw@example.com/v1"),
    ):
        text = repr(adapter)
        assert KEY not in text
        assert "pw" not in text
        assert "api_key=set" in text
    assert repr(OpenAICompatibleAdapter(model="m")).endswith("api_key=none)")


@pytest.mark.parametrize(
    "reply",
    [
        httpx.Response(401, json={"error": {"message": f"Incorrect API key provided: {KEY}."}}),
        httpx.Response(500, json={"error": {"message": f"internal error for key {KEY}"}}),
        httpx.Response(429, json={"type": "error", "error": {"type": "rate_limit_error", "message": KEY}}),
        httpx.Response(404, json={"error": KEY}),
    ],
)
@respx.mock
def test_the_key_is_redacted_even_when_the_provider_echoes_it(reply: httpx.Response) -> None:
    respx.post(OPENAI_URL).mock(return_value=reply)

    with pytest.raises(LLMError) as caught:
        run(openai(RecordedSleep()).complete(ask()))
    assert KEY not in str(caught.value)
    assert "[redacted]" in str(caught.value)


@respx.mock
def test_the_key_is_redacted_from_an_error_inside_a_stream() -> None:
    body = f'data: {{"error": {{"message": "bad key {KEY}"}}}}\n\n'.encode()
    respx.post(OPENAI_URL).mock(return_value=httpx.Response(200, content=body))

    with pytest.raises(LLMError) as caught:
        run(collect(openai(RecordedSleep()).stream(ask())))
    assert KEY not in str(caught.value)


def test_the_llm_errors_are_one_family_under_the_root() -> None:
    for error in (LLMRateLimitError, LLMAuthenticationError, LLMResponseError):
        assert issubclass(error, LLMError)
    assert issubclass(LLMError, TeaAgentError)
    assert LLMError("x").status_code is None
