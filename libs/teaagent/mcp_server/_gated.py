"""An MCP server over a tool registry, every call through the node's full policy gate.

:class:`GatedToolServer` is what ``teaagent mcp serve`` (the node's own tools) and ``teaagent mcp
gateway`` (the tools of upstream MCP servers) share. A ``tools/call`` takes exactly the path of
``teaagent tools call``: the :class:`~teaagent.runner._gate.ToolGate` with the node's registry,
its :func:`~teaagent.runner._node.node_policy` (permission mode, presets, the peers' quorum for a
high-risk call), rate limits and the node's audit log. The gate is synchronous and may wait
minutes for a quorum, so each call runs in a worker thread; the MCP connection keeps serving.

What a client sees:

* a refusal (schema, permission mode, rate limit, a denial by the quorum, an expiry) or a failed
  tool is a tool result with ``isError`` and one sentence (who denied and why), never a protocol
  error or a hang;
* while a high-risk call waits for its quorum, a client that sent a progress token gets progress
  notifications: seconds waited out of the quorum's timeout, and a message naming the signers so
  far and the time left;
* in ``prompt`` mode a call the mode leaves to a person is asked of the client's user by
  elicitation, when the client declared it (pushed on a handshake-era connection, returned as an
  ``InputRequiredResult`` on a 2026-07-28 one); without it the policy's safe default applies: the
  call is denied.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext

from teaagent.audit import AuditLogger
from teaagent.config import NodeConfig
from teaagent.errors import ApprovalDeniedError, ConfigError, TeaAgentError, ToolError
from teaagent.policy import PromptAnswer, PromptRequest
from teaagent.quorum import canonical
from teaagent.runner._gate import ToolGate
from teaagent.runner._node import node_audit_path, node_policy, node_quorum_gate
from teaagent.tools import ToolDefinition, ToolRegistry

if TYPE_CHECKING:
    from teaagent.relay_client import WaitProgress

__all__ = [
    "ELICITATION_TIMEOUT_SECONDS",
    "META_ERROR",
    "META_HIGH_RISK",
    "META_SECURITY_TIER",
    "PROGRESS_EVERY_SECONDS",
    "GatedToolServer",
    "ToolCallFailed",
]

logger = logging.getLogger("teaagent.mcp_server")

META_HIGH_RISK: Final = "teaagent/high_risk"  # a tool's _meta: a call needs the peers' quorum
META_SECURITY_TIER: Final = "teaagent/security_tier"
META_ERROR: Final = "teaagent/error"  # an error result's _meta: "refused", "denied" or "failed"
MAX_CALL_THREADS: Final = 64  # calls in flight at once; each holds a thread while it waits for a quorum
PROGRESS_EVERY_SECONDS: Final = 2.0  # changes closer together than this are one notification, sent at its end
PROGRESS_SEND_SECONDS: Final = (
    10.0  # how long one notification may take to go out; a client that stopped reading
)
ELICITATION_TIMEOUT_SECONDS: Final = 300.0  # a user who never answers denies the call
_PENDING_QUESTIONS: Final = 1000  # 2026-07-28 questions awaiting the client's retry, oldest dropped
_INPUT_KEY: Final = "approval"
_ANSWERS: Final = ("once", "session", "deny")


class ToolCallFailed(TeaAgentError):
    """A handler's failure that carries the MCP result to hand back (an upstream's own error result)."""

    def __init__(self, message: str, result: types.CallToolResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class _InputRequired(BaseException):
    """Unwinds the gate when a 2026-07-28 client must be asked first (it retries with the answer).

    A BaseException on purpose: the policy turns every Exception from a prompter into a denial,
    and this is no answer yet. Nothing was approved or run, so the gate writes nothing.
    """

    def __init__(self, request: PromptRequest) -> None:
        super().__init__(request.tool_name)
        self.request = request


@dataclass
class _Question:
    """A question returned to a 2026-07-28 client, bound to exactly the call it was asked about."""

    tool_name: str
    arguments: bytes  # canonical JSON
    expires: float


@dataclass(eq=False)  # held in a set, by identity
class _Call:
    """One ``tools/call`` in flight: how its worker thread reaches the client."""

    ctx: ServerRequestContext[Any, Any]
    tool_name: str
    on_wait: Callable[[_Call, WaitProgress], None]
    loop: asyncio.AbstractEventLoop
    answer: PromptAnswer | None = None  # a 2026-07-28 retry's answer, used once
    stop: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    last_report: float = 0.0
    progress: float = 0.0
    # A change within PROGRESS_EVERY_SECONDS of the last notification, sent when that time is up.
    held: WaitProgress | None = None
    ended: bool = False  # the call's result is being returned: no notification after it
    lock: threading.Lock = field(default_factory=threading.Lock)  # the worker thread's and the loop's


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("teaagent_mcp_call", default=None)


def _text(text: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=text)]


def error_result(sentence: str, kind: str) -> types.CallToolResult:
    """Return the tool result of a refused, denied or failed call: one sentence the client shows."""
    return types.CallToolResult(content=_text(sentence), is_error=True, _meta={META_ERROR: kind})


def _describe_call(request: PromptRequest) -> str:
    arguments = json.dumps(request.arguments, ensure_ascii=False, sort_keys=True)
    if len(arguments) > 500:
        arguments = arguments[:497] + "..."
    return f"{request.tool_name} {arguments}"


def _approval_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "answer": {
                "type": "string",
                "title": "Allow this call?",
                "description": (
                    "once: this call only; session: this tool until the server stops; deny: refuse it"
                ),
                "enum": list(_ANSWERS),
                "default": "deny",
            }
        },
        "required": ["answer"],
    }


def _answer_of(result: types.ElicitResult) -> PromptAnswer:
    """What an elicitation's result says; anything but an accepted once/session is a denial."""
    if result.action != "accept" or not isinstance(result.content, dict):
        return PromptAnswer.DENY
    answer = result.content.get("answer")
    return PromptAnswer(answer) if answer in ("once", "session") else PromptAnswer.DENY


