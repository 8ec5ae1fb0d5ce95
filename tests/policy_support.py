"""The policy tests' tool calls (read-only, writing, destructive), a scripted prompter, and the check."""

from __future__ import annotations

import re
from typing import Any

from teaagent.policy import ApprovalPolicy, Authorization, PromptAnswer, PromptRequest

READ = ("fs.read", {"path": "notes.txt"}, {"read_only": True, "destructive": False})
WRITE = ("fs.write", {"path": "notes.txt", "content": "hello"}, {"read_only": False, "destructive": False})
DESTROY = ("fs.delete", {"path": "notes.txt"}, {"read_only": False, "destructive": True})
KINDS = {"read-only": READ, "writing": WRITE, "destructive": DESTROY}


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


class ScriptedPrompter:
    """A prompter that answers from a script and remembers what it was asked."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked: list[PromptRequest] = []

    def __call__(self, request: PromptRequest) -> PromptAnswer:
        self.asked.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


def check(
    policy: ApprovalPolicy, kind: tuple[str, dict[str, Any], dict[str, bool]], call_id: str = "c1"
) -> None:
    tool, arguments, annotations = kind
    policy.assert_allowed(
        tool, call_id, annotations["destructive"], arguments, read_only=annotations["read_only"]
    )


def authorize(
    policy: ApprovalPolicy,
    kind: tuple[str, dict[str, Any], dict[str, bool]],
    call_id: str = "c1",
    **extra: Any,
) -> Authorization:
    tool, arguments, annotations = kind
    return policy.authorize(
        tool, call_id, annotations["destructive"], arguments, read_only=annotations["read_only"], **extra
    )
