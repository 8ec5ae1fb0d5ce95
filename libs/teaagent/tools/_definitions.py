"""The frozen descriptions of a tool: its annotations, its rate limit, its definition."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["SECURITY_TIERS", "ToolAnnotations", "ToolDefinition", "ToolHandler", "ToolRateLimit"]

SECURITY_TIERS: Final = ("Low", "Medium", "High", "Critical")
"""The security tiers, from the least to the most dangerous."""

ToolHandler = Callable[[dict[str, Any]], dict[str, Any]]
"""A tool's implementation: called with the validated arguments, returns the result object."""


@dataclass(frozen=True)
class ToolAnnotations:
    """What a tool does to the world, as the policy gate and the model see it.

    Attributes:
        read_only: The tool only reads; it changes nothing.
        destructive: The tool can destroy data or do anything (deleting files, running commands).
        idempotent: Calling it twice with the same arguments has the effect of calling it once.
        stateful: Its effect depends on, or leaves behind, state outside the call.
        security_tier: One of ``Low``, ``Medium``, ``High``, ``Critical``.

    Raises:
        ValueError: ``security_tier`` is not one of the four tiers, or the tool claims to be both
            read-only and destructive.
    """

    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    stateful: bool = False
    security_tier: str = "Medium"  # Low | Medium | High | Critical

    def __post_init__(self) -> None:
        if self.security_tier not in SECURITY_TIERS:
            raise ValueError(
                f"security_tier must be one of {', '.join(SECURITY_TIERS)}, got {self.security_tier!r}"
            )
        if self.read_only and self.destructive:
            # A policy that trusts read_only would let a destructive tool through: refuse the lie.
            raise ValueError("a tool cannot be both read-only and destructive")


@dataclass(frozen=True)
class ToolRateLimit:
    """``max_calls`` calls per ``window_seconds`` seconds: a burst of ``max_calls``, then refills.

    Limiters count it as a bucket of ``max_calls`` calls that gets one call back every
    ``window_seconds / max_calls`` (GCRA; :mod:`teaagent.tools._ratelimit` states what that allows).

    Raises:
        TypeError: ``max_calls`` is not an integer or ``window_seconds`` is not a number.
        ValueError: ``max_calls`` is below 1, or ``window_seconds`` is not a finite number above 0.
    """

    max_calls: int
    window_seconds: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_calls, bool) or not isinstance(self.max_calls, int):
            raise TypeError(f"max_calls must be an integer, got {self.max_calls!r}")
        if self.max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {self.max_calls}")
        if isinstance(self.window_seconds, bool) or not isinstance(self.window_seconds, int | float):
            raise TypeError(f"window_seconds must be a number, got {self.window_seconds!r}")
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError(f"window_seconds must be a finite number above 0, got {self.window_seconds}")

    def describe(self) -> str:
        """Return the limit in words, such as ``3 calls per 60 s``."""
        noun = "call" if self.max_calls == 1 else "calls"
        return f"{self.max_calls} {noun} per {self.window_seconds:g} s"


@dataclass(frozen=True)
class ToolDefinition:
    """A registered tool. :meth:`ToolRegistry.register <teaagent.tools.ToolRegistry.register>` builds it.

    Attributes:
        name: The unique tool name, such as ``fs.read``.
        description: What the tool does, written for the model.
        input_schema: JSON Schema (Draft 2020-12) of the arguments object.
        output_schema: JSON Schema (Draft 2020-12) of the result object.
        annotations: Security and behaviour annotations.
        handler: The implementation, called with the validated arguments.
        rate_limit: The tool's rate limit, or None for none.
        capability_manifest: Free-form description of what the tool may touch, or None.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    annotations: ToolAnnotations
    handler: ToolHandler
    rate_limit: ToolRateLimit | None
    capability_manifest: dict[str, Any] | None

    def get_security_tier(self) -> str:
        """Return the security tier string from annotations."""
        return self.annotations.security_tier
