"""Approvals, watched: the policy's prompter and quorum gate, reporting each wait as events and audit records.

The runner wraps the policy's two ways of waiting for someone (a person at a prompt, the peers'
quorum) so that a wait shows up as ``approval_request`` in the audit log and ``approval_waiting``
in the events before it starts, and a grant as ``approval_granted``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from teaagent.policy import ApprovalPolicy, PromptAnswer, PromptRequest, QuorumGate
from teaagent.quorum import describe_needs
from teaagent.runner._types import ApprovalRequest

__all__ = ["Emit", "Waiting", "watched_policy"]

#: Reports a wait that starts: the call, ``prompt`` or ``quorum``, and what else the wait is about.
Waiting = Callable[[ApprovalRequest, str, Mapping[str, Any]], None]
#: Emits one run event: its kind and its data.
Emit = Callable[[str, dict[str, Any]], None]


def watched_policy(policy: ApprovalPolicy, waiting: Waiting, emit: Emit) -> ApprovalPolicy:
    """The same policy, with its prompter and quorum gate reporting waits through ``waiting`` and ``emit``."""
    prompter = policy.prompter
    gate = policy.quorum_gate
    if prompter is None and gate is None:
        return policy
    # replace() keeps the JIT state and the preset store (the same objects) and checks again.
    return dataclasses.replace(
        policy,
        prompter=None if prompter is None else _WatchedPrompter(prompter, waiting, emit),
        quorum_gate=None if gate is None else _WatchedQuorumGate(gate, policy, waiting, emit),
    )


class _WatchedPrompter:
    def __init__(
        self, prompter: Callable[[PromptRequest], PromptAnswer], waiting: Waiting, emit: Emit
    ) -> None:
        self._prompter = prompter
        self._waiting = waiting
        self._emit = emit

    def __call__(self, request: PromptRequest, /) -> PromptAnswer:
        approval = ApprovalRequest.asking(request)
        self._waiting(approval, "prompt", {})
        answer = self._prompter(request)
        if answer in (PromptAnswer.ONCE, PromptAnswer.SESSION):
            self._emit(
                "approval_granted",
                {
                    "call_id": request.call_id,
                    "tool_name": request.tool_name,
                    "via": "prompt",
                    "answer": str(answer),
                },
            )
        return answer


class _WatchedQuorumGate:
    def __init__(self, gate: QuorumGate, policy: ApprovalPolicy, waiting: Waiting, emit: Emit) -> None:
        self._gate = gate
        self._config = policy.multi_sig_config
        self._waiting = waiting
        self._emit = emit

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        call_id, tool_name = request["call_id"], request["tool_name"]
        config = self._config
        asked = PromptRequest(
            call_id=call_id,
            tool_name=tool_name,
            arguments=request["arguments"],
            reason=request["reason"],
            annotations={},
            run_id=request["run_id"] or None,
        )
        approval = ApprovalRequest.asking(asked)
        self._waiting(
            approval,
            "quorum",
            {
                "request_id": request["request_id"],
                "required_approvals": config.required_approvals,
                "peers": list(config.peer_agent_ids),
                "timeout_seconds": config.timeout_seconds,
                "expires_at": request["expires_at"],
                # Version 2: the request's rule and terms, as the gate words them.
                **({"needs": describe_needs(request, config)} if request.get("v") == 2 else {}),
            },
        )
        certificate = self._gate.obtain(request)
        self._emit("approval_granted", {"call_id": call_id, "tool_name": tool_name, "via": "quorum"})
        return certificate
