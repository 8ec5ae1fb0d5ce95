"""The approver's own audit log: one hash-chained record per decision of this node, with its key.

The log is ``<data_dir>/approver-audit.jsonl`` (its chain key beside it, ``.key``), written by
:class:`teaagent.audit.AuditLogger`, so ``teaagent audit verify`` checks it. Every record is an
``approver.decision`` event whose payload names the request (id, origin, tool, digest, run and
call), the decision (kind, reason, ``signed_at``), who decided (a rule or an operator) and the
fingerprint of the key that signed.

Exactly one record per decision, across crashes: the process that records a decision in Redis
writes its audit record; a process that finishes a decision another one recorded (that process
died) first looks in the log for a record of it (:meth:`DecisionAudit.has`, read incrementally
from where it last stopped), so a crash between writing the record and sending the decision
never leaves two.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from teaagent.audit import AuditLogger
from teaagent.errors import TeaAgentError
from teaagent_approver._ledger import Record

__all__ = ["AUDIT_FILE_NAME", "DECISION_EVENT", "AuditWriteError", "DecisionAudit"]

logger = logging.getLogger("teaagent.approver")

AUDIT_FILE_NAME: Final = "approver-audit.jsonl"
DECISION_EVENT: Final = "approver.decision"
READ_CHUNK: Final = 1024 * 1024  # bytes of the log read at once when looking for earlier records


class AuditWriteError(TeaAgentError):
    """The audit record of a decision could not be written; the decision is not sent until it is."""


class DecisionAudit:
    """Writes the approver's audit records and knows which decisions already have one."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        """Open (or create) the log.

        Raises:
            ConfigError: The chain key file beside the log holds no key.
        """
        self.path = path
        self._logger = AuditLogger(path, audit_level="L2", fsync=fsync, run_id="approver")
        self._lock = threading.Lock()
        self._offset = 0  # how far the log was read for :meth:`has`
        self._seen: set[tuple[str, str]] = set()

    def record(self, request: Mapping[str, Any], record: Record, *, recovered: bool = False) -> None:
        """Append the audit record of one decision.

        Args:
            request: The request decided on.
            record: The decision as recorded (kind, reason, who, key, statement).
            recovered: The decision was recorded by an approver process that died before auditing it.

        Raises:
            AuditWriteError: The record could not be written to the disk.
        """
        before = self._logger.disk_error_count
        payload = {
            "request_id": request["request_id"],
            "origin": request["origin"],
            "tool_name": request["tool_name"],
            "payload_digest": request["payload_digest"],
            "run_id": request["run_id"],
            "call_id": request["call_id"],
            "expires_at": request["expires_at"],
            "decision": record.kind,
            "reason": record.reason,
            "by": record.by,
            "key_fingerprint": record.key_fingerprint,
            "signed_at": record.signed_at,
            "recovered": recovered,
        }
        self._logger.log(DECISION_EVENT, payload)
        if self._logger.disk_error_count != before:
            raise AuditWriteError(
                f"The audit record of request {request['request_id']} could not be written to "
                f"{self.path}: {self._logger.disk_error}."
            )
        with self._lock:
            self._seen.add((request["origin"], request["request_id"]))

    def has(self, origin: str, request_id: str) -> bool:
        """Whether the log holds a decision record of the request (by any approver process).

        Reads the log from where the last call stopped; only whole lines count.
        """
        with self._lock:
            if (origin, request_id) in self._seen:
                return True
            self._read_on()
            return (origin, request_id) in self._seen

    def _read_on(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            logger.warning("cannot read the audit log %s: %s", self.path, exc)
            return
        try:
            while True:
                chunk = os.pread(fd, READ_CHUNK, self._offset)
                if not chunk:
                    return
                end = chunk.rfind(b"\n")
                if end < 0:
                    if len(chunk) < READ_CHUNK:
                        return  # a line still being written (or cut by a crash): not a record yet
                    self._offset += len(chunk)  # a line longer than a chunk is no decision record
                    continue
                for line in chunk[: end + 1].splitlines():
                    self._note(line)
                self._offset += end + 1
        finally:
            os.close(fd)

    def _note(self, line: bytes) -> None:
        try:
            event = json.loads(line)
            if event.get("event_type") != DECISION_EVENT:
                return
            payload = event["payload"]
            self._seen.add((str(payload["origin"]), str(payload["request_id"])))
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # the verifier reports broken lines; they are no record of a decision

    def close(self) -> None:
        """Close the log file."""
        self._logger.close()