def _can_elicit(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client declared form elicitation (an empty ``elicitation`` object means form)."""
    capabilities = ctx.session.client_capabilities
    if capabilities is None or capabilities.elicitation is None:
        return False
    elicitation = capabilities.elicitation
    return elicitation.form is not None or elicitation.url is None


class GatedToolServer:
    """The MCP low-level server of a registry whose every call goes through the node's gate.

    Args:
        node: The node configuration: its policy, quorum and audit log apply.
        registry: The tools served.
        name: The server's name in MCP's ``serverInfo``.
        run_prefix: The audit log's run id starts with it (``mcp``, ``mcp-gateway``).
        refresh: Called (in the event loop) before tools are listed and before a call to a tool the
            registry does not hold, so a gateway can (re)connect its upstreams; None for none.
        describe: How a tool is listed; :meth:`mcp_tool` when None.
        to_result: How a tool's result becomes the MCP result; as JSON text and structured
            content when None.
        lifespan: The MCP server's lifespan (entered once per stdio run, once by the HTTP app).
        instructions: The server's instructions for the client's model.
        run_at_once: Runs a tool in the event loop (a gateway awaiting its upstream). Given, a
            call that the permission mode settles alone (no approval, quorum or rate-limit window
            to wait for) takes the gate in the loop rather than in a worker thread: the same
            checks and records, without the two thread hops each way.
    """

    def __init__(
        self,
        node: NodeConfig,
        registry: ToolRegistry,
        *,
        name: str,
        run_prefix: str,
        refresh: Callable[[str | None], Awaitable[None]] | None = None,
        describe: Callable[[ToolDefinition], types.Tool] | None = None,
        to_result: Callable[[dict[str, Any]], types.CallToolResult] | None = None,
        lifespan: Callable[[Server[Any]], AbstractAsyncContextManager[Any]] | None = None,
        instructions: str | None = None,
        run_at_once: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None = None,
    ) -> None:
        self.node = node
        self._run_at_once = run_at_once
        self.registry = registry
        self.run_id = f"{run_prefix}-{secrets.token_hex(8)}"
        self._refresh = refresh
        self._describe = describe or self.mcp_tool
        self._to_result = to_result or _success
        self._calls = 0
        self._count_lock = threading.Lock()
        self._active: set[_Call] = set()
        self._held_sends: set[asyncio.Task[None]] = set()  # a held change's notification, pending
        self._questions: dict[str, _Question] = {}
        # The loop's own executor and run_coroutine_threadsafe: two thread hops per call, at about
        # half the cost of anyio's to_thread and from_thread on a loaded machine.
        self._threads = concurrent.futures.ThreadPoolExecutor(MAX_CALL_THREADS, thread_name_prefix="mcp-call")
        quorum_gate = _CallQuorumGate(node) if node.quorum.enabled else None
        # One policy for the server's life: a "session" answer holds until the server stops.
        self.policy = node_policy(node, prompter=self._prompt, quorum_gate=quorum_gate)
        self.audit = AuditLogger(node_audit_path(node), run_id=self.run_id)
        if self.audit.disk_error is not None:
            # Fail closed: a call that cannot be put on record is not made.
            self.audit.close()
            raise ConfigError(f"The audit log {self.audit.path} cannot be written: {self.audit.disk_error}.")
        self.gate = ToolGate(registry=registry, policy=self.policy, audit=self.audit, run_id=self.run_id)
        self.server: Server[Any] = Server(
            name,
            version=_version(),
            instructions=instructions,
            lifespan=lifespan or _no_lifespan,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )

    def stop_calls(self) -> None:
        """Stop every call still waiting for a quorum: each is denied within half a second."""
        for call in list(self._active):
            call.stop.set()

    def close(self) -> None:
        """Stop the calls still waiting (see :meth:`stop_calls`) and close the audit log."""
        self.stop_calls()
        self._threads.shutdown(wait=False)
        self.audit.close()

    # -- listing ------------------------------------------------------------------------------

    def mcp_tool(self, tool: ToolDefinition) -> types.Tool:
        """Return a tool as MCP lists it: its schema, its annotations as hints, its risk in ``_meta``."""
        annotations = tool.annotations
        output = tool.output_schema if tool.output_schema.get("type") == "object" else None
        return types.Tool(
            name=tool.name,
            description=tool.description,
            input_schema=tool.input_schema,
            output_schema=output,
            annotations=types.ToolAnnotations(
                read_only_hint=annotations.read_only,
                destructive_hint=annotations.destructive,
                idempotent_hint=annotations.idempotent,
            ),
            _meta={
                META_HIGH_RISK: self.node.quorum.is_high_risk(tool.name),
                META_SECURITY_TIER: tool.get_security_tier(),
            },
        )

    async def _list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        if self._refresh is not None:
            await self._refresh(None)
        return types.ListToolsResult(tools=[self._describe(tool) for tool in self.registry.list_tools()])

    # -- calling ------------------------------------------------------------------------------

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        name = params.name
        arguments: dict[str, Any] = dict(params.arguments or {})
        if name not in self.registry and self._refresh is not None:
            await self._refresh(name)
        loop = asyncio.get_running_loop()
        call = _Call(ctx=ctx, tool_name=name, on_wait=self.report_wait, loop=loop)
        if params.request_state is not None:
            refused = self._take_answer(call, params, arguments)
            if refused is not None:
                return refused
        with self._count_lock:
            self._calls += 1
            call_id = f"{self.run_id}-{self._calls}"
        if self._run_at_once is not None and call.answer is None:
            settled = await self._call_at_once(self._run_at_once, ctx, name, arguments, call_id)
            if settled is not None:
                return settled
        self._active.add(call)
        try:
            # A cancelled await leaves the thread to finish; the stop below ends its quorum wait.
            return await loop.run_in_executor(self._threads, self._run, call, name, arguments, call_id)
        except _InputRequired as asked:
            return self._ask_by_returning(asked.request, arguments)
        except anyio.get_cancelled_exc_class():
            # The client cancelled or went away: end the quorum's wait (the call is denied).
            call.stop.set()
            raise
        finally:
            with call.lock:
                call.ended = True
            self._active.discard(call)

    def _run(self, call: _Call, name: str, arguments: dict[str, Any], call_id: str) -> types.CallToolResult:
        """The gate, in a worker thread: one call exactly as ``teaagent tools call`` makes it."""
        _current.set(call)
        reason = f"MCP call from {_client_name(call.ctx)}"
        try:
            result = self.gate.call(name, arguments, call_id=call_id, reason=reason)
        except Exception as exc:
            return _error_of(name, exc)
        return self._to_result(result)

    async def _call_at_once(
        self,
        run: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]],
        ctx: ServerRequestContext[Any, Any],
        name: str,
        arguments: dict[str, Any],
        call_id: str,
    ) -> types.CallToolResult | None:
        """The gate in the event loop, for a call that waits for nobody; None: it must take a thread.

        The checks and records are the gate's own (:meth:`ToolGate.admit`, ``finished``,
        ``failed``); only the tool is run by ``run`` instead of the registry's handler. The audit
        records are appended in the loop, as a logging handler would (no fsync by default).
        """
        reason = f"MCP call from {_client_name(ctx)}"
        try:
            admitted = self.gate.admit(name, arguments, call_id=call_id, reason=reason, at_once=True)
            if admitted is None:
                return None
            try:
                result = await run(name, arguments)
                self.registry.validate_result(name, result)
            except BaseException as exc:  # a cancelled call is on record too, then cancelled
                self.gate.failed(admitted, exc)
                raise
            return self._to_result(self.gate.finished(admitted, result))
        except Exception as exc:
            return _error_of(name, exc)

    # -- asking the client's user ---------------------------------------------------------------

    def _prompt(self, request: PromptRequest) -> PromptAnswer:
        """The policy's prompter: runs in the call's worker thread."""
        call = _current.get()
        if call is None:  # pragma: no cover - the policy only prompts inside a call
            raise RuntimeError("no MCP client is there to ask")
        if call.answer is not None:
            answer, call.answer = call.answer, None
            return answer
        if not _can_elicit(call.ctx):
            raise RuntimeError("the MCP client does not support elicitation, so its user cannot be asked")
        if not call.ctx.session.can_send_request:
            raise _InputRequired(request)  # 2026-07-28: the question goes back with the result
        result = asyncio.run_coroutine_threadsafe(self._elicit(call, request), call.loop).result()
        return _answer_of(result)

    async def _elicit(self, call: _Call, request: PromptRequest) -> types.ElicitResult:
        message = f"{self.node.agent_id} asks to run {_describe_call(request)}."
        if request.reason:
            message += f" Reason: {request.reason}"
        with anyio.fail_after(ELICITATION_TIMEOUT_SECONDS):
            return await call.ctx.session.elicit_form(message, _approval_schema(), call.ctx.request_id)

    def _ask_by_returning(
        self, request: PromptRequest, arguments: dict[str, Any]
    ) -> types.InputRequiredResult:
        state = secrets.token_urlsafe(24)
        now = time.monotonic()
        for key in [key for key, question in self._questions.items() if question.expires <= now]:
            del self._questions[key]
        while len(self._questions) >= _PENDING_QUESTIONS:
            del self._questions[next(iter(self._questions))]
        self._questions[state] = _Question(
            request.tool_name, canonical(arguments), now + ELICITATION_TIMEOUT_SECONDS
        )
        message = f"{self.node.agent_id} asks to run {_describe_call(request)}."
        ask = types.ElicitRequest(
            params=types.ElicitRequestFormParams(message=message, requested_schema=_approval_schema())
        )
        return types.InputRequiredResult(input_requests={_INPUT_KEY: ask}, request_state=state)

    def _take_answer(
        self, call: _Call, params: types.CallToolRequestParams, arguments: dict[str, Any]
    ) -> types.CallToolResult | None:
        """Bind a 2026-07-28 retry's answer to the call, or refuse a state this server did not hand out."""
        question = self._questions.pop(params.request_state or "", None)
        if (
            question is None
            or question.expires <= time.monotonic()
            or question.tool_name != params.name
            or question.arguments != canonical(arguments)
        ):
            return error_result(
                f"{params.name} was not run: its approval answer does not belong to this call "
                "(expired, already used, or asked about other arguments); call it again.",
                "refused",
            )
        response = (params.input_responses or {}).get(_INPUT_KEY)
        call.answer = _answer_of(response) if isinstance(response, types.ElicitResult) else PromptAnswer.DENY
        return None

    # -- quorum progress ----------------------------------------------------------------------

    def report_wait(self, call: _Call, progress: WaitProgress) -> None:
        """Send the client one progress notification for its call's quorum wait (its worker thread).

        The message is the wait as every surface words it (``describe_wait``): the request id's
        prefix, the count, who received it, the time left and the command a peer's operator runs.
        The gate calls this when the request is sent, on each change and at the reminder marks. A
        change within :data:`PROGRESS_EVERY_SECONDS` of the last notification is held and sent
        when that time is up, the latest of a burst only: a burst is one notification, and no
        change waits for the next reminder mark (minutes away on a long wait). The decision is
        sent at once.
        """
        now = time.monotonic()
        with call.lock:
            if progress.why == "changed" and now - call.last_report < PROGRESS_EVERY_SECONDS:
                if call.held is None:
                    delay = call.last_report + PROGRESS_EVERY_SECONDS - now
                    call.loop.call_soon_threadsafe(self._send_held_later, call, delay)
                call.held = progress
                return
            call.held = None
            sent = self._notification(call, progress, now)
        # Bounded: a client that stopped reading must not hold the quorum's wait.
        asyncio.run_coroutine_threadsafe(sent, call.loop).result(timeout=PROGRESS_SEND_SECONDS)

    def _notification(self, call: _Call, progress: WaitProgress, now: float) -> Coroutine[Any, Any, None]:
        """The notification of ``progress`` (under ``call.lock``: its value must grow with each one)."""
        from teaagent.relay_client import describe_wait

        call.last_report = now
        # MCP wants progress to grow with every report: seconds waited do, the count may not.
        call.progress = max(now - call.started, call.progress + 0.001)
        total = max(float(self.node.quorum.timeout_seconds), call.progress)
        return call.ctx.session.report_progress(call.progress, total, describe_wait(progress))

    def _send_held_later(self, call: _Call, delay: float) -> None:
        """On the call's loop: send its held change once ``delay`` seconds have passed."""
        task = call.loop.create_task(self._send_held(call, delay))
        self._held_sends.add(task)
        task.add_done_callback(self._held_sends.discard)

    async def _send_held(self, call: _Call, delay: float) -> None:
        await asyncio.sleep(max(0.0, delay))
        with call.lock:
            held, call.held = call.held, None
            if held is None or call.ended:  # sent with a later report, or the call is over
                return
            sent = self._notification(call, held, time.monotonic())
        try:
            await asyncio.wait_for(sent, PROGRESS_SEND_SECONDS)
        except Exception as exc:  # a client gone or not reading: the call's own wait goes on
            logger.info("a progress notification for %s was not sent: %r", call.tool_name, exc)


