"""Verification of an audit log: every record intact, every link in place, every HMAC right."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from teaagent._fields import json_fields
from teaagent.audit._event import GENESIS_HASH, canonical_json, chain_suffix
from teaagent.audit._keys import check_chain_key, default_key_path, read_key_file
from teaagent.errors import AuditVerificationError, ConfigError

__all__ = ["AuditProblem", "VerificationReport", "verify_log", "verify_log_or_raise"]

_HEX_HASH = re.compile(r"[0-9a-f]{64}")
_RECORD_FIELDS = frozenset(
    {"created_at", "chain_hmac", "event_hash", "event_id", "event_type", "payload", "prev_hash", "run_id"}
)
_TEXT_FIELDS = ("created_at", "event_id", "event_type", "run_id")
_HASH_FIELDS = ("prev_hash", "event_hash", "chain_hmac")


class AuditProblem(StrEnum):
    """Why a line fails verification (the report's ``problem``)."""

    CUT_SHORT = "cut_short"
    EMPTY_LINE = "empty_line"
    BAD_JSON = "bad_json"
    NOT_A_RECORD = "not_a_record"
    CHANGED = "changed"
    CHAIN_BROKEN = "chain_broken"
    NOT_CANONICAL = "not_canonical"
    HMAC_MISMATCH = "hmac_mismatch"


_REASONS = {
    AuditProblem.CUT_SHORT: (
        "the line is cut short (it has no newline: an interrupted write or a truncated file)"
    ),
    AuditProblem.EMPTY_LINE: "the line is empty (a line was inserted or a record was blanked)",
    AuditProblem.BAD_JSON: "the line is not valid JSON (the record was damaged)",
    AuditProblem.CHANGED: "event_hash does not match the record (the record was changed)",
    AuditProblem.CHAIN_BROKEN: (
        "prev_hash does not match the previous record's event_hash"
        " (a record was removed, inserted or reordered)"
    ),
    AuditProblem.NOT_CANONICAL: "the record is not in canonical form (it was edited)",
    AuditProblem.HMAC_MISMATCH: (
        "chain_hmac does not match (the record was rewritten by someone without the chain key,"
        " or the key is not this log's)"
    ),
}
_FIRST_LINK_REASON = "prev_hash is not the genesis value (the records before this one were removed)"


@dataclass(frozen=True)
class VerificationReport:
    """What :func:`verify_log` found.

    Attributes:
        path: The log, as given.
        ok: True when every line is an intact record in its place.
        records: How many records verified (all of them when ``ok``, those before the bad line if not).
        hmac_checked: Whether the HMACs were checked (a key was given or found beside the log).
        first_bad_line: The 1-based number of the first line that fails, or None.
        problem: Why that line fails, or None.
        reason: The sentence that says so, or None.
        last_event_hash: The ``event_hash`` of the last verified record (None for none). Keep it
            elsewhere to detect later removal of the log's last records, which no chain can show.
    """

    path: str
    ok: bool
    records: int
    hmac_checked: bool
    first_bad_line: int | None = None
    problem: AuditProblem | None = None
    reason: str | None = None
    last_event_hash: str | None = None

    @property
    def message(self) -> str:
        """One line for a person: the summary of an intact log, or the first bad line and why."""
        if not self.ok:
            return f"{self.path}: line {self.first_bad_line}: {self.reason}"
        hmac_note = (
            "HMAC verified"
            if self.hmac_checked
            else "HMAC not checked (no key file beside the log and no key given)"
        )
        noun = "record" if self.records == 1 else "records"
        return f"{self.path}: {self.records} {noun}, hash chain intact, {hmac_note}."

    def to_dict(self) -> dict[str, Any]:
        """Return the report as JSON values (what ``teaagent audit verify --json`` prints)."""
        return json_fields(self) | {"message": self.message}


class _BadLine(Exception):
    def __init__(self, problem: AuditProblem, reason: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.reason = reason or _REASONS[problem]


def _check_line(raw: bytes, expected_prev: str, key: bytes | None) -> str:
    """Check one line against the chain so far and return its event_hash; raise _BadLine if it fails."""
    # 1. A whole line: ends with its newline, holds something.
    if not raw.endswith(b"\n"):
        raise _BadLine(AuditProblem.CUT_SHORT)
    text_bytes = raw[:-1]
    if not text_bytes.strip():
        raise _BadLine(AuditProblem.EMPTY_LINE)
    # 2. A JSON object with exactly the record's fields, of the right types.
    try:
        text = text_bytes.decode("utf-8")
        record = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _BadLine(AuditProblem.BAD_JSON) from None
    _check_fields(record)
    event_hash: str = record.pop("event_hash")
    chain_hmac: str = record.pop("chain_hmac")
    # 3. The hashed bytes are the line's own: the line without its chain fields, closed again.
    suffix = chain_suffix(event_hash, chain_hmac)
    if not text.endswith(suffix):
        raise _BadLine(AuditProblem.NOT_CANONICAL)
    body = (text[: -len(suffix)] + "}").encode("utf-8")
    # 4. The record is unchanged.
    if hashlib.sha256(body).hexdigest() != event_hash:
        raise _BadLine(AuditProblem.CHANGED)
    # 5. It links to the record before it.
    if record["prev_hash"] != expected_prev:
        raise _BadLine(
            AuditProblem.CHAIN_BROKEN, _FIRST_LINK_REASON if expected_prev == GENESIS_HASH else None
        )
    # 6. Its text is the one canonical text of its content (no duplicate keys, spaces, escapes...).
    try:
        canonical = canonical_json(record)
    except (ValueError, TypeError):  # NaN or Infinity, which json.loads accepts
        raise _BadLine(AuditProblem.NOT_CANONICAL) from None
    if canonical.encode("utf-8") != body:
        raise _BadLine(AuditProblem.NOT_CANONICAL)
    # 7. Whoever wrote it held the chain key.
    if key is not None:
        expected_hmac = hmac.new(key, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected_hmac, chain_hmac):
            raise _BadLine(AuditProblem.HMAC_MISMATCH)
    return event_hash


def _check_fields(record: object) -> None:
    if not isinstance(record, dict):
        raise _BadLine(AuditProblem.NOT_A_RECORD, "the line is not an audit record (it is not a JSON object)")
    missing = sorted(_RECORD_FIELDS - record.keys())
    extra = sorted(record.keys() - _RECORD_FIELDS)
    if missing or extra:
        detail = f"it lacks {', '.join(missing)}" if missing else f"it has unknown fields {', '.join(extra)}"
        raise _BadLine(AuditProblem.NOT_A_RECORD, f"the line is not an audit record ({detail})")
    wrong = [name for name in _TEXT_FIELDS if not isinstance(record[name], str)]
    wrong += [
        name
        for name in _HASH_FIELDS
        if not (isinstance(record[name], str) and _HEX_HASH.fullmatch(record[name]))
    ]
    if not isinstance(record["payload"], dict):
        wrong.append("payload")
    if wrong:
        raise _BadLine(
            AuditProblem.NOT_A_RECORD,
            f"the line is not an audit record ({', '.join(wrong)} of the wrong form)",
        )


def _resolve_key(
    path: Path, chain_key: bytes | None, key_file: str | os.PathLike[str] | None
) -> bytes | None:
    if chain_key is not None:
        return check_chain_key(chain_key)
    if key_file is not None:
        return read_key_file(key_file)
    try:
        return read_key_file(default_key_path(path))
    except FileNotFoundError:
        return None


def verify_log(
    path: str | os.PathLike[str],
    *,
    chain_key: bytes | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> VerificationReport:
    """Check an audit log line by line and report the first line that fails; never raises for a bad log.

    Each line must be a whole record (1), a JSON object with the record's fields (2) whose chain
    fields close it (3), whose ``event_hash`` is the SHA-256 of its body (4), whose ``prev_hash`` is
    the previous record's ``event_hash`` or the genesis value for the first (5), in canonical form (6),
    and, when a key is at hand, whose ``chain_hmac`` is the HMAC of its body under the key (7).
    An empty file is an intact log of no records.

    Args:
        path: The JSONL log.
        chain_key: The HMAC key.
        key_file: A key file to read the key from, when ``chain_key`` is not given. With neither,
            the key file beside the log is used if it exists; otherwise only the hash chain is
            checked, and the report says so.

    Returns:
        The report.

    Raises:
        FileNotFoundError: The log, or the given key file, does not exist.
        ConfigError: The log or a key file cannot be read, or a key file holds no key.
        ValueError: ``chain_key`` is shorter than 16 bytes.
        TypeError: ``chain_key`` is not bytes.
    """
    log_path = Path(path)
    key = _resolve_key(log_path, chain_key, key_file)
    name = os.fspath(path)
    expected_prev = GENESIS_HASH
    records = 0
    try:
        with open(log_path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    expected_prev = _check_line(raw, expected_prev, key)
                except _BadLine as bad:
                    return VerificationReport(
                        name,
                        ok=False,
                        records=records,
                        hmac_checked=key is not None,
                        first_bad_line=number,
                        problem=bad.problem,
                        reason=bad.reason,
                        last_event_hash=expected_prev if records else None,
                    )
                records += 1
    except FileNotFoundError:
        raise FileNotFoundError(f"the audit log {name} does not exist.") from None
    except IsADirectoryError:
        raise ConfigError(f"the audit log {name} is a folder, not a file.") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the audit log {name}: {exc.strerror or exc}.") from None
    return VerificationReport(
        name,
        ok=True,
        records=records,
        hmac_checked=key is not None,
        last_event_hash=expected_prev if records else None,
    )


def verify_log_or_raise(
    path: str | os.PathLike[str],
    *,
    chain_key: bytes | None = None,
    key_file: str | os.PathLike[str] | None = None,
    require_hmac: bool = False,
) -> VerificationReport:
    """Verify an audit log as :func:`verify_log` does, and raise unless it is intact.

    Args:
        path: The JSONL log.
        chain_key: The HMAC key.
        key_file: A key file, when ``chain_key`` is not given.
        require_hmac: Fail when no key is at hand, instead of checking the hash chain only.

    Returns:
        The report of an intact log.

    Raises:
        AuditVerificationError: A line fails (the message names it and says why), or
            ``require_hmac`` is set and there is no key.
        FileNotFoundError: The log, or the given key file, does not exist.
        ConfigError: The log or a key file cannot be read, or a key file holds no key.
    """
    report = verify_log(path, chain_key=chain_key, key_file=key_file)
    if not report.ok:
        raise AuditVerificationError(report.message)
    if require_hmac and not report.hmac_checked:
        raise AuditVerificationError(
            f"{report.path}: the HMAC cannot be checked:"
            " there is no key file beside the log and no key was given."
        )
    return report
