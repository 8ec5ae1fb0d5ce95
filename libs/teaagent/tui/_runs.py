"""A TUI's runs: the model that answers, the tools and gate, the worker thread, what it shows and asks.

Each task runs in a worker thread; whatever the run reports is put on one queue that the UI thread
drains while the run lasts (see :mod:`teaagent.tui._tui`).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import secrets
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from teaagent._words import time_left
from teaagent.budget import RunBudget
from teaagent.errors import ConfigError, TeaAgentError
from teaagent.llm import PROVIDER_CONFIGS, LLMAdapter, create_llm_adapter, price_for
from teaagent.policy import (
    ApprovalPolicy,
    PromptAnswer,
    PromptRequest,
)
from teaagent.runner import AgentRunner, Question, RunEvent, RunResult
from teaagent.runner._gate import ToolGate
from teaagent.runner._node import gated_runner, node_gate, node_registry, open_audit
from teaagent.session import MAX_LABEL_CHARS
from teaagent.tools import ToolAnnotations, ToolRegistry, workspace_registry
from teaagent.tui._base import TUIBase
from teaagent.tui._common import (
    AUDIT_FILE,
    RUN_LABEL,
    SUBAGENT_MAX_COST_CENTS,
    SUBAGENT_MAX_ITERATIONS,
    SUBAGENT_MAX_TASK_CHARS,
    SUBAGENT_MAX_TOOL_CALLS,
    SUBAGENT_TOOL,
    TICK_SECONDS,
    TOOL_PROGRESS_AFTER_SECONDS,
    Job,
    ModelChoice,
    Prompt,
    Usage,
    Wait,
    count,
    sentence,
    short,
)
from teaagent.tui._context import is_simple_turn
from teaagent.tui._screen import visible

if TYPE_CHECKING:
    from teaagent.relay_client import RequestStatus, WaitProgress


class RunsMixin(TUIBase):
    """The runs of :class:`~teaagent.tui.TeaAgentTUI`."""

    # -- models --------------------------------------------------------------------------------------

    def _adapter(self, choice: ModelChoice) -> LLMAdapter:
        """The adapter of ``choice``, made once.

        Raises:
            ConfigError: The provider cannot be reached with this configuration (a key, a URL, a script).
            MissingAPIKeyError: The provider's key is not set.
            ValueError: The provider is unknown.
        """
        adapter = self._adapters.get(choice)
        if adapter is not None:
            return adapter
        if self._adapter_factory is not None:
            adapter = self._adapter_factory(choice.provider, choice.model)
            if not isinstance(adapter, LLMAdapter):
                raise ConfigError(f"adapter_factory returned {type(adapter).__name__}, not an LLMAdapter.")
        else:
            adapter = self._built_in_adapter(choice)
        self._adapters[choice] = adapter
        return adapter

    def _built_in_adapter(self, choice: ModelChoice) -> LLMAdapter:
        node = self.node
        environ: Mapping[str, str] | None = None
        base_url: str | None = None
        if node is not None and choice.name is not None and choice.name in node.models:
            settings = node.models[choice.name]
            base_url = settings.base_url
            key_env = PROVIDER_CONFIGS[choice.provider].api_key_env
            if settings.token and key_env:
                environ = {**os.environ, key_env: settings.token}
        elif node is not None and choice.provider == node.agent.provider:
            base_url = node.agent.base_url
        if choice.provider == "scripted":
            base_url = None  # the offline provider calls no server
        script = self._script_path if choice.provider == "scripted" else None
        if (
            script is None
            and node is not None
            and choice.name is None
            and choice.provider == node.agent.provider
        ):
            script = node.agent.script  # [agent] script belongs to [agent] provider
        return create_llm_adapter(
            choice.provider, choice.model, environ=environ, base_url=base_url, script_path=script
        )

    def _price(self, choice: ModelChoice) -> float:
        price = price_for(choice.provider, choice.model)
        return price.input_per_1k + price.output_per_1k

    def _cheaper_choice(self) -> ModelChoice | None:
        """The cheapest configured model that is cheaper than the current one, if any."""
        if self.node is None:
            return None
        try:
            current = self._price(self._choice)
            candidates = [
                (self._price(option), option.label, option)
                for option in (
                    ModelChoice(settings.provider, settings.model, name)
                    for name, settings in self.node.models.items()
                )
            ]
        except (ConfigError, ValueError) as exc:  # a broken price file: no routing, and it is said
            self._screen.say(
                f"route_model: no price to compare ({exc}); the turn goes to the current model.", "yellow"
            )
            return None
        cheaper = sorted(
            (candidate for candidate in candidates if candidate[0] < current), key=lambda item: item[:2]
        )
        return cheaper[0][2] if cheaper else None

    # -- tools and policy ----------------------------------------------------------------------------

    def _tools(self) -> ToolRegistry:
        """The tools of the model's runs (with ``agent.delegate`` when ``subagent``), made once.

        Raises:
            ConfigError: The node's rate limits name a tool that is not a workspace tool.
            OSError: The workspace is gone.
        """
        if self._registry is not None:
            return self._registry
        base = node_registry(self.node) if self.node is not None else workspace_registry(self.root)
        registry = base
        if self.subagent:
            registry = ToolRegistry(rate_limiter=base.rate_limiter)
            for tool in base.list_tools():
                registry.register(
                    tool.name,
                    tool.description,
                    tool.input_schema,
                    tool.output_schema,
                    tool.annotations,
                    tool.handler,
                    tool.rate_limit,
                    tool.capability_manifest,
                )
            registry.register(
                SUBAGENT_TOOL,
                "Hand a self-contained sub-task to a helper agent, which works on it with the same tools "
                f"and rules (at most {SUBAGENT_MAX_ITERATIONS} turns) and returns its answer. Use it for "
                "a separable piece of work; describe the sub-task fully, the helper sees nothing else.",
                {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "minLength": 1, "maxLength": SUBAGENT_MAX_TASK_CHARS},
                        "max_iterations": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": SUBAGENT_MAX_ITERATIONS,
                        },
                    },
                    "required": ["task"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "status": {"type": "string"},
                        "answer": {"type": "string"},
                        "error": {"type": "string"},
                        "iterations": {"type": "integer"},
                        "tool_calls": {"type": "integer"},
                        "cost_cents": {"type": "number"},
                    },
                    "required": ["status", "answer"],
                },
                # The delegation itself changes nothing: every call the child makes is checked on its own.
                ToolAnnotations(read_only=True, stateful=True),
                self._delegate,
            )
        self._base_registry, self._registry = base, registry
        return registry

    def _run_gate(self, run_id: str) -> ToolGate:
        """This run's tools, policy (the node's, else the workspace's, with the session's approvals) and log.

        Raises:
            ConfigError: The quorum is on and the node's own public key cannot be read, or the
                audit log cannot be written.
        """
        # One JIT state for the whole session: "for the session" outlives one run.
        changes: dict[str, Any] = {"jit_state": self._jit, "allow_all_destructive": self.allow_destructive}
        registry = self._tools()
        if self.node is not None:
            return node_gate(
                self.node,
                run_id=run_id,
                registry=registry,
                prompter=self._prompter,
                quorum_gate=self._gate,
                mode=self._mode,
                policy_changes=changes,
            )
        base = ApprovalPolicy.for_workspace(self.root, mode=self._mode, prompter=self._prompter)
        policy = dataclasses.replace(base, **changes)
        audit = open_audit(self.root / AUDIT_FILE, run_id)
        return ToolGate(registry=registry, policy=policy, audit=audit, run_id=run_id)

    # -- runs ----------------------------------------------------------------------------------------

    def _run_task(self, task: str) -> RunResult | None:
        try:
            job = self._prepare(task)
        except (TeaAgentError, ValueError, OSError) as exc:
            self._screen.say(f"The run cannot start: {sentence(exc)}", "red")
            return None
        self._stop_wait.clear()
        self._job = job
        job.thread = threading.Thread(target=self._work, args=(job,), name="teaagent-tui-run", daemon=True)
        self._last_line = time.monotonic()
        job.thread.start()
        try:
            self._pump(job)
        finally:
            self._job = None
            self._waiting = None
            self._screen.status(None)
        if job.error is not None:
            self._screen.say(f"The run could not finish: {sentence(job.error)}", "red")
        self._save_tui_state()
        return job.result

    def _prepare(self, task: str) -> Job:
        choice, routed = self._choice, False
        if self.route_model and is_simple_turn(task):
            cheaper = self._cheaper_choice()
            if cheaper is not None:
                choice, routed = cheaper, True
        adapter = self._adapter(choice)
        gate = self._run_gate(secrets.token_hex(16))
        if not self._session.label:
            self._session.label = task[:MAX_LABEL_CHARS]
        runner = gated_runner(
            gate,
            adapter=adapter,
            budget=self.budget,
            provider=choice.provider,
            model=choice.model,
            root=self.root,
            event_sink=lambda event: self._queue.put(("event", event, 0)),
            ask=self._ask,
            session_store=self._store,
            session=self._session,
            label=RUN_LABEL,
            stream=self.stream,
        )
        return Job(
            task=task,
            choice=choice,
            routed=routed,
            adapter=adapter,
            policy=gate.policy,
            audit=gate.audit,
            budget=self.budget,
            runner=runner,
        )

    def _work(self, job: Job) -> None:
        try:
            job.result = job.runner.run(job.task)
        except BaseException as exc:  # reported by the UI thread; the REPL goes on
            job.error = exc
        finally:
            try:
                job.audit.close()
            finally:
                self._queue.put(("done", job))

    def _pump(self, job: Job) -> None:
        """Draw what the run reports until it ends; Ctrl-C withdraws a quorum wait or cancels the run."""
        while True:
            try:
                try:
                    item = self._queue.get(timeout=TICK_SECONDS)
                except queue.Empty:
                    item = None
                if item is not None:
                    if item[0] == "done" and item[1] is job:
                        return
                    self._handle(item)
                self._tick()
            except KeyboardInterrupt:
                self._interrupt(job)

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "event":
            self._show(item[1], item[2])
        elif kind == "status":
            self._board.update(item[1])  # the live line and /quorum; the lines come with "wait"
            return
        elif kind == "wait":
            if not self._show_wait(item[1]):
                return  # nothing new was printed: no reason to keep quiet
        elif kind == "note":
            self._screen.say(f"  {visible(item[1])}", "dim")
        elif kind == "prompt":
            self._answer(item[1])
        self._last_line = time.monotonic()

    def _interrupt(self, job: Job) -> None:
        call = self._board.current
        if call is not None:
            self._stop_wait.set()
            self._board.withdraw()
            self._screen.status(None)
            # The gate sees the stop within a poll, signs the withdrawal and hands it to the relay,
            # which tells every peer; the run then ends with the gate's sentence of how it went.
            self._screen.say(
                f"Withdrawing request {call.request_id[:12]}: {call.tool_name} will not run, the peers drop "
                "it, and the run ends with the refusal.",
                "yellow",
            )
            return
        if job.cancel_requested:
            self._screen.say("Still stopping: a tool call that has started finishes first.", "yellow")
            return
        job.cancel_requested = True
        job.runner.cancel()
        for child in list(job.children):
            child.cancel()
        self._screen.status(None)
        self._screen.say("Cancelling the run…", "yellow")

    def _tick(self) -> None:
        now = time.time()
        call = self._board.current
        if call is not None:
            if self._screen.live:
                self._screen.status(call.live_line(now), key=("quorum", call.request_id))
        elif self._waiting is not None and self.progress:
            wait = self._waiting
            elapsed = int(time.monotonic() - wait.since)
            if wait.kind == "model":
                self._screen.status(
                    f"⠿ thinking… ({wait.detail}) {elapsed}s · Ctrl-C cancels", key=("model", wait.detail)
                )
            elif elapsed >= TOOL_PROGRESS_AFTER_SECONDS:
                self._screen.status(
                    f"⠿ {wait.detail} is running… {elapsed}s · Ctrl-C cancels", key=("tool", wait.detail)
                )
        if self.heartbeat and time.monotonic() - self._last_line >= self.heartbeat:
            text = self._heartbeat_text(now)
            if text is not None:
                self._screen.say(f"… {text}", "dim")
            self._last_line = time.monotonic()

    def _heartbeat_text(self, now: float) -> str | None:
        call = self._board.current
        if call is not None:
            left = time_left(call.expires_at - now)
            return f"still waiting for {call.tool_name}'s quorum: {call.summary()}, {left} left"
        wait = self._waiting
        if wait is None:
            return None
        elapsed = int(time.monotonic() - wait.since)
        if wait.kind == "model":
            return f"still waiting for the model ({wait.detail}), {elapsed}s"
        return f"{wait.detail} still running, {elapsed}s"

    # -- what the run reports ------------------------------------------------------------------------

    def _relay_note(self, line: str) -> None:
        # "request ...: waiting ..." lines are the board's to show; the others are the relay's troubles.
        if not line.startswith("request ") and " needs " not in line:
            self._queue.put(("note", line))

    def _relay_status(self, status: RequestStatus) -> None:
        self._queue.put(("status", status))

    def _relay_wait(self, progress: WaitProgress) -> None:
        self._queue.put(("wait", progress))

    def _show_wait(self, progress: WaitProgress) -> bool:
        """Print what changed of a quorum wait, and the wait itself when sent or reminded.

        Returns:
            False when nothing was printed.
        """
        from teaagent.relay_client import describe_wait, wait_news

        before = self._waits.get(progress.request_id)
        self._waits[progress.request_id] = progress
        lines = wait_news(before, progress)
        for line in lines:
            colour = "green" if line.startswith("✓") else "red" if line.startswith("✗") else "dim"
            self._screen.say(f"  {visible(line)}", colour)
        if progress.why in ("sent", "reminder") and progress.waiting:
            self._screen.say(f"  {visible(describe_wait(progress))}", "yellow")
            return True
        return bool(lines)

    def _show(self, event: RunEvent, depth: int) -> None:
        data = event.data
        kind = event.kind
        say = self._screen.say
        pad = "  │ " * depth
        if kind == "run_started":
            if depth:
                say(
                    f"{'  │ ' * (depth - 1)}  ↳ sub-task (run {str(data['run_id'])[-8:]}): "
                    f"{short(data['task'], 120)}",
                    "magenta",
                )
            elif self._job is not None and self._job.routed:
                say(f"A simple turn: routed to {self._job.choice.label}, the cheaper model.", "dim")
        elif kind == "model_request":
            self._waiting = Wait("model", f"turn {data['iteration']}", time.monotonic())
        elif kind == "model_delta":
            if depth == 0 and self.stream:
                # The reply is arriving: no "thinking" line to redraw between its pieces.
                self._waiting = None
                if not self._streamed:
                    self._screen.status(None)
                self._streamed = True
                self._screen.write(visible(str(data["text"])))
        elif kind == "model_response":
            self._waiting = None
            self._screen.status(None)
            content = str(data["content"]).strip()
            if self._streamed and depth == 0:
                self._streamed = False
                self._screen.write("\n")
            elif content:
                say(f"{pad}{visible(content)}")
        elif kind == "tool_call":
            self._waiting = Wait("tool", str(data["tool_name"]), time.monotonic())
            say(f"{pad}→ {visible(str(data['tool_name']))} {short(data['arguments'])}", "cyan")
        elif kind == "approval_waiting":
            self._waiting = None
            if data.get("via") == "quorum":
                begun = self._board.begin(data)
                self._screen.status(None)
                say(f"{pad}{begun.opening()}", "yellow")
        elif kind == "approval_granted":
            if data.get("via") == "quorum":
                call = self._board.granted(str(data["call_id"]))
                self._screen.status(None)
                signers = ", ".join(call.signers) if call is not None and call.signers else "the peers"
                say(
                    f"{pad}✓ quorum reached for {data['tool_name']}: signed by {signers}; "
                    "the certificate is verified before it runs.",
                    "green",
                )
            else:
                say(f"{pad}✓ {data['tool_name']} approved ({data.get('answer', data.get('via'))})", "green")
            self._waiting = Wait("tool", str(data["tool_name"]), time.monotonic())
        elif kind == "approval_denied":
            self._waiting = None
            self._board.denied(str(data["call_id"]), str(data["reason"]))
            self._screen.status(None)
            say(f"{pad}✗ {visible(str(data['reason']))}", "red")
        elif kind == "tool_result":
            self._waiting = None
            self._screen.status(None)
            name = visible(str(data["tool_name"]))
            if data["ok"]:
                say(f"{pad}← {name} {short(data['result'])}", "green")
            else:
                say(f"{pad}← {name} failed: {short(data['error'])}", "red")
        elif kind == "run_finished":
            self._waiting = None
            self._screen.status(None)
            self._finished(data, depth)

    def _finished(self, data: Mapping[str, Any], depth: int) -> None:
        job = self._job
        choice = job.choice if job is not None else self._choice
        self._usage.setdefault(choice.label, Usage()).add(data)
        status = str(data["status"])
        style = "green" if status == "completed" else "red"
        counts = (
            f"{status} · {count(int(data['iterations']), 'turn')} · "
            f"{count(int(data['tool_calls']), 'tool call')} · {float(data['cost_cents']):.4f} cents"
        )
        if depth:
            self._screen.say(f"{'  │ ' * (depth - 1)}  ↳ sub-task {counts}", style)
            return
        if status != "completed" and data.get("error_message"):
            self._screen.say(f"The run ended {status}: {visible(str(data['error_message']))}", style)
        routed = " (a simple turn, routed to the cheaper model)" if job is not None and job.routed else ""
        self._screen.say(f"{counts} · answered by {choice.label}{routed}", "dim")

    # -- asking the user, from the run's threads -----------------------------------------------------

    def _put_to_user(self, prompt: Prompt) -> Any:
        """Hand ``prompt`` to the UI thread and wait for its answer (in a run's thread).

        A Ctrl-C that cancels the run answers no at once, even if it struck just as the prompt
        was taken off the queue and before it was shown.
        """
        job = self._job
        self._queue.put(("prompt", prompt))
        while not prompt.done.wait(TICK_SECONDS):
            if job is not None and job.cancel_requested:
                break
        return prompt.answer

    def _prompter(self, request: PromptRequest) -> PromptAnswer:
        answer: PromptAnswer = self._put_to_user(Prompt("approval", request, PromptAnswer.DENY))
        return answer

    def _ask(self, question: Question) -> str | None:
        answer: str | None = self._put_to_user(Prompt("question", question, None))
        return answer

    def _answer(self, prompt: Prompt) -> None:
        """Put a worker's question to the user; Ctrl-C or the end of input answers no."""
        assert self._reader is not None
        self._screen.status(None)
        try:
            if prompt.kind == "approval":
                prompt.answer = self._ask_approval(prompt.request)
            else:
                prompt.answer = self._ask_question(prompt.request)
        except KeyboardInterrupt:
            self._end_prompt_line()
            self._screen.say("  (Ctrl-C: no.)", "yellow")
        except EOFError:
            self._end_prompt_line()
            self._eof = True
            self._screen.say("  (end of input: no.)", "yellow")
        finally:
            prompt.done.set()  # whatever happened, the worker is answered (denied, declined by default)

    def _ask_approval(self, request: PromptRequest) -> PromptAnswer:
        assert self._reader is not None
        what = "destructive" if request.annotations.get("destructive") else "not read-only"
        self._screen.say(
            f"⚠ {visible(request.tool_name)} {short(request.arguments)} is {what}: it needs your approval.",
            "bold yellow",
        )
        if request.reason:
            self._screen.say(f"  reason: {short(request.reason)}")
        text = self._reader.read(
            "  allow it? [o]nce, for the [s]ession, or [d]eny (default): ", remember=False
        )
        answer = text.strip().lower()
        if answer in ("o", "once", "y", "yes"):
            return PromptAnswer.ONCE
        if answer in ("s", "session", "a", "always"):
            return PromptAnswer.SESSION
        return PromptAnswer.DENY

    def _ask_question(self, question: Question) -> str | None:
        assert self._reader is not None
        self._screen.say(f"? {visible(question.question)}", "bold cyan")
        for number, option in enumerate(question.options, start=1):
            self._screen.say(f"  {number}. {visible(option)}")
        text = self._reader.read("  your answer (empty to decline): ", remember=False).strip()
        if text.isdigit() and 1 <= int(text) <= len(question.options):
            return question.options[int(text) - 1]
        return text or None

    # -- sub-agents ----------------------------------------------------------------------------------

    def _delegate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """``agent.delegate``: run a sub-task as a child run with its own budget (in the gate's thread)."""
        job = self._job
        if job is None or self._base_registry is None:
            raise RuntimeError("a sub-task needs a run to belong to")
        job.sub_tasks += 1
        parent_cap = job.budget.max_estimated_cost_cents
        budget = RunBudget(
            max_iterations=min(
                int(arguments.get("max_iterations", SUBAGENT_MAX_ITERATIONS)), SUBAGENT_MAX_ITERATIONS
            ),
            max_tool_calls=SUBAGENT_MAX_TOOL_CALLS,
            max_estimated_cost_cents=SUBAGENT_MAX_COST_CENTS
            if parent_cap is None
            else min(SUBAGENT_MAX_COST_CENTS, parent_cap),
        )
        child = AgentRunner(
            adapter=job.adapter,
            registry=self._base_registry,
            policy=job.policy,
            audit=job.audit,
            budget=budget,
            run_id=f"{job.runner.run_id}-sub{job.sub_tasks}",
            provider=job.choice.provider,
            model=job.choice.model,
            root=self.root,
            event_sink=lambda event: self._queue.put(("event", event, 1)),
            ask=self._ask,
            label=f"{RUN_LABEL}-subagent",
        )
        job.children.append(child)
        if job.cancel_requested:
            child.cancel()
        result = child.run(str(arguments["task"]))
        return {
            "status": result.status,
            "answer": result.final_answer.content if result.final_answer is not None else "",
            "error": result.error_message or "",
            "iterations": result.iterations,
            "tool_calls": result.tool_calls,
            "cost_cents": result.cost_cents,
        }
