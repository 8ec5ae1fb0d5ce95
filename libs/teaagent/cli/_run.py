"""``teaagent run``: one agent run on the node, shown as it goes.

The run is the agent service's run: the node's tools, its policy (permission mode, presets, the
peers' quorum through its relay) and its audit log in ``<data_dir>/audit/``; its cost goes to the
run log in ``<workspace>/.teaagent/runs/``. Each model turn, tool call, approval waited for and the
cost so far are printed (on stderr with ``--json``, whose stdout is the result alone).

Exit codes: 0 the run completed; 3 a call was denied (or its approval expired); 1 any other
ending (failed, limit_exceeded, cost_exceeded); 2 bad usage or configuration.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
import threading
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.status import Status

from teaagent._words import needed_from, span
from teaagent.budget import (
    DEFAULT_MAX_ESTIMATED_COST_CENTS,
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_MAX_TOOL_CALLS,
    RunBudget,
)
from teaagent.cli._options import ConfigOption, ScriptOption
from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError, MissingAPIKeyError
from teaagent.llm import LLMAdapter
from teaagent.policy import PromptAnswer, Prompter, PromptRequest
from teaagent.runner import AskCallback, Question, RunEvent, RunResult
from teaagent.runner._node import for_node, node_quorum_gate

EXIT_BY_STATUS = {"completed": 0, "approval_denied": 3}
EXIT_OTHER = 1
MAX_SHOWN_CHARS = 400  # of a tool's arguments or result on one line; the audit log has the rest


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = " ".join(text.split())
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 1] + "…"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _interactive() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def terminal_prompter(console: Console | None = None) -> Prompter | None:
    """Ask on the terminal about a call the permission mode leaves to a person.

    Returns:
        The prompter, or None when stdin is not a terminal: nobody can answer, so such calls are denied.
    """
    if not _interactive():
        return None
    shown = console if console is not None else Console(stderr=True, highlight=False)

    def prompt(request: PromptRequest) -> PromptAnswer:
        call = f"{request.tool_name} {_short(request.arguments)}"
        shown.print(f"[bold yellow]approval needed[/]: {escape(call)}")
        if request.reason:
            shown.print(f"  reason: {escape(_short(request.reason))}")
        answer = shown.input("  allow it? [o]nce, for the [s]ession, or [d]eny (default): ").strip().lower()
        if answer in ("o", "once"):
            return PromptAnswer.ONCE
        if answer in ("s", "session"):
            return PromptAnswer.SESSION
        return PromptAnswer.DENY

    return prompt


def terminal_ask(console: Console) -> AskCallback | None:
    """Answer the model's questions on the terminal; None (decline them all) when stdin is not one."""
    if not _interactive():
        return None

    def ask(question: Question) -> str | None:
        console.print(f"[bold cyan]the agent asks[/]: {escape(question.question)}")
        for number, option in enumerate(question.options, start=1):
            console.print(f"  {number}. {escape(option)}")
        answer = console.input("  your answer (empty to decline): ").strip()
        if answer.isdigit() and 1 <= int(answer) <= len(question.options):
            return question.options[int(answer) - 1]
        return answer or None

    return ask


