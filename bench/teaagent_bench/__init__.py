"""teaagent's benchmarks, run by ``teaagent bench NAME`` and ``make bench``: not part of the library.

They live in the checkout's ``bench/`` folder, beside ``libs/`` and ``services/``, and ship in no
wheel: ``teaagent bench`` puts this folder on the path when it runs from a checkout (see
docs/architecture.md, "Benchmarks"). They import the library and the services; the library imports
them only in ``teaagent bench``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

ROOT: Final = str(Path(__file__).resolve().parent.parent)  # the folder that holds this package


def python_code(code: str) -> str:
    """``code`` for ``python -c``, first putting this package on the path (a checkout's bench/ is on none)."""
    return f"import sys; sys.path.insert(0, {ROOT!r}); {code}"
