"""teaagent.audit.AuditLogger: the chain, the key file, resuming, concurrency and disk errors."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from teaagent.audit import (
    GENESIS_HASH,
    AuditEventType,
    AuditLevel,
    AuditLogger,
    canonical_json,
    default_key_path,
    read_key_file,
    verify_log,
)
from teaagent.audit._keys import ChainMac
from teaagent.errors import ConfigError

KEY = bytes(range(32))
OPENAI_KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx1234"


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def body_of(record: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in record.items() if k not in ("event_hash", "chain_hmac")}).encode()


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


def test_each_record_links_hashes_and_authenticates_its_canonical_body(log_path: Path) -> None:
    with AuditLogger(log_path, run_id="run-1") as logger:
        logger.log("run_start", {"task": "demo"})
        logger.log(AuditEventType.TOOL_CALL, {"tool_name": "fs.read", "call_id": "c1"})
        logger.log("run_end", {"status": "completed"})
        key = logger.get_chain_key()
    lines = records(log_path)
    assert [line["event_type"] for line in lines] == ["run_start", "tool_call", "run_end"]
    previous = GENESIS_HASH
    for record in lines:
        body = body_of(record)
        assert record["prev_hash"] == previous
        assert record["event_hash"] == hashlib.sha256(body).hexdigest()
        assert record["chain_hmac"] == hmac.new(key, body, hashlib.sha256).hexdigest()
        assert record["run_id"] == "run-1"
        previous = record["event_hash"]


def test_each_line_is_the_events_to_json_and_the_events_are_kept_in_file_order(log_path: Path) -> None:
    logger = AuditLogger(log_path, chain_key=KEY)
    for index in range(5):
        logger.log("tool_result", {"index": index, "text": "é"})
    raw_lines = log_path.read_text(encoding="ascii").split("\n")
    assert raw_lines[-1] == ""  # every line ends with its newline
    events = logger.events
    assert [event.payload["index"] for event in events] == list(range(5))
    for event, line in zip(events, raw_lines, strict=False):
        record = json.loads(line)
        assert event.to_json(record["prev_hash"], record["event_hash"], record["chain_hmac"]) == line
    events.clear()
    assert len(logger.events) == 5  # a copy was returned


def test_the_run_id_is_random_by_default_and_can_be_given_per_event(log_path: Path) -> None:
    logger = AuditLogger(log_path, chain_key=KEY)
    assert re.fullmatch(r"[0-9a-f]{32}", logger.run_id)
    logger.log("run_start", {})
    logger.log("run_start", {}, run_id="other-run")
    assert [record["run_id"] for record in records(log_path)] == [logger.run_id, "other-run"]


def test_the_audit_level_decides_what_is_written(log_path: Path) -> None:
    payload = {"tool_name": "shell.run", "duration_ms": 5, "arguments": {"command": f"echo {OPENAI_KEY}"}}
    expected = {
        "L0": {"duration_ms": 5},
        "L1": {
            "tool_name": "shell.run",
            "duration_ms": 5,
            "arguments": f"[OMITTED:{len(canonical_json(payload['arguments']))} bytes]",
        },
        "L2": {
            "tool_name": "shell.run",
            "duration_ms": 5,
            "arguments": {"command": "echo [REDACTED:api_key]"},
        },
        "L3": payload,
    }
    for level, written in expected.items():
        path = log_path.with_name(f"{level}.jsonl")
        logger = AuditLogger(path, audit_level=level, chain_key=KEY)
        assert logger.audit_level is AuditLevel(level)
        logger.log("tool_call", payload)
        assert records(path)[0]["payload"] == written
        assert logger.events[0].payload == written


def test_the_redaction_config_applies_at_level_l2(log_path: Path) -> None:
    logger = AuditLogger(log_path, {"content": "truncate:3"}, chain_key=KEY)
    logger.log("tool_result", {"content": "abcdef"})
    assert records(log_path)[0]["payload"] == {"content": "abc[TRUNCATED:6 chars]"}


def test_bad_arguments_are_refused_with_a_sentence(log_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("audit level 'L9' is not one of L0, L1, L2, L3.")):
        AuditLogger(log_path, audit_level="L9")
    with pytest.raises(ValueError, match=re.escape("redaction rule 'x' for field 'a' is not one of")):
        AuditLogger(log_path, {"a": "x"})
    with pytest.raises(ValueError, match=re.escape("an audit chain key must be at least 16 bytes long.")):
        AuditLogger(log_path, chain_key=b"k" * 15)
    with pytest.raises(TypeError, match=re.escape("an audit chain key must be bytes, not str.")):
        AuditLogger(log_path, chain_key="k" * 32)  # type: ignore[arg-type]
    logger = AuditLogger(log_path, chain_key=b"k" * 16)
    for bad in ["", "Tool_Call", "1start", "a" * 65, "tool call"]:
        with pytest.raises(
            ValueError, match=re.escape(f"audit event type {bad!r} must be 1 to 64 lowercase")
        ):
            logger.log(bad, {})
    logger.log("a" * 64, {})
    logger.log("quorum.outcome-v1", {})
    with pytest.raises(TypeError, match=re.escape("an audit payload must be a mapping, not list.")):
        logger.log("run_start", [])  # type: ignore[arg-type]
    assert len(records(log_path)) == 2


# The chain key


def test_the_key_file_is_created_beside_the_log_with_mode_0600_and_reused(log_path: Path) -> None:
    first = AuditLogger(log_path)
    key_path = default_key_path(log_path)
    assert first.key_path == key_path == log_path.with_name("audit.jsonl.key")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(log_path.stat().st_mode) == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}\n", key_path.read_text())
    assert read_key_file(key_path) == first.get_chain_key()
    assert len(first.get_chain_key()) == 32
    second = AuditLogger(log_path)
    assert second.get_chain_key() == first.get_chain_key()
    assert {p.name for p in log_path.parent.iterdir()} == {
        "audit.jsonl",
        "audit.jsonl.key",
    }  # no temporary left


def test_a_given_key_is_used_and_no_key_file_is_written(log_path: Path) -> None:
    logger = AuditLogger(log_path, chain_key=KEY)
    logger.log("run_start", {})
    assert logger.get_chain_key() == KEY
    assert logger.key_path is None
    assert not default_key_path(log_path).exists()
    assert verify_log(log_path, chain_key=KEY).hmac_checked


def test_a_broken_key_file_is_refused_when_the_logger_starts(log_path: Path) -> None:
    default_key_path(log_path).write_text("not hex\n")
    with pytest.raises(
        ConfigError, match=re.escape(f"the audit key file {log_path}.key does not hold a hex key")
    ):
        AuditLogger(log_path)


def test_the_key_never_appears_in_the_log_or_in_its_messages(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    logger = AuditLogger(log_path)
    logger.log("run_start", {"note": "hello"})
    key_hex = logger.get_chain_key().hex()
    blocked = AuditLogger(log_path / "inside-a-file.jsonl", chain_key=logger.get_chain_key())
    blocked.log("run_start", {})
    assert blocked.disk_error is not None
    assert key_hex not in log_path.read_text()
    assert key_hex not in caplog.text
    assert key_hex not in str(blocked.disk_error)


# Resuming


def test_a_new_logger_continues_the_chain_of_an_existing_log(log_path: Path) -> None:
    AuditLogger(log_path).log("run_start", {"n": 1})
    AuditLogger(log_path).log("run_end", {"n": 2})
    third = AuditLogger(log_path)
    third.log("run_start", {"n": 3})
    lines = records(log_path)
    assert [line["payload"]["n"] for line in lines] == [1, 2, 3]
    assert lines[1]["prev_hash"] == lines[0]["event_hash"]
    assert lines[2]["prev_hash"] == lines[1]["event_hash"]
    assert verify_log(log_path).ok


def test_resuming_finds_a_last_line_longer_than_the_first_read(log_path: Path) -> None:
    logger = AuditLogger(log_path, audit_level="L3")
    logger.log("tool_result", {"content": "x" * 50_000})
    logger.log("tool_result", {"content": "y" * 100_000})
    AuditLogger(log_path).log("run_end", {})
    lines = records(log_path)
    assert lines[2]["prev_hash"] == lines[1]["event_hash"]
    assert verify_log(log_path).records == 3


def test_after_a_line_cut_short_the_next_record_starts_on_a_new_line_and_links_to_the_last_whole_one(
    log_path: Path,
) -> None:
    logger = AuditLogger(log_path)
    logger.log("run_start", {})
    logger.log("tool_call", {"tool_name": "fs.read"})
    logger.close()
    whole = log_path.read_bytes()
    first_line = whole.split(b"\n")[0]
    log_path.write_bytes(whole[: len(first_line) + 1 + 40])  # the second record cut after 40 bytes
    AuditLogger(log_path).log("run_end", {})
    lines = log_path.read_bytes().split(b"\n")
    assert len(lines) == 4
    assert lines[-1] == b""
    assert json.loads(lines[2])["prev_hash"] == json.loads(first_line)["event_hash"]
    report = verify_log(log_path)
    assert (report.ok, report.first_bad_line, report.problem) == (False, 2, "bad_json")


def test_a_last_line_that_is_not_a_record_restarts_the_chain_with_a_warning(
    log_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log_path.write_text("something else\n")
    AuditLogger(log_path).log("run_start", {})
    assert records_after_first(log_path)[0]["prev_hash"] == GENESIS_HASH
    assert "is not an audit record; the chain starts again from genesis" in caplog.text


def records_after_first(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def test_a_file_holding_only_a_fragment_gets_a_newline_before_the_first_record(log_path: Path) -> None:
    log_path.write_bytes(b'{"created_at":')
    AuditLogger(log_path).log("run_start", {})
    fragment, line, end = log_path.read_bytes().split(b"\n")
    assert fragment == b'{"created_at":'
    assert end == b""
    assert json.loads(line)["prev_hash"] == GENESIS_HASH


# Concurrency


def test_eight_threads_appending_at_once_make_one_verifying_chain(log_path: Path) -> None:
    logger = AuditLogger(log_path)
    start = threading.Barrier(8)

    def append(worker: int) -> None:
        start.wait()
        for index in range(200):
            logger.log("tool_call", {"worker": worker, "index": index})

    threads = [threading.Thread(target=append, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = verify_log(log_path)
    assert (report.ok, report.records, report.hmac_checked) == (True, 1600, True)
    assert len(logger.events) == 1600
    assert logger.disk_error is None
    by_worker: dict[int, list[int]] = {}
    for record in records(log_path):
        by_worker.setdefault(record["payload"]["worker"], []).append(record["payload"]["index"])
    assert by_worker == {worker: list(range(200)) for worker in range(8)}


def test_two_loggers_of_one_process_on_one_file_keep_one_chain(log_path: Path) -> None:
    first = AuditLogger(log_path)
    second = AuditLogger(log_path)
    for index in range(10):
        (first if index % 3 else second).log("tool_call", {"index": index})
    assert verify_log(log_path).records == 10


_WRITER = textwrap.dedent(
    """
    import sys
    from teaagent.audit import AuditLogger

    import os, time

    logger = AuditLogger(sys.argv[1], run_id=sys.argv[2])
    while not os.path.exists(sys.argv[4]):  # start together, so that the appends overlap
        time.sleep(0.001)
    for index in range(int(sys.argv[3])):
        logger.log("tool_call", {"index": index, "text": "x" * (index % 50)})
    sys.exit(0 if logger.disk_error is None else 1)
    """
)


@pytest.mark.slow
def test_two_processes_appending_to_one_file_write_whole_lines_in_one_chain(log_path: Path) -> None:
    # Both create the key file if it is missing: the hard-link publication lets one win.
    go = log_path.with_name("go")
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(log_path), name, "3000", str(go)])
        for name in ("proc-a", "proc-b")
    ]
    go.touch()
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0]
    parsed = [json.loads(line) for line in log_path.read_text().splitlines()]  # every line is whole JSON
    assert len(parsed) == 6000
    for name in ("proc-a", "proc-b"):
        assert [r["payload"]["index"] for r in parsed if r["run_id"] == name] == list(range(3000))
    report = verify_log(log_path)
    assert (report.ok, report.records, report.hmac_checked) == (True, 6000, True)


@pytest.mark.slow
def test_a_logger_inherited_through_fork_keeps_the_chain_with_its_parent(log_path: Path) -> None:
    logger = AuditLogger(log_path)
    logger.log("run_start", {})
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 2
        try:
            for index in range(100):
                logger.log("tool_call", {"who": "child", "index": index})
            code = 0 if logger.disk_error is None else 1
        finally:
            os._exit(code)
    for index in range(100):
        logger.log("tool_call", {"who": "parent", "index": index})
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report = verify_log(log_path)
    assert (report.ok, report.records) == (True, 201)


# Disk errors


def test_a_disk_error_is_recorded_not_raised_and_the_next_append_retries(log_path: Path) -> None:
    blocker = log_path.parent / "blocker"
    blocker.write_text("a file where the log's folder should be")
    path = blocker / "audit.jsonl"
    logger = AuditLogger(path)
    assert isinstance(logger.disk_error, OSError)
    logger.log("run_start", {"n": 1})
    assert isinstance(logger.disk_error, OSError)
    assert logger.disk_error_count == 2
    assert len(logger.events) == 1
    with pytest.raises(OSError):  # noqa: PT011 - the kind of OSError depends on the platform
        logger.get_chain_key()
    blocker.unlink()
    logger.log("run_end", {"n": 2})
    assert logger.disk_error_count == 2  # opening in the constructor, then the first append
    assert [record["payload"] for record in records(path)] == [{"n": 2}]
    assert verify_log(path).ok
    assert len(logger.events) == 2


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_recorded_as_enospc() -> None:
    logger = AuditLogger("/dev/full", chain_key=KEY)
    logger.log("run_start", {})
    assert logger.disk_error is not None
    assert logger.disk_error.errno == 28  # ENOSPC
    assert len(logger.events) == 1


_FILLER = textwrap.dedent(
    """
    import resource, signal, sys
    from teaagent.audit import AuditLogger

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit, write() then fails with EFBIG
    logger = AuditLogger(sys.argv[1], chain_key=bytes(range(32)))
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
    for index in range(40):
        logger.log("tool_call", {"index": index, "pad": "x" * 100})
    print(logger.disk_error_count, logger.disk_error.errno)
    """
)


@pytest.mark.slow
def test_a_record_only_partly_written_is_taken_back_so_the_log_still_verifies(log_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _FILLER, str(log_path)], capture_output=True, text=True, check=True, timeout=60
    )
    failures, error_number = map(int, result.stdout.split())
    data = log_path.read_bytes()
    assert len(data) <= 4000
    assert data.endswith(b"\n")
    written = data.count(b"\n")
    assert written + failures == 40
    assert written > 0
    assert error_number == 28  # the short write that crossed the limit, taken back and reported as ENOSPC
    report = verify_log(log_path, chain_key=bytes(range(32)))
    assert (report.ok, report.records) == (True, written)


def test_fsync_mode_writes_the_same_chain(log_path: Path) -> None:
    logger = AuditLogger(log_path, fsync=True)
    for index in range(3):
        logger.log("tool_call", {"index": index})
    assert logger.disk_error is None
    assert verify_log(log_path).records == 3


def test_a_closed_logger_opens_the_file_again_on_the_next_append(log_path: Path) -> None:
    logger = AuditLogger(log_path)
    logger.log("run_start", {})
    logger.close()
    logger.close()
    logger.log("run_end", {})
    assert verify_log(log_path).records == 2
    assert ChainMac(KEY).hexdigest(b"data") == hmac.new(KEY, b"data", hashlib.sha256).hexdigest()
    long_key = bytes(100)
    assert ChainMac(long_key).hexdigest(b"x") == hmac.new(long_key, b"x", hashlib.sha256).hexdigest()
