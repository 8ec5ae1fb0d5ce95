"""teaagent.audit verification, told as stories: intact passes; changed, removed, inserted, reordered,
cut and forged logs fail at the right line for the right reason; and the ``teaagent audit verify`` command."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from teaagent.audit import (
    GENESIS_HASH,
    AuditLogger,
    AuditProblem,
    AuditVerificationError,
    canonical_json,
    default_key_path,
    verify_log,
    verify_log_or_raise,
)
from teaagent.cli._main import run
from teaagent.errors import ConfigError

CHANGED = "event_hash does not match the record (the record was changed)"
CHAIN_BROKEN = (
    "prev_hash does not match the previous record's event_hash (a record was removed, inserted or reordered)"
)
FIRST_LINK = "prev_hash is not the genesis value (the records before this one were removed)"
HMAC_MISMATCH = (
    "chain_hmac does not match"
    " (the record was rewritten by someone without the chain key, or the key is not this log's)"
)
NO_KEY = "HMAC not checked (no key file beside the log and no key given)"
CUT_SHORT = "the line is cut short (it has no newline: an interrupted write or a truncated file)"
NOT_CANONICAL = "the record is not in canonical form (it was edited)"


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    """An intact log of 8 records, its key in the key file beside it."""
    path = tmp_path / "audit.jsonl"
    with AuditLogger(path, run_id="run-1") as logger:
        logger.log("run_start", {"task": "tidy up"})
        for index in range(3):
            logger.log("tool_call", {"tool_name": "fs.read", "call_id": f"c{index}", "cost_cents": 0.5})
            logger.log("tool_result", {"call_id": f"c{index}", "status": "ok"})
        logger.log("run_end", {"status": "completed"})
    return path


def read_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def forge(records: list[dict[str, Any]], key: bytes) -> list[bytes]:
    """Rebuild a chain over ``records`` as a forger would: every hash recomputed, HMACs under ``key``."""
    lines = []
    previous = GENESIS_HASH
    for record in records:
        body_fields = {k: v for k, v in record.items() if k not in ("event_hash", "chain_hmac")}
        body_fields["prev_hash"] = previous
        body = canonical_json(body_fields)
        event_hash = hashlib.sha256(body.encode()).hexdigest()
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        lines.append(f'{body[:-1]},"chain_hmac":"{mac}","event_hash":"{event_hash}"}}\n'.encode())
        previous = event_hash
    return lines


def assert_fails(path: Path, line: int, problem: AuditProblem, reason: str, **kwargs: Any) -> None:
    report = verify_log(path, **kwargs)
    assert (report.ok, report.first_bad_line, report.problem, report.reason) == (False, line, problem, reason)
    assert report.records == line - 1
    assert report.message == f"{path}: line {line}: {reason}"
    with pytest.raises(AuditVerificationError, match=re.escape(report.message)):
        verify_log_or_raise(path, **kwargs)


# The story


def test_an_intact_log_verifies_with_its_hmacs(log_path: Path) -> None:
    report = verify_log(log_path)
    assert (report.ok, report.records, report.hmac_checked, report.first_bad_line, report.problem) == (
        True,
        8,
        True,
        None,
        None,
    )
    assert report.last_event_hash == json.loads(read_lines(log_path)[-1])["event_hash"]
    assert report.message == f"{log_path}: 8 records, hash chain intact, HMAC verified."
    assert verify_log_or_raise(log_path, require_hmac=True) == report


def test_a_changed_record_fails_at_its_line(log_path: Path) -> None:
    lines = read_lines(log_path)
    lines[6] = lines[6].replace(b'"status":"ok"', b'"status":"no"')
    write_lines(log_path, lines)
    assert_fails(log_path, 7, AuditProblem.CHANGED, CHANGED)


def test_a_changed_event_hash_fails_at_its_line(log_path: Path) -> None:
    lines = read_lines(log_path)
    record = json.loads(lines[2])
    lines[2] = lines[2].replace(record["event_hash"].encode(), b"0" * 64)
    write_lines(log_path, lines)
    assert_fails(log_path, 3, AuditProblem.CHANGED, CHANGED)


def test_a_removed_record_fails_at_the_line_that_lost_its_predecessor(log_path: Path) -> None:
    lines = read_lines(log_path)
    del lines[3]
    write_lines(log_path, lines)
    assert_fails(log_path, 4, AuditProblem.CHAIN_BROKEN, CHAIN_BROKEN)


def test_a_removed_first_record_fails_at_line_1(log_path: Path) -> None:
    write_lines(log_path, read_lines(log_path)[1:])
    assert_fails(log_path, 1, AuditProblem.CHAIN_BROKEN, FIRST_LINK)


def test_an_inserted_copy_of_a_record_fails_where_it_stands(log_path: Path) -> None:
    lines = read_lines(log_path)
    lines.insert(5, lines[2])
    write_lines(log_path, lines)
    assert_fails(log_path, 6, AuditProblem.CHAIN_BROKEN, CHAIN_BROKEN)


def test_reordered_records_fail_at_the_first_moved_line(log_path: Path) -> None:
    lines = read_lines(log_path)
    lines[3], lines[4] = lines[4], lines[3]
    write_lines(log_path, lines)
    assert_fails(log_path, 4, AuditProblem.CHAIN_BROKEN, CHAIN_BROKEN)


def test_a_last_line_cut_short_fails(log_path: Path) -> None:
    data = log_path.read_bytes()
    log_path.write_bytes(data[:-30])
    assert_fails(log_path, 8, AuditProblem.CUT_SHORT, CUT_SHORT)
    log_path.write_bytes(data[:-1])  # only the final newline missing
    assert_fails(log_path, 8, AuditProblem.CUT_SHORT, CUT_SHORT)


def test_removing_the_last_records_shows_only_against_a_kept_last_hash(log_path: Path) -> None:
    kept = verify_log(log_path).last_event_hash
    write_lines(log_path, read_lines(log_path)[:-2])
    report = verify_log(log_path)
    assert (report.ok, report.records) == (True, 6)  # no chain can show a cut at the end by itself
    assert report.last_event_hash != kept


def test_a_forgery_with_every_hash_recomputed_passes_the_hash_chain_but_fails_the_hmac(
    log_path: Path,
) -> None:
    records = [json.loads(line) for line in read_lines(log_path)]
    records[4]["payload"]["status"] = "failed"
    del records[6]
    write_lines(log_path, forge(records, b"f" * 32))  # the forger does not have the key
    key_file = default_key_path(log_path)
    key_file.rename(log_path.with_name("elsewhere.key"))
    hash_only = verify_log(log_path)
    assert (hash_only.ok, hash_only.hmac_checked) == (True, False)
    assert hash_only.message == (f"{log_path}: 7 records, hash chain intact, {NO_KEY}.")
    with pytest.raises(AuditVerificationError, match=re.escape(f"{log_path}: the HMAC cannot be checked:")):
        verify_log_or_raise(log_path, require_hmac=True)
    elsewhere = log_path.with_name("elsewhere.key")
    assert_fails(log_path, 1, AuditProblem.HMAC_MISMATCH, HMAC_MISMATCH, key_file=elsewhere)


def test_a_forgery_of_one_record_with_the_hashes_after_it_recomputed_fails_at_that_record(
    log_path: Path,
) -> None:
    key = default_key_path(log_path).read_text().strip()
    lines = read_lines(log_path)
    records = [json.loads(line) for line in lines]
    records[3]["payload"]["tool_name"] = "shell.run"
    forged = forge(records, b"f" * 32)
    write_lines(log_path, lines[:3] + forged[3:])
    assert_fails(log_path, 4, AuditProblem.HMAC_MISMATCH, HMAC_MISMATCH)
    assert verify_log(log_path, chain_key=bytes.fromhex(key)).first_bad_line == 4


def test_the_right_key_rebuilds_a_valid_chain_so_the_key_must_stay_secret(log_path: Path) -> None:
    key = bytes.fromhex(default_key_path(log_path).read_text())
    records = [json.loads(line) for line in read_lines(log_path)]
    records[1]["payload"]["tool_name"] = "shell.run"
    write_lines(log_path, forge(records, key))
    assert verify_log(log_path).ok


def test_a_wrong_key_fails_at_line_1(log_path: Path) -> None:
    assert_fails(log_path, 1, AuditProblem.HMAC_MISMATCH, HMAC_MISMATCH, chain_key=b"w" * 32)


# Lines that are not records


@pytest.mark.parametrize(
    ("replacement", "problem", "reason"),
    [
        (b"\n", AuditProblem.EMPTY_LINE, "the line is empty (a line was inserted or a record was blanked)"),
        (
            b"   \n",
            AuditProblem.EMPTY_LINE,
            "the line is empty (a line was inserted or a record was blanked)",
        ),
        (b"{not json\n", AuditProblem.BAD_JSON, "the line is not valid JSON (the record was damaged)"),
        (b"\xff\xfe\n", AuditProblem.BAD_JSON, "the line is not valid JSON (the record was damaged)"),
        (
            b"[" * 100_000 + b"\n",
            AuditProblem.BAD_JSON,
            "the line is not valid JSON (the record was damaged)",
        ),
        (b"[1, 2]\n", AuditProblem.NOT_A_RECORD, "the line is not an audit record (it is not a JSON object)"),
        (
            b'{"event_type": "x"}\n',
            AuditProblem.NOT_A_RECORD,
            "the line is not an audit record"
            " (it lacks chain_hmac, created_at, event_hash, event_id, payload, prev_hash, run_id)",
        ),
    ],
)
def test_a_line_that_is_not_a_record_fails(
    log_path: Path, replacement: bytes, problem: AuditProblem, reason: str
) -> None:
    lines = read_lines(log_path)
    lines[2] = replacement
    write_lines(log_path, lines)
    assert_fails(log_path, 3, problem, reason)


def test_records_with_unknown_fields_or_fields_of_the_wrong_form_fail(log_path: Path) -> None:
    lines = read_lines(log_path)
    record = json.loads(lines[1])
    write_lines(log_path, [lines[0], json.dumps({**record, "extra": 1}).encode() + b"\n"])
    assert_fails(
        log_path,
        2,
        AuditProblem.NOT_A_RECORD,
        "the line is not an audit record (it has unknown fields extra)",
    )
    bad = {**record, "run_id": 5, "event_hash": "XYZ", "payload": []}
    write_lines(log_path, [lines[0], json.dumps(bad).encode() + b"\n"])
    assert_fails(
        log_path,
        2,
        AuditProblem.NOT_A_RECORD,
        "the line is not an audit record (run_id, event_hash, payload of the wrong form)",
    )


def test_a_record_whose_hash_covers_a_non_canonical_text_fails(log_path: Path) -> None:
    lines = read_lines(log_path)
    records = [json.loads(line) for line in lines]
    forged = forge(records[:2], b"f" * 32)
    # Re-hash a body with a space after a colon: the hash matches the bytes but the form is not canonical.
    body = forged[1].decode().split(',"chain_hmac"')[0].replace('"run_id":', '"run_id": ') + "}"
    digest = hashlib.sha256(body.encode()).hexdigest()
    line = f'{body[:-1]},"chain_hmac":"{"0" * 64}","event_hash":"{digest}"}}\n'.encode()
    write_lines(log_path, [forged[0], line])
    assert_fails(log_path, 2, AuditProblem.NOT_CANONICAL, NOT_CANONICAL, chain_key=b"f" * 32)


def test_chain_fields_that_do_not_close_the_line_fail_as_not_canonical(log_path: Path) -> None:
    lines = read_lines(log_path)
    record = json.loads(lines[0])
    write_lines(log_path, [json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"])
    assert_fails(log_path, 1, AuditProblem.NOT_CANONICAL, NOT_CANONICAL)


def test_a_nan_that_json_accepts_but_canonical_json_refuses_fails(log_path: Path) -> None:
    record = json.loads(read_lines(log_path)[0])
    body = canonical_json({k: v for k, v in record.items() if k not in ("event_hash", "chain_hmac")})
    body = body.replace('"payload":{', '"payload":{"cost":NaN,')
    digest = hashlib.sha256(body.encode()).hexdigest()
    log_path.write_bytes(f'{body[:-1]},"chain_hmac":"{"0" * 64}","event_hash":"{digest}"}}\n'.encode())
    assert_fails(log_path, 1, AuditProblem.NOT_CANONICAL, NOT_CANONICAL)


def test_an_empty_log_is_intact_with_no_records(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    report = verify_log(path)
    assert (report.ok, report.records, report.last_event_hash, report.hmac_checked) == (True, 0, None, False)
    assert report.message == f"{path}: 0 records, hash chain intact, {NO_KEY}."


# Files that cannot be read


def test_a_missing_log_or_key_file_and_a_broken_key_file_are_reported_in_a_sentence(
    tmp_path: Path, log_path: Path
) -> None:
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"the audit log {tmp_path / 'nope.jsonl'} does not exist.")
    ):
        verify_log(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match=re.escape(f"the audit log {tmp_path} is a folder, not a file.")):
        verify_log(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"the audit key file {tmp_path / 'k'} does not exist.")
    ):
        verify_log(log_path, key_file=tmp_path / "k")
    (tmp_path / "short.key").write_text("abcd\n")
    with pytest.raises(ConfigError, match=re.escape("does not hold a hex key of at least 16 bytes.")):
        verify_log(log_path, key_file=tmp_path / "short.key")
    default_key_path(log_path).write_bytes(b"\xff" * 40)
    with pytest.raises(
        ConfigError, match=re.escape(f"the audit key file {log_path}.key does not hold a hex key")
    ):
        verify_log(log_path)


# The command line


def test_cli_verify_prints_a_summary_and_exits_0_for_an_intact_log(
    log_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["audit", "verify", str(log_path)]) == 0
    assert capsys.readouterr().out == f"{log_path}: 8 records, hash chain intact, HMAC verified.\n"


def test_cli_verify_names_the_first_bad_line_and_exits_1(
    log_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = read_lines(log_path)
    lines[6] = lines[6].replace(b'"ok"', b'"ko"')
    write_lines(log_path, lines)
    assert run(["audit", "verify", str(log_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"teaagent: {log_path}: line 7: {CHANGED}\n"


def test_cli_verify_json_prints_the_report(log_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["audit", "verify", "--json", str(log_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == verify_log(log_path).to_dict()
    assert (report["ok"], report["records"], report["problem"]) == (True, 8, None)
    write_lines(log_path, read_lines(log_path)[1:])
    assert run(["audit", "verify", str(log_path), "--json"]) == 1
    broken = json.loads(capsys.readouterr().out)
    assert (broken["ok"], broken["first_bad_line"], broken["problem"], broken["reason"]) == (
        False,
        1,
        "chain_broken",
        FIRST_LINK,
    )


def test_cli_verify_uses_a_key_file_given_by_option(
    log_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = log_path.with_name("moved.key")
    default_key_path(log_path).rename(moved)
    assert run(["audit", "verify", str(log_path)]) == 0
    assert "HMAC not checked" in capsys.readouterr().out
    assert run(["audit", "verify", str(log_path), "--key-file", str(moved)]) == 0
    assert capsys.readouterr().out.endswith("HMAC verified.\n")
    wrong = log_path.with_name("wrong.key")
    wrong.write_text("ab" * 32 + "\n")
    assert run(["audit", "verify", str(log_path), "--key-file", str(wrong)]) == 1
    assert capsys.readouterr().err == f"teaagent: {log_path}: line 1: {HMAC_MISMATCH}\n"


def test_cli_verify_exits_2_with_one_sentence_for_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    assert run(["audit", "verify", str(missing)]) == 2
    assert capsys.readouterr().err == f"teaagent: the audit log {missing} does not exist.\n"
    assert run(["audit", "verify", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"teaagent: the audit log {tmp_path} is a folder, not a file.\n"


def test_cli_verify_without_a_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["audit", "verify"]) == 2
    assert capsys.readouterr().err.startswith("teaagent: ")


@pytest.mark.slow
def test_the_installed_command_verifies_and_exits_with_the_documented_codes(log_path: Path) -> None:
    command = [sys.executable, "-m", "teaagent", "audit", "verify"]
    intact = subprocess.run(
        [*command, str(log_path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert (intact.returncode, intact.stdout) == (
        0,
        f"{log_path}: 8 records, hash chain intact, HMAC verified.\n",
    )
    lines = read_lines(log_path)
    lines[3], lines[4] = lines[4], lines[3]
    write_lines(log_path, lines)
    broken = subprocess.run(
        [*command, str(log_path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert (broken.returncode, broken.stderr) == (1, f"teaagent: {log_path}: line 4: {CHAIN_BROKEN}\n")
    missing = subprocess.run(
        [*command, str(log_path) + ".nope"], capture_output=True, text=True, check=False, timeout=60
    )
    assert (missing.returncode, missing.stderr) == (
        2,
        f"teaagent: the audit log {log_path}.nope does not exist.\n",
    )
