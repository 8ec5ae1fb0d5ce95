"""The ``teaagent`` command line (``python -m teaagent`` runs it too).

Exit codes (a contract, ARCHITECTURE.md): 0 success; 1 a tool or run failed; 2 bad usage or
configuration, with one sentence on stderr; 3 approval denied or expired.
"""

from __future__ import annotations

from teaagent.cli._main import EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, app, main

__all__ = ["EXIT_DENIED", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "app", "main"]
