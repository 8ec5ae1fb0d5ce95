"""What a time shown to a person looks like (:func:`teaagent._words.moment`), for tests to match.

The relative part depends on the clock when the sentence was made, so tests pin the date and the
shape of the relative part: ``2026-12-06 01:02:03Z, 3m 05s ago`` (or ``in 1m 58s``, ``now``).
"""

from __future__ import annotations

import re
import time

__all__ = ["AGO", "AN_HOUR_AHEAD", "DATE", "RELATIVE", "date_of", "moment_re"]

DATE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"
"""Any date part of a moment, as a regular expression."""
_SPAN = r"(?:\d+h \d\dm|\d+m \d\ds|\d+s)"
RELATIVE = rf"(?:now|in {_SPAN}|{_SPAN} ago)"
"""The relative part of a moment, as a regular expression."""
AGO = rf"(?:{_SPAN} ago|now)"
"""The relative part of a moment not in the future."""
AN_HOUR_AHEAD = r"in (?:59m \d\ds|1h 00m)"
"""The relative part of a moment made an hour ahead of a clock read a little earlier."""


def date_of(when: float) -> str:
    """The date part of a moment: ``2026-12-06 01:02:03Z``."""
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(int(when)))


def moment_re(when: float, relative: str = RELATIVE) -> str:
    """A regular expression for the moment ``when`` as shown: its exact date and a relative part."""
    return re.escape(date_of(when)) + f", (?:{relative})"