class _Display:
    """Prints a run's events as they come; a spinner while the model thinks or a quorum is awaited."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.status: Status | None = None

    def _spin(self, text: str, *, say: bool = False) -> None:
        """Show ``text`` beside a spinner on a terminal; elsewhere, print it when ``say``."""
        self._stop()
        if self.console.is_terminal:
            self.status = self.console.status(escape(text))
            self.status.start()
        elif say:
            self.console.print(escape(text))

    def _stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def note(self, line: str) -> None:
        """Print one line of progress (a quorum request's steps)."""
        self.console.print(f"[dim]  {escape(line)}[/]")

    def __call__(self, event: RunEvent) -> None:
        data = event.data
        say = self.console.print
        kind = event.kind
        if kind == "run_started":
            budget = data["budget"]
            cap = budget["max_estimated_cost_cents"]
            say(
                f"[bold]run {data['run_id']}[/] with {data['provider']}/{escape(str(data['model']))}; "
                f"at most {_count(budget['max_iterations'], 'turn')}, "
                f"{_count(budget['max_tool_calls'], 'tool call')}, "
                f"{'no cost cap' if cap is None else f'{cap} cents'}"
            )
        elif kind == "steered":
            say(f"[magenta]steered[/]: {escape(_short(data['text']))}")
        elif kind == "model_request":
            self._spin(f"model turn {data['iteration']}…")
        elif kind == "model_response":
            self._stop()
            content = str(data["content"]).strip()
            if content:
                say(f"[bold]model[/] (turn {data['iteration']}): {escape(content)}")
        elif kind == "cost":
            say(
                f"[dim]cost so far {data['total_cents']:.4f} cents "
                f"({data['input_tokens']} tokens in, {data['output_tokens']} out)[/]"
            )
        elif kind == "tool_call":
            say(f"[cyan]→ {escape(str(data['tool_name']))}[/] {escape(_short(data['arguments']))}")
        elif kind == "approval_waiting":
            if data.get("via") == "quorum":
                needed = needed_from(data["required_approvals"], len(data["peers"]))
                needs = data.get("needs") or f"{needed} ({', '.join(data['peers'])})"
                self._spin(
                    f"{data['tool_name']} waits for {needs}, up to {span(data['timeout_seconds'])}…", say=True
                )
            else:
                say(f"[yellow]{escape(str(data['tool_name']))} waits for your approval[/]")
        elif kind == "approval_granted":
            self._stop()
            say(f"[green]✓ {escape(str(data['tool_name']))} approved ({data['via']})[/]")
        elif kind == "approval_denied":
            self._stop()
            say(f"[red]✗ {escape(str(data['reason']))}[/]")
        elif kind == "tool_result":
            if data["ok"]:
                say(f"[green]← {escape(str(data['tool_name']))}[/] {escape(_short(data['result']))}")
            else:
                say(f"[red]← {escape(str(data['tool_name']))} failed[/]: {escape(_short(data['error']))}")
        elif kind == "question":
            say(f"[cyan]? {escape(str(data['question']))}[/]")
        elif kind == "answer":
            say(f"  answer: {escape(str(data['answer']))}" if data["answered"] else "  [dim](declined)[/]")
        elif kind == "run_finished":
            self._stop()
            self._finished(data)

    def _finished(self, data: dict[str, Any]) -> None:
        say = self.console.print
        say("")
        if data["final_answer"] is not None:
            say(escape(str(data["final_answer"])))
            say("")
        colour = "green" if data["status"] == "completed" else "red"
        say(
            f"[{colour}]{data['status']}[/] after {_count(data['iterations'], 'turn')} and "
            f"{_count(data['tool_calls'], 'tool call')}; cost {data['cost_cents']:.4f} cents "
            f"({data['input_tokens']} tokens in, {data['output_tokens']} out)"
        )


def _adapter(provider: str, model: str | None, script: str | None, base_url: str | None = None) -> LLMAdapter:
    from teaagent.llm import create_llm_adapter

    if script is not None and provider != "scripted":
        raise ConfigError(
            f"--script plays a script with the scripted provider; the provider here is {provider}."
        )
    try:
        return create_llm_adapter(provider, model, script_path=script, base_url=base_url)
    except MissingAPIKeyError as exc:
        raise ConfigError(str(exc)) from None
    except ValueError as exc:  # an unknown provider
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None


def _budget(max_iterations: int, max_tool_calls: int, max_cost_cents: int, unlimited_cost: bool) -> RunBudget:
    try:
        return RunBudget(
            max_iterations=max_iterations,
            max_tool_calls=max_tool_calls,
            max_estimated_cost_cents=None if unlimited_cost else max_cost_cents,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _session(node: NodeConfig, session_id: str | None, task: str) -> tuple[Any, Any]:
    if session_id is None:
        return None, None
    from teaagent.session import SessionStore, new_session

    store = SessionStore(node.workspace)
    try:
        session = store.load(session_id)
        if session is None:
            session = new_session(label=task[:200], session_id=session_id)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(str(exc)) from None
    return store, session


def run(
    task: Annotated[str, typer.Argument(help="What the agent should do.")],
    config: ConfigOption = None,
    provider: Annotated[
        str | None,
        typer.Option("--provider", help="The LLM provider; the configuration's [agent] provider by default."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="The model; [agent] model, else the provider's default.")
    ] = None,
    script: ScriptOption = None,
    max_iterations: Annotated[
        int, typer.Option("--max-iterations", help="Model turns allowed.")
    ] = DEFAULT_MAX_ITERATIONS,
    max_tool_calls: Annotated[
        int, typer.Option("--max-tool-calls", help="Tool calls allowed.")
    ] = DEFAULT_MAX_TOOL_CALLS,
    max_cost_cents: Annotated[
        int, typer.Option("--max-cost-cents", help="The cost cap in US cents (0: no spend).")
    ] = DEFAULT_MAX_ESTIMATED_COST_CENTS,
    unlimited_cost: Annotated[bool, typer.Option("--no-cost-cap", help="Run without a cost cap.")] = False,
    session_id: Annotated[
        str | None, typer.Option("--session", help="Continue (or start) this chat session of the workspace.")
    ] = None,
    label: Annotated[str, typer.Option("--label", help="What the run is for, in cost reports.")] = "cli",
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the result as one JSON object on stdout; progress on stderr."),
    ] = False,
) -> None:
    """Run one task with the node's agent: model turns, tool calls through the gate, approvals, cost."""
    budget = _budget(max_iterations, max_tool_calls, max_cost_cents, unlimited_cost)
    node = load_config(config)
    chosen = provider or node.agent.provider
    # [agent] model and base_url belong to [agent] provider: another --provider gets its defaults.
    own = chosen == node.agent.provider
    if own:
        model = model or node.agent.model
    if own and script is None:
        script = node.agent.script  # [agent] script, like model and base_url, is [agent] provider's
    adapter = _adapter(chosen, model, script, node.agent.base_url if own else None)
    from teaagent.runner._node import node_registry

    registry = node_registry(node)
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    display = _Display(console)
    from teaagent.cli._interrupt import interrupted, stop_on_ctrl_c
    from teaagent.cli._watch import QuorumWatch

    # Who received each quorum request, each decision as it arrives, and why one expired.
    stop = threading.Event()  # Ctrl-C sets it: a quorum wait (in the run's worker thread) withdraws
    quorum_gate = node_quorum_gate(
        node, on_progress=display.note, on_wait=QuorumWatch(display.note), stop=stop
    )
    store, session = _session(node, session_id, task)
    runner = for_node(
        node,
        run_id=secrets.token_hex(16),
        registry=registry,
        prompter=terminal_prompter(console),
        quorum_gate=quorum_gate,
        adapter=adapter,
        budget=budget,
        provider=chosen,
        model=model,
        event_sink=display,
        ask=terminal_ask(console),
        session_store=store,
        session=session,
        label=label,
    )
    try:
        started = time.monotonic()
        with stop_on_ctrl_c(stop):
            result = runner.run(task)
    except KeyboardInterrupt:
        display._stop()
        interrupted(quorum_gate)  # the wait withdrew its request: exit 130 with that one line
        raise
    finally:
        display._stop()
        runner.audit.close()
    if as_json:
        typer.echo(json.dumps(result_to_dict(result, time.monotonic() - started), ensure_ascii=False))
    if result.status != "completed":
        sys.stderr.write(f"teaagent: the run ended {result.status}: {result.error_message}\n")
    raise typer.Exit(EXIT_BY_STATUS.get(result.status, EXIT_OTHER))


def result_to_dict(result: RunResult, seconds: float | None = None) -> dict[str, Any]:
    """The run's result as plain JSON data (``--json`` prints it)."""
    data = dataclasses.asdict(result)
    if seconds is not None:
        data["seconds"] = round(seconds, 3)
    return data
