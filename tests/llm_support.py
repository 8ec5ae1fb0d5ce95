"""The LLM adapter tests' parts: recorded provider replies, a sleep that records its waits, the adapters.

Test modules take ``fixture_no_price_override`` (autouse: no prices file from the environment).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from teaagent.llm import PRICES_FILE_ENV, AnthropicAdapter, LLMMessage, LLMRequest, OpenAIAdapter

FIXTURES = Path(__file__).parent / "fixtures" / "llm"
OPENAI_URL = "https://api.openai.com/v1/chat/completions"
ANTHROPIC_URL = "https://api.anthropic.com/v1/messages"
KEY = "sk-proj-SECRET-do-not-print-4f2a9c"
T = TypeVar("T")


@pytest.fixture(autouse=True, name="no_price_override")
def fixture_no_price_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_FILE_ENV, raising=False)


class RecordedSleep:
    """Stands in for asyncio.sleep between attempts: records each wait, waits for none."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def fixture_reply(name: str, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, content=(FIXTURES / name).read_bytes(), headers=headers)


def openai(sleep: RecordedSleep, **kwargs: Any) -> OpenAIAdapter:
    return OpenAIAdapter(model="gpt-4.1", api_key=KEY, sleep=sleep, **kwargs)


def anthropic(sleep: RecordedSleep, **kwargs: Any) -> AnthropicAdapter:
    return AnthropicAdapter(model="claude-sonnet-4-5", api_key=KEY, sleep=sleep, **kwargs)


def ask(model: str = "gpt-4.1") -> LLMRequest:
    return LLMRequest(messages=[LLMMessage("user", "Hello?")], model=model)


async def collect(stream: AsyncIterator[str]) -> list[str]:
    return [piece async for piece in stream]
