"""The agent loop: model turns, tool calls through the gate, budget checks, audit records and events.

One :class:`AgentRunner` makes one run. Each iteration, in order:

1. stop if the run was cancelled; refuse iteration ``n`` past ``max_iterations`` (audit
   ``iteration_limit``, status ``limit_exceeded``);
2. add the user messages steered in since the last call (event ``steered``);
3. refuse the model call when its worst-case cost (every allowed output token charged) would take
   the run above its cost cap (status ``cost_exceeded``, the call is never made);
4. call the model with the conversation and the tools (audit ``model_request``/``model_response``
   and ``cost_checkpoint``, the run log's ``model_call``, events ``model_request``, ``model_delta``,
   ``model_response``, ``cost``); an adapter error ends the run ``failed``;
5. a reply without tool calls is the final answer: status ``completed``;
6. each tool call, in order: refuse it past ``max_tool_calls`` (audit ``tool_call_limit``, status
   ``limit_exceeded``); ``ask_user`` asks the user (:attr:`AgentRunner.ask`); any other goes through
   the :class:`~teaagent.runner._gate.ToolGate` (policy, quorum, schema, rate limit, audit). A
   refusal by the policy or the quorum ends the run ``approval_denied`` (a wait that
   :meth:`AgentRunner.cancel` ended ends it cancelled); any other failure (unknown tool, bad
   arguments, rate limit, the handler's exception) goes back to the model as an error result, and
   the run goes on.

Whatever happens, ``run_start`` and ``run_end`` are audited and ``run_finished`` is the last event.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from teaagent.audit import AuditLogger
from teaagent.budget import RunBudget
from teaagent.cost_tracker import RunLogWriter, check_run_id
from teaagent.errors import ApprovalDeniedError, CostCapError, RunLimitError
from teaagent.llm import PROVIDER_CONFIGS, LLMAdapter, LLMMessage, LLMRequest, LLMResponse, LLMToolCall
from teaagent.policy import ApprovalPolicy
from teaagent.runner._ask import (
    ASK_USER_REFUSAL,
    ASK_USER_SPEC,
    ASK_USER_TOOL,
    AskCallback,
    Question,
    answer_of,
    question_of,
)
from teaagent.runner._events import EventHub, EventSink, RunEvent
from teaagent.runner._gate import ToolGate
from teaagent.runner._run_state import (
    MAX_REASON_CHARS,
    MAX_TOOL_RESULT_CHARS,
    Outcome,
    RunState,
    json_text,
    last_event_hash,
    message_chars,
    reply_record,
)
from teaagent.runner._types import (
    ApprovalRequest,
    FinalAnswer,
    RunResult,
    ToolRequest,
    ValidationResult,
    Validator,
    verdict_of,
)
from teaagent.runner._watch import watched_policy
from teaagent.session import ChatSession, ChatToolCall, SessionStore
from teaagent.tools import ToolRegistry

__all__ = [
    "ASK_USER_TOOL",
    "CANCELLED_MESSAGE",
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "DEFAULT_SYSTEM_PROMPT",
    "MAX_REASON_CHARS",
    "MAX_TOOL_RESULT_CHARS",
    "AgentRunner",
    "AskCallback",
    "Question",
    "ValidationResult",
    "Validator",
]

_log = logging.getLogger("teaagent.runner")

DEFAULT_MAX_OUTPUT_TOKENS: Final = 4096  # a long code edit fits; the cost preflight charges all of it
CANCELLED_MESSAGE: Final = "The run was cancelled."
DEFAULT_SYSTEM_PROMPT: Final = (
    "You are a careful coding agent working in a workspace through the tools you are given. "
    "Every tool call goes through a policy gate: a call may be refused, and some calls wait for "
    "approval by people or by peer nodes. Read before you change anything, keep changes small, and "
    "say what you did. When you cannot go on without a decision from the user, call ask_user. "
    "When the task is done, answer without calling a tool."
)


class _Cancelled(Exception):
    """The run was cancelled by :meth:`AgentRunner.cancel`."""


def _sentence(error: BaseException) -> str:
    text = str(error).strip()
    return text or type(error).__name__


class AgentRunner:
    """Runs one task: the model proposes, the gate disposes, the audit log records.

    One runner makes one run (:meth:`run` or :meth:`arun`, once); :meth:`cancel` and :meth:`steer`
    may be called from any thread while it runs.

    Args:
        adapter: The model.
        registry: The tools the model may call (besides the built-in ``ask_user``).
        policy: The approval policy every tool call is checked against.
        audit: The audit log of the run.
        budget: The run's limits; ``RunBudget()`` when None.
        run_id: The run's id (1 to 64 letters, digits, ``_``, ``-``); the audit logger's ``run_id``
            when None. The gate writes its records under the logger's ``run_id``, so give a logger
            made with the same ``run_id`` when passing one.
        provider: The provider's name, for cost estimates; ``adapter.provider`` when None.
        model: The model to ask; ``adapter.model`` when None, else the provider's default model.
        root: The workspace root whose ``.teaagent/runs/`` holds the run log; the policy's
            workspace root when None.
        system_prompt: The system message that starts the conversation; ``""`` for none.
        max_output_tokens: The most tokens one model reply may hold.
        temperature: The sampling temperature.
        event_sink: A callback, or several, receiving every :class:`RunEvent`.
        ask: Answers the model's questions; None declines every one.
        session_store: Where ``session`` is saved.
        session: A chat session whose messages start the conversation (their text: the tool
            calls of earlier runs are not sent again); the task, each reply that calls tools with
            its calls, each call's result (a ``tool`` message) and the final answer are appended
            to it, and it is saved when the run ends.
        label: What the run is for, in the run log (cost reports group by it).
        stream: Ask the model to stream its reply (events ``model_delta``).
        run_log: Write the run log (``<root>/.teaagent/runs/<run_id>.jsonl``).
        validator: Checks a completed run's work (say, runs the test suite) before the run is
            called completed; it is audited as ``validation_result``, and a run that fails it ends
            ``failed``. It runs in a worker thread.

    Raises:
        ValueError: The run id is invalid, ``max_output_tokens`` is below 1, the budget has a cost
            cap but the provider is unknown (the cap could not be checked before a call), the
            registry holds a tool named ``ask_user``, or ``session`` is given without ``session_store``.
        TypeError: An argument has the wrong type.
    """

    def __init__(
        self,
        *,
        adapter: LLMAdapter,
        registry: ToolRegistry,
        policy: ApprovalPolicy,
        audit: AuditLogger,
        budget: RunBudget | None = None,
        run_id: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        root: str | os.PathLike[str] | None = None,
        system_prompt: str = DEFAULT_SYSTEM_PROMPT,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        temperature: float = 0.0,
        event_sink: EventSink | Iterable[EventSink] | None = None,
        ask: AskCallback | None = None,
        session_store: SessionStore | None = None,
        session: ChatSession | None = None,
        label: str = "",
        stream: bool = False,
        run_log: bool = True,
        validator: Validator | None = None,
    ) -> None:
        budget = RunBudget() if budget is None else budget
        for name, value, kind, article in (
            ("adapter", adapter, LLMAdapter, "an"),
            ("registry", registry, ToolRegistry, "a"),
            ("policy", policy, ApprovalPolicy, "an"),
            ("audit", audit, AuditLogger, "an"),
            ("budget", budget, RunBudget, "a"),
        ):
            if not isinstance(value, kind):
                raise TypeError(f"{name} must be {article} {kind.__name__}, not {type(value).__name__}.")
        if (
            isinstance(max_output_tokens, bool)
            or not isinstance(max_output_tokens, int)
            or max_output_tokens < 1
        ):
            raise ValueError(f"max_output_tokens must be an int >= 1, not {max_output_tokens!r}.")
        if ASK_USER_TOOL in registry:
            raise ValueError(f"The registry holds a tool named {ASK_USER_TOOL!r}, which the runner provides.")
        if session is not None and session_store is None:
            raise ValueError("A session needs the session_store to save it in.")
        self.run_id = run_id if run_id is not None else audit.run_id
        if run_log:
            check_run_id(self.run_id)
        self.adapter = adapter
        self.registry = registry
        self.audit = audit
        self.budget = budget
        resolved_provider = provider if provider is not None else getattr(adapter, "provider", None)
        if resolved_provider is not None and resolved_provider not in PROVIDER_CONFIGS:
            raise ValueError(
                f"Unknown LLM provider {resolved_provider!r}; choose one of: {', '.join(PROVIDER_CONFIGS)}."
            )
        if resolved_provider is None and budget.max_estimated_cost_cents is not None:
            # A cap that cannot be checked before a call does not cap anything: refuse to start.
            raise ValueError(
                "The run has a cost cap but its provider is unknown; pass provider= so that each model "
                "call's cost can be checked before it is made."
            )
        self.provider: str | None = resolved_provider
        default_model = PROVIDER_CONFIGS[resolved_provider].default_model if resolved_provider else "model"
        self.model: str = model or getattr(adapter, "model", None) or default_model
        self.root = Path(os.fspath(root)) if root is not None else Path(policy.workspace_root)
        self.system_prompt = system_prompt
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature
        self.ask = ask
        self.session_store = session_store
        self.session = session
        self.label = label
        self.stream = stream
        self.run_log = run_log
        self.validator = validator
        if event_sink is None:
            sinks: list[EventSink] = []
        elif callable(event_sink):
            sinks = [event_sink]
        else:
            sinks = list(event_sink)
        self._hub = EventHub(sinks)
        self.policy = watched_policy(policy, self._approval_waiting, self._emit)
        self._gate = ToolGate(registry=registry, policy=self.policy, audit=audit, run_id=self.run_id)
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._steering: list[str] = []
        self._started = False
        self._done = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight: asyncio.Future[LLMResponse] | None = None
        self._result: RunResult | None = None

    # -- control from any thread ---------------------------------------------------------------------

    def cancel(self) -> bool:
        """Stop the run: a model call in flight is abandoned, no further model or tool step starts.

        A tool call already running (or waiting for an approval) finishes first; a wait for an
        approval that the cancel ends (the quorum gate's ``stop``, a prompt answered no) counts as
        the cancel, not as a denial. The run ends with status ``failed``, error message
        :data:`CANCELLED_MESSAGE` and ``metadata["cancelled"]``.
        Thread-safe.

        Returns:
            False when the run had already finished, else True.
        """
        with self._lock:
            if self._done:
                return False
            self._cancel.set()
            inflight, loop = self._inflight, self._loop
        if inflight is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing left to stop
                loop.call_soon_threadsafe(inflight.cancel)
        return True

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._cancel.is_set()

    def steer(self, text: str) -> bool:
        """Add a user message to the conversation, sent with the next model call. Thread-safe.

        Args:
            text: The message.

        Returns:
            False when the run has finished (the message was not taken), else True.

        Raises:
            ValueError: ``text`` is empty.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError("A steering message must be a non-empty string.")
        with self._lock:
            if self._done:
                return False
            self._steering.append(text)
            return True

    def add_sink(self, sink: EventSink) -> None:
        """Send every event emitted from now on to ``sink`` as well."""
        self._hub.add_sink(sink)

    def events(self) -> AsyncIterator[RunEvent]:
        """An async iterator over the run's events, from the first to ``run_finished``.

        It may start before or during the run (it replays what it missed), from any event loop.

        Returns:
            An ``AsyncIterator[RunEvent]``.
        """
        return self._hub.stream()

    @property
    def history(self) -> list[RunEvent]:
        """The events emitted so far."""
        return self._hub.history

    @property
    def result(self) -> RunResult | None:
        """The run's result once it has finished, else None."""
        return self._result

    # -- running -------------------------------------------------------------------------------------

    def run(self, task: str) -> RunResult:
        """Run ``task`` to its end and return how it ended (a blocking wrapper of :meth:`arun`).

        Args:
            task: What the user asks the agent to do.

        Returns:
            The run's result; its status says how it ended (the run itself never raises for a
            refused call, a budget limit or a model error).

        Raises:
            RuntimeError: The runner has already run, or this is called inside a running event loop
                (use :meth:`arun` there).
            ValueError: ``task`` is empty.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(task))
        raise RuntimeError("AgentRunner.run() cannot be called inside an event loop; await arun() instead.")

    async def arun(self, task: str) -> RunResult:
        """Run ``task`` to its end and return how it ended.

        Args:
            task: What the user asks the agent to do.

        Returns:
            The run's result.

        Raises:
            RuntimeError: The runner has already run.
            ValueError: ``task`` is empty.
            asyncio.CancelledError: The task running this coroutine was cancelled; the run is
                recorded as cancelled first.
        """
        if not isinstance(task, str) or not task.strip():
            raise ValueError("A run needs a task: a non-empty string.")
        with self._lock:
            if self._started:
                raise RuntimeError("An AgentRunner makes one run; make a new one for the next task.")
            self._started = True
            self._loop = asyncio.get_running_loop()
        state = RunState()
        outcome = Outcome(status="failed", error_message="The run did not start.")
        interrupted: BaseException | None = None
        try:
            outcome = await self._run(task, state)
            if outcome.status == "completed" and self.validator is not None and outcome.final_answer:
                outcome = await self._validate(self.validator, outcome.final_answer)
        except _Cancelled:
            outcome = Outcome(status="failed", error_message=CANCELLED_MESSAGE)
        except asyncio.CancelledError as exc:
            self._cancel.set()
            outcome = Outcome(status="failed", error_message=CANCELLED_MESSAGE)
            interrupted = exc
        except Exception as exc:  # a bug must still leave run_end behind, and a failed result
            _log.exception("the run %s failed", self.run_id)
            outcome = Outcome(status="failed", error_message=f"Internal error: {type(exc).__name__}: {exc}")
        result = self._finish(state, outcome)
        if interrupted is not None:
            raise interrupted
        return result

    # -- the loop ------------------------------------------------------------------------------------

    async def _run(self, task: str, state: RunState) -> Outcome:
        self._start(task, state)
        try:
            state.writer = self._open_run_log()
        except OSError as exc:
            return Outcome(status="failed", error_message=f"The run log cannot be written: {_sentence(exc)}.")
        self._emit(
            "run_started",
            {
                "run_id": self.run_id,
                "task": task,
                "provider": self.provider,
                "model": self.model,
                "tools": [tool["name"] for tool in state.tools],
                "budget": dataclasses.asdict(self.budget),
            },
        )
        iteration = 0
        while True:
            self._check_cancelled()
            iteration += 1
            reply = await self._model_turn(iteration, state)
            if isinstance(reply, Outcome):
                return reply
            requests = state.tool_requests(reply)
            self._append(
                state,
                LLMMessage(
                    "assistant",
                    reply.content,
                    tool_calls=[
                        LLMToolCall(call_id=wire_id, tool_name=request.tool_name, arguments=request.arguments)
                        for wire_id, request in requests
                    ]
                    or None,
                ),
            )
            if requests and self.session is not None:
                self.session.add_message(
                    "assistant",
                    reply.content,
                    tool_calls=tuple(
                        ChatToolCall(
                            call_id=request.call_id,
                            tool_name=request.tool_name,
                            arguments=request.arguments if isinstance(request.arguments, dict) else {},
                        )
                        for _wire_id, request in requests
                    ),
                )
            if not requests:
                metadata: dict[str, Any] = {"stop_reason": reply.stop_reason, "iteration": iteration}
                if reply.stop_reason == "max_tokens":
                    metadata["truncated"] = True
                return Outcome(
                    status="completed", final_answer=FinalAnswer(content=reply.content, metadata=metadata)
                )
            outcome = await self._tool_turn(requests, state)
            if outcome is not None:
                return outcome

    def _start(self, task: str, state: RunState) -> None:
        """Build the conversation and the tool list, and audit ``run_start``."""
        state.tools = [
            {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
            for tool in self.registry.list_tools()
        ]
        state.tools.append(ASK_USER_SPEC)
        state.chars = len(json_text(state.tools))
        if self.system_prompt:
            self._append(state, LLMMessage("system", self.system_prompt))
        if self.session is not None:
            # The conversation's text; the tool calls of earlier runs are on record, not sent again.
            for message in self.session.messages:
                if message.conversational:
                    self._append(state, LLMMessage(message.role, message.content))
            self.session.add_message("user", task)
        self._append(state, LLMMessage("user", task))
        # Disk errors from before the run are not this run's; one from run_start on stops tool calls.
        state.audit_errors = self.audit.disk_error_count
        self._audit(
            "run_start",
            {
                "task": task,
                "provider": self.provider,
                "model": self.model,
                "tools": [tool["name"] for tool in state.tools],
                "permission_mode": self.policy.permission_mode.value,
                "budget": dataclasses.asdict(self.budget),
                "session_id": None if self.session is None else self.session.id,
            },
        )

    @staticmethod
    def _append(state: RunState, message: LLMMessage) -> None:
        state.messages.append(message)
        state.chars += message_chars(message)

    async def _model_turn(self, iteration: int, state: RunState) -> LLMResponse | Outcome:
        """Steps 1 to 4 of an iteration: limits, steering, the cost preflight, the model call."""
        budget = self.budget
        try:
            budget.check_iteration(iteration)
        except RunLimitError as exc:
            self._audit("iteration_limit", {"iteration": iteration, "max_iterations": budget.max_iterations})
            return Outcome(status="limit_exceeded", error_message=_sentence(exc))
        steered = self._take_steering()
        for text in steered:
            self._append(state, LLMMessage("user", text))
            self._emit("steered", {"iteration": iteration, "text": text})
        if self.provider is not None:
            try:
                budget.check_cost_preflight(
                    self.provider,
                    self.model,
                    state.chars,
                    self.max_output_tokens,
                    spent_cents=state.cost_cents,
                )
            except CostCapError as exc:
                refusal = {"iteration": iteration, "total_cents": state.cost_cents, "refused": "preflight"}
                self._audit("cost_checkpoint", {**refusal, "reason": _sentence(exc)})
                return Outcome(status="cost_exceeded", error_message=_sentence(exc))
        request = LLMRequest(
            messages=list(state.messages),
            model=self.model,
            max_tokens=self.max_output_tokens,
            tools=state.tools,
            temperature=self.temperature,
        )
        size = {
            "iteration": iteration,
            "message_count": len(state.messages),
            "approx_input_chars": state.chars,
        }
        self._audit(
            "model_request",
            {
                **size,
                "provider": self.provider,
                "model": self.model,
                "max_tokens": self.max_output_tokens,
                "tool_count": len(state.tools),
                "steered": steered,
            },
        )
        self._emit("model_request", size)
        state.iterations = iteration
        try:
            response = await self._call_model(request, iteration)
        except (_Cancelled, asyncio.CancelledError):
            raise
        except Exception as exc:  # the adapter converts provider errors; anything else fails too
            self._audit("model_response", {"iteration": iteration, "error": _sentence(exc)})
            return Outcome(status="failed", error_message=_sentence(exc))
        state.add_reply(response)
        if state.writer is not None:
            try:
                state.writer.record_model_call(
                    self.model, response.input_tokens, response.output_tokens, float(response.cost_cents)
                )
            except OSError as exc:
                # A cost that no report would show: stop rather than spend more unrecorded.
                return Outcome(
                    status="failed", error_message=f"The run log cannot be written: {_sentence(exc)}."
                )
        reply, totals = reply_record(iteration, response), state.totals(iteration, response)
        self._audit("model_response", reply)
        self._audit("cost_checkpoint", totals)
        self._emit("model_response", reply)
        self._emit("cost", {**totals, "cap_cents": budget.max_estimated_cost_cents})
        try:
            budget.check_cost(state.cost_cents)
        except CostCapError as exc:
            return Outcome(status="cost_exceeded", error_message=_sentence(exc))
        return response

    async def _tool_turn(self, requests: list[tuple[str, ToolRequest]], state: RunState) -> Outcome | None:
        """Step 6: the reply's tool calls, in order; an outcome when one of them ends the run."""
        budget = self.budget
        for wire_id, request in requests:
            self._check_cancelled()
            try:
                budget.check_tool_calls(state.tool_calls + 1)
            except RunLimitError as exc:
                self._audit(
                    "tool_call_limit",
                    {
                        "tool_name": request.tool_name,
                        "call_id": request.call_id,
                        "max_tool_calls": budget.max_tool_calls,
                    },
                )
                return Outcome(status="limit_exceeded", error_message=_sentence(exc))
            state.tool_calls += 1
            if request.tool_name == ASK_USER_TOOL:
                content = await self._ask_user(request)
            elif self.audit.disk_error_count > state.audit_errors:
                # Fail closed: a tool call that cannot be put on record is not made.
                error = self.audit.disk_error
                message = f"The audit log cannot be written, so no tool is called: {error}."
                return Outcome(status="failed", error_message=message)
            else:
                try:
                    content = await self._call_tool(request)
                except ApprovalDeniedError as exc:
                    if self._cancel.is_set():
                        # The cancel ended the wait (a quorum withdrawn, a prompt answered no):
                        # the run was cancelled, not denied; the call's event says what became of it.
                        raise _Cancelled from None
                    reason = _sentence(exc)
                    if request.tool_name not in reason:
                        reason = f"{request.tool_name} was denied: {reason}"
                    return Outcome(status="approval_denied", error_message=reason)
            self._append(state, LLMMessage("tool", content, tool_call_id=wire_id))
        return None

    async def _call_model(self, request: LLMRequest, iteration: int) -> LLMResponse:
        if self.stream:

            def on_text(text: str) -> None:
                if text:
                    self._emit("model_delta", {"iteration": iteration, "text": text})

            call = self.adapter.complete_streaming(request, on_text)
        else:
            call = self.adapter.complete(request)
        task: asyncio.Future[LLMResponse] = asyncio.ensure_future(call)
        with self._lock:
            self._inflight = task
            cancelled = self._cancel.is_set()
        if cancelled:
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._cancel.is_set() and (current is None or not current.cancelling()):
                raise _Cancelled from None
            raise
        finally:
            with self._lock:
                self._inflight = None

    async def _call_tool(self, request: ToolRequest) -> str:
        """Run one call through the gate; return the tool message's content. Denials propagate."""
        self._emit(
            "tool_call",
            {
                "call_id": request.call_id,
                "tool_name": request.tool_name,
                "arguments": request.arguments,
                "reason": request.reasoning or "",
            },
        )
        try:
            # The gate may block for minutes (a quorum, a person at a prompt): keep the loop free.
            result = await asyncio.to_thread(
                self._gate.call,
                request.tool_name,
                request.arguments,
                call_id=request.call_id,
                reason=request.reasoning or "",
            )
        except ApprovalDeniedError as exc:
            self._emit(
                "approval_denied",
                {"call_id": request.call_id, "tool_name": request.tool_name, "reason": _sentence(exc)},
            )
            self._record_result(request, _sentence(exc), ok=False)
            raise
        except Exception as exc:
            error = {"error": _sentence(exc), "error_type": type(exc).__name__}
            self._tool_result(request, ok=False, **error)
            return self._record_result(request, json_text(error), ok=False)
        self._tool_result(request, ok=True, result=result)
        return self._record_result(request, json_text(result), ok=True)

    def _tool_result(self, request: ToolRequest, *, ok: bool, **data: Any) -> None:
        self._emit(
            "tool_result", {"call_id": request.call_id, "tool_name": request.tool_name, "ok": ok, **data}
        )

    def _record_result(self, request: ToolRequest, content: str, *, ok: bool) -> str:
        """Add a call's result to the session (a ``tool`` message); return ``content``."""
        if self.session is not None:
            self.session.add_message(
                "tool", content, tool_call_id=request.call_id, tool_name=request.tool_name, ok=ok
            )
        return content

    async def _ask_user(self, request: ToolRequest) -> str:
        base = {"tool_name": ASK_USER_TOOL, "call_id": request.call_id, "arguments": request.arguments}
        asked = question_of(request.arguments)
        if asked is None:
            error = ASK_USER_REFUSAL
            self._audit("tool_error", {**base, "error": error, "stage": "arguments"})
            self._tool_result(request, ok=False, error=error)
            return self._record_result(
                request, json_text({"error": error, "error_type": "SchemaValidationError"}), ok=False
            )
        question, options = asked
        self._audit("tool_call", {**base, "reason": request.reasoning or ""})
        self._emit("question", {"call_id": request.call_id, "question": question, "options": list(options)})
        answer = await answer_of(
            self.ask,
            Question(call_id=request.call_id, question=question, options=options, run_id=self.run_id),
        )
        result: dict[str, Any] = {"declined": True} if answer is None else {"answer": answer}
        self._audit("tool_result", {**base, "result": result})
        self._emit("answer", {"call_id": request.call_id, "answered": answer is not None, "answer": answer})
        return self._record_result(request, json_text(result), ok=True)

    # -- pieces --------------------------------------------------------------------------------------

    def _check_cancelled(self) -> None:
        if self._cancel.is_set():
            raise _Cancelled

    def _take_steering(self) -> list[str]:
        with self._lock:
            taken, self._steering = self._steering, []
        return taken

    def _audit(self, event_type: str, payload: dict[str, Any]) -> None:
        self.audit.log(event_type, payload, run_id=self.run_id)

    def _emit(self, kind: str, data: dict[str, Any]) -> None:
        self._hub.emit(kind, data)

    def _open_run_log(self) -> RunLogWriter | None:
        if not self.run_log:
            return None
        return RunLogWriter(
            self.root, self.run_id, label=self.label, provider=self.provider or "", model=self.model
        )

    async def _validate(self, validator: Validator, answer: FinalAnswer) -> Outcome:
        """Run the post-run validator on a completed run; its verdict is audited either way."""
        verdict = await verdict_of(validator, answer)
        report = {"ok": verdict.ok, "detail": verdict.detail}
        self._audit("validation_result", report)
        self._emit("validation", report)
        if verdict.ok:
            return Outcome(status="completed", final_answer=answer)
        return Outcome(
            status="failed",
            error_message=f"Post-run validation failed: {verdict.detail or 'the validator said no'}.",
            final_answer=answer,
        )

    def _finish(self, state: RunState, outcome: Outcome) -> RunResult:
        cancelled = self._cancel.is_set() and outcome.error_message == CANCELLED_MESSAGE
        metadata: dict[str, Any] = {
            "provider": self.provider,
            "model": self.model,
            "cancelled": cancelled,
            "audit_log": str(self.audit.path),
            "run_log": None if state.writer is None else str(state.writer.path),
        }
        if outcome.final_answer is not None:
            metadata["stop_reason"] = outcome.final_answer.metadata.get("stop_reason")
        writer = state.writer
        if writer is not None:
            try:
                if not writer.finished:
                    writer.finish(outcome.status)
            except (OSError, RuntimeError) as exc:
                metadata["run_log_error"] = _sentence(exc)
                with contextlib.suppress(Exception):
                    writer.close()
        if self.session is not None and self.session_store is not None:
            metadata["session_id"] = self.session.id
            try:
                if outcome.final_answer is not None:
                    self.session.add_message("assistant", outcome.final_answer.content)
                self.session_store.save(self.session)
            except Exception as exc:  # the run's outcome stands; the caller learns the session was not saved
                metadata["session_error"] = _sentence(exc)
        end = state.end_record(outcome, cancelled=cancelled)
        self._audit("run_end", end)
        last_hash = last_event_hash(self.audit)
        if last_hash is not None:
            metadata["last_audit_hash"] = last_hash
        if self.audit.disk_error_count:
            metadata["audit_disk_error"] = str(self.audit.disk_error)
        result = state.result(self.run_id, outcome, metadata)
        with self._lock:
            self._done = True
            self._result = result
        self._emit(
            "run_finished",
            {
                **end,
                "run_id": self.run_id,
                "final_answer": None if outcome.final_answer is None else outcome.final_answer.content,
            },
        )
        return result

    def _approval_waiting(self, request: ApprovalRequest, via: str, extra: Mapping[str, Any]) -> None:
        self._audit("approval_request", {**request.to_dict(), "via": via, **extra})
        self._emit("approval_waiting", {**request.to_dict(), "via": via, **extra})
