"""Runs over HTTP: each one a task of the service, its frames kept for every reader, its answers awaited.

A run belongs to a session; a session has one run at a time (``busy``), and the service holds the
workspace lock of :mod:`teaagent.mcp_server` while any of its runs goes (``locked`` when another
process holds it). The run is the service's task, not the request's: a client that disconnects
leaves it running, and another reads the same frames from ``GET /runs/events`` (from its
``Last-Event-ID`` on).

The frames, in the order the run makes them (``id`` counts from 1 in each run):

=======================  ============================================================================
event                    data
=======================  ============================================================================
``run_accepted``         first, as soon as the run is accepted: ``run_id``, ``session_id``, ``model``,
                         ``resumed``
(runner events)          every :class:`teaagent.runner.RunEvent` under its own kind (``run_started``,
                         ``model_delta``, ``tool_call``, ``approval_waiting``, ``run_finished``...),
                         its data as the runner wrote it, with ``at``
``approval_requested``   a call waits for ``POST /runs/approvals`` (``ask``): ``call_id``,
                         ``tool_name``, ``arguments``, ``command``, ``timeout_seconds``
``approval_answered``    how the run's approvals answered a call: ``call_id``, ``approved``, ``by``
                         (``deny``, ``auto``, ``commands``, ``client``, ``timeout``, ``cancel``)
``question_asked``       the model asks (``questions = "ask"``): ``call_id``, ``question``, ``options``
``quorum_requested``     the node's relay took the quorum request: ``request_id``, ``tool_name``,
                         ``required``, ``peers``, ``expires_at``
``quorum_decision``      one peer's decision, as the relay counted it: ``peer``, ``decision``
                         (``approved`` or ``denied``), ``reason``, ``signers``, ``denied_by``,
                         ``seconds_left``
``quorum_outcome``       the relay's outcome (``approved``, ``denied``, ``expired``); the run still
                         verifies the certificate itself, and says so with ``approval_granted``
``compacted``            the session was compacted before the run (``CompactionOut``)
``error``                an ``ErrorOut``: ``timeout`` when the run's deadline stopped it
``result``               the ``ResultOut``; always the last frame
=======================  ============================================================================
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from teaagent.policy import PromptAnswer, PromptRequest, remember_key
from teaagent.runner import AgentRunner, Question, RunEvent, RunResult
from teaagent_agent._schemas import (
    FrameOut,
    PendingOut,
    ResultOut,
    RunOptions,
    ToolOut,
    UsageOut,
)

Hook = Callable[[str, dict[str, Any]], None]

__all__ = [
    "KEEPALIVE_SECONDS",
    "SHELL_CHARACTERS",
    "ActiveRun",
    "Frame",
    "RunChannel",
    "command_matches",
]

logger = logging.getLogger("teaagent.agent")

KEEPALIVE_SECONDS: Final = 15.0  # an idle stream sends a comment this often, so a gone client is noticed
MAX_TOOL_OUTPUT_CHARS: Final = 4000  # of each tool's output in a result; the frames have it whole
#: A command holding one of these never matches an approved command: each can start another command,
#: substitute one, or redirect into a file.
SHELL_CHARACTERS: Final = frozenset(";|&$`<>()\\\n\r\x00")
SHELL_TOOLS: Final = frozenset({"shell.run"})


def command_matches(command: str, approved: list[str]) -> bool:
    """Whether ``command`` is one of ``approved`` or continues one with arguments.

    A command holding any of :data:`SHELL_CHARACTERS` never matches; words are compared whole, so
    ``git status`` approves ``git status -s`` but not ``git statusx``.
    """
    if not command.strip() or any(character in SHELL_CHARACTERS for character in command):
        return False
    words = command.split()
    for entry in approved:
        wanted = entry.split()
        if wanted and words[: len(wanted)] == wanted:
            return True
    return False


@dataclass(frozen=True)
class Frame:
    """One frame of a run's stream."""

    id: int
    event: str
    data: dict[str, Any]
    encoded: bytes

    def out(self) -> FrameOut:
        return FrameOut(id=self.id, event=self.event, data=self.data)


def _encode(frame_id: int, event: str, data: dict[str, Any]) -> bytes:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"id: {frame_id}\nevent: {event}\ndata: {body}\n\n".encode()


