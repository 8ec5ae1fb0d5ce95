"""The HTTP models of the quorum's shapes that more than one service answers with."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["SettledOut"]


class SettledOut(BaseModel):
    """A request's outcome at its origin, as evidence verified here proves it (``Settlement``)."""

    outcome: Literal["approved", "denied"]
    decided_by: list[str] = Field(description="The counted approvers, or deniers, in peer order.")
    at: int = Field(description="The latest signed_at of those decisions, Unix seconds.")
