"""teaagent.llm (OpenAI part): Chat Completions and compatible servers, replayed from recorded wire bodies.

Every reply comes from a file under ``tests/fixtures/llm/`` in the provider's documented format
(``chat.completion`` objects, ``chat.completion.chunk`` SSE streams ending in ``data: [DONE]``),
served by respx in place of the network. No test reaches a real provider.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import respx

from teaagent.errors import LLMError, LLMResponseError
from teaagent.llm import (
    PRICES_FILE_ENV,
    LLMMessage,
    LLMRequest,
    LLMResponse,
    LLMToolCall,
    OpenAIAdapter,
    OpenAICompatibleAdapter,
    create_llm_adapter,
    price_for,
)

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
URL = "https://api.openai.com/v1/chat/completions"
KEY = "sk-test-0123456789abcdef"
TOOLS: list[dict[str, Any]] = [
    {
        "name": "fs.read",
        "description": "Read a file of the workspace.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
    {
        "name": "shell.run",
        "description": "Run a shell command in the workspace.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
            "required": ["command"],
        },
    },
]
T = TypeVar("T")


@pytest.fixture(autouse=True)
def no_price_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_FILE_ENV, raising=False)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def json_reply(name: str, status: int = 200) -> httpx.Response:
    return httpx.Response(
        status, content=(FIXTURES / name).read_bytes(), headers={"content-type": "application/json"}
    )


def sse_reply(name: str) -> httpx.Response:
    return httpx.Response(
        200, content=(FIXTURES / name).read_bytes(), headers={"content-type": "text/event-stream"}
    )


def sse_text(chunks: list[dict[str, Any]], *, done: bool = True) -> httpx.Response:
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + (
        "data: [DONE]\n\n" if done else ""
    )
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def sent_body(route: respx.Route, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[index].request.content)
    return body


def adapter(**kwargs: Any) -> OpenAIAdapter:
    return OpenAIAdapter(model="gpt-4.1", api_key=KEY, **kwargs)


def ask(text: str = "What is in the workspace?", **kwargs: Any) -> LLMRequest:
    return LLMRequest(messages=[LLMMessage("system", "You are careful."), LLMMessage("user", text)], **kwargs)


async def collect(stream: AsyncIterator[str]) -> list[str]:
    return [piece async for piece in stream]


def cents(model: str, input_tokens: int, output_tokens: int) -> float:
    price = price_for("openai", model)
    return (input_tokens * price.input_per_1k + output_tokens * price.output_per_1k) * 100 / 1000


# --- complete --------------------------------------------------------------------------------


@respx.mock
def test_text_completion_reads_content_stop_reason_usage_and_cost() -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_text.json"))

    response = run(adapter().complete(ask(model="gpt-4.1")))

    assert dataclasses.replace(response, cost_cents=0.0) == LLMResponse(
        content="The workspace holds a README and a src folder.",
        stop_reason="end_turn",
        tool_calls=[],
        input_tokens=1200,
        output_tokens=300,
        cost_cents=0.0,
    )
    # 1200 x $0.002/1k + 300 x $0.008/1k = $0.0048
    assert response.cost_cents == pytest.approx(0.48)
    assert response.cost_cents == pytest.approx(cents("gpt-4.1", 1200, 300))
    request = route.calls.last.request
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert sent_body(route) == {
        "model": "gpt-4.1",
        "messages": [
            {"role": "system", "content": "You are careful."},
            {"role": "user", "content": "What is in the workspace?"},
        ],
        "temperature": 0.0,
    }


@respx.mock
def test_tool_call_completion_parses_json_arguments_and_maps_names_back() -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_tool_calls.json"))

    response = run(adapter().complete(ask(model="gpt-4.1", tools=TOOLS, tool_choice="auto")))

    assert response.stop_reason == "tool_use"
    assert response.content == ""
    assert response.tool_calls == [
        LLMToolCall("call_8fKq2VJ1hXy6Zt3LmN0pQrSa", "fs.read", {"path": "README.md"}),
        LLMToolCall("call_Wb4TnE7cYd2Gk9Hs5Jm1Lx0v", "shell.run", {"command": "ls -la", "timeout": 30}),
    ]
    assert (response.input_tokens, response.output_tokens) == (412, 58)
    assert response.cost_cents == pytest.approx(cents("gpt-4.1", 412, 58))
    body = sent_body(route)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "fs_read",
                "description": TOOLS[0]["description"],
                "parameters": TOOLS[0]["input_schema"],
            },
        },
        {
            "type": "function",
            "function": {
                "name": "shell_run",
                "description": TOOLS[1]["description"],
                "parameters": TOOLS[1]["input_schema"],
            },
        },
    ]
    assert body["tool_choice"] == "auto"


@respx.mock
def test_length_finish_is_max_tokens_and_the_limit_goes_in_max_completion_tokens() -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_length.json"))

    response = run(adapter().complete(ask(model="gpt-4.1", max_tokens=5, temperature=0.7)))

    assert response.stop_reason == "max_tokens"
    assert response.content == "The first part of a long"
    body = sent_body(route)
    assert body["max_completion_tokens"] == 5
    assert "max_tokens" not in body
    assert body["temperature"] == 0.7


@respx.mock
def test_a_dated_snapshot_model_is_priced_as_the_model_it_names() -> None:
    respx.post(URL).mock(return_value=json_reply("openai_text.json"))

    response = run(adapter().complete(ask(model="gpt-4.1-2025-04-14")))

    assert response.cost_cents == pytest.approx(cents("gpt-4.1", 1200, 300))


@respx.mock
def test_an_empty_request_model_falls_back_to_the_adapters_model() -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_text.json"))

    run(OpenAIAdapter(model="gpt-4.1-mini", api_key=KEY).complete(ask(model="")))

    assert sent_body(route)["model"] == "gpt-4.1-mini"


@respx.mock
def test_a_tool_round_trip_is_sent_in_openais_shape() -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_text.json"))
    conversation = [
        LLMMessage("system", "You are careful."),
        LLMMessage("user", "Read the README."),
        LLMMessage(
            "assistant",
            "",
            tool_calls=[
                LLMToolCall("call_1", "fs.read", {"path": "README.md"}),
                LLMToolCall("call_2", "shell.run", {"command": "echo é"}),
            ],
        ),
        LLMMessage("tool", '{"content": "# Hello"}', tool_call_id="call_1"),
        LLMMessage("tool", '{"exit_code": 0}', tool_call_id="call_2"),
        LLMMessage("assistant", "It says hello."),
        LLMMessage("user", "Thanks."),
    ]

    run(adapter().complete(LLMRequest(messages=conversation, model="gpt-4.1", tools=TOOLS)))

    assert sent_body(route)["messages"] == [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "Read the README."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "fs_read", "arguments": '{"path":"README.md"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "shell_run", "arguments": '{"command":"echo é"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"content": "# Hello"}'},
        {"role": "tool", "tool_call_id": "call_2", "content": '{"exit_code": 0}'},
        {"role": "assistant", "content": "It says hello."},
        {"role": "user", "content": "Thanks."},
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("shell.run", {"type": "function", "function": {"name": "shell_run"}}),
    ],
)
@respx.mock
def test_tool_choice_is_sent_as_openai_names_it(choice: str, wire: Any) -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_tool_calls.json"))

    run(adapter().complete(ask(model="gpt-4.1", tools=TOOLS, tool_choice=choice)))

    assert sent_body(route)["tool_choice"] == wire


@respx.mock
def test_auto_tool_choice_without_tools_is_not_sent() -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_text.json"))

    run(adapter().complete(ask(model="gpt-4.1", tool_choice="auto")))

    assert "tool_choice" not in sent_body(route)
    assert "tools" not in sent_body(route)


@pytest.mark.parametrize(
    ("tools", "choice", "message"),
    [
        (
            TOOLS,
            "fs.write",
            r"^tool_choice must be 'auto', 'none', 'required' or the name of an offered tool, "
            r"not 'fs\.write'\.$",
        ),
        (None, "required", r"^tool_choice 'required' needs tools, and the request offers none\.$"),
        ([{"description": "no name"}], None, r"^tools\[0\] must be a dict with a string 'name'\.$"),
        (
            [{"name": "fs.read", "input_schema": "object"}],
            None,
            r"^tools\[0\] \(fs\.read\) must have an object 'input_schema'\.$",
        ),
    ],
)
@respx.mock
def test_a_request_that_cannot_be_expressed_is_refused_before_sending(
    tools: list[dict[str, Any]] | None, choice: str | None, message: str
) -> None:
    route = respx.post(URL).mock(return_value=json_reply("openai_text.json"))

    with pytest.raises(ValueError, match=message):
        run(adapter().complete(ask(model="gpt-4.1", tools=tools, tool_choice=choice)))
    assert route.call_count == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", r"^The openai provider answered with malformed JSON\.$"),
        (b"[1, 2]", r"^The openai provider sent a reply that is not a JSON object\.$"),
        (b'{"choices": []}', r"^The openai provider sent a reply without choices\.$"),
        (b'{"choices": [{"index": 0}]}', r"^The openai provider sent a reply without a message\.$"),
        (
            b'{"choices": [{"message": {"content": null, "tool_calls": [{"id": "c", "function": '
            b'{"name": "fs_read", "arguments": "{\\"path\\": "}}]}, "finish_reason": "tool_calls"}]}',
            r"^The openai provider gave the tool call fs\.read arguments that are not a JSON object\.$",
        ),
        (
            b'{"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}], '
            b'"usage": {"prompt_tokens": -1}}',
            r"^The openai provider reported prompt_tokens as -1, not a count\.$",
        ),
    ],
)
@respx.mock
def test_a_malformed_reply_is_an_llm_response_error(body: bytes, message: str) -> None:
    respx.post(URL).mock(return_value=httpx.Response(200, content=body))

    with pytest.raises(LLMResponseError, match=message):
        run(adapter().complete(ask(model="gpt-4.1", tools=TOOLS)))


# --- stream --------------------------------------------------------------------------------------


@respx.mock
def test_streamed_text_arrives_in_pieces_and_asks_for_usage() -> None:
    route = respx.post(URL).mock(return_value=sse_reply("openai_text_stream.sse"))

    pieces = run(collect(adapter().stream(ask(model="gpt-4.1"))))

    assert pieces == ["Hello", "! The", " workspace", " looks", " tidy", "."]
    body = sent_body(route)
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


@respx.mock
def test_complete_streaming_assembles_streamed_tool_calls_usage_and_cost() -> None:
    respx.post(URL).mock(return_value=sse_reply("openai_tool_stream.sse"))
    seen: list[str] = []

    response = run(adapter().complete_streaming(ask(model="gpt-4.1", tools=TOOLS), seen.append))

    assert seen == ["Let me look."]
    assert dataclasses.replace(response, cost_cents=0.0) == LLMResponse(
        content="Let me look.",
        stop_reason="tool_use",
        tool_calls=[
            LLMToolCall("call_Qm3xT8vBn2Lk5Jh7Gf9Dd1Sa", "fs.read", {"path": "docs/guide.md"}),
            LLMToolCall(
                "call_Zp0oI9uY8tR7eW6qA5sD4fG3", "shell.run", {"command": "git status", "timeout": 30}
            ),
        ],
        input_tokens=530,
        output_tokens=61,
        cost_cents=0.0,
    )
    assert response.cost_cents == pytest.approx(cents("gpt-4.1", 530, 61))


@respx.mock
def test_stream_of_tool_calls_yields_only_the_text() -> None:
    respx.post(URL).mock(return_value=sse_reply("openai_tool_stream.sse"))

    assert run(collect(adapter().stream(ask(model="gpt-4.1", tools=TOOLS)))) == ["Let me look."]


@respx.mock
def test_complete_streaming_of_text_matches_complete() -> None:
    respx.post(URL).mock(return_value=sse_reply("openai_text_stream.sse"))
    seen: list[str] = []

    response = run(adapter().complete_streaming(ask(model="gpt-4.1"), seen.append))

    assert response.content == "".join(seen) == "Hello! The workspace looks tidy."
    assert (response.stop_reason, response.input_tokens, response.output_tokens) == ("end_turn", 19, 7)


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "model": "gpt-4.1",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


@respx.mock
def test_a_stream_cut_before_its_finish_reason_is_an_llm_response_error() -> None:
    respx.post(URL).mock(return_value=sse_text([chunk({"content": "Hel"})], done=False))
    seen: list[str] = []

    with pytest.raises(
        LLMResponseError, match=r"^The openai provider's stream ended before its reply was finished\.$"
    ):
        run(adapter().complete_streaming(ask(model="gpt-4.1"), seen.append))
    assert seen == ["Hel"]


@respx.mock
def test_a_stream_that_ends_without_done_after_its_finish_reason_is_complete() -> None:
    respx.post(URL).mock(return_value=sse_text([chunk({"content": "Hi"}), chunk({}, "stop")], done=False))

    response = run(adapter().complete_streaming(ask(model="gpt-4.1"), lambda _: None))

    assert (response.content, response.stop_reason, response.input_tokens) == ("Hi", "end_turn", 0)


@respx.mock
def test_an_error_inside_the_stream_is_an_llm_error_and_is_not_retried() -> None:
    error = {
        "error": {"message": "The server had an error while processing your request.", "type": "server_error"}
    }
    route = respx.post(URL).mock(return_value=sse_text([chunk({"content": "Hel"}), error], done=False))

    with pytest.raises(
        LLMError, match=r"^The openai provider reported an error during its reply: The server had"
    ):
        run(collect(adapter().stream(ask(model="gpt-4.1"))))
    assert route.call_count == 1


@respx.mock
def test_a_stream_event_that_is_not_json_is_an_llm_response_error() -> None:
    respx.post(URL).mock(return_value=httpx.Response(200, content=b"data: {oops\n\n"))

    with pytest.raises(
        LLMResponseError, match=r"^The openai provider sent a stream event that is not JSON\.$"
    ):
        run(collect(adapter().stream(ask(model="gpt-4.1"))))


@respx.mock
def test_a_name_repeated_in_every_fragment_is_not_doubled() -> None:
    call = {
        "index": 0,
        "id": "call_a",
        "type": "function",
        "function": {"name": "fs_read", "arguments": '{"pa'},
    }
    again = {"index": 0, "function": {"name": "fs_read", "arguments": 'th":"a"}'}}
    respx.post(URL).mock(
        return_value=sse_text(
            [chunk({"tool_calls": [call]}), chunk({"tool_calls": [again]}), chunk({}, "tool_calls")]
        )
    )

    response = run(adapter().complete_streaming(ask(model="gpt-4.1", tools=TOOLS), lambda _: None))

    assert response.tool_calls == [LLMToolCall("call_a", "fs.read", {"path": "a"})]


# --- OpenAI-compatible servers -------------------------------------------------------------------

OLLAMA = "http://127.0.0.1:11434/v1/chat/completions"


@respx.mock
def test_compatible_server_without_key_sends_no_authorization_and_uses_max_tokens() -> None:
    route = respx.post(OLLAMA).mock(return_value=json_reply("ollama_tool_calls.json"))
    compatible = OpenAICompatibleAdapter(model="qwen2.5-coder:7b")

    response = run(
        compatible.complete(
            LLMRequest(
                messages=[LLMMessage("user", "List it.")],
                model="qwen2.5-coder:7b",
                max_tokens=256,
                tools=[{"name": "fs.list", "description": "List.", "input_schema": {"type": "object"}}],
            )
        )
    )

    assert "authorization" not in route.calls.last.request.headers
    assert sent_body(route)["max_tokens"] == 256
    assert "max_completion_tokens" not in sent_body(route)
    # Ollama reports finish_reason "stop" beside tool calls: the calls decide.
    assert response.stop_reason == "tool_use"
    assert response.tool_calls == [LLMToolCall("call_k2v9x1ab", "fs.list", {"path": "."})]
    assert (response.input_tokens, response.output_tokens, response.cost_cents) == (310, 22, 0.0)


@respx.mock
def test_compatible_server_streams_a_whole_tool_call_in_one_chunk() -> None:
    respx.post(OLLAMA).mock(return_value=sse_reply("ollama_tool_stream.sse"))
    compatible = OpenAICompatibleAdapter(model="qwen2.5-coder:7b")
    request = LLMRequest(
        messages=[LLMMessage("user", "List it.")],
        model="qwen2.5-coder:7b",
        tools=[{"name": "fs.list", "description": "List.", "input_schema": {"type": "object"}}],
    )

    response = run(compatible.complete_streaming(request, lambda _: None))

    assert response.tool_calls == [LLMToolCall("call_p4q8r2cd", "fs.list", {"path": "."})]
    assert response.stop_reason == "tool_use"


@respx.mock
def test_compatible_server_with_key_and_base_url_from_the_environment() -> None:
    route = respx.post("https://openrouter.ai/api/v1/chat/completions").mock(
        return_value=json_reply("openai_text.json")
    )
    environ = {
        "OPENAI_COMPATIBLE_BASE_URL": "https://openrouter.ai/api/v1/",
        "OPENAI_COMPATIBLE_API_KEY": "sk-or-v1-secret",
    }
    compatible = create_llm_adapter("openai-compatible", "openai/gpt-4.1", environ=environ)

    response = run(compatible.complete(ask(model="openai/gpt-4.1")))

    assert route.calls.last.request.headers["authorization"] == "Bearer sk-or-v1-secret"
    assert response.content == "The workspace holds a README and a src folder."
    assert "sk-or-v1-secret" not in repr(compatible)


@respx.mock
def test_a_tool_call_without_an_id_gets_one_from_its_position() -> None:
    reply = {
        "choices": [
            {
                "message": {
                    "content": "",
                    "tool_calls": [{"function": {"name": "fs_read", "arguments": {"path": "a"}}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    respx.post(OLLAMA).mock(return_value=httpx.Response(200, json=reply))

    response = run(
        OpenAICompatibleAdapter(model="m").complete(LLMRequest([LLMMessage("user", "x")], "m", tools=TOOLS))
    )

    assert response.tool_calls == [LLMToolCall("call_0", "fs.read", {"path": "a"})]


def test_each_adapter_class_takes_its_defaults_from_its_providers_configuration() -> None:
    from teaagent.llm import PROVIDER_CONFIGS, AnthropicAdapter, HTTPAdapter

    for adapter_class in (OpenAIAdapter, OpenAICompatibleAdapter, AnthropicAdapter):
        adapter = adapter_class(model="m")
        config = PROVIDER_CONFIGS[adapter_class.PROVIDER]
        assert (adapter.provider, adapter.base_url) == (config.name, config.base_url)
        assert adapter._api_key_env == config.api_key_env
    assert OpenAICompatibleAdapter(model="m", base_url="http://h/v1/").base_url == "http://h/v1"
    assert OpenAIAdapter(model="m", max_tokens_field="max_tokens")._max_tokens_field == "max_tokens"
    assert OpenAICompatibleAdapter(model="m")._max_tokens_field == "max_tokens"
    assert OpenAIAdapter(model="m")._max_tokens_field == "max_completion_tokens"

    class Nameless(OpenAIAdapter):
        PROVIDER = ""

    with pytest.raises(ValueError, match=r"^Nameless names no provider\.$"):
        Nameless(model="m")
    assert issubclass(Nameless, HTTPAdapter)
    assert Nameless(model="m", provider="local").provider == "local"
