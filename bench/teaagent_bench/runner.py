"""``teaagent bench core``: what the gate costs a tool call, and how fast the audit log appends.

``gate_overhead_us_median``: a read-only tool call through :class:`ToolGate` (argument and result
schemas, policy, rate limit, and its L2 audit records without fsync) against the same handler
called bare. Calls are timed in pairs, gated and bare back to back, and the median of the
differences is reported, so that noise from the machine cancels out instead of adding up.

``gate_floor_ratio``: the gated call (``gate_call_us_median``) over ``floor_us_median``, the floor
of what the call's audit record costs: the same record (the fields, the arguments and the result
the gate writes for a read-only call) appended plainly with the standard library, one
``json`` encoding, a SHA-256 chained over the previous hash, an HMAC-SHA256 seal and one
``os.write`` on an ``O_APPEND`` descriptor, with no lock and no redaction (see :class:`_FloorLog`).
``api_floor_ratio`` is the same for the library's API called by hand
(``ApprovalPolicy.assert_allowed``, ``ToolRegistry.call``, ``AuditLogger.log``:
``api_call_us_median``). The three are timed in alternating rounds of :data:`_ROUND` calls in one
run, so that the ratios hold on a machine whose speed changes while it runs.

``audit_appends_per_s``: L2 appends of a small ``tool_result`` record, no fsync.

``teaagent bench runner`` (:func:`bench_runner`): ``iteration_overhead_ms_median``, what one agent
iteration costs besides the model's and the tool's own time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from teaagent.audit import GENESIS_HASH, AuditLogger
from teaagent.budget import RunBudget
from teaagent.llm import LLMAdapter, LLMRequest, LLMResponse, ScriptedAdapter
from teaagent.policy import ApprovalPolicy, PermissionMode
from teaagent.runner._events import RunEvent
from teaagent.runner._gate import ToolGate
from teaagent.tools import ToolAnnotations, ToolHandler, ToolRateLimit, ToolRegistry
from teaagent.tools._workspace_schemas import FS_READ_INPUT, FS_READ_OUTPUT

__all__ = ["bench_core", "bench_runner"]

_WARMUP_CALLS = 200  # compiled validators, regex caches and the file's page cache are warm after these
_ROUND = 50  # calls of one kind in a row: long enough to run warm, short enough to follow the machine
_MIN_ROUNDS = 20

_CONTENT = "def main() -> None:\n    print('hello, world')\n"


def _read_note(arguments: dict[str, Any]) -> dict[str, Any]:
    # A read-only tool whose own work is negligible, so what is measured is the gate.
    return {"content": _CONTENT, "size": len(_CONTENT), "truncated": False}


def _workspace(
    root: Path, read_note: ToolHandler, rate_limit: ToolRateLimit | None = None
) -> tuple[ToolRegistry, ApprovalPolicy, AuditLogger]:
    """The bench's one tool, ``notes.read`` (``read_note`` on fs.read's schemas), its policy and audit log."""
    registry = ToolRegistry()
    registry.register(
        "notes.read",
        "Read a note.",
        FS_READ_INPUT,
        FS_READ_OUTPUT,
        ToolAnnotations(read_only=True, idempotent=True, security_tier="Low"),
        read_note,
        rate_limit=rate_limit,
    )
    policy = ApprovalPolicy.for_workspace(root, mode=PermissionMode.WORKSPACE_WRITE, use_presets=False)
    return registry, policy, AuditLogger(root / "audit.jsonl", audit_level="L2", fsync=False)


class _FloorLog:
    """The floor of an audit append: a hash-chained, HMAC-sealed record written plainly.

    The records are the ones the gate writes for a read-only call (``created_at``, ``event_id``,
    ``event_type``, the payload with the tool's name, the call id, the arguments and the reason
    (``tool_call``) or the result (``tool_result``), ``prev_hash``, ``run_id``, then ``chain_hmac``
    and ``event_hash``), in the same canonical JSON,
    so the file verifies with :func:`teaagent.audit.verify_log`. Each append is the least that
    writing it takes with the standard library: one encoding with a ``json`` encoder made once,
    ``hashlib.sha256``, ``hmac.digest`` and one ``os.write``; no redaction, no lock, no copy.
    """

    def __init__(self, path: Path, key: bytes, run_id: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._key = key
        self._run_id = run_id
        self._encode = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
        # The second is formatted once: the text has the shape of a timestamp at the least cost.
        self._second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        self._prev_hash = GENESIS_HASH

    def append(self, tool_name: str, call_id: str, arguments: dict[str, Any], result: dict[str, Any]) -> None:
        """Append the ``tool_call`` and ``tool_result`` records of one read-only call."""
        self._write(
            "tool_call", {"tool_name": tool_name, "call_id": call_id, "arguments": arguments, "reason": ""}
        )
        self._write("tool_result", {"tool_name": tool_name, "call_id": call_id, "result": result})

    def _write(self, event_type: str, payload: dict[str, Any]) -> None:
        record = {
            "created_at": f"{self._second}.{time.time_ns() // 1000 % 1_000_000:06d}Z",
            "event_id": os.urandom(16).hex(),
            "event_type": event_type,
            "payload": payload,
            "prev_hash": self._prev_hash,
            "run_id": self._run_id,
        }
        body = self._encode(record).encode("ascii")
        event_hash = hashlib.sha256(body).hexdigest()
        seal = hmac.digest(self._key, body, "sha256").hex()
        os.write(
            self._fd,
            b'%s,"chain_hmac":"%s","event_hash":"%s"}\n' % (body[:-1], seal.encode(), event_hash.encode()),
        )
        self._prev_hash = event_hash

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def bench_core(seconds: float) -> dict[str, float]:
    """Measure the gate's overhead per read-only call, its ratio to the floor, and the append rate.

    Args:
        seconds: Roughly how long the whole benchmark runs.

    Returns:
        ``gate_overhead_us_median``, ``gate_call_us_median``, ``bare_call_us_median``,
        ``api_call_us_median`` and ``floor_us_median`` (microseconds), ``gate_floor_ratio`` and
        ``api_floor_ratio``, ``gate_calls_measured`` and ``audit_appends_per_s``.
    """
    with tempfile.TemporaryDirectory(prefix="teaagent-bench-") as folder:
        root = Path(folder)
        # A limit that is never reached, so the window is checked on every call.
        limit = ToolRateLimit(max_calls=1_000_000_000, window_seconds=60.0)
        registry, policy, audit = _workspace(root, _read_note, limit)
        gate = ToolGate(registry=registry, policy=policy, audit=audit, run_id="bench")
        floor = _FloorLog(root / "floor.jsonl", audit.get_chain_key(), "bench")
        handler = _read_note
        arguments = {"path": "src/main.py"}
        result = handler(arguments)
        clock = time.perf_counter_ns

        def api_call(call_id: str) -> None:
            # The gate's steps through the public API, as a program without ToolGate would call them.
            policy.assert_allowed("notes.read", call_id, False, arguments, read_only=True, run_id="bench")
            audit.log(
                "tool_call",
                {"tool_name": "notes.read", "call_id": call_id, "arguments": arguments, "reason": ""},
                run_id="bench",
            )
            answer = registry.call("notes.read", arguments)
            audit.log(
                "tool_result",
                {"tool_name": "notes.read", "call_id": call_id, "result": answer},
                run_id="bench",
            )

        for index in range(_WARMUP_CALLS):
            gate.call("notes.read", arguments, call_id=f"warm-{index}")
            api_call(f"warm-api-{index}")
            floor.append("notes.read", f"warm-{index}", arguments, result)
        differences: list[int] = []
        gated: list[int] = []
        bare: list[int] = []
        api: list[int] = []
        floors: list[int] = []
        deadline = time.perf_counter() + seconds / 2
        rounds = index = 0
        while time.perf_counter() < deadline or rounds < _MIN_ROUNDS:
            rounds += 1
            for _ in range(_ROUND):
                index += 1
                t0 = clock()
                handler(arguments)
                t1 = clock()
                gate.call("notes.read", arguments, call_id=f"call-{index}")
                t2 = clock()
                bare.append(t1 - t0)
                gated.append(t2 - t1)
                differences.append((t2 - t1) - (t1 - t0))
            for _ in range(_ROUND):
                index += 1
                call_id = f"call-{index}"
                t0 = clock()
                api_call(call_id)
                api.append(clock() - t0)
            for _ in range(_ROUND):
                index += 1
                call_id = f"call-{index}"
                t0 = clock()
                floor.append("notes.read", call_id, arguments, result)
                floors.append(clock() - t0)
        floor.close()

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
    gate_us = statistics.median(gated) / 1000
    api_us = statistics.median(api) / 1000
    floor_us = statistics.median(floors) / 1000
    return {
        "gate_overhead_us_median": statistics.median(differences) / 1000,
        "gate_call_us_median": gate_us,
        "bare_call_us_median": statistics.median(bare) / 1000,
        "gate_calls_measured": float(len(differences)),
        "api_call_us_median": api_us,
        "floor_us_median": floor_us,
        "gate_floor_ratio": gate_us / floor_us,
        "api_floor_ratio": api_us / floor_us,
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
        registry, policy, audit = _workspace(root, timed_read)
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
