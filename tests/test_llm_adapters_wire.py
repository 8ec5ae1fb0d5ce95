"""teaagent.llm's adapters on the wire: tool names mapped to what providers accept, SSE framing,
the tool round-trip fields of LLMMessage, and the cost of a reply."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import respx
from llm_support import OPENAI_URL, RecordedSleep, ask, collect, fixture_reply, openai, run
from llm_support import fixture_no_price_override as fixture_no_price_override  # the fixture

from teaagent.errors import ConfigError, LLMResponseError
from teaagent.llm import (
    PRICES_FILE_ENV,
    LLMAdapter,
    LLMMessage,
    LLMRequest,
    LLMResponse,
    LLMToolCall,
    ToolNameMap,
    create_llm_adapter,
    wire_tool_name,
)
from teaagent.llm._http import iter_sse

# --- tool names ----------------------------------------------------------------------------------


def test_dotted_names_round_trip_through_their_wire_names() -> None:
    names = ToolNameMap(["fs.read", "fs.write", "shell.run", "plain", "a-b.c_d"])

    for name in ("fs.read", "fs.write", "shell.run", "plain", "a-b.c_d"):
        assert names.from_wire(names.to_wire(name)) == name
    assert names.to_wire("fs.read") == wire_tool_name("fs.read") == "fs_read"
    assert names.to_wire("a-b.c_d") == "a-b_c_d"


def test_a_wire_name_no_offered_tool_has_comes_back_unchanged() -> None:
    assert ToolNameMap(["fs.read"]).from_wire("fs_delete") == "fs_delete"


def test_two_tools_with_one_wire_name_are_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^The tools 'fs\.read' and 'fs_read' would both reach the model as 'fs_read'; rename one\.$",
    ):
        ToolNameMap(["fs.read", "fs_read"])


def test_the_same_tool_twice_is_not_a_collision() -> None:
    assert ToolNameMap(["fs.read", "fs.read"]).from_wire("fs_read") == "fs.read"


@pytest.mark.parametrize(("length", "accepted"), [(64, True), (65, False)])
def test_wire_names_hold_at_most_64_characters(length: int, accepted: bool) -> None:
    name = "t." + "x" * (length - 2)
    if accepted:
        assert wire_tool_name(name) == "t_" + "x" * (length - 2)
    else:
        with pytest.raises(ValueError, match=r"^The tool name 't\.x+' cannot be sent to a model"):
            wire_tool_name(name)


@respx.mock
def test_a_request_whose_tools_collide_is_refused_before_sending() -> None:
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_text.json"))
    tools = [{"name": "fs.read", "input_schema": {}}, {"name": "fs_read", "input_schema": {}}]

    with pytest.raises(ValueError, match=r"would both reach the model as 'fs_read'"):
        run(openai(RecordedSleep()).complete(LLMRequest([LLMMessage("user", "x")], "gpt-4.1", tools=tools)))
    assert route.call_count == 0


# --- SSE framing -----------------------------------------------------------------------------------


async def events_of(chunks: list[bytes]) -> list[tuple[str, str]]:
    async def source() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return [(event.event, event.data) async for event in iter_sse(source())]


def test_sse_events_split_across_chunks_with_crlf_comments_and_multiline_data() -> None:
    wire = b": keep-alive\r\nevent: ping\r\ndata: {}\r\n\r\ndata: line one\r\ndata: line two\r\n\r\nid: 7\n\n"
    chunks = [wire[i : i + 3] for i in range(0, len(wire), 3)]

    assert run(events_of(chunks)) == [("ping", "{}"), ("message", "line one\nline two")]


def test_sse_last_event_without_its_blank_line_is_kept() -> None:
    assert run(events_of([b"data: a\n\ndata: [DONE]"])) == [("message", "a"), ("message", "[DONE]")]


def test_sse_stream_longer_than_the_limit_is_refused() -> None:
    async def scenario() -> None:
        async def source() -> AsyncIterator[bytes]:
            yield b"data: " + b"x" * 20 + b"\n\n"

        async for _ in iter_sse(source(), limit=10):
            pass

    with pytest.raises(LLMResponseError, match=r"^The provider's event stream is longer than 10 bytes\.$"):
        run(scenario())


def test_sse_stream_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(LLMResponseError, match=r"^The provider's event stream is not valid UTF-8\.$"):
        run(events_of([b"data: \xff\xfe\n\n"]))


# --- the tool round-trip fields of LLMMessage ------------------------------------------------------


def test_tool_round_trip_messages() -> None:
    call = LLMToolCall("c1", "fs.read", {"path": "a"})
    assistant = LLMMessage("assistant", "", tool_calls=[call])
    result = LLMMessage("tool", "text of a", tool_call_id="c1")

    assert (assistant.tool_calls, assistant.tool_call_id) == ([call], None)
    assert (result.role, result.tool_call_id, result.tool_calls) == ("tool", "c1", None)
    assert LLMMessage("user", "hi") == LLMMessage(
        role="user", content="hi", tool_calls=None, tool_call_id=None
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"role": "tool", "content": "x"},
            r"^A tool message must name the call it answers in tool_call_id\.$",
        ),
        (
            {"role": "tool", "content": "x", "tool_call_id": ""},
            r"^A tool message must name the call it answers in tool_call_id\.$",
        ),
        (
            {"role": "user", "content": "x", "tool_call_id": "c1"},
            r"^Only a tool message may set tool_call_id, not a user message\.$",
        ),
        (
            {"role": "user", "content": "x", "tool_calls": []},
            r"^Only an assistant message may set tool_calls, not a user message\.$",
        ),
        (
            {"role": "tool", "content": "x", "tool_call_id": "c1", "tool_calls": []},
            r"^Only an assistant message may set tool_calls, not a tool message\.$",
        ),
        (
            {"role": "developer", "content": "x"},
            r"^A message role must be one of user, assistant, system, tool, not 'developer'\.$",
        ),
    ],
)
def test_tool_round_trip_fields_are_checked(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LLMMessage(**kwargs)


def test_the_round_trip_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        LLMMessage("assistant", "", [])  # type: ignore[call-arg]


class _WholeReplyAdapter(LLMAdapter):
    """The smallest adapter that cannot stream: what the default complete_streaming serves."""

    def __init__(self, content: str) -> None:
        self.content = content

    async def complete(self, request: LLMRequest) -> LLMResponse:
        return LLMResponse(self.content, "end_turn", [], input_tokens=1, output_tokens=1, cost_cents=0.0)

    async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
        yield self.content


@pytest.mark.parametrize(("content", "pieces"), [("All done.", ["All done."]), ("", [])])
def test_default_complete_streaming_hands_over_the_whole_text_once(content: str, pieces: list[str]) -> None:
    seen: list[str] = []

    response = run(_WholeReplyAdapter(content).complete_streaming(ask(), seen.append))

    assert response.content == content
    assert seen == pieces


# --- cost ------------------------------------------------------------------------------------------


@respx.mock
def test_cost_follows_the_operators_price_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(
        '{"format": 1, "unit": "USD per 1000 tokens", "providers": '
        '{"openai-compatible": {"models": {"qwen2.5-coder:7b": {"input": 0.01, "output": 0.02}}}}}'
    )
    monkeypatch.setenv(PRICES_FILE_ENV, str(prices))
    respx.post("http://127.0.0.1:11434/v1/chat/completions").mock(
        return_value=fixture_reply("ollama_tool_calls.json")
    )

    response = run(create_llm_adapter("openai-compatible", environ={}).complete(ask("qwen2.5-coder:7b")))

    # 310 x $0.01/1k + 22 x $0.02/1k = $0.00354
    assert response.cost_cents == pytest.approx(0.354)


@respx.mock
def test_a_broken_price_file_stops_the_call_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text("{broken")
    monkeypatch.setenv(PRICES_FILE_ENV, str(prices))
    route = respx.post(OPENAI_URL).mock(return_value=fixture_reply("openai_text.json"))

    with pytest.raises(ConfigError, match=r"is not valid JSON"):
        run(openai(RecordedSleep()).complete(ask()))
    with pytest.raises(ConfigError, match=r"is not valid JSON"):
        run(collect(openai(RecordedSleep()).stream(ask())))
    assert route.call_count == 0
