"""The permission modes, from the narrowest to the widest."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["PermissionMode"]


class PermissionMode(StrEnum):
    """How much a run may do locally without asking (the table in :mod:`teaagent.policy`)."""

    READ_ONLY = "read-only"
    WORKSPACE_WRITE = "workspace-write"
    PROMPT = "prompt"
    ALLOW = "allow"
    DANGER_FULL_ACCESS = "danger-full-access"
