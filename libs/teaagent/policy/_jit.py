"""Just-in-time approvals: the session's memory of what a person approved, and how to ask them."""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal, Protocol

__all__ = [
    "LAUNCHERS",
    "MAX_TRACKED_CALLS",
    "SHELL_CHARACTERS",
    "JITApprovalState",
    "PromptAnswer",
    "PromptRequest",
    "Prompter",
    "remember_key",
]

# The calls whose tool the state remembers, for is_call_approved(call_id): the calls in flight of a
# session, with room to spare; the oldest is forgotten first.
MAX_TRACKED_CALLS: Final = 4096


#: A command holding one of these is compound or not plain words (a pipe, a list, a substitution, a
#: subshell, a redirection, an escape): "the same program" cannot be told, so it is never remembered.
SHELL_CHARACTERS: Final = frozenset(";|&$`<>()\\\n\r\x00{}")
#: Programs that run the program named in their arguments: remembering one would let any program run.
LAUNCHERS: Final = frozenset(
    {
        "sh", "bash", "dash", "zsh", "ksh", "fish", "csh", "tcsh", "busybox",
        "env", "sudo", "doas", "su", "runuser", "xargs", "parallel", "exec", "eval", "command",
        "builtin", "source", ".", "nohup", "nice", "ionice", "timeout", "time", "stdbuf",
        "setsid", "chroot", "unshare", "nsenter", "flock", "taskset", "watch", "strace", "ltrace",
        "script", "ssh",
    }
)  # fmt: skip
_PROGRAM: Final = re.compile(r"[A-Za-z0-9_./+-]{1,256}")


def remember_key(tool_name: str, arguments: Mapping[str, Any]) -> str | None:
    """What a "remember" answer about this call approves for the rest of the session, or None.

    A call whose arguments hold a ``command`` (``shell.run``) is remembered by its program: the
    first word of the command, split as the shell would (``shlex``), so that approving
    ``echo hi`` lets ``echo bye`` run unasked but not ``touch x``. It fails closed: a command
    that is compound or not plain words (:data:`SHELL_CHARACTERS`: pipes, ``;``, ``&&``,
    subshells, substitutions, redirections), that ``shlex`` cannot split, whose first word is
    an assignment, a pattern or a launcher (:data:`LAUNCHERS`: ``env``, ``sudo``, ``sh``...)
    has no key, and is approved once only. Any other call is remembered by its tool.

    Returns:
        ``"<tool> <program>"`` for a command, the tool's name for any other call, None when
        nothing may be remembered.
    """
    if "command" not in arguments:
        return tool_name
    command = arguments["command"]
    if not isinstance(command, str) or any(character in SHELL_CHARACTERS for character in command):
        return None
    try:
        words = shlex.split(command, comments=False, posix=True)
    except ValueError:  # an unterminated quote
        return None
    if not words:
        return None
    program = words[0]
    if _PROGRAM.fullmatch(program) is None or program in LAUNCHERS or program.rsplit("/", 1)[-1] in LAUNCHERS:
        return None
    return f"{tool_name} {program}"


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
    * a **session** approval names a tool, or one program of a command tool (``"shell.run echo"``,
      what a prompt's ``session`` answer records: :func:`remember_key`); every later call to
      that tool (or of that program) passes the local check until the state is cleared. It is
      never consumed.

    Neither kind ever replaces a multi-sig quorum. Change the state through the methods, which hold
    the lock; the two public sets are the spec's fields and are best treated as read-only.

    The state also remembers the tool of each call the policy has looked up (:meth:`consume`), the
    latest :data:`MAX_TRACKED_CALLS` of them, so that :meth:`is_call_approved` given a call id
    alone sees a session approval of that call's tool.

    Attributes:
        approved_call_ids: Call ids with a live once approval.
        session_approved_tools: Tool names (and ``"<tool> <program>"`` keys) approved for the rest
            of the session.
    """

    approved_call_ids: set[str] = field(default_factory=set)
    session_approved_tools: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _call_tools: dict[str, tuple[str, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def approve_once(self, call_id: str) -> None:
        """Approve one in-flight call ID via JIT/session state.

        Raises:
            ValueError: ``call_id`` is empty or not a string.
        """
        self._approve(self.approved_call_ids, "call_id", call_id)

    def approve_session(self, tool_name: str) -> None:
        """Approve all calls to a tool for the current session; ValueError as :meth:`approve_once`."""
        self._approve(self.session_approved_tools, "tool_name", tool_name)

    def _approve(self, approved: set[str], name: str, value: str) -> None:
        _non_empty(name, value)
        with self._lock:
            approved.add(value)

    def is_call_approved(self, call_id: str, *, tool_name: str | None = None) -> bool:
        """Return True if this in-flight call ID has a live JIT/session approval.

        Looking does not consume a once approval.

        Args:
            call_id: The call's id.
            tool_name: The call's tool; when None, the tool (and the program, for a command) the
                policy last looked this call up with (:meth:`consume`), so that a session approval
                of either counts too.
        """
        with self._lock:
            if call_id in self.approved_call_ids:
                return True
            if tool_name is not None:
                return tool_name in self.session_approved_tools
            names = self._call_tools.get(call_id, ())
            return any(name in self.session_approved_tools for name in names)

    def consume(
        self, call_id: str, *, tool_name: str, key: str | None = None
    ) -> Literal["once", "session"] | None:
        """Use the approval of one call, atomically: a once approval is removed as it is used.

        A live once approval is consumed even when the tool also holds a session approval, so that
        no once approval outlives the call it was given for. The call's tool is remembered for
        :meth:`is_call_approved`.

        Args:
            call_id: The call's id.
            tool_name: The call's tool.
            key: What a session approval of this very kind of call is recorded as
                (:func:`remember_key`: ``"shell.run echo"`` for a command's program), when it is
                not the tool's name.

        Returns:
            ``"once"`` when a once approval was consumed, else ``"session"`` when the tool (or
            ``key``) is approved for the session, else None.
        """
        names = (tool_name,) if key is None or key == tool_name else (tool_name, key)
        with self._lock:
            self._call_tools.pop(call_id, None)  # re-inserted last: the newest call is kept longest
            self._call_tools[call_id] = names
            if len(self._call_tools) > MAX_TRACKED_CALLS:
                del self._call_tools[next(iter(self._call_tools))]
            if call_id in self.approved_call_ids:
                self.approved_call_ids.discard(call_id)
                return "once"
            if any(name in self.session_approved_tools for name in names):
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
