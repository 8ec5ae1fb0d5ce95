"""The ``teaagent`` command line (``python -m teaagent`` runs it too).

Exit codes (a contract, ARCHITECTURE.md): 0 success; 1 a tool or run failed; 2 bad usage or
configuration, with one sentence on stderr; 3 approval denied or expired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from teaagent.cli._main import EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, main

if TYPE_CHECKING:
    import typer

__all__ = ["EXIT_DENIED", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "app", "main"]


def __getattr__(name: str) -> typer.Typer:
    # ``app`` imports every command's module: built when first asked for (then kept, one object as
    # before), never by ``teaagent relay serve``.
    if name == "app":
        from teaagent.cli._main import build_app

        app = globals()["app"] = build_app()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
