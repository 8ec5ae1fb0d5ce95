"""Canonical JSON (RFC 8785) and the payload digest of a tool call (PROTOCOL.md, Encoding rules).

This module sits below every other so that :mod:`teaagent.policy` and :mod:`teaagent.quorum`
can both use it without importing each other; :mod:`teaagent.quorum` re-exports its names.

Both encoders recurse once per level of arrays and objects, so a value is refused before it is
encoded when it nests deeper than ``MAX_JSON_DEPTH`` (``teaagent._json``), and a call's
arguments when they nest deeper than ``MAX_ARGUMENTS_DEPTH``: never a ``RecursionError``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Final

import rfc8785

from teaagent._json import MAX_ARGUMENTS_DEPTH, MAX_JSON_DEPTH, check_value_depth

__all__ = ["DIGEST_PREFIX", "canonical", "payload_digest"]

DIGEST_PREFIX = "sha256:"
_SAFE: Final = 2**53 - 1  # I-JSON's exact integers; rfc8785 refuses any beyond


def _plain(value: Any, room: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` holds only what RFC 8785 writes as the compact, key-sorted ``json.dumps``.

    That is: dicts with ASCII string keys (sorted alike by UTF-16 code units and by code
    points), lists, strings (both write them as UTF-8 with the same escapes: quote, backslash
    and the control characters), integers of I-JSON's exact range, booleans and None. Floats,
    tuples, subclasses and everything else are left to the full encoder. ``room`` is how many
    more levels of dicts and lists may follow: a value nested deeper is not plain either (the
    full encoder's path refuses it before encoding).
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-_SAFE <= value <= _SAFE)
    if kind is dict or kind is list:
        if room == 0:
            return False
        if kind is dict:
            return all(
                type(key) is str and key.isascii() and _plain(item, room - 1) for key, item in value.items()
            )
        return all(_plain(item, room - 1) for item in value)
    return False


def canonical(obj: Any) -> bytes:
    """Return the RFC 8785 (JCS) canonical JSON bytes of ``obj``.

    Args:
        obj: A JSON value: dicts with string keys, lists, strings, integers, floats, booleans, None.

    Returns:
        The canonical UTF-8 bytes.

    Raises:
        JSONDepthError: ``obj`` nests more than ``MAX_JSON_DEPTH`` levels deep (a ``ValueError``).
        ValueError: ``obj`` holds something JSON cannot carry (a NaN, an integer beyond
            the I-JSON range, a non-string key, a set...).
    """
    if _plain(obj):
        # The common case (no floats), about three times faster than the full encoder.
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        try:
            return text.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it
            raise ValueError(f"the value cannot be written as canonical JSON: {exc}") from exc
    check_value_depth(obj)  # rfc8785 recurses per level (_plain stops at a float, or at the limit)
    try:
        return rfc8785.dumps(obj)
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise ValueError(f"the value cannot be written as canonical JSON: {exc}") from exc


def payload_digest(tool_name: str, arguments: dict[str, Any]) -> str:
    """Return the digest that names one tool call: ``sha256:`` + hex SHA-256 of its canonical JSON.

    The digest covers ``{"arguments": arguments, "tool_name": tool_name}``; it is what
    ``ApprovalPolicy.preapproved_payload_digests`` holds and what every signed statement carries.

    Args:
        tool_name: The tool's registered name.
        arguments: The call's arguments.

    Returns:
        ``"sha256:"`` followed by 64 lowercase hex characters.

    Raises:
        JSONDepthError: The arguments nest more than ``MAX_ARGUMENTS_DEPTH`` levels deep.
        ValueError: The arguments cannot be written as canonical JSON.
    """
    check_value_depth(arguments, limit=MAX_ARGUMENTS_DEPTH, what="The arguments object")
    body = canonical({"arguments": arguments, "tool_name": tool_name})
    return DIGEST_PREFIX + hashlib.sha256(body).hexdigest()