class RunChannel:
    """The frames of one run, in order, for any number of readers.

    Frames are sent from any thread (:meth:`send`) into one queue that a single callback on the
    loop drains, so a burst of frames costs one wake-up of the loop, not one each; readers wait
    on one event that the drain sets.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._thread = threading.get_ident()
        self.frames: list[Frame] = []
        self.closed = False
        self._changed = asyncio.Event()
        self._queue: collections.deque[tuple[str, dict[str, Any], Hook | None]] = collections.deque()
        self._queue_lock = threading.Lock()
        self._draining = False
        #: Set once a reader took its first chunk: the run's heavy start waits for it (briefly).
        self.first_read = asyncio.Event()

    def publish(self, event: str, data: dict[str, Any]) -> Frame:
        """Append a frame (in the loop's thread) and wake the readers."""
        number = len(self.frames) + 1
        frame = Frame(number, event, data, _encode(number, event, data))
        self.frames.append(frame)
        self._changed.set()
        return frame

    def send(self, event: str, data: dict[str, Any], hook: Hook | None = None) -> None:
        """Publish from any thread, in the order of the calls (one from the loop's thread is queued too).

        ``hook(event, data)`` runs in the loop's thread just before the frame is published.
        """
        with self._queue_lock:
            self._queue.append((event, data, hook))
            if self._draining:
                return
            self._draining = True
        if threading.get_ident() == self._thread:
            self.loop.call_soon(self._drain)
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
                self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        while True:
            with self._queue_lock:
                if not self._queue:
                    self._draining = False
                    return
                batch = list(self._queue)
                self._queue.clear()
            for event, data, hook in batch:
                if self.closed:
                    continue
                if hook is not None:
                    hook(event, data)
                if event:  # "" only runs the hook, in its place among the frames
                    self.publish(event, data)

    def close(self) -> None:
        self.closed = True
        self._changed.set()

    async def follow(self, after: int = 0, *, keepalive: float = KEEPALIVE_SECONDS) -> AsyncIterator[bytes]:
        """Yield the encoded frames after ``after`` as they come (several at once when they queued up),
        an SSE comment when idle for ``keepalive`` seconds, and stop after the last one."""
        index = max(0, after)
        changed = self._changed
        while True:
            if index < len(self.frames):
                chunk = b"".join(frame.encoded for frame in self.frames[index:])
                index = len(self.frames)
                self.first_read.set()
                yield chunk
                continue
            if self.closed:
                return
            # Nothing runs between the clear and the wait (one thread): no frame can slip between.
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), keepalive)
            except TimeoutError:
                yield b": keepalive\n\n"


@dataclass
class Pending:
    """An approval or a question the run waits on, answered from another thread."""

    out: PendingOut
    done: threading.Event = field(default_factory=threading.Event)
    answer: Any = None
    by: str = ""
    remember: bool = False


@dataclass
class QuorumWatch:
    """What the relay has said so far about one quorum request of the run."""

    request_id: str
    call_id: str
    tool_name: str
    required: int
    peers: list[str]
    expires_at: int
    announced: bool = False
    signers: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    state: str = "pending"


