"""What a run passes around: the tool calls it asks for, the approvals it waits on, and how it ended."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import enum
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePath
from typing import Any, Literal, get_args

from teaagent.policy._jit import PromptRequest

__all__ = [
    "BYTES_KEY",
    "REDACTED",
    "RUN_STATUSES",
    "ApprovalRequest",
    "FinalAnswer",
    "RunResult",
    "RunStatus",
    "ToolRequest",
    "ValidationResult",
    "Validator",
    "verdict_of",
]

RunStatus = Literal["completed", "failed", "approval_denied", "limit_exceeded", "cost_exceeded"]
#: Every value :attr:`RunResult.status` may take.
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
#: What :meth:`ApprovalRequest.to_dict` writes in place of a value that holds the workspace secret.
REDACTED = "[redacted]"
#: The key of the object that stands for a bytes value in :meth:`ApprovalRequest.to_dict`.
BYTES_KEY = "__bytes_base64__"
_CIRCULAR = "[circular reference]"


@dataclass(frozen=True)
class ToolRequest:
    """A tool call the model asked for, before the policy gate has seen it.

    Attributes:
        tool_name: The registered tool's name.
        arguments: The call's arguments.
        call_id: The id that ties the call to its result.
        reasoning: What the model said about why it makes the call, when it said anything.
    """

    tool_name: str
    arguments: dict[str, Any]
    call_id: str
    reasoning: str | None


@dataclass(frozen=True)
class FinalAnswer:
    """The model's last reply, which ends the run.

    Attributes:
        content: The reply's text.
        metadata: Whatever the runner records beside it (the model, the stop reason...).
    """

    content: str
    metadata: dict[str, Any]


class _SecretScrubber:
    """Finds the workspace secret in the forms it could take inside a value: raw, hex, base64, text."""

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret or b""
        self._hex = self._secret.hex()
        forms = set()
        if self._secret:
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                # The unpadded form is a prefix of the padded one, so it finds both.
                forms.add(encode(self._secret).decode("ascii").rstrip("="))
            with contextlib.suppress(UnicodeDecodeError):
                forms.add(self._secret.decode("utf-8"))
        self._text_forms = tuple(forms)

    def holds_bytes(self, value: bytes) -> bool:
        return bool(self._secret) and self._secret in value

    def text(self, value: str) -> str:
        if not self._secret:
            return value
        if self._hex in value.lower() or any(form in value for form in self._text_forms):
            return REDACTED
        return value


def _json_safe(value: object, scrubber: _SecretScrubber, open_containers: set[int]) -> Any:
    """Return ``value`` as plain JSON data: str, int, finite float, bool, None, list and str-keyed dict."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        # json.dumps would write NaN/Infinity, which strict JSON readers refuse.
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str):
        return scrubber.text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if scrubber.holds_bytes(raw):
            return REDACTED
        encoded = scrubber.text(base64.b64encode(raw).decode("ascii"))
        return REDACTED if encoded == REDACTED else {BYTES_KEY: encoded}
    if isinstance(value, enum.Enum):
        return _json_safe(value.value, scrubber, open_containers)
    if isinstance(value, PurePath):
        return scrubber.text(str(value))
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        if id(value) in open_containers:
            return _CIRCULAR
        open_containers.add(id(value))
        try:
            if isinstance(value, Mapping):
                return {
                    _json_key(key, scrubber): _json_safe(item, scrubber, open_containers)
                    for key, item in value.items()
                }
            items = [_json_safe(item, scrubber, open_containers) for item in value]
            if isinstance(value, set | frozenset):
                # A set has no order; sort by each item's JSON text so that the output is repeatable.
                items.sort(key=lambda item: json.dumps(item, sort_keys=True))
            return items
        finally:
            open_containers.discard(id(value))
    return scrubber.text(repr(value))


def _json_key(key: object, scrubber: _SecretScrubber) -> str:
    if isinstance(key, enum.Enum):
        key = key.value
    return scrubber.text(key if isinstance(key, str) else str(key))


