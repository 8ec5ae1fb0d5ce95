"""``teaagent demo``: the whole story in one command."""

from __future__ import annotations


def demo() -> None:
    """Show teaagent at work, end to end."""
