"""Fixtures shared by the whole suite."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace root of its own for one test."""
    root = tmp_path / "workspace"
    root.mkdir()
    return root
