"""The gate every tool call goes through, whether a model asked for it or an operator did.

One call, in order (the runner and ``teaagent tools call`` share it):

1. look the tool up and check its arguments against its input schema, so that nothing malformed is
   ever put before an approver;
2. ask the :class:`~teaagent.policy.ApprovalPolicy` (permission mode, local approvals, and the
   peers' quorum for a high-risk call) what allows the call; a refusal is audited as
   ``approval_denied`` and raised;
3. audit ``approval_granted`` when something other than the permission mode allowed the call (the
   quorum certificate included), and ``tool_call`` before a call that can change something, so
   that a call which crashes the process is still on record;
4. run it through the :class:`~teaagent.tools.ToolRegistry` (rate limit, handler, output schema)
   and audit ``tool_result`` or ``tool_error``.

A read-only call has no side effect that a crash could hide, so it is recorded once, when it
ends: its ``tool_result`` (or ``tool_error``) record carries the arguments as well. Every call
therefore leaves exactly one ``tool_result`` or ``tool_error`` record with its arguments.
"""

from __future__ import annotations

import functools
from typing import Any

from teaagent.audit import AuditLogger
from teaagent.errors import ApprovalDeniedError, ToolError
from teaagent.policy import ApprovalPolicy
from teaagent.policy._policy import ApprovalSource, Authorization
from teaagent.tools import ToolRegistry

__all__ = ["ToolGate"]


class ToolGate:
    """Runs tool calls through policy, schema, rate limit and the audit log.

    Args:
        registry: The tools that may be called.
        policy: The approval policy of the run.
        audit: The audit log every call is written to.
        run_id: The run the calls belong to.
    """

    def __init__(
        self, *, registry: ToolRegistry, policy: ApprovalPolicy, audit: AuditLogger, run_id: str
    ) -> None:
        self.registry = registry
        self.policy = policy
        self.audit = audit
        self.run_id = run_id

    def call(
        self, tool_name: str, arguments: dict[str, Any], *, call_id: str, reason: str = ""
    ) -> dict[str, Any]:
        """Run one tool call through the gate and return its result.

        Args:
            tool_name: The registered tool's name.
            arguments: The call's arguments.
            call_id: The call's id, unique within the run.
            reason: Why the model (or operator) wants the call; shown to approvers.

        Returns:
            The tool's result, validated against its output schema.

        Raises:
            ToolNotFoundError: No tool of that name.
            SchemaValidationError: The arguments or the result do not match the schemas.
            ApprovalDeniedError: The policy or the quorum refused the call.
            ToolRateLimitError: The tool's rate-limit window is full.
            Exception: Whatever the tool's handler raised.
        """
        # The gate's run, not the logger's: one audit log may carry several runs.
        log = functools.partial(self.audit.log, run_id=self.run_id)
        base: dict[str, Any] = {"tool_name": tool_name, "call_id": call_id}
        try:
            definition = self.registry.validate_arguments(tool_name, arguments)
        except ToolError as exc:
            log("tool_error", {**base, "arguments": arguments, "error": str(exc), "stage": "arguments"})
            raise
        annotations = definition.annotations
        try:
            authorization = self.policy.authorize(
                tool_name,
                call_id,
                annotations.destructive,
                arguments,
                read_only=annotations.read_only,
                reason=reason,
                run_id=self.run_id,
            )
        except ApprovalDeniedError as exc:
            log("approval_denied", {**base, "arguments": arguments, "reason": str(exc)})
            raise
        if authorization.source is not ApprovalSource.PERMISSION_MODE or authorization.certificate:
            log("approval_granted", {**base, **_granted(authorization)})
        if annotations.read_only:
            base["arguments"] = arguments
        else:
            log("tool_call", {**base, "arguments": arguments, "reason": reason})
        try:
            result = self.registry.call(tool_name, arguments)
        except Exception as exc:
            log("tool_error", {**base, "error": str(exc), "error_type": type(exc).__name__, "stage": "call"})
            raise
        log("tool_result", {**base, "result": result})
        return result


def _granted(authorization: Authorization) -> dict[str, Any]:
    granted: dict[str, Any] = {"source": str(authorization.source)}
    if authorization.preset is not None:
        preset = authorization.preset
        granted["preset"] = {"preset_id": preset.preset_id, "tool_pattern": preset.tool_pattern}
    if authorization.certificate is not None:
        granted["certificate"] = authorization.certificate
    return granted
