"""``teaagent bench core``: what the gate costs a tool call, and how fast the audit log appends.

``gate_overhead_us_median``: a read-only tool call through :class:`ToolGate` (argument and result
schemas, policy, rate limit, and its L2 audit records without fsync) against the same handler
called bare. Calls are timed in pairs, gated and bare back to back, and the median of the
differences is reported, so that noise from the machine cancels out instead of adding up.

``audit_appends_per_s``: L2 appends of a small ``tool_result`` record, no fsync.

``teaagent bench runner`` (:func:`bench_runner`): ``iteration_overhead_ms_median``, what one agent
iteration costs besides the model's and the tool's own time.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from teaagent.audit import AuditLogger
from teaagent.budget import RunBudget
from teaagent.llm import LLMAdapter, LLMRequest, LLMResponse, ScriptedAdapter
from teaagent.policy import ApprovalPolicy, PermissionMode
from teaagent.runner._events import RunEvent
from teaagent.runner._gate import ToolGate
from teaagent.tools import ToolAnnotations, ToolRateLimit, ToolRegistry

__all__ = ["bench_core", "bench_runner"]

_WARMUP_CALLS = 200  # compiled validators, regex caches and the file's page cache are warm after these

_INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "max_bytes": {"type": "integer", "minimum": 1},
    },
    "required": ["path"],
    "additionalProperties": False,
}
_OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "content": {"type": "string"},
        "size": {"type": "integer", "minimum": 0},
        "truncated": {"type": "boolean"},
    },
    "required": ["content", "size", "truncated"],
    "additionalProperties": False,
}
_CONTENT = "def main() -> None:\n    print('hello, world')\n"


def _read_note(arguments: dict[str, Any]) -> dict[str, Any]:
    # A read-only tool whose own work is negligible, so what is measured is the gate.
    return {"content": _CONTENT, "size": len(_CONTENT), "truncated": False}


def bench_core(seconds: float) -> dict[str, float]:
    """Measure the gate's overhead per read-only call and the audit log's append rate.

    Args:
        seconds: Roughly how long the whole benchmark runs.

    Returns:
        ``gate_overhead_us_median``, ``gate_call_us_median``, ``bare_call_us_median`` (microseconds)
        and ``audit_appends_per_s``.
    """
    with tempfile.TemporaryDirectory(prefix="teaagent-bench-") as folder:
        root = Path(folder)
        registry = ToolRegistry()
        registry.register(
            "notes.read",
            "Read a note.",
            _INPUT_SCHEMA,
            _OUTPUT_SCHEMA,
            ToolAnnotations(read_only=True, idempotent=True, security_tier="Low"),
            _read_note,
            # A limit that is never reached, so the window is checked on every call.
            rate_limit=ToolRateLimit(max_calls=1_000_000_000, window_seconds=60.0),
        )
        policy = ApprovalPolicy.for_workspace(root, mode=PermissionMode.WORKSPACE_WRITE, use_presets=False)
        audit = AuditLogger(root / "audit.jsonl", audit_level="L2", fsync=False)
        gate = ToolGate(registry=registry, policy=policy, audit=audit, run_id="bench")
        handler = _read_note
        arguments = {"path": "src/main.py"}
        clock = time.perf_counter_ns

        for index in range(_WARMUP_CALLS):
            gate.call("notes.read", arguments, call_id=f"warm-{index}")
        differences: list[int] = []
        gated: list[int] = []
        bare: list[int] = []
        deadline = time.perf_counter() + seconds / 2
        index = 0
        while time.perf_counter() < deadline or index < 1000:
            index += 1
            t0 = clock()
            handler(arguments)
            t1 = clock()
            gate.call("notes.read", arguments, call_id=f"call-{index}")
            t2 = clock()
            bare.append(t1 - t0)
            gated.append(t2 - t1)
            differences.append((t2 - t1) - (t1 - t0))

        appender = AuditLogger(root / "appends.jsonl", audit_level="L2", fsync=False)
        payload = {"tool_name": "fs.read", "call_id": "c1", "result": {"content": _CONTENT, "size": 48}}
        appends = 0
        started = time.perf_counter()
        deadline = started + seconds / 2
        while True:
            for _ in range(200):
                appender.log("tool_result", payload)
            appends += 200
            now = time.perf_counter()
            if now >= deadline:
                break
        for logger in (audit, appender):
            if logger.disk_error is not None:
                raise logger.disk_error
    return {
        "gate_overhead_us_median": statistics.median(differences) / 1000,
        "gate_call_us_median": statistics.median(gated) / 1000,
        "bare_call_us_median": statistics.median(bare) / 1000,
        "gate_calls_measured": float(len(differences)),
        "audit_appends_per_s": appends / (now - started),
    }


# -- teaagent bench runner --------------------------------------------------------------------------

_TURNS_PER_RUN = 50  # tool-call turns per run, then a final answer; a run is a realistic long task
_RUNNER_WARMUP_RUNS = 2  # the thread pool, the compiled schemas and the files are warm after these


class _TimedAdapter(LLMAdapter):
    """The scripted model, with the time spent inside each ``complete`` call recorded."""

    provider = "scripted"

    def __init__(self, inner: ScriptedAdapter, spent: list[int]) -> None:
        self.inner = inner
        self.model = inner.model
        self.spent = spent

    async def complete(self, request: LLMRequest) -> LLMResponse:
        t0 = time.perf_counter_ns()
        response = await self.inner.complete(request)
        self.spent.append(time.perf_counter_ns() - t0)
        return response

    async def stream(self, request: LLMRequest) -> AsyncIterator[str]:
        async for piece in self.inner.stream(request):
            yield piece


def bench_runner(seconds: float) -> dict[str, float]:
    """Measure what the runner adds to each iteration, besides the model's and the tool's own time.

    Each measured iteration is one model turn that calls one read-only tool (scripted provider,
    the ``notes.read`` tool of :func:`bench_core`, default budget with its cost preflight, L2 audit
    log and run log without fsync, an event sink). Its overhead is the time from one
    ``model_request`` event to the next, minus the time spent inside ``adapter.complete`` and
    inside the tool's handler; the median is reported.

    Args:
        seconds: Roughly how long the benchmark runs.

    Returns:
        ``iteration_overhead_ms_median`` (the figure with a target), ``iteration_overhead_ms_p90``,
        ``iteration_ms_median`` (the whole iteration) and ``iterations_measured``.
    """
    from teaagent.runner._runner import AgentRunner

    turns = [
        {"content": "", "tool_calls": [{"tool_name": "notes.read", "arguments": {"path": "src/main.py"}}]}
    ] * _TURNS_PER_RUN + [{"content": "Done."}]
    script = ScriptedAdapter(turns, source="bench")
    budget = RunBudget(max_iterations=_TURNS_PER_RUN + 1, max_tool_calls=_TURNS_PER_RUN)
    handler_ns: list[int] = []

    def timed_read(arguments: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter_ns()
        result = _read_note(arguments)
        handler_ns.append(time.perf_counter_ns() - t0)
        return result

    overheads: list[int] = []
    totals: list[int] = []
    with tempfile.TemporaryDirectory(prefix="teaagent-bench-") as folder:
        root = Path(folder)
        registry = ToolRegistry()
        registry.register(
            "notes.read",
            "Read a note.",
            _INPUT_SCHEMA,
            _OUTPUT_SCHEMA,
            ToolAnnotations(read_only=True, idempotent=True, security_tier="Low"),
            timed_read,
        )
        policy = ApprovalPolicy.for_workspace(root, mode=PermissionMode.WORKSPACE_WRITE, use_presets=False)
        audit = AuditLogger(root / "audit.jsonl", audit_level="L2", fsync=False)
        deadline = time.perf_counter() + seconds
        runs = 0
        while runs < _RUNNER_WARMUP_RUNS + 2 or time.perf_counter() < deadline:
            runs += 1
            script.reset()
            model_ns: list[int] = []
            handler_ns.clear()
            marks: list[int] = []

            def mark(event: RunEvent, marks: list[int] = marks) -> None:
                if event.kind == "model_request":
                    marks.append(time.perf_counter_ns())

            runner = AgentRunner(
                adapter=_TimedAdapter(script, model_ns),
                registry=registry,
                policy=policy,
                audit=audit,
                budget=budget,
                run_id=f"bench-{runs}",
                root=root,
                event_sink=mark,
            )
            result = runner.run("Read src/main.py again and again.")
            if result.status != "completed":
                raise RuntimeError(f"the benchmark's run ended {result.status}: {result.error_message}")
            if runs <= _RUNNER_WARMUP_RUNS:
                continue
            # Iteration i runs from marks[i] to marks[i + 1] and holds model call i and tool call i.
            for index in range(_TURNS_PER_RUN):
                total = marks[index + 1] - marks[index]
                totals.append(total)
                overheads.append(total - model_ns[index] - handler_ns[index])
        if audit.disk_error is not None:
            raise audit.disk_error
    overheads.sort()
    return {
        "iteration_overhead_ms_median": statistics.median(overheads) / 1e6,
        "iteration_overhead_ms_p90": overheads[int(len(overheads) * 0.9)] / 1e6,
        "iteration_ms_median": statistics.median(totals) / 1e6,
        "iterations_measured": float(len(overheads)),
    }
