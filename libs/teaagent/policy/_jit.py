"""Just-in-time approvals: the session's memory of what a person approved, and how to ask them."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

__all__ = ["MAX_TRACKED_CALLS", "JITApprovalState", "PromptAnswer", "PromptRequest", "Prompter"]

# The calls whose tool the state remembers, for is_call_approved(call_id): the calls in flight of a
# session, with room to spare; the oldest is forgotten first.
MAX_TRACKED_CALLS: Final = 4096


def _non_empty(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string.")
    return value


@dataclass
class JITApprovalState:
    """Mutable just-in-time approval state for one session; safe to share between threads.

    Two kinds of approval live here:

    * a **once** approval names one in-flight call id. It is *consumed* by the policy check that
      uses it, so it lets exactly one call run: a call id that comes back (a retry, or a
      provider that reuses ids) must be approved again.
    * a **session** approval names a tool; every later call to that tool passes the local check
      until the state is cleared. It is never consumed.

    Neither kind ever replaces a multi-sig quorum. Change the state through the methods, which hold
    the lock; the two public sets are the spec's fields and are best treated as read-only.

    The state also remembers the tool of each call the policy has looked up (:meth:`consume`), the
    latest :data:`MAX_TRACKED_CALLS` of them, so that :meth:`is_call_approved` given a call id
    alone sees a session approval of that call's tool.

    Attributes:
        approved_call_ids: Call ids with a live once approval.
        session_approved_tools: Tool names approved for the rest of the session.
    """

    approved_call_ids: set[str] = field(default_factory=set)
    session_approved_tools: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _call_tools: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def approve_once(self, call_id: str) -> None:
        """Approve one in-flight call ID via JIT/session state.

        Raises:
            ValueError: ``call_id`` is empty or not a string.
        """
        _non_empty("call_id", call_id)
        with self._lock:
            self.approved_call_ids.add(call_id)

    def approve_session(self, tool_name: str) -> None:
        """Approve all calls to a tool for the current session.

        Raises:
            ValueError: ``tool_name`` is empty or not a string.
        """
        _non_empty("tool_name", tool_name)
        with self._lock:
            self.session_approved_tools.add(tool_name)

    def is_call_approved(self, call_id: str, *, tool_name: str | None = None) -> bool:
        """Return True if this in-flight call ID has a live JIT/session approval.

        Looking does not consume a once approval.

        Args:
            call_id: The call's id.
            tool_name: The call's tool; when None, the tool the policy last looked this call up
                with (:meth:`consume`), so that a session approval of that tool counts too.
        """
        with self._lock:
            if call_id in self.approved_call_ids:
                return True
            tool = tool_name if tool_name is not None else self._call_tools.get(call_id)
            return tool is not None and tool in self.session_approved_tools

    def consume(self, call_id: str, *, tool_name: str) -> Literal["once", "session"] | None:
        """Use the approval of one call, atomically: a once approval is removed as it is used.

        A live once approval is consumed even when the tool also holds a session approval, so that
        no once approval outlives the call it was given for. The call's tool is remembered for
        :meth:`is_call_approved`.

        Args:
            call_id: The call's id.
            tool_name: The call's tool.

        Returns:
            ``"once"`` when a once approval was consumed, else ``"session"`` when the tool is
            approved for the session, else None.
        """
        with self._lock:
            self._call_tools.pop(call_id, None)  # re-inserted last: the newest call is kept longest
            self._call_tools[call_id] = tool_name
            if len(self._call_tools) > MAX_TRACKED_CALLS:
                del self._call_tools[next(iter(self._call_tools))]
            if call_id in self.approved_call_ids:
                self.approved_call_ids.discard(call_id)
                return "once"
            if tool_name in self.session_approved_tools:
                return "session"
            return None

    def clear(self) -> None:
        """Forget every once and session approval (a new session starts)."""
        with self._lock:
            self.approved_call_ids.clear()
            self.session_approved_tools.clear()
            self._call_tools.clear()


class PromptAnswer(StrEnum):
    """What a person answered when asked about one call."""

    ONCE = "once"
    SESSION = "session"
    DENY = "deny"


@dataclass(frozen=True, kw_only=True)
class PromptRequest:
    """The question put to a person about one tool call (the runner converts it to its ApprovalRequest).

    Attributes:
        call_id: The call's id.
        tool_name: The tool.
        arguments: The call's arguments, as the tool would receive them.
        reason: The model's reasoning for the call, possibly empty.
        annotations: ``{"read_only": ..., "destructive": ...}`` as the policy saw them.
        run_id: The run the call belongs to, if known.
    """

    call_id: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    annotations: dict[str, bool]
    run_id: str | None


class Prompter(Protocol):
    """Asks a person about one tool call and returns their answer.

    It may block (a terminal prompt, an HTTP approval endpoint). An exception, or an answer that
    is not one of ``once``/``session``/``deny``, denies the call.
    """

    def __call__(self, request: PromptRequest, /) -> PromptAnswer: ...
