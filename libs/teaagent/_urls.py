"""What a message or a log line may repeat of a URL: never a credential it may carry.

A URL in a configuration can hold a secret in its user information (``redis://:PASSWORD@host``,
``https://user:pass@proxy``), in its query (``redis://host/0?password=...``) or in its path (a
Slack webhook's token). Every sentence that names a URL names it through :func:`shown_url`, and a
rejected URL, which no parser may be able to read, the same way: this module reads it as text.
:func:`split_url` is ``urlsplit`` for a URL that may be malformed: None instead of Python's
``ValueError``.

This module sits below every other (it imports none of teaagent), as ``_json`` does.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import SplitResult, urlsplit

__all__ = ["shown_url", "split_url"]

_QUERY_OR_FRAGMENT: Final = re.compile(r"[?#]")


def split_url(url: str) -> SplitResult | None:
    """``urlsplit(url)``, its host and port read once; None when they cannot be read.

    An unclosed IPv6 bracket, a bracketed host that is no address and a port out of range make
    ``urlsplit`` or its ``hostname`` and ``port`` raise a bare ``ValueError`` in Python's words: a
    user's typo in a URL must come back as one sentence of ours, not as an internal error.
    """
    try:
        parts = urlsplit(url)
        _ = parts.hostname, parts.port
    except ValueError:
        return None
    return parts


def shown_url(url: str, *, path: bool = False) -> str:
    """Return ``url`` as a message may show it: its scheme, host and port, and nothing secret.

    The user and password are left out, and so are the query and the fragment; the path, which
    may hold a token (a webhook's), is shown as ``/…`` unless ``path`` (a service's base URL,
    whose path is a prefix at most). Read as text, not parsed, so that a URL no parser takes
    (an unclosed IPv6 bracket, a port out of range, no scheme) is shown the same way.

    Args:
        url: The URL, well formed or not.
        path: Whether to keep the path (never its query or fragment).

    Returns:
        ``scheme://host:port``, followed by the path or ``/…`` when the URL has more.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "", url
    cut = len(rest)
    for mark in ("/", "?", "#"):
        at = rest.find(mark)
        if at >= 0:
            cut = min(cut, at)
    authority = rest[:cut].rpartition("@")[2]
    tail = rest[cut:]
    if path:
        kept = _QUERY_OR_FRAGMENT.split(tail, maxsplit=1)[0]
        tail = kept + ("?…" if kept != tail else "")
    elif tail:
        tail = "/…"
    return f"{scheme}{separator}{authority}{tail}"
