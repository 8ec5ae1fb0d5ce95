"""Where the TUI writes and reads: rich on the terminal, or the caller's ``output_fn``/``input_fn``.

Two screens speak one small interface (:class:`Screen`): lines, streamed text, one transient status
line and tables. :class:`RichScreen` draws with rich (colours, a live status line redrawn in place);
:class:`PlainScreen` hands plain text to a ``print``-like function, so that tests and embedders see
exactly the words a person would, without escape codes. Text from outside (a model's reply, a
peer's arguments) is always shown as text, never as markup, with invisible characters escaped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

from rich.console import Console
from rich.live import Live
from rich.text import Text

from teaagent._display import visible as _visible

__all__ = [
    "FunctionReader",
    "LineReader",
    "PlainScreen",
    "RichScreen",
    "Screen",
    "ToolkitReader",
    "table_lines",
    "visible",
]

STATUS_REFRESH_PER_SECOND: Final = 4  # the countdown moves by the second; four redraws hide the jitter


def visible(text: str) -> str:
    r"""Return ``text`` with every character a terminal would not show as itself escaped (``\u202e``).

    A model's reply and a peer's arguments reach the user's terminal: an escape sequence, a
    right-to-left override or a zero-width character could otherwise hide what is really there.
    Line feeds are kept; tabs and every other control character are escaped.
    """
    return _visible(text, newlines=True)


def table_lines(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, trailing blanks removed."""
    everything = [list(header), *[list(row) for row in rows]]
    widths = [max(len(row[index]) for row in everything) for index in range(len(header))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in everything
    ]


class Screen(Protocol):
    """What the TUI draws on."""

    @property
    def live(self) -> bool:
        """Whether the status line is redrawn in place (a terminal), rather than printed once."""

    def say(self, text: str, style: str = "") -> None:
        """Print one line (or several, joined by line feeds)."""

    def write(self, text: str) -> None:
        """Print streamed text as it comes, without ending the line."""

    def status(self, text: str | None, key: object = None) -> None:
        """Show ``text`` as the transient status line, or clear it with None.

        A live screen redraws the line at every call; a plain one prints it when ``key`` changes,
        so that a countdown does not print a line a second.
        """

    def table(self, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        """Print a table."""


class PlainScreen:
    """Plain text to a ``print``-like function: ``output_fn(line)``; ``output_fn(piece, end="", flush=True)``
    for streamed text."""

    def __init__(self, output_fn: Callable[..., None]) -> None:
        self._out = output_fn
        self._mid_line = False
        self._status_key: object = None
        self._status_shown = False

    @property
    def live(self) -> bool:
        return False

    def _end_line(self) -> None:
        if self._mid_line:
            self._out("")
            self._mid_line = False

    def say(self, text: str, style: str = "") -> None:
        self._end_line()
        self._out(text)

    def write(self, text: str) -> None:
        if text:
            self._out(text, end="", flush=True)
            self._mid_line = not text.endswith("\n")

    def status(self, text: str | None, key: object = None) -> None:
        if text is None:
            self._status_shown = False
            self._status_key = None
            return
        if self._status_shown and key == self._status_key:
            return
        self._status_shown, self._status_key = True, key
        self.say(text)

    def table(self, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        for line in table_lines(header, rows):
            self.say(line)


class RichScreen:
    """A rich console: styled lines and a status line redrawn in place while something is awaited."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(highlight=False)
        self._live: Live | None = None
        self._mid_line = False
        self._plain_key: object = None
        self._plain_shown = False

    @property
    def live(self) -> bool:
        return self.console.is_terminal

    def _end_line(self) -> None:
        if self._mid_line:
            self.console.print()
            self._mid_line = False

    def say(self, text: str, style: str = "") -> None:
        self._end_line()
        # Text, not markup: "[red]" in a model's reply is shown as typed.
        self.console.print(Text(text, style=style), soft_wrap=True)

    def write(self, text: str) -> None:
        if not text:
            return
        if self._live is not None:
            self.status(None)
        self.console.print(Text(text), end="", soft_wrap=True)
        self._mid_line = not text.endswith("\n")

    def status(self, text: str | None, key: object = None) -> None:
        if not self.console.is_terminal:
            if text is None:
                self._plain_shown, self._plain_key = False, None
            elif not (self._plain_shown and key == self._plain_key):
                self._plain_shown, self._plain_key = True, key
                self.say(text, "dim")
            return
        if text is None:
            if self._live is not None:
                self._live.stop()
                self._live = None
            return
        self._end_line()
        line = Text(text, style="yellow", no_wrap=True, overflow="ellipsis")
        if self._live is None:
            self._live = Live(
                line,
                console=self.console,
                transient=True,
                refresh_per_second=STATUS_REFRESH_PER_SECOND,
            )
            self._live.start()
        else:
            self._live.update(line)

    def table(self, header: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        lines = table_lines(header, rows)
        self.say(lines[0], "bold")
        for line in lines[1:]:
            self.say(line)


class LineReader(Protocol):
    """Reads one line typed by the user; raises EOFError at the end of input, KeyboardInterrupt on Ctrl-C."""

    def read(self, prompt: str, *, completions: dict[str, Any] | None = None, remember: bool = True) -> str:
        """Return the line typed after ``prompt``, without its line feed."""


class FunctionReader:
    """Reads through an ``input``-like function: ``input_fn(prompt)``."""

    def __init__(self, input_fn: Callable[..., str]) -> None:
        self._input = input_fn

    def read(self, prompt: str, *, completions: dict[str, Any] | None = None, remember: bool = True) -> str:
        line = self._input(prompt)
        if not isinstance(line, str):
            raise EOFError  # an input function that has nothing more to say
        return line


class ToolkitReader:
    """prompt_toolkit on a terminal: line editing, a history (kept in a file or in memory), completion."""

    def __init__(self, history_path: Path | None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, History, InMemoryHistory

        history: History
        if history_path is None:
            history = InMemoryHistory()
        else:
            history_path.parent.mkdir(parents=True, exist_ok=True)
            # What was typed may hold whatever was pasted in: private to the user, like the sessions.
            descriptor = os.open(history_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.close(descriptor)
            history = FileHistory(str(history_path))
        self._session: PromptSession[str] = PromptSession(history=history)
        self._answers: PromptSession[str] = PromptSession()  # approvals and questions stay out of history

    def read(self, prompt: str, *, completions: dict[str, Any] | None = None, remember: bool = True) -> str:
        from prompt_toolkit.completion import NestedCompleter

        completer = NestedCompleter.from_nested_dict(completions) if completions else None
        session = self._session if remember else self._answers
        return session.prompt(prompt, completer=completer, complete_while_typing=completer is not None)
