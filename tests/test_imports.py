"""Every public module imports first in a fresh interpreter, and every name in ``__all__`` exists.

A fresh interpreter per module catches import cycles that a shared one hides (sigstore's
``test_imports.py`` does the same).
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import teaagent

PUBLIC_MODULES = sorted(
    {"teaagent"}
    | {
        info.name
        for info in pkgutil.walk_packages(teaagent.__path__, prefix="teaagent.")
        if not any(part.startswith("_") for part in info.name.split("."))
    }
)
SERVICES = ["teaagent_agent", "teaagent_relay", "teaagent_approver"]


@pytest.mark.parametrize("module", PUBLIC_MODULES + SERVICES)
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("module", PUBLIC_MODULES + SERVICES)
def test_every_name_in_all_exists(module: str) -> None:
    imported = importlib.import_module(module)
    names = getattr(imported, "__all__", [])
    missing = [name for name in names if not hasattr(imported, name)]
    assert missing == []
