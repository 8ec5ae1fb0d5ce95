"""``teaagent bench core``: what the gate costs a tool call, and how fast the audit log appends.

``gate_overhead_us_median``: a read-only tool call through :class:`ToolGate` (argument and result
schemas, policy, rate limit, and its L2 audit records without fsync) against the same handler
called bare. Calls are timed in pairs, gated and bare back to back, and the median of the
differences is reported, so that noise from the machine cancels out instead of adding up.

``audit_appends_per_s``: L2 appends of a small ``tool_result`` record, no fsync.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from teaagent.audit import AuditLogger
from teaagent.policy import ApprovalPolicy, PermissionMode
from teaagent.runner._gate import ToolGate
from teaagent.tools import ToolAnnotations, ToolRateLimit, ToolRegistry

__all__ = ["bench_core"]

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
