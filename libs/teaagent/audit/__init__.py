"""Tamper-evident audit logging: a JSONL hash chain authenticated by HMAC, and its verification.

Each line of an audit log is one :class:`AuditEvent` with three chain fields::

    {"created_at":"2026-06-05T12:00:00.000001Z","event_id":"<uuid hex>","event_type":"tool_call",
     "payload":{...},"prev_hash":"<64 hex>","run_id":"<run>","chain_hmac":"<64 hex>","event_hash":"<64 hex>"}

- ``prev_hash``: the previous line's ``event_hash``; :data:`GENESIS_HASH` (64 zeros) on the first line.
- ``event_hash``: hex SHA-256 of the record's *body*, the canonical JSON (:func:`canonical_json`) of
  every field except ``event_hash`` and ``chain_hmac``, ``prev_hash`` included.
- ``chain_hmac``: hex HMAC-SHA256 of the same body under the chain key, which lives in the key file
  beside the log (``<log>.key``, mode 0600, the key in hex) unless the logger is given one.

The body is the line's own text up to the chain fields: remove
``,"chain_hmac":"<hex>","event_hash":"<hex>"}`` from the end of the line, put back ``}``, and hash
those bytes. Changing a record breaks its ``event_hash``; removing, inserting or reordering records
breaks a ``prev_hash`` link; recomputing the hashes breaks the HMACs, unless the key is known.
Removing the last records cannot show in the chain itself: compare the report's ``last_event_hash``
with one kept elsewhere.

The audit level (:class:`AuditLevel`, see :mod:`teaagent.audit._levels`) decides how much of the
payload is written: L0 metrics, L1 metadata, L2 redacted payloads (:class:`Redactor`), L3 everything.

``teaagent audit verify LOG [--key-file PATH] [--json]`` runs :func:`verify_log` from the command line.
"""

from __future__ import annotations

from teaagent.audit._event import (
    EVENT_TYPES,
    GENESIS_HASH,
    AuditEvent,
    AuditEventType,
    canonical_json,
)
from teaagent.audit._keys import KEY_FILE_SUFFIX, MIN_KEY_BYTES, default_key_path, read_key_file
from teaagent.audit._levels import (
    MAX_METADATA_CHARS,
    METADATA_FIELDS,
    METADATA_SUFFIXES,
    AuditLevel,
    metadata_only,
    metrics_only,
    parse_audit_level,
    shape_payload,
)
from teaagent.audit._logger import AuditLogger
from teaagent.audit._redact import (
    MAX_DEPTH,
    MAX_TRUNCATE_CHARS,
    MIN_SCAN_CHARS,
    REDACTION_RULES,
    Redactor,
    redact_secrets,
)
from teaagent.audit._verify import AuditProblem, VerificationReport, verify_log, verify_log_or_raise
from teaagent.errors import AuditVerificationError

__all__ = [
    "EVENT_TYPES",
    "GENESIS_HASH",
    "KEY_FILE_SUFFIX",
    "MAX_DEPTH",
    "MAX_METADATA_CHARS",
    "MAX_TRUNCATE_CHARS",
    "METADATA_FIELDS",
    "METADATA_SUFFIXES",
    "MIN_KEY_BYTES",
    "MIN_SCAN_CHARS",
    "REDACTION_RULES",
    "AuditEvent",
    "AuditEventType",
    "AuditLevel",
    "AuditLogger",
    "AuditProblem",
    "AuditVerificationError",
    "Redactor",
    "VerificationReport",
    "canonical_json",
    "default_key_path",
    "metadata_only",
    "metrics_only",
    "parse_audit_level",
    "read_key_file",
    "redact_secrets",
    "shape_payload",
    "verify_log",
    "verify_log_or_raise",
]