class _CallQuorumGate:
    """The policy's quorum gate: the node's own (``node_quorum_gate``), made for each high-risk call.

    Each call gets its own gate so that its progress goes to its own client and a cancelled call
    stops only its own wait.
    """

    def __init__(self, node: NodeConfig) -> None:
        self._node = node

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        call = _current.get()
        if call is None:  # pragma: no cover - the policy only asks for a quorum inside a call
            raise RuntimeError("a quorum is only obtained for an MCP call")

        def on_wait(progress: WaitProgress) -> None:
            call.on_wait(call, progress)

        gate = node_quorum_gate(
            self._node, on_progress=lambda line: logger.info("%s", line), on_wait=on_wait, stop=call.stop
        )
        assert gate is not None  # made only when the quorum is enabled
        return gate.obtain(request)


def _error_of(name: str, exc: Exception) -> types.CallToolResult:
    """The error result of a call that the gate refused or that failed."""
    if isinstance(exc, ApprovalDeniedError):
        return error_result(str(exc), "denied")
    if isinstance(exc, ToolCallFailed):
        return exc.result if exc.result is not None else error_result(str(exc), "failed")
    if isinstance(exc, ToolError):  # unknown tool, bad arguments, a full rate-limit window
        return error_result(str(exc), "refused")
    # The tool's own failure (or its store's): one sentence, no crash.
    return error_result(f"{name} failed: {type(exc).__name__}: {exc}", "failed")


def _success(result: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=_text(json.dumps(result, ensure_ascii=False)), structured_content=result
    )


@asynccontextmanager
async def _no_lifespan(_server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
    yield {}


def _client_name(ctx: ServerRequestContext[Any, Any]) -> str:
    params = ctx.session.client_params
    if params is not None and params.client_info is not None and params.client_info.name:
        return params.client_info.name[:100]
    return "an MCP client"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("teaagent")
    except PackageNotFoundError:  # pragma: no cover - an uninstalled checkout
        return ""
