"""The focus stack: the files and sub-tasks a session is working on, most recent on top."""

from __future__ import annotations

import builtins
import itertools
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from teaagent.session._time import parse_timestamp, utc_now

__all__ = [
    "FOCUS_KINDS",
    "MAX_FOCUS_ENTRIES",
    "MAX_FOCUS_NOTE_CHARS",
    "MAX_FOCUS_VALUE_CHARS",
    "FocusEntry",
    "FocusStackManager",
]

#: What a focus entry points at: a file of the workspace, or a sub-task in words.
FOCUS_KINDS: Final = ("file", "task")
MAX_FOCUS_ENTRIES: Final = 32  # a person keeps a handful of files and sub-tasks in mind; more is runaway
MAX_FOCUS_VALUE_CHARS: Final = 4096  # the longest path Linux accepts, or a one-line sub-task
MAX_FOCUS_NOTE_CHARS: Final = 1000  # a reminder of why, not a document

_ENTRY_FIELDS: Final = frozenset({"kind", "value", "note", "pushed_at"})


@dataclass(frozen=True)
class FocusEntry:
    """One thing the session is focused on.

    Attributes:
        kind: ``"file"`` (``value`` is a workspace path) or ``"task"`` (``value`` is a sub-task).
        value: The path or the sub-task, 1 to :data:`MAX_FOCUS_VALUE_CHARS` characters.
        note: Why it is in focus; at most :data:`MAX_FOCUS_NOTE_CHARS` characters.
        pushed_at: When it was pushed, ISO 8601 UTC.

    Raises:
        ValueError: ``kind`` is not one of :data:`FOCUS_KINDS`, ``value`` is empty or too long,
            ``note`` is too long, or ``pushed_at`` is not an ISO 8601 timestamp with a time zone.
    """

    kind: str
    value: str
    note: str = ""
    pushed_at: str = field(default_factory=utc_now)

    def __post_init__(self) -> None:
        if self.kind not in FOCUS_KINDS:
            raise ValueError(f"focus kind {self.kind!r} is not one of {', '.join(FOCUS_KINDS)}.")
        if not isinstance(self.value, str) or not self.value.strip():
            raise ValueError("a focus entry needs a non-empty value.")
        if len(self.value) > MAX_FOCUS_VALUE_CHARS:
            raise ValueError(f"a focus value is limited to {MAX_FOCUS_VALUE_CHARS} characters.")
        if not isinstance(self.note, str):
            raise ValueError(f"a focus note must be a string, not {type(self.note).__name__}.")
        if len(self.note) > MAX_FOCUS_NOTE_CHARS:
            raise ValueError(f"a focus note is limited to {MAX_FOCUS_NOTE_CHARS} characters.")
        parse_timestamp(self.pushed_at, "pushed_at")

    def to_dict(self) -> dict[str, str]:
        """Return the entry as stored in a session file."""
        return {"kind": self.kind, "value": self.value, "note": self.note, "pushed_at": self.pushed_at}

    @classmethod
    def from_dict(cls, data: object) -> FocusEntry:
        """Rebuild an entry from :meth:`to_dict`'s output.

        Raises:
            ValueError: ``data`` is not an object with exactly the entry's keys, or a field is invalid.
        """
        if not isinstance(data, Mapping) or set(data) != _ENTRY_FIELDS:
            raise ValueError(
                f"a focus entry must be an object with exactly the keys {sorted(_ENTRY_FIELDS)}."
            )
        return cls(kind=data["kind"], value=data["value"], note=data["note"], pushed_at=data["pushed_at"])


