"""teaagent.llm (Anthropic part): the Messages API, replayed from recorded wire bodies.

Every reply comes from a file under ``tests/fixtures/llm/`` in Anthropic's documented format
(``message`` objects with ``text`` and ``tool_use`` blocks; SSE streams of ``message_start``,
``content_block_*``, ``message_delta``, ``message_stop``, ``ping`` and ``error`` events), served by
respx in place of the network. No test reaches a real provider.
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

from teaagent.errors import LLMError, LLMRateLimitError, LLMResponseError
from teaagent.llm import (
    ANTHROPIC_VERSION,
    DEFAULT_MAX_TOKENS,
    PRICES_FILE_ENV,
    AnthropicAdapter,
    LLMMessage,
    LLMRequest,
    LLMResponse,
    LLMToolCall,
    price_for,
)

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
URL = "https://api.anthropic.com/v1/messages"
KEY = "sk-ant-api03-test-0123456789"
MODEL = "claude-sonnet-4-5"
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
            "properties": {"command": {"type": "string"}},
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


def json_reply(name: str, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        content=(FIXTURES / name).read_bytes(),
        headers={"content-type": "application/json", **headers},
    )


def sse_reply(name: str) -> httpx.Response:
    return httpx.Response(
        200, content=(FIXTURES / name).read_bytes(), headers={"content-type": "text/event-stream"}
    )


def sse_events(events: list[dict[str, Any]]) -> httpx.Response:
    body = "".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events)
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def sent_body(route: respx.Route) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls.last.request.content)
    return body


def adapter(**kwargs: Any) -> AnthropicAdapter:
    return AnthropicAdapter(model=MODEL, api_key=KEY, **kwargs)


def ask(text: str = "What is in the workspace?", **kwargs: Any) -> LLMRequest:
    return LLMRequest(
        messages=[LLMMessage("system", "You are careful."), LLMMessage("user", text)], model=MODEL, **kwargs
    )


async def collect(stream: AsyncIterator[str]) -> list[str]:
    return [piece async for piece in stream]


def cents(input_tokens: int, output_tokens: int) -> float:
    price = price_for("anthropic", MODEL)
    return (input_tokens * price.input_per_1k + output_tokens * price.output_per_1k) * 100 / 1000


# --- complete --------------------------------------------------------------------------------


@respx.mock
def test_text_completion_sends_system_apart_and_reads_usage_and_cost() -> None:
    route = respx.post(URL).mock(return_value=json_reply("anthropic_text.json"))

    response = run(adapter().complete(ask()))

    assert dataclasses.replace(response, cost_cents=0.0) == LLMResponse(
        content="The workspace holds a README and a src folder.",
        stop_reason="end_turn",
        tool_calls=[],
        input_tokens=1000,
        output_tokens=200,
        cost_cents=0.0,
    )
    # 1000 x $0.003/1k + 200 x $0.015/1k = $0.006
    assert response.cost_cents == pytest.approx(0.6)
    assert response.cost_cents == pytest.approx(cents(1000, 200))
    request = route.calls.last.request
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == ANTHROPIC_VERSION == "2023-06-01"
    assert "authorization" not in request.headers
    assert sent_body(route) == {
        "model": MODEL,
        "max_tokens": DEFAULT_MAX_TOKENS,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is in the workspace?"}]}],
        "temperature": 0.0,
        "system": "You are careful.",
    }


@respx.mock
def test_tool_use_blocks_become_tool_calls_with_registered_names() -> None:
    route = respx.post(URL).mock(return_value=json_reply("anthropic_tool_use.json"))

    response = run(adapter().complete(ask(tools=TOOLS, max_tokens=1024)))

    assert response.stop_reason == "tool_use"
    assert response.content == "I'll read the README first."
    assert response.tool_calls == [
        LLMToolCall("toolu_01A09q90qw90lq917835lq9", "fs.read", {"path": "README.md"}),
        LLMToolCall("toolu_01B18r81rx81mr826724mr8", "shell.run", {"command": "ls -la", "timeout": 30}),
    ]
    assert (response.input_tokens, response.output_tokens) == (612, 96)
    body = sent_body(route)
    assert body["max_tokens"] == 1024
    assert body["tools"] == [
        {"name": "fs_read", "description": TOOLS[0]["description"], "input_schema": TOOLS[0]["input_schema"]},
        {
            "name": "shell_run",
            "description": TOOLS[1]["description"],
            "input_schema": TOOLS[1]["input_schema"],
        },
    ]
    assert "tool_choice" not in body


@respx.mock
def test_a_tool_round_trip_is_sent_as_tool_use_and_merged_tool_result_blocks() -> None:
    route = respx.post(URL).mock(return_value=json_reply("anthropic_text.json"))
    conversation = [
        LLMMessage("system", "You are careful."),
        LLMMessage("user", "Read the README."),
        LLMMessage(
            "assistant",
            "I'll read it.",
            tool_calls=[
                LLMToolCall("toolu_1", "fs.read", {"path": "README.md"}),
                LLMToolCall("toolu_2", "shell.run", {"command": "ls"}),
            ],
        ),
        LLMMessage("tool", '{"content": "# Hello"}', tool_call_id="toolu_1"),
        LLMMessage("tool", '{"exit_code": 0}', tool_call_id="toolu_2"),
        LLMMessage("user", "Also be brief."),
        LLMMessage("system", "Answer in English."),
        LLMMessage("assistant", "", tool_calls=[LLMToolCall("toolu_3", "fs.read", {"path": "a"})]),
        LLMMessage("tool", "gone", tool_call_id="toolu_3"),
    ]

    run(adapter().complete(LLMRequest(messages=conversation, model=MODEL, tools=TOOLS)))

    body = sent_body(route)
    assert body["system"] == "You are careful.\n\nAnswer in English."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Read the README."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "I'll read it."},
                {"type": "tool_use", "id": "toolu_1", "name": "fs_read", "input": {"path": "README.md"}},
                {"type": "tool_use", "id": "toolu_2", "name": "shell_run", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": '{"content": "# Hello"}'},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": '{"exit_code": 0}'},
                {"type": "text", "text": "Also be brief."},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_3", "name": "fs_read", "input": {"path": "a"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": "gone"}]},
    ]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ("fs.read", {"type": "tool", "name": "fs_read"}),
    ],
)
@respx.mock
def test_tool_choice_is_sent_as_anthropic_names_it(choice: str, wire: dict[str, str]) -> None:
    route = respx.post(URL).mock(return_value=json_reply("anthropic_tool_use.json"))

    run(adapter().complete(ask(tools=TOOLS, tool_choice=choice)))

    assert sent_body(route)["tool_choice"] == wire


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("end_turn", "end_turn"),
        ("max_tokens", "max_tokens"),
        ("stop_sequence", "end_turn"),
        ("refusal", "end_turn"),
        ("model_context_window_exceeded", "max_tokens"),
        ("something_new", "end_turn"),
    ],
)
@respx.mock
def test_stop_reasons_map_onto_the_three_the_runner_knows(reason: str, expected: str) -> None:
    document = json.loads((FIXTURES / "anthropic_text.json").read_text())
    document["stop_reason"] = reason
    respx.post(URL).mock(return_value=httpx.Response(200, json=document))

    assert run(adapter().complete(ask())).stop_reason == expected


@respx.mock
def test_prompt_cache_tokens_count_as_input() -> None:
    document = json.loads((FIXTURES / "anthropic_text.json").read_text())
    document["usage"].update(input_tokens=10, cache_creation_input_tokens=200, cache_read_input_tokens=3000)
    respx.post(URL).mock(return_value=httpx.Response(200, json=document))

    assert run(adapter().complete(ask())).input_tokens == 3210


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"type": "message"}, r"^The anthropic provider sent a reply without content blocks\.$"),
        ({"content": [{"type": "text"}]}, r"^The anthropic provider sent a text block without text\.$"),
        (
            {"content": [{"type": "tool_use", "name": "fs_read", "input": {}}]},
            r"^The anthropic provider sent a tool_use block without an id and a name\.$",
        ),
        (
            {"content": [{"type": "tool_use", "id": "t", "name": "fs_read", "input": [1]}]},
            r"^The anthropic provider gave the tool call fs\.read arguments that are not a JSON object\.$",
        ),
    ],
)
@respx.mock
def test_a_malformed_message_is_an_llm_response_error(document: dict[str, Any], message: str) -> None:
    respx.post(URL).mock(return_value=httpx.Response(200, json=document))

    with pytest.raises(LLMResponseError, match=message):
        run(adapter().complete(ask(tools=TOOLS)))


@respx.mock
def test_thinking_blocks_are_skipped() -> None:
    document = json.loads((FIXTURES / "anthropic_text.json").read_text())
    document["content"].insert(0, {"type": "thinking", "thinking": "Hmm.", "signature": "EqQBCgIYAhIM"})
    respx.post(URL).mock(return_value=httpx.Response(200, json=document))

    assert run(adapter().complete(ask())).content == "The workspace holds a README and a src folder."


def test_default_max_tokens_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^default_max_tokens must be an int >= 1, not 0\.$"):
        AnthropicAdapter(model=MODEL, api_key=KEY, default_max_tokens=0)


@respx.mock
def test_the_smallest_default_max_tokens_is_sent() -> None:
    route = respx.post(URL).mock(return_value=json_reply("anthropic_text.json"))

    run(AnthropicAdapter(model=MODEL, api_key=KEY, default_max_tokens=1).complete(ask()))

    assert sent_body(route)["max_tokens"] == 1


# --- stream --------------------------------------------------------------------------------------


@respx.mock
def test_streamed_text_arrives_in_pieces() -> None:
    route = respx.post(URL).mock(return_value=sse_reply("anthropic_text_stream.sse"))

    pieces = run(collect(adapter().stream(ask())))

    assert pieces == ["Hello", "! The", " workspace", " looks", " tidy", "."]
    assert sent_body(route)["stream"] is True


@respx.mock
def test_complete_streaming_assembles_input_json_deltas_and_cumulative_usage() -> None:
    respx.post(URL).mock(return_value=sse_reply("anthropic_tool_stream.sse"))
    seen: list[str] = []

    response = run(adapter().complete_streaming(ask(tools=TOOLS), seen.append))

    assert seen == ["Let me", " look."]
    assert response.content == "Let me look."
    assert response.stop_reason == "tool_use"
    assert response.tool_calls == [
        LLMToolCall("toolu_01T1x1fJ34qAmk2tNTrN7Up6", "fs.read", {"path": "docs/guide.md"}),
        LLMToolCall("toolu_01VxYz8cB3nM6kJ4hG2fD0sA", "shell.run", {"command": "git status", "timeout": 30}),
    ]
    # message_start's 472 input + 100 read from the cache; message_delta's cumulative 89 output.
    assert (response.input_tokens, response.output_tokens) == (572, 89)
    assert response.cost_cents == pytest.approx(cents(572, 89))


@respx.mock
def test_complete_streaming_of_text_reads_output_tokens_from_message_delta() -> None:
    respx.post(URL).mock(return_value=sse_reply("anthropic_text_stream.sse"))

    response = run(adapter().complete_streaming(ask(), lambda _: None))

    assert (response.content, response.stop_reason) == ("Hello! The workspace looks tidy.", "end_turn")
    assert (response.input_tokens, response.output_tokens) == (25, 15)


@respx.mock
def test_an_overloaded_error_mid_stream_is_an_llm_error_after_the_text_so_far() -> None:
    route = respx.post(URL).mock(return_value=sse_reply("anthropic_overloaded_stream.sse"))
    seen: list[str] = []

    with pytest.raises(
        LLMError, match=r"^The anthropic provider reported an error during its reply: Overloaded\.$"
    ):
        run(adapter().complete_streaming(ask(), seen.append))
    assert seen == ["Partial"]
    assert route.call_count == 1


@respx.mock
def test_a_rate_limit_error_mid_stream_is_an_llm_rate_limit_error() -> None:
    events = [{"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited"}}]
    respx.post(URL).mock(return_value=sse_events(events))

    with pytest.raises(
        LLMRateLimitError, match=r"^The anthropic provider reported an error during its reply"
    ):
        run(collect(adapter().stream(ask())))


@respx.mock
def test_a_stream_cut_before_message_delta_is_an_llm_response_error() -> None:
    text = (FIXTURES / "anthropic_text_stream.sse").read_text()
    cut = text[: text.index("event: message_delta")]
    respx.post(URL).mock(return_value=httpx.Response(200, content=cut.encode()))

    with pytest.raises(
        LLMResponseError, match=r"^The anthropic provider's stream ended before its reply was finished\.$"
    ):
        run(collect(adapter().stream(ask())))


@respx.mock
def test_input_json_delta_for_a_block_that_never_started_is_an_llm_response_error() -> None:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 1, "output_tokens": 1}}},
        {
            "type": "content_block_delta",
            "index": 3,
            "delta": {"type": "input_json_delta", "partial_json": "{}"},
        },
    ]
    respx.post(URL).mock(return_value=sse_events(events))

    with pytest.raises(
        LLMResponseError,
        match=r"^The anthropic provider sent an input_json_delta for a block that never started\.$",
    ):
        run(collect(adapter().stream(ask())))


@respx.mock
def test_a_tool_use_block_without_deltas_keeps_its_starting_input() -> None:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t1", "name": "fs_read", "input": {}},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]
    respx.post(URL).mock(return_value=sse_events(events))

    response = run(adapter().complete_streaming(ask(tools=TOOLS), lambda _: None))

    assert response.tool_calls == [LLMToolCall("t1", "fs.read", {})]
    assert (response.input_tokens, response.output_tokens) == (5, 9)
