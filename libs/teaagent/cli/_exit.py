"""The command line's exit codes and its one-sentence failure, shared by every command module.

They live apart from :mod:`teaagent.cli._main`, which imports every command module: a command that
needs them imports this instead, so no command module imports ``_main`` back.
"""

from __future__ import annotations

import sys
from typing import Final, NoReturn

import typer

__all__ = ["EXIT_DENIED", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "PRIVATE_KEY_SENTENCE", "bad_usage", "fail"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1  # a tool or a run failed
EXIT_USAGE: Final = 2  # bad usage or configuration
EXIT_DENIED: Final = 3  # an approval was denied or expired


PRIVATE_KEY_SENTENCE: Final = (
    "an argument is a private key, which is never shown; give its public half (the .pub file)."
)


def fail(message: str, code: int) -> int:
    """Write ``teaagent: <message>`` to stderr and return ``code``.

    A message that quotes a private key (a pasted key an option parser echoes back as an unknown
    option, say) is replaced by :data:`PRIVATE_KEY_SENTENCE`: a terminal or a log never shows it.
    """
    if "PRIVATE KEY-----" in message or "openssh-key-v1" in message:
        message = PRIVATE_KEY_SENTENCE
    sys.stderr.write(f"teaagent: {message}\n")
    return code


def bad_usage(message: str) -> NoReturn:
    """End the command with the sentence and exit code of a usage error.

    Raises:
        typer.Exit: Always, with :data:`EXIT_USAGE`.
    """
    raise typer.Exit(fail(message, EXIT_USAGE))
