"""What every count of model calls adds up: tokens in, tokens out, and their cost."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Usage"]


@dataclass
class Usage:
    """The tokens and the cost of some model calls, added up.

    The base of the sums that the cost tracker (per label, model and day), the runner (per run)
    and the agent service (per session, model and day) keep beside their own counts.

    Attributes:
        input_tokens: Tokens sent.
        output_tokens: Tokens received.
        cost_cents: What they cost, in US cents.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cost_cents: float = 0.0

    def add_usage(self, input_tokens: int, output_tokens: int, cost_cents: float) -> None:
        """Add one call's (or another sum's) tokens and cost."""
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost_cents += cost_cents
