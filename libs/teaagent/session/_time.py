"""UTC timestamps in ISO 8601, as sessions and focus entries store them."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["parse_timestamp", "utc_now"]


def utc_now() -> str:
    """Return the current UTC time in ISO 8601 with microseconds, e.g. ``2026-06-05T12:00:00.000001Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_timestamp(value: object, what: str) -> datetime:
    """Parse an ISO 8601 timestamp that names its time zone.

    Args:
        value: The stored text.
        what: What the timestamp is, for the message (``"created_at"``).

    Returns:
        The aware datetime.

    Raises:
        ValueError: ``value`` is not an ISO 8601 string with a time zone.
    """
    if not isinstance(value, str):
        raise ValueError(f"{what} must be an ISO 8601 string, not {type(value).__name__}.")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not an ISO 8601 timestamp.") from None
    if parsed.tzinfo is None:
        # Without a zone the order of two timestamps depends on where they were written.
        raise ValueError(f"{what} {value!r} does not name its time zone (end it with 'Z' for UTC).")
    return parsed
