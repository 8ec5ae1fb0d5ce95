"""The gate every tool call goes through, whether a model asked for it or an operator did.

One call, in order (the runner and ``teaagent tools call`` share it):

1. look the tool up and check its arguments against its input schema, so that nothing malformed is
   ever put before an approver;
2. ask the :class:`~teaagent.policy.ApprovalPolicy` (permission mode, local approvals, and the
   peers' quorum for a high-risk call) what allows the call; a refusal is audited as
   ``approval_denied`` and raised;
3. audit ``approval_granted`` when something other than the permission mode allowed the call (the
   quorum certificate included), and ``tool_call`` (its arguments and reason) before every call
   it lets run, read-only ones included, so that a call which crashes the process is still on
   record;
4. run it through the :class:`~teaagent.tools.ToolRegistry` (rate limit, handler, output schema)
   and audit ``tool_result`` or ``tool_error``.

Every call that runs therefore leaves one ``tool_call`` record and then exactly one
``tool_result`` or ``tool_error`` record; a call refused before it runs leaves ``tool_error``
(stage ``arguments``) or ``approval_denied``, with its arguments.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from teaagent.audit import AuditLogger
from teaagent.errors import ApprovalDeniedError, ToolError
from teaagent.policy import ApprovalPolicy
from teaagent.policy._policy import ApprovalSource, Authorization
from teaagent.tools import ToolRegistry

__all__ = ["Admitted", "ToolGate"]


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
        admitted = self.admit(tool_name, arguments, call_id=call_id, reason=reason)
        assert admitted is not None  # it waits for whatever the policy needs
        try:
            result = self.registry.call(tool_name, arguments)
        except Exception as exc:
            self.failed(admitted, exc)
            raise
        return self.finished(admitted, result)

    def admit(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        *,
        call_id: str,
        reason: str = "",
        at_once: bool = False,
    ) -> Admitted | None:
        """Steps 1 to 3 of a call: check it, authorize it and put it on record before it runs.

        The caller then runs the tool and reports how it ended with :meth:`finished` or
        :meth:`failed`; :meth:`call` is exactly that, with the registry's own handler.

        Args:
            tool_name: The registered tool's name.
            arguments: The call's arguments.
            call_id: The call's id, unique within the run.
            reason: Why the model (or operator) wants the call; shown to approvers.
            at_once: Decide only what needs nobody to be asked and nothing to be waited for
                (:meth:`~teaagent.policy.ApprovalPolicy.authorize_at_once`): an event loop's
                shortcut for a call it may make without a worker thread.

        Returns:
            The admitted call; with ``at_once``, None when the call needs an approval, the quorum
            or a rate-limit window (nothing was recorded or used up: call :meth:`call` instead).

        Raises:
            ToolNotFoundError: No tool of that name.
            SchemaValidationError: The arguments do not match the tool's input schema.
            ApprovalDeniedError: The policy or the quorum refused the call.
        """
        # The gate's run, not the logger's: one audit log may carry several runs.
        log = functools.partial(self.audit.log, run_id=self.run_id)
        base: dict[str, Any] = {"tool_name": tool_name, "call_id": call_id}
        try:
            definition = self.registry.validate_arguments(tool_name, arguments)
        except ToolError as exc:
            log("tool_error", {**base, "arguments": arguments, "error": str(exc), "stage": "arguments"})
            raise
        if at_once and definition.rate_limit is not None:
            return None  # its window may live in Redis: a round trip an event loop must not block on
        annotations = definition.annotations
        authorize = self.policy.authorize_at_once if at_once else self.policy.authorize
        try:
            authorization = authorize(
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
        if authorization is None:
            return None
        if authorization.source is not ApprovalSource.PERMISSION_MODE or authorization.certificate:
            log("approval_granted", {**base, **_granted(authorization)})
        log("tool_call", {**base, "arguments": arguments, "reason": reason})
        return Admitted(record=base)

    def finished(self, admitted: Admitted, result: dict[str, Any]) -> dict[str, Any]:
        """Step 4's record of an admitted call that returned ``result``; returns ``result``."""
        self.audit.log("tool_result", {**admitted.record, "result": result}, run_id=self.run_id)
        return result

    def failed(self, admitted: Admitted, exc: BaseException) -> None:
        """Step 4's record of an admitted call that raised ``exc`` (or was cancelled)."""
        self.audit.log(
            "tool_error",
            {**admitted.record, "error": str(exc), "error_type": type(exc).__name__, "stage": "call"},
            run_id=self.run_id,
        )


@dataclass(frozen=True)
class Admitted:
    """A call the gate let through and recorded; its end is recorded by :meth:`ToolGate.finished`.

    Attributes:
        record: What each of its audit records carries (name and call id; the arguments are in its
            ``tool_call`` record).
    """

    record: dict[str, Any]


def _granted(authorization: Authorization) -> dict[str, Any]:
    granted: dict[str, Any] = {"source": str(authorization.source)}
    if authorization.preset is not None:
        preset = authorization.preset
        granted["preset"] = {"preset_id": preset.preset_id, "tool_pattern": preset.tool_pattern}
    if authorization.certificate is not None:
        granted["certificate"] = authorization.certificate
    return granted
