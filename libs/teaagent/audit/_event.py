"""One audit event, its event types, and the exact bytes the chain hashes.

The record layout (one line of the JSONL file)::

    {"created_at":...,"event_id":...,"event_type":...,"payload":{...},"prev_hash":...,"run_id":...,
     "chain_hmac":"<64 hex>","event_hash":"<64 hex>"}\\n

The *body* is the record without ``chain_hmac`` and ``event_hash``, written by :func:`canonical_json`;
the line is the body with its closing brace replaced by the two chain fields. A verifier therefore
recovers the hashed bytes verbatim: strip the suffix ``,"chain_hmac":"H","event_hash":"E"}`` and put
the ``}`` back. It never needs to re-serialise the record to check it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from json.encoder import encode_basestring_ascii
from typing import Any

__all__ = [
    "EVENT_TYPES",
    "GENESIS_HASH",
    "AuditEvent",
    "AuditEventType",
    "canonical_json",
    "chain_suffix",
    "new_event_id",
    "utc_timestamp",
]

GENESIS_HASH = "0" * 64
"""The ``prev_hash`` of the first record of a log: nothing precedes it."""

# The C encoder that JSONEncoder.iterencode builds (None without the _json accelerator); typeshed
# does not declare it.
_C_MAKE_ENCODER: Callable[..., Callable[[Any, int], Iterable[str]]] | None = getattr(
    json.encoder, "c_make_encoder", None
)
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False, check_circular=False
)


def _one_shot_encoder() -> Callable[[Any], str]:
    """Return ``_ENCODER.encode`` with the C encoder it uses made once instead of at every call.

    ``JSONEncoder.encode`` builds a new C encoder each time (``iterencode``'s one-shot path), which
    costs about as much as encoding a small record. This calls ``c_make_encoder`` with the very
    arguments ``iterencode`` passes it, once; where that is not possible (no C accelerator, or a
    Python whose signature differs) or gives another text on a probe, ``encode`` itself is used.
    """
    if _C_MAKE_ENCODER is None:  # pragma: no cover - CPython always has the accelerator
        return _ENCODER.encode
    try:
        encoder = _C_MAKE_ENCODER(
            None,  # markers: check_circular=False
            _ENCODER.default,
            encode_basestring_ascii,
            _ENCODER.indent,
            _ENCODER.key_separator,
            _ENCODER.item_separator,
            _ENCODER.sort_keys,
            _ENCODER.skipkeys,
            _ENCODER.allow_nan,
        )
    except TypeError:  # pragma: no cover - a future signature
        return _ENCODER.encode

    def encode(value: Any) -> str:
        return "".join(encoder(value, 0))

    probe = {"b": [1, 2.5, -0.0, 1e16, True, None, '\u00e9\n"\ud800'], "a": {"d": "x", "c": {}}, "10": []}
    return encode if encode(probe) == _ENCODER.encode(probe) else _ENCODER.encode


_ENCODE = _one_shot_encoder()


def canonical_json(value: Any) -> str:
    """Return the canonical JSON text that the audit chain hashes (ASCII only, so its UTF-8 is itself).

    The rule, for anyone writing an outside verifier: Python's
    ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)``.
    That is: object keys sorted by code point, no whitespace, ``"`` ``\\`` ``\\b`` ``\\f`` ``\\n``
    ``\\r`` ``\\t`` as two-character escapes, every other character outside U+0020..U+007E written as
    ``\\uXXXX`` (lowercase hex; UTF-16 surrogate pairs above U+FFFF; DEL is ``\\u007f``), integers
    in decimal, floats as Python's shortest round-trip ``repr`` (``0.1``, ``1e-05``, ``100.0``), no NaN
    or infinity. An outside verifier does not need to reproduce it, since it hashes the line's own
    bytes (see the module docstring); :func:`teaagent.audit.verify_log` also checks that each record is
    in this form so that no two texts can stand for one record.

    It is not RFC 8785 (:func:`teaagent.quorum.canonical`): that one is several times slower in pure
    Python, and the audit log is on the hot path of every tool call.

    Args:
        value: A JSON value made of dicts with string keys, lists, strings, ints, finite floats,
            booleans and None (what :class:`teaagent.audit.Redactor` produces). It must not be cyclic.

    Returns:
        The canonical text.

    Raises:
        ValueError: ``value`` holds a NaN or an infinity.
        TypeError: ``value`` holds something JSON cannot carry.
    """
    return _ENCODE(value)


def chain_suffix(event_hash: str | None, chain_hmac: str | None) -> str:
    """Return what replaces the body's closing brace in a record: the two chain fields and ``}``."""
    return f',"chain_hmac":{_ENCODE(chain_hmac)},"event_hash":{_ENCODE(event_hash)}}}'


_ID_BATCH = 128  # ids drawn per read of os.urandom: one system call for this many events
_VERSION_4 = bytes((byte & 0x0F) | 0x40 for byte in range(256))  # byte 6: version 4
_RFC_4122 = bytes((byte & 0x3F) | 0x80 for byte in range(256))  # byte 8: the RFC 4122 variant
_spare_ids: list[str] = []
os.register_at_fork(after_in_child=_spare_ids.clear)  # a child never hands out its parent's ids