@dataclass(frozen=True, kw_only=True)
class ApprovalRequest(PromptRequest):
    """A tool call waiting for a human's or the peers' approval: the policy's question, and the secret.

    The fields before ``workspace_secret`` are :class:`~teaagent.policy.PromptRequest`'s (the call,
    its reason, its annotations, its run). The constructor is keyword-only: the request carries the
    workspace secret, which must never land in another field by position. The secret stays out of
    :func:`repr` and out of :meth:`to_dict`.

    Attributes:
        workspace_secret: The workspace's secret that binds an approval to this workspace; never
            serialised or printed.

    Raises:
        TypeError: ``workspace_secret`` is neither bytes nor None.
    """

    workspace_secret: bytes | None = field(repr=False)

    def __post_init__(self) -> None:
        if self.workspace_secret is not None and not isinstance(self.workspace_secret, bytes):
            raise TypeError(
                f"workspace_secret must be bytes or None, not {type(self.workspace_secret).__name__}."
            )

    def to_dict(self) -> dict[str, Any]:
        """Serialise to a plain dict suitable for JSON encoding.

        ``json.dumps`` accepts the result, whatever the arguments hold: bytes become
        ``{"__bytes_base64__": "<base64>"}``, sets sorted lists, tuples lists, paths, enums and dates
        strings, non-finite floats ``"NaN"``/``"Infinity"``/``"-Infinity"``, other objects their
        ``repr``. The workspace secret is not in the result in any form (not its value, length or
        digest); a value that holds it, raw or as hex, base64 or text, is replaced by
        :data:`REDACTED`.

        Returns:
            ``{"call_id", "tool_name", "arguments", "reason", "annotations", "run_id"}``.
        """
        scrubber = _SecretScrubber(self.workspace_secret)
        asked = (question.name for question in fields(PromptRequest))
        return {name: _json_safe(getattr(self, name), scrubber, set()) for name in asked}

    @classmethod
    def asking(cls, question: PromptRequest) -> ApprovalRequest:
        """The approval request of the policy's ``question``, with no workspace secret."""
        asked = {field.name: getattr(question, field.name) for field in fields(PromptRequest)}
        return cls(**asked, workspace_secret=None)


@dataclass(frozen=True)
class RunResult:
    """How a run ended.

    Attributes:
        run_id: The run's id.
        final_answer: The model's last reply, or None when the run ended without one.
        iterations: Model turns taken.
        tool_calls: Tool calls made.
        status: One of :data:`RUN_STATUSES`: ``completed``, ``failed``, ``approval_denied``,
            ``limit_exceeded``, ``cost_exceeded``.
        metadata: Whatever the runner records beside the result.
        error_message: The sentence that says why the run did not complete, or None.
        cost_cents: What the run's model calls cost, in US cents.
        input_tokens: Prompt tokens over the whole run.
        output_tokens: Generated tokens over the whole run.

    Raises:
        ValueError: ``status`` is not one of :data:`RUN_STATUSES`, a count is negative, or
            ``cost_cents`` is negative or not finite.
    """

    run_id: str
    final_answer: FinalAnswer | None
    iterations: int
    tool_calls: int
    status: str
    metadata: dict[str, Any]
    error_message: str | None
    cost_cents: float
    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"A run status must be one of {', '.join(RUN_STATUSES)}, not {self.status!r}.")
        for name in ("iterations", "tool_calls", "input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, not {value!r}.")
        if not math.isfinite(self.cost_cents) or self.cost_cents < 0:
            raise ValueError(f"cost_cents must be a finite number >= 0, not {self.cost_cents!r}.")


@dataclass(frozen=True)
class ValidationResult:
    """A validator's verdict on a completed run's work.

    Attributes:
        ok: Whether the work passed.
        detail: What was checked or what failed, for the audit log and the result.
    """

    ok: bool
    detail: str = ""


#: Checks the work of a completed run; returns a bool or a :class:`ValidationResult`.
Validator = Callable[[FinalAnswer], "ValidationResult | bool"]


async def verdict_of(validator: Validator, answer: FinalAnswer) -> ValidationResult:
    """What ``validator`` says of ``answer``, run in a worker thread; a validator that breaks says no.

    A bool is taken as ``ValidationResult(ok=...)``; anything else, or an exception, fails closed.
    """
    try:
        verdict = await asyncio.to_thread(validator, answer)
        if isinstance(verdict, bool):
            verdict = ValidationResult(ok=verdict)
        if not isinstance(verdict, ValidationResult):
            raise TypeError(f"a validator returns a bool or a ValidationResult, not {type(verdict).__name__}")
    except Exception as exc:  # a validator that breaks has not validated anything: fail closed
        verdict = ValidationResult(ok=False, detail=f"the validator raised {type(exc).__name__}: {exc}")
    return verdict
