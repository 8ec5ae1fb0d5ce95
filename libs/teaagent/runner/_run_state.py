"""What one run carries from step to step: its counts, its conversation, how it ended, and how text is cut."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Final

from teaagent.audit import AuditLogger
from teaagent.cost_tracker import RunLogWriter, Usage
from teaagent.llm import LLMMessage, LLMResponse
from teaagent.runner._types import FinalAnswer, RunResult, ToolRequest

__all__ = [
    "MAX_REASON_CHARS",
    "MAX_TOOL_RESULT_CHARS",
    "Outcome",
    "RunState",
    "json_text",
    "last_event_hash",
    "message_chars",
    "reply_record",
]

MAX_REASON_CHARS: Final = 2000  # what approvers are shown of the model's reasoning for a call
MAX_TOOL_RESULT_CHARS: Final = 100_000  # about 25k tokens: a whole source file, not a flood of the context
_TAIL_BYTES: Final = 64 * 1024  # the run_end record is among the last lines of the audit log


@dataclass(frozen=True)
class Outcome:
    """How a run ended, before it is written up as a :class:`~teaagent.runner.RunResult`."""

    status: str
    error_message: str | None = None
    final_answer: FinalAnswer | None = None


def json_text(value: object) -> str:
    """``value`` as JSON text for the model, cut at ``MAX_TOOL_RESULT_CHARS``."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = json.dumps(repr(value))
    if len(text) > MAX_TOOL_RESULT_CHARS:
        cut = len(text) - MAX_TOOL_RESULT_CHARS
        text = text[:MAX_TOOL_RESULT_CHARS] + f"... [{cut} more characters cut by the runner]"
    return text


def message_chars(message: LLMMessage) -> int:
    chars = len(message.content)
    for call in message.tool_calls or ():
        chars += len(call.tool_name) + len(json_text(call.arguments))
    return chars


@dataclass
class RunState(Usage):
    """The counts and the conversation of one run so far: tokens and cost (:class:`Usage`), and the rest."""

    iterations: int = 0
    tool_calls: int = 0
    chars: int = 0
    audit_errors: int = 0
    writer: RunLogWriter | None = None
    call_ids: set[str] = dataclasses.field(default_factory=set)
    messages: list[LLMMessage] = dataclasses.field(default_factory=list)
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def tool_requests(self, response: LLMResponse) -> list[tuple[str, ToolRequest]]:
        """The reply's tool calls, each with the id the provider knows and a call id unique in the run."""
        reasoning = response.content[:MAX_REASON_CHARS] or None
        requests: list[tuple[str, ToolRequest]] = []
        for call in response.tool_calls:
            wire_id = call.call_id or f"call_{len(self.call_ids) + 1}"
            call_id = wire_id
            # Approvals are given per call id, so two calls must never share one, even when a
            # provider reuses ids across turns.
            if call_id in self.call_ids:
                call_id = f"{wire_id}-{len(self.call_ids) + 1}"
            self.call_ids.add(call_id)
            # Arguments that are not an object stay as they are, for the gate's schema check to refuse.
            arguments = call.arguments
            requests.append(
                (
                    wire_id,
                    ToolRequest(
                        tool_name=call.tool_name, arguments=arguments, call_id=call_id, reasoning=reasoning
                    ),
                )
            )
        return requests

    def add_reply(self, response: LLMResponse) -> None:
        """Count a model reply's cost and tokens."""
        self.add_usage(response.input_tokens, response.output_tokens, response.cost_cents)

    def totals(self, iteration: int, response: LLMResponse) -> dict[str, Any]:
        """The ``cost_checkpoint`` record after ``response``: its cost and the run's totals."""
        return {
            "iteration": iteration,
            "call_cents": response.cost_cents,
            "total_cents": self.cost_cents,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }

    def end_record(self, outcome: Outcome, *, cancelled: bool) -> dict[str, Any]:
        """The ``run_end`` record (and the ``run_finished`` event's counts)."""
        return {
            "status": outcome.status,
            "error_message": outcome.error_message,
            **self.counts(),
            "cancelled": cancelled,
        }

    def counts(self) -> dict[str, Any]:
        """What the run counted, as the ``run_end`` record and :class:`RunResult` both name it."""
        return {
            "iterations": self.iterations,
            "tool_calls": self.tool_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_cents": self.cost_cents,
        }

    def result(self, run_id: str, outcome: Outcome, metadata: dict[str, Any]) -> RunResult:
        """The run's result: how it ended, and what it counted."""
        return RunResult(
            run_id=run_id,
            final_answer=outcome.final_answer,
            status=outcome.status,
            metadata=metadata,
            error_message=outcome.error_message,
            **self.counts(),
        )


def reply_record(iteration: int, response: LLMResponse) -> dict[str, Any]:
    """The ``model_response`` record (and event) of one reply."""
    return {
        "iteration": iteration,
        "content": response.content,
        "stop_reason": response.stop_reason,
        "tool_calls": [
            {"call_id": call.call_id, "tool_name": call.tool_name, "arguments": call.arguments}
            for call in response.tool_calls
        ],
        "input_tokens": response.input_tokens,
        "output_tokens": response.output_tokens,
        "cost_cents": response.cost_cents,
    }


def last_event_hash(audit: AuditLogger) -> str | None:
    """The ``event_hash`` of the last record this logger wrote, read back from the file's tail."""
    events = audit.events
    if not events:
        return None
    event_id = events[-1].event_id
    try:
        with open(audit.path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            tail = handle.read()
    except OSError:
        return None
    marker = f'"event_id":"{event_id}"'.encode()
    for line in reversed(tail.splitlines()):
        if marker in line:
            try:
                value = json.loads(line).get("event_hash")
            except (ValueError, AttributeError):
                return None
            return value if isinstance(value, str) else None
    return None