class FocusStackManager:
    """A bounded stack of :class:`FocusEntry`, saved with its session.

    - :meth:`push` puts an entry on top; pushing what is already on top (same kind and value)
      changes nothing, so repeating a focus does not fill the stack.
    - The stack holds at most ``max_size`` entries: a push onto a full stack drops the oldest
      entry (the bottom one), since the newest focus is the one that matters.
    - :meth:`pop`, :meth:`peek` return None on an empty stack rather than raising: "no focus" is
      an ordinary state of a session.

    Thread-safe: every method holds the manager's lock, so a UI thread and an agent thread may share it.
    Two managers are equal when they hold the same entries in the same order and the same ``max_size``.
    """

    __hash__ = None  # type: ignore[assignment]  # mutable: equal managers must not share a hash

    def __init__(self, entries: Iterable[FocusEntry] = (), *, max_size: int = MAX_FOCUS_ENTRIES) -> None:
        """Make a stack, bottom entry first.

        Args:
            entries: The entries, from the bottom (oldest) to the top (newest).
            max_size: How many entries the stack keeps, 1 to :data:`MAX_FOCUS_ENTRIES`.

        Raises:
            ValueError: ``max_size`` is out of range, ``entries`` holds more than ``max_size`` entries,
                or two neighbouring entries have the same kind and value.
            TypeError: An entry is not a :class:`FocusEntry`.
        """
        if type(max_size) is not int or not 1 <= max_size <= MAX_FOCUS_ENTRIES:
            raise ValueError(f"max_size must be an integer from 1 to {MAX_FOCUS_ENTRIES}, not {max_size!r}.")
        stack = builtins.list(entries)
        for entry in stack:
            if not isinstance(entry, FocusEntry):
                raise TypeError(f"a focus stack holds FocusEntry objects, not {type(entry).__name__}.")
        if len(stack) > max_size:
            raise ValueError(f"a focus stack of max_size {max_size} cannot hold {len(stack)} entries.")
        for below, above in itertools.pairwise(stack):
            if _same_focus(below, above):
                raise ValueError(f"the focus {above.kind} {above.value!r} appears twice in a row.")
        self._max_size = max_size
        self._entries = stack
        self._lock = threading.Lock()

    @property
    def max_size(self) -> int:
        """How many entries the stack keeps before the oldest falls off."""
        return self._max_size

    def push(self, kind: str, value: str, note: str = "") -> FocusEntry:
        """Put a file or a sub-task on top of the stack.

        Args:
            kind: ``"file"`` or ``"task"``.
            value: The workspace path or the sub-task.
            note: Why it is in focus.

        Returns:
            The entry now on top: the new one, or the one already there when it has the same kind and value.

        Raises:
            ValueError: A field is invalid (see :class:`FocusEntry`).
        """
        entry = FocusEntry(kind=kind, value=value, note=note)
        with self._lock:
            if self._entries and _same_focus(self._entries[-1], entry):
                return self._entries[-1]
            self._entries.append(entry)
            if len(self._entries) > self._max_size:
                del self._entries[0]
            return entry

    def pop(self) -> FocusEntry | None:
        """Remove and return the top entry, or return None when the stack is empty."""
        with self._lock:
            return self._entries.pop() if self._entries else None

    def peek(self) -> FocusEntry | None:
        """Return the top entry without removing it, or None when the stack is empty."""
        with self._lock:
            return self._entries[-1] if self._entries else None

    def clear(self) -> builtins.list[FocusEntry]:
        """Empty the stack.

        Returns:
            The removed entries, bottom first.
        """
        with self._lock:
            removed, self._entries = self._entries, []
            return removed

    def list(self) -> builtins.list[FocusEntry]:
        """Return a copy of the entries, from the bottom (oldest) to the top (newest)."""
        with self._lock:
            return builtins.list(self._entries)

    def to_dict(self) -> dict[str, Any]:
        """Return the stack as stored: ``{"max_size": N, "entries": [...]}``, entries bottom first."""
        with self._lock:
            return {"max_size": self._max_size, "entries": [entry.to_dict() for entry in self._entries]}

    @classmethod
    def from_dict(cls, data: object) -> FocusStackManager:
        """Rebuild a stack from :meth:`to_dict`'s output.

        Raises:
            ValueError: ``data`` is not such an object, or an entry or the size is invalid.
        """
        if not isinstance(data, Mapping) or set(data) != {"max_size", "entries"}:
            raise ValueError("a focus stack must be an object with exactly the keys 'entries', 'max_size'.")
        items = data["entries"]
        if not isinstance(items, builtins.list):
            raise ValueError("a focus stack's entries must be a list.")
        return cls((FocusEntry.from_dict(item) for item in items), max_size=data["max_size"])

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[FocusEntry]:
        return iter(self.list())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FocusStackManager):
            return NotImplemented
        return self.max_size == other.max_size and self.list() == other.list()

    def __repr__(self) -> str:
        return f"FocusStackManager({self.list()!r}, max_size={self._max_size})"

    # A lock can be neither copied nor pickled: copies and pickles get a fresh one.
    def __getstate__(self) -> dict[str, Any]:
        return {"max_size": self.max_size, "entries": self.list()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._max_size = state["max_size"]
        self._entries = builtins.list(state["entries"])
        self._lock = threading.Lock()


def _same_focus(first: FocusEntry, second: FocusEntry) -> bool:
    return first.kind == second.kind and first.value == second.value