class ActiveRun:
    """One run of the service: its runner, frames, pending answers and, once over, its result.

    Args:
        session_id: The session it runs in.
        run_id: The run's id.
        options: The run's options from the request.
        channel: Where its frames go.
    """

    def __init__(self, *, session_id: str, run_id: str, options: RunOptions, channel: RunChannel) -> None:
        self.session_id = session_id
        self.run_id = run_id
        self.options = options
        self.channel = channel
        self.runner: AgentRunner | None = None
        self.stop_event = threading.Event()
        self.started = time.monotonic()
        self.cancelled = False
        self.timed_out = False
        self.result: ResultOut | None = None
        self.task: asyncio.Task[None] | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, Pending] = {}
        self._quorum: dict[str, QuorumWatch] = {}
        self._waiting_quorum: str | None = None
        self._tools: dict[str, ToolOut] = {}
        self._questions: list[str] = []
        self._context_chars = 0
        self._early_steering: list[str] = []

    # -- frames ----------------------------------------------------------------------------------

    def sink(self, event: RunEvent) -> None:
        """The runner's event sink: every event becomes a frame, in order (called from any thread)."""
        self.channel.send(event.kind, {**event.data, "at": event.at}, self._observe)

    def send(self, event: str, data: dict[str, Any]) -> None:
        self.channel.send(event, data, self._observe)

    def _observe(self, event: str, data: dict[str, Any]) -> None:
        """Keep what the result and ``GET /runs/state`` need (in the loop's thread, frame by frame)."""
        if event == "model_delta":
            return  # the most frequent frame by far, and nothing to keep
        if event == "tool_call":
            arguments = data.get("arguments")
            self._tools[str(data["call_id"])] = ToolOut(
                call_id=str(data["call_id"]),
                name=str(data["tool_name"]),
                arguments=arguments if isinstance(arguments, dict) else {},
                skipped=True,
            )
        elif event == "tool_result":
            tool = self._tools.get(str(data["call_id"]))
            if tool is not None:
                output = data.get("result") if data.get("ok") else data.get("error")
                text = (
                    output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
                )
                tool.output = text[:MAX_TOOL_OUTPUT_CHARS]
                tool.ok = bool(data.get("ok"))
                tool.skipped = False
            self._end_quorum(str(data["call_id"]))
        elif event == "approval_denied":
            tool = self._tools.get(str(data["call_id"]))
            if tool is not None:
                tool.output = str(data.get("reason", ""))[:MAX_TOOL_OUTPUT_CHARS]
                tool.ok = False
                tool.skipped = True
            self._end_quorum(str(data["call_id"]))
        elif event == "approval_granted":
            self._end_quorum(str(data["call_id"]))
        elif event == "question":
            self._questions.append(str(data.get("question", "")))
        elif event == "model_request":
            self._context_chars = int(data.get("approx_input_chars", 0))
        elif event == "approval_waiting" and data.get("via") == "quorum":
            watch = QuorumWatch(
                request_id=str(data["request_id"]),
                call_id=str(data["call_id"]),
                tool_name=str(data["tool_name"]),
                required=int(data["required_approvals"]),
                peers=[str(peer) for peer in data["peers"]],
                expires_at=int(data["expires_at"]),
            )
            with self._lock:
                self._quorum[watch.request_id] = watch
                self._waiting_quorum = watch.request_id

    def _end_quorum(self, call_id: str) -> None:
        with self._lock:
            waiting = self._quorum.get(self._waiting_quorum or "")
            if waiting is not None and waiting.call_id == call_id:
                self._waiting_quorum = None

    # -- the quorum, as the relay reports it (the gate's thread) ---------------------------------

    def quorum_status(self, status: Any) -> None:
        """``RelayQuorumGate``'s ``on_status``: frames for the request taken, each decision, the outcome.

        Queued with the run's other frames, so they keep their order with the ones the gate's
        thread sends before and after (``approval_waiting``, ``approval_granted``).
        """
        self.channel.send("", {"status": status}, lambda _event, data: self._quorum_status(data["status"]))

    def quorum_wait(self, progress: Any) -> None:
        """``RelayQuorumGate``'s ``on_wait``: a ``quorum_progress`` frame, worded as every surface words it.

        When the request is sent, on each change (a peer's relay received it, a peer signed or
        denied), at the reminder marks of the time left, and when it is decided: the counts, who
        received it, ``seconds_left``, ``approve_command`` (what a peer's operator runs) and
        ``text`` (``describe_wait``). The signers and deniers are the ones that verify here.
        """
        self.channel.send(
            "", {"progress": progress}, lambda _event, data: self._quorum_wait(data["progress"])
        )

    def _quorum_wait(self, progress: Any) -> None:
        with self._lock:
            watch = self._quorum.get(progress.request_id)
        if watch is None or self.channel.closed:
            return
        self.channel.publish("quorum_progress", {"call_id": watch.call_id, **progress.to_dict()})

    def _quorum_status(self, status: Any) -> None:
        with self._lock:
            watch = self._quorum.get(status.request_id)
        if watch is None or self.channel.closed:
            return
        seconds_left = max(0, int(status.expires_at - time.time()))
        base = {"request_id": watch.request_id, "call_id": watch.call_id, "tool_name": watch.tool_name}
        if not watch.announced:
            watch.announced = True
            self.channel.publish(
                "quorum_requested",
                {
                    **base,
                    "required": status.required,
                    "peers": list(status.peers),
                    "expires_at": status.expires_at,
                    "seconds_left": seconds_left,
                },
            )
        counted = {
            "signers": list(status.signers),
            "denied_by": list(status.denied_by),
            "required": status.required,
        }
        for peer in status.denied_by:
            if peer not in watch.denied_by:
                reason = str(status.denial_reasons.get(peer, ""))
                self.channel.publish(
                    "quorum_decision",
                    {
                        **base,
                        "peer": peer,
                        "decision": "denied",
                        "reason": reason,
                        **counted,
                        "seconds_left": seconds_left,
                    },
                )
        for peer in status.signers:
            if peer not in watch.signers:
                self.channel.publish(
                    "quorum_decision",
                    {
                        **base,
                        "peer": peer,
                        "decision": "approved",
                        "reason": "",
                        **counted,
                        "seconds_left": seconds_left,
                    },
                )
        with self._lock:
            watch.signers, watch.denied_by = tuple(status.signers), tuple(status.denied_by)
        if status.state != "pending" and watch.state == "pending":
            watch.state = status.state
            self.channel.publish(
                "quorum_outcome",
                {
                    **base,
                    "state": status.state,
                    "signers": list(status.signers),
                    "denied_by": list(status.denied_by),
                },
            )

    # -- answers (the gate's worker threads wait, the routes answer) -----------------------------

    def prompter(self, request: PromptRequest, /) -> PromptAnswer:
        """The policy's prompter: the run's ``ApprovalPolicy`` answers what the permission leaves open."""
        policy = self.options.approvals
        command = request.arguments.get("command") if request.tool_name in SHELL_TOOLS else None
        shown = command if isinstance(command, str) else _describe(request.tool_name, request.arguments)
        answer, remember = PromptAnswer.DENY, False
        # "remember" approves the same program of a command (the tool, for any other call); a
        # compound command has none, and is approved once whatever the client says.
        remembered = remember_key(request.tool_name, request.arguments)
        by: str = policy.mode
        if self.stop_event.is_set():
            by = "cancel"
        elif policy.mode == "auto":
            answer = PromptAnswer.ONCE
        elif policy.mode == "commands":
            if isinstance(command, str) and command_matches(command, policy.commands):
                answer = PromptAnswer.ONCE
        elif policy.mode == "ask":
            timeout = self.options.answer_timeout
            pending = Pending(
                PendingOut(
                    kind="approval",
                    call_id=request.call_id,
                    command=shown,
                    timeout_seconds=int(timeout),
                    remember_supported=remembered is not None,
                    tool_name=request.tool_name,
                )
            )
            self.send(
                "approval_requested",
                {
                    "call_id": request.call_id,
                    "tool_name": request.tool_name,
                    "arguments": request.arguments,
                    "command": shown,
                    "reason": request.reason,
                    "timeout_seconds": int(timeout),
                    "remember_supported": remembered is not None,
                },
            )
            approved, by, remember = self._wait(pending, timeout)
            if approved:
                answer = PromptAnswer.SESSION if remember and remembered is not None else PromptAnswer.ONCE
        self.send(
            "approval_answered",
            {
                "call_id": request.call_id,
                "tool_name": request.tool_name,
                "approved": answer is not PromptAnswer.DENY,
                "remember": answer is PromptAnswer.SESSION,
                "by": by,
            },
        )
        return answer

    def ask(self, question: Question) -> str | None:
        """The runner's ask callback with ``questions = "ask"``: the client answers, or the wait runs out."""
        timeout = self.options.answer_timeout
        pending = Pending(
            PendingOut(
                kind="question",
                call_id=question.call_id,
                question=question.question,
                options=list(question.options),
                timeout_seconds=int(timeout),
            )
        )
        self.send(
            "question_asked",
            {
                "call_id": question.call_id,
                "question": question.question,
                "options": list(question.options),
                "allow_multiple": False,
                "timeout_seconds": int(timeout),
            },
        )
        answer, _by, _remember = self._wait(pending, timeout)
        return answer if isinstance(answer, str) else None

    def _wait(self, pending: Pending, timeout: float) -> tuple[Any, str, bool]:
        call_id = pending.out.call_id
        with self._lock:
            self._pending[call_id] = pending
        try:
            if self.stop_event.is_set() or not pending.done.wait(timeout):
                return None, "cancel" if self.stop_event.is_set() else "timeout", False
            answer = pending.answer
            if pending.by == "cancel":
                return None, "cancel", False
            return answer, pending.by, pending.remember
        finally:
            with self._lock:
                self._pending.pop(call_id, None)

    def answer_approval(self, call_id: str, approve: bool, remember: bool) -> bool:
        """Answer a waiting approval; False when none of that id waits."""
        return self._answer(call_id, "approval", approve, remember)

    def answer_question(self, call_id: str, answer: str | None) -> bool:
        """Answer a waiting question (None declines it); False when none of that id waits."""
        return self._answer(call_id, "question", answer, False)

    def _answer(self, call_id: str, kind: str, answer: Any, remember: bool) -> bool:
        """The client's answer to the wait of that id and kind; False when none such waits."""
        with self._lock:
            pending = self._pending.get(call_id)
            if pending is None or pending.out.kind != kind or pending.done.is_set():
                return False
            pending.answer = answer
            pending.by = "client"
            pending.remember = remember
            pending.done.set()
            return True

    def pending(self) -> PendingOut | None:
        """What the run waits on now: an answer, or the peers' quorum."""
        with self._lock:
            for pending in self._pending.values():
                if not pending.done.is_set():
                    return pending.out
            watch = self._quorum.get(self._waiting_quorum or "")
            if watch is None:
                return None
            return PendingOut(
                kind="quorum",
                call_id=watch.call_id,
                tool_name=watch.tool_name,
                request_id=watch.request_id,
                required=watch.required,
                signers=list(watch.signers),
                denied_by=list(watch.denied_by),
                timeout_seconds=max(0, int(watch.expires_at - time.time())),
            )

    # -- the runner ------------------------------------------------------------------------------

    def attach(self, runner: AgentRunner) -> None:
        """Hand the run its runner (built in its task); steering and a stop asked for before go to it."""
        with self._lock:
            self.runner = runner
            early, self._early_steering = self._early_steering, []
        for text in early:
            runner.steer(text)
        if self.stop_event.is_set():
            runner.cancel()

    def steer(self, text: str) -> bool:
        """Add a message for the run's next model call; False once the run is over."""
        with self._lock:
            runner = self.runner
            if runner is None and self.result is None:
                self._early_steering.append(text)
                return True
        return runner is not None and runner.steer(text)

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self, *, why: str) -> bool:
        """Stop the run (cancel or deadline): the runner stops, waits are answered no, a quorum wait ends."""
        runner = self.runner
        if self.result is not None:
            return False
        if why == "timeout":
            self.timed_out = True
        else:
            self.cancelled = True
        self.stop_event.set()
        with self._lock:
            for pending in self._pending.values():
                pending.by = "cancel"
                pending.answer = None
                pending.done.set()
        if runner is not None:
            runner.cancel()
        return True

    @property
    def running(self) -> bool:
        return self.result is None

    # -- the end ----------------------------------------------------------------------------------

    def finish(self, result: RunResult | None, error: str | None) -> ResultOut:
        """Build the result (in the loop's thread, after every frame of the runner arrived)."""
        if self.timed_out:
            stop: str | None = "timeout"
        elif self.cancelled:
            stop = "cancelled"
        elif result is not None:
            stop = result.status
        else:
            stop = "failed"
        text = ""
        message = error
        usage = UsageOut(
            seconds=round(time.monotonic() - self.started, 3), context_tokens=self._context_chars // 4
        )
        if result is not None:
            if result.final_answer is not None:
                text = result.final_answer.content
            message = result.error_message
            usage.input_tokens = result.input_tokens
            usage.output_tokens = result.output_tokens
            usage.requests = result.iterations
        if self.timed_out:
            message = f"The run was stopped after {self.options.timeout:g} seconds, its time limit."
        self.result = ResultOut(
            text=text,
            session_id=self.session_id,
            usage=usage,
            tools=list(self._tools.values()),
            stop=stop,
            stop_message=message,
            questions=list(self._questions),
            run_id=self.run_id,
            events=[frame.out() for frame in self.channel.frames] if self.options.keep_events else None,
        )
        return self.result


def _describe(tool_name: str, arguments: dict[str, Any]) -> str:
    shown = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
    return f"{tool_name} {shown if len(shown) <= 300 else shown[:299] + '…'}"


def new_run_id() -> str:
    """A fresh run id (the audit log's and the run log's)."""
    return secrets.token_hex(16)