def new_event_id() -> str:
    """Return a random UUID (version 4) as 32 lowercase hex characters.

    It is ``uuid.uuid4().hex`` without building a ``UUID`` object, a measurable part of an append:
    the ids are drawn :data:`_ID_BATCH` at a time from ``os.urandom``, their version and variant
    bits set for the whole batch at once. Thread-safe (``list.pop`` and ``list.extend`` are atomic);
    a forked child drops the ids its parent had drawn, so no id is given out twice.
    """
    try:
        return _spare_ids.pop()
    except IndexError:
        pass
    raw = bytearray(os.urandom(16 * _ID_BATCH))
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_RFC_4122)
    text = raw.hex()
    batch = [text[start : start + 32] for start in range(0, len(text), 32)]
    event_id = batch.pop()
    _spare_ids.extend(batch)
    return event_id


_second_cache: tuple[int, str] = (-1, "")


def utc_timestamp() -> str:
    """Return the current UTC time in ISO 8601 with microseconds, e.g. ``2026-06-05T12:00:00.000001Z``.

    The text up to the second is cached: formatting it costs more than the rest of an append's bookkeeping.
    """
    global _second_cache
    seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
    cached_second, prefix = _second_cache
    if cached_second != seconds:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _second_cache = (seconds, prefix)
    return f"{prefix}.{nanos // 1000:06d}Z"


class AuditEventType(StrEnum):
    """The event types the library writes (a ``StrEnum``: each member is its string value)."""

    RUN_START = "run_start"
    """Agent run began."""
    RUN_END = "run_end"
    """Agent run completed."""
    TOOL_CALL = "tool_call"
    """Tool invoked."""
    TOOL_RESULT = "tool_result"
    """Tool returned a result."""
    TOOL_ERROR = "tool_error"
    """Tool raised an exception."""
    APPROVAL_REQUEST = "approval_request"
    """Approval prompt triggered."""
    APPROVAL_GRANTED = "approval_granted"
    """Call approved."""
    APPROVAL_DENIED = "approval_denied"
    """Call denied."""
    MODEL_REQUEST = "model_request"
    """LLM request sent."""
    MODEL_RESPONSE = "model_response"
    """LLM response received."""
    COST_CHECKPOINT = "cost_checkpoint"
    """Intermediate cost recorded."""
    ITERATION_LIMIT = "iteration_limit"
    """Iteration limit hit."""
    TOOL_CALL_LIMIT = "tool_call_limit"
    """Tool call limit hit."""
    VALIDATION_RESULT = "validation_result"
    """Post-run validation result."""


EVENT_TYPES: frozenset[str] = frozenset(member.value for member in AuditEventType)
"""Every event type of the specification's table, as plain strings."""


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One audit event; the chain fields belong to its place in a log, so they are not stored here.

    Attributes:
        event_type: What happened, one of :data:`EVENT_TYPES` for the library's own events.
        run_id: The run the event belongs to.
        payload: The event's details as the audit level let them through (JSON values only).
        event_id: A random UUID as 32 hex characters.
        created_at: UTC time in ISO 8601 with microseconds.
    """

    event_type: str
    run_id: str
    payload: dict[str, Any]
    event_id: str = field(default_factory=new_event_id)
    created_at: str = field(default_factory=utc_timestamp)

    def body(self, prev_hash: str | None) -> str:
        """Return the canonical JSON of the record without its chain fields: the bytes that are hashed.

        Args:
            prev_hash: The previous record's ``event_hash`` (:data:`GENESIS_HASH` for the first).

        Returns:
            The canonical text (see :func:`canonical_json`).

        Raises:
            ValueError: The payload holds a NaN or an infinity.
            TypeError: The payload holds something JSON cannot carry.
        """
        created_at, event_id, event_type, run_id = (
            self.created_at,
            self.event_id,
            self.event_type,
            self.run_id,
        )
        if (
            type(created_at) is str
            and type(event_id) is str
            and type(event_type) is str
            and type(run_id) is str
            and type(prev_hash) is str
        ):
            # The outer object written by hand (its keys are already in sorted order, each string
            # escaped as the encoder would) so that the encoder sorts and walks the payload only.
            text = encode_basestring_ascii
            return (
                f'{{"created_at":{text(created_at)},"event_id":{text(event_id)},'
                f'"event_type":{text(event_type)},"payload":{_ENCODE(self.payload)},'
                f'"prev_hash":{text(prev_hash)},"run_id":{text(run_id)}}}'
            )
        return _ENCODE(
            {
                "created_at": created_at,
                "event_id": event_id,
                "event_type": event_type,
                "payload": self.payload,
                "prev_hash": prev_hash,
                "run_id": run_id,
            }
        )

    def to_json(self, prev_hash: str | None, event_hash: str | None, chain_hmac: str | None) -> str:
        """Serialise to a JSON string including chain fields: one record line, without its newline.

        Args:
            prev_hash: The previous record's ``event_hash``.
            event_hash: Hex SHA-256 of :meth:`body`.
            chain_hmac: Hex HMAC-SHA256 of :meth:`body` under the chain key.

        Returns:
            The record's JSON text.

        Raises:
            ValueError: The payload holds a NaN or an infinity.
            TypeError: The payload holds something JSON cannot carry.
        """
        return self.body(prev_hash)[:-1] + chain_suffix(event_hash, chain_hmac)
