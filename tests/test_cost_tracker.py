"""Run logs written by RunLogWriter, and the cost reports CostTracker makes of them."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import stat
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from teaagent.cost_tracker import (
    MAX_LABEL_CHARS,
    MAX_RECORD_BYTES,
    RUN_LOG_VERSION,
    RUNS_DIR,
    CostTracker,
    RunLogWriter,
)

DAY1 = datetime(2026, 6, 5, 9, 0, tzinfo=UTC)
DAY2 = datetime(2026, 6, 6, 9, 0, tzinfo=UTC)


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# -- the writer -------------------------------------------------------------------------------------


def test_writer_writes_the_documented_records(workspace: Path) -> None:
    writer = RunLogWriter(
        workspace, "run-1", label="nightly", provider="openai", model="gpt-4o-mini", at=DAY1
    )
    writer.record_model_call("gpt-4o-mini", 1200, 85, 0.0231, at=DAY1 + timedelta(seconds=2.5))
    writer.finish("completed", at=DAY1 + timedelta(seconds=9))
    assert writer.path == workspace / RUNS_DIR / "run-1.jsonl"
    assert lines_of(writer.path) == [
        {
            "type": "run_start",
            "version": RUN_LOG_VERSION,
            "run_id": "run-1",
            "label": "nightly",
            "provider": "openai",
            "model": "gpt-4o-mini",
            "at": "2026-06-05T09:00:00.000000Z",
        },
        {
            "type": "model_call",
            "run_id": "run-1",
            "model": "gpt-4o-mini",
            "input_tokens": 1200,
            "output_tokens": 85,
            "cost_cents": 0.0231,
            "at": "2026-06-05T09:00:02.500000Z",
        },
        {"type": "run_end", "run_id": "run-1", "status": "completed", "at": "2026-06-05T09:00:09.000000Z"},
    ]
    assert stat.S_IMODE(writer.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(writer.path.parent.stat().st_mode) == 0o700
    assert writer.finished


def test_writer_keeps_running_totals(workspace: Path) -> None:
    writer = RunLogWriter(workspace, "r", provider="scripted", model="m")
    writer.record_model_call("m", 10, 2, 1.5)
    writer.record_model_call("m", 5, 1, 0)
    assert (writer.cost_cents, writer.input_tokens, writer.output_tokens, writer.model_calls) == (
        1.5,
        15,
        3,
        2,
    )
    writer.close()


def test_writer_times_are_utc(workspace: Path) -> None:
    plus_two = timezone(timedelta(hours=2))
    writer = RunLogWriter(
        workspace, "r", provider="p", model="m", at=datetime(2026, 6, 6, 1, 0, tzinfo=plus_two)
    )
    writer.close()
    assert lines_of(writer.path)[0]["at"] == "2026-06-05T23:00:00.000000Z"
    with pytest.raises(
        ValueError, match=r"^a run-log time must be an aware datetime \(with a time zone\)\.$"
    ):
        RunLogWriter(workspace, "r2", provider="p", model="m", at=datetime(2026, 6, 5))


@pytest.mark.parametrize("run_id", ["../escape", "a/b", "", "x" * 65, "a.b"])
def test_writer_refuses_run_ids_that_leave_the_folder(workspace: Path, run_id: str) -> None:
    with pytest.raises(ValueError, match=r"must be 1 to 64 letters, digits, '_' or '-'\.$"):
        RunLogWriter(workspace, run_id, provider="p", model="m")
    assert not (workspace / ".teaagent").exists()


def test_writer_checks_each_field(workspace: Path) -> None:
    assert RunLogWriter(workspace, "x" * 64, label="l" * MAX_LABEL_CHARS, provider="p", model="m").run_id
    with pytest.raises(ValueError, match=rf"^a run label is limited to {MAX_LABEL_CHARS} characters\.$"):
        RunLogWriter(workspace, "r", label="l" * (MAX_LABEL_CHARS + 1), provider="p", model="m")
    writer = RunLogWriter(workspace, "r", provider="p", model="m")
    with pytest.raises(ValueError, match=r"^input_tokens must not be negative, not -1\.$"):
        writer.record_model_call("m", -1, 0, 0.0)
    with pytest.raises(TypeError, match=r"^output_tokens must be an int, not bool\.$"):
        writer.record_model_call("m", 0, True, 0.0)
    with pytest.raises(ValueError, match=r"^a model name must not be empty\.$"):
        writer.record_model_call("", 0, 0, 0.0)
    for cost in (-0.01, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^cost_cents must be a finite number of at least 0"):
            writer.record_model_call("m", 0, 0, cost)
    with pytest.raises(TypeError, match=r"^cost_cents must be a number, not str\.$"):
        writer.record_model_call("m", 0, 0, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^run status 'Completed' must be a lowercase word"):
        writer.finish("Completed")
    writer.record_model_call("m", 0, 0, 0)  # zero everything is a valid call
    writer.close()
    assert len(lines_of(writer.path)) == 2  # nothing of the refused calls was written


def test_a_finished_run_takes_no_more_records(workspace: Path) -> None:
    writer = RunLogWriter(workspace, "r", provider="p", model="m")
    writer.finish("failed")
    with pytest.raises(RuntimeError, match=r"^the run log of run r is already finished\.$"):
        writer.record_model_call("m", 1, 1, 1.0)
    with pytest.raises(RuntimeError, match=r"^the run log of run r is already finished\.$"):
        writer.finish("completed")
    closed = RunLogWriter(workspace, "c", provider="p", model="m")
    closed.close()
    with pytest.raises(RuntimeError, match=r"^the run log of run c is closed\.$"):
        closed.record_model_call("m", 1, 1, 1.0)


def test_leaving_the_block_by_an_exception_records_a_failed_run(workspace: Path) -> None:
    writer = RunLogWriter(workspace, "boom", provider="p", model="m")
    with pytest.raises(KeyError, match="the model adapter broke"), writer:
        raise KeyError("the model adapter broke")
    assert [line["type"] for line in lines_of(writer.path)] == ["run_start", "run_end"]
    assert lines_of(writer.path)[-1]["status"] == "failed"
    with RunLogWriter(workspace, "quiet", provider="p", model="m") as quiet:
        pass
    assert [line["type"] for line in lines_of(quiet.path)] == ["run_start"]  # no invented ending


def test_a_line_cut_short_by_a_crash_does_not_swallow_the_next_record(workspace: Path) -> None:
    writer = RunLogWriter(workspace, "r", label="l", provider="p", model="m", at=DAY1)
    with writer.path.open("ab") as handle:
        handle.write(b'{"type":"model_call","run_id":"r","mod')  # what a crash mid-append leaves
    writer.record_model_call("m", 10, 1, 2.0, at=DAY1)
    writer.finish("completed")
    tracker = CostTracker(workspace)
    assert tracker.get_summary_by_label()["l"]["cost_cents"] == 2.0
    assert tracker.skipped_lines == 1


def test_a_resumed_run_appends_to_its_log_and_counts_once(workspace: Path) -> None:
    first = RunLogWriter(workspace, "r", label="first", provider="p", model="m", at=DAY1)
    first.record_model_call("m", 1, 1, 1.0, at=DAY1)
    first.close()
    second = RunLogWriter(workspace, "r", label="second", provider="p", model="m", at=DAY2)
    second.record_model_call("m", 1, 1, 2.0, at=DAY2)
    second.finish("completed")
    summary = CostTracker(workspace).get_summary_by_label()
    assert summary == {
        "first": {"cost_cents": 3.0, "runs": 1, "input_tokens": 2, "output_tokens": 2, "model_calls": 2}
    }


def test_threads_sharing_a_writer_never_interleave_lines(workspace: Path) -> None:
    writer = RunLogWriter(workspace, "r", label="t", provider="p", model="m")

    def calls() -> None:
        for _ in range(250):
            writer.record_model_call("m", 3, 1, 0.25)

    threads = [threading.Thread(target=calls) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.finish("completed")
    tracker = CostTracker(workspace)
    assert tracker.get_summary_by_label()["t"] == {
        "cost_cents": 250.0,
        "runs": 1,
        "input_tokens": 3000,
        "output_tokens": 1000,
        "model_calls": 1000,
    }
    assert tracker.skipped_lines == 0


def _append_calls(root: str, count: int) -> None:
    writer = RunLogWriter(root, "shared", label="procs", provider="p", model="m")
    for _ in range(count):
        writer.record_model_call("m", 7, 2, 0.5, at=DAY1)
    writer.close()


@pytest.mark.slow
def test_processes_appending_to_one_log_never_interleave_lines(workspace: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_calls, args=(str(workspace), 300)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    tracker = CostTracker(workspace)
    assert tracker.get_summary_by_model() == {
        "m": {
            "cost_cents": 600.0,
            "runs": 1,
            "input_tokens": 8400,
            "output_tokens": 2400,
            "model_calls": 1200,
        }
    }
    assert tracker.skipped_lines == 0


# -- the reports ------------------------------------------------------------------------------------


def write_story(root: Path) -> None:
    """Four runs over two days, as the runner would log them."""
    nightly = RunLogWriter(root, "n1", label="nightly", provider="openai", model="gpt-4o-mini", at=DAY1)
    nightly.record_model_call("gpt-4o-mini", 1000, 100, 1.25, at=DAY1)
    nightly.record_model_call("gpt-4o", 2000, 200, 10.0, at=DAY1)  # routed to a bigger model
    nightly.finish("completed", at=DAY1)
    # Starts a minute before midnight; its second call lands on the next day.
    late = RunLogWriter(root, "n2", label="nightly", provider="openai", model="gpt-4o-mini",
                        at=datetime(2026, 6, 5, 23, 59, tzinfo=UTC))  # fmt: skip
    late.record_model_call("gpt-4o-mini", 100, 10, 0.5, at=datetime(2026, 6, 5, 23, 59, 30, tzinfo=UTC))
    late.record_model_call("gpt-4o-mini", 300, 30, 0.75, at=datetime(2026, 6, 6, 0, 0, 30, tzinfo=UTC))
    late.finish("cost_exceeded", at=datetime(2026, 6, 6, 0, 1, tzinfo=UTC))
    review = RunLogWriter(root, "r1", label="review", provider="anthropic", model="claude", at=DAY2)
    review.record_model_call("claude", 500, 50, 2.0, at=DAY2)
    review.close()  # still running: no run_end
    idle = RunLogWriter(root, "i1", provider="scripted", model="replay", at=DAY2)  # no label, no calls
    idle.finish("failed", at=DAY2)


def test_summary_by_label(workspace: Path) -> None:
    write_story(workspace)
    assert CostTracker(workspace).get_summary_by_label() == {
        "": {"cost_cents": 0.0, "runs": 1, "input_tokens": 0, "output_tokens": 0, "model_calls": 0},
        "nightly": {
            "cost_cents": 12.5,
            "runs": 2,
            "input_tokens": 3400,
            "output_tokens": 340,
            "model_calls": 4,
        },
        "review": {"cost_cents": 2.0, "runs": 1, "input_tokens": 500, "output_tokens": 50, "model_calls": 1},
    }


def test_summary_by_model(workspace: Path) -> None:
    write_story(workspace)
    assert CostTracker(workspace).get_summary_by_model() == {
        "claude": {"cost_cents": 2.0, "runs": 1, "input_tokens": 500, "output_tokens": 50, "model_calls": 1},
        "gpt-4o": {
            "cost_cents": 10.0,
            "runs": 1,
            "input_tokens": 2000,
            "output_tokens": 200,
            "model_calls": 1,
        },
        "gpt-4o-mini": {
            "cost_cents": 2.5,
            "runs": 2,
            "input_tokens": 1400,
            "output_tokens": 140,
            "model_calls": 3,
        },
        "replay": {"cost_cents": 0.0, "runs": 1, "input_tokens": 0, "output_tokens": 0, "model_calls": 0},
    }


def test_summary_by_day_is_utc_and_counts_runs_on_their_first_day(workspace: Path) -> None:
    write_story(workspace)
    by_day = CostTracker(workspace).get_summary_by_day()
    assert list(by_day) == ["2026-06-05", "2026-06-06"]
    assert by_day["2026-06-05"] == {
        "cost_cents": 11.75,
        "runs": 2,
        "input_tokens": 3100,
        "output_tokens": 310,
        "model_calls": 3,
    }
    assert by_day["2026-06-06"] == {
        "cost_cents": 2.75,
        "runs": 2,
        "input_tokens": 800,
        "output_tokens": 80,
        "model_calls": 2,
    }


def test_reports_see_runs_in_progress(workspace: Path) -> None:
    writer = RunLogWriter(workspace, "live", label="live", provider="p", model="m", at=DAY1)
    tracker = CostTracker(workspace)
    assert tracker.get_summary_by_label()["live"]["runs"] == 1
    writer.record_model_call("m", 1, 1, 4.0, at=DAY1)
    assert tracker.get_summary_by_label()["live"]["cost_cents"] == 4.0
    writer.close()


def test_no_logs_no_costs(workspace: Path) -> None:
    tracker = CostTracker(workspace)
    assert tracker.get_summary_by_label() == {}
    assert tracker.get_summary_by_model() == {}
    assert tracker.get_summary_by_day() == {}
    assert tracker.skipped_lines == 0


def test_default_root_is_the_current_folder(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    RunLogWriter(".", "r", label="here", provider="p", model="m").close()
    assert list(CostTracker().get_summary_by_label()) == ["here"]


# -- damaged logs -----------------------------------------------------------------------------------


def record(**fields: object) -> bytes:
    base: dict[str, object] = {
        "type": "model_call",
        "run_id": "r",
        "model": "m",
        "input_tokens": 1,
        "output_tokens": 1,
        "cost_cents": 1.0,
        "at": "2026-06-05T09:00:00Z",
    }
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


BAD_LINES = {
    "not json": b"this is not json",
    "a list": b"[1, 2]",
    "no type": b'{"run_id": "r"}',
    "negative tokens": record(input_tokens=-1),
    "bool tokens": record(output_tokens=True),
    "float tokens": record(input_tokens=1.5),
    "string cost": record(cost_cents="1.0"),
    "negative cost": record(cost_cents=-0.5),
    "infinite cost": b'{"type":"model_call","run_id":"r","model":"m","input_tokens":1,"output_tokens":1,'
    b'"cost_cents":1e999,"at":"2026-06-05T09:00:00Z"}',
    "NaN cost": record(cost_cents=math.nan),
    "no time": record(at=...),
    "naive time": record(at="2026-06-05T09:00:00"),
    "bad run id": record(run_id="../x"),
    "empty model": record(model=""),
    "bad status": record(type="run_end", status="Done!"),
    "start without label": record(type="run_start", provider="p", label=...),
    "invalid utf-8": b'{"type":"model_call","model":"\xff"}',
    "deeply nested": b"[" * 5000 + b"]" * 5000,
}  # fmt: skip


def test_malformed_lines_are_skipped_and_counted(workspace: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = RunLogWriter(workspace, "r", label="ok", provider="p", model="m", at=DAY1)
    writer.record_model_call("m", 10, 1, 3.0, at=DAY1)
    writer.close()
    with writer.path.open("ab") as handle:
        for line in BAD_LINES.values():
            handle.write(line + b"\n")
        handle.write(b"\n   \n")  # blank lines: not records, not damage
        handle.write(b'{"type":"tool_call","run_id":"r","tool":"fs.read"}\n')  # a later type: ignored
        handle.write(record(cost_cents=2, extra_field="ignored") + b"\n")  # an int cost and an unknown key
    (workspace / RUNS_DIR / "notes.txt").write_text("not a run log")
    tracker = CostTracker(workspace)
    with caplog.at_level(logging.WARNING, logger="teaagent.cost_tracker"):
        summary = tracker.get_summary_by_label()
    assert summary == {
        "ok": {"cost_cents": 5.0, "runs": 1, "input_tokens": 11, "output_tokens": 2, "model_calls": 2}
    }
    assert tracker.skipped_lines == len(BAD_LINES)
    assert [r.getMessage() for r in caplog.records] == [
        f"skipped {len(BAD_LINES)} malformed line(s) of the run log {writer.path}"
    ]


def test_record_size_boundary(workspace: Path) -> None:
    def padded(size: int) -> bytes:
        line = record(pad="")
        return record(pad="x" * (size - len(line)))

    folder = workspace / RUNS_DIR
    folder.mkdir(parents=True)
    at_limit, over_limit = padded(MAX_RECORD_BYTES), padded(MAX_RECORD_BYTES + 1)
    assert (len(at_limit), len(over_limit)) == (MAX_RECORD_BYTES, MAX_RECORD_BYTES + 1)
    (folder / "r.jsonl").write_bytes(
        at_limit + b"\n" + over_limit + b"\n" + b"y" * 100_000 + b"\n" + at_limit
    )
    tracker = CostTracker(workspace)
    assert (
        tracker.get_summary_by_model()["m"]["model_calls"] == 2
    )  # both at-limit lines, the last unterminated
    assert tracker.skipped_lines == 2


def test_a_run_without_its_start_line_is_unlabelled_and_dated_by_its_first_record(workspace: Path) -> None:
    folder = workspace / RUNS_DIR
    folder.mkdir(parents=True)
    (folder / "orphan.jsonl").write_bytes(
        record(run_id="orphan", at="2026-06-06T10:00:00Z", cost_cents=1.0)
        + b"\n"
        + record(run_id="orphan", at="2026-06-05T10:00:00Z", cost_cents=2.0)
        + b"\n"
    )
    tracker = CostTracker(workspace)
    assert tracker.get_summary_by_label()[""]["runs"] == 1
    by_day = tracker.get_summary_by_day()
    assert {day: (v["runs"], v["cost_cents"]) for day, v in by_day.items()} == {
        "2026-06-05": (1, 2.0),
        "2026-06-06": (0, 1.0),
    }


def test_unreadable_entries_are_reported_not_fatal(
    workspace: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    RunLogWriter(workspace, "real", label="real", provider="p", model="m").close()
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_bytes(record(run_id="fake", cost_cents=999.0) + b"\n")
    (workspace / RUNS_DIR / "link.jsonl").symlink_to(elsewhere)
    (workspace / RUNS_DIR / "dir.jsonl").mkdir()
    with caplog.at_level(logging.WARNING, logger="teaagent.cost_tracker"):
        assert list(CostTracker(workspace).get_summary_by_label()) == ["real"]
    messages = sorted(r.getMessage() for r in caplog.records)
    assert messages == [
        f"skipping the run log {workspace / RUNS_DIR / 'dir.jsonl'}: it is not a regular file",
        f"skipping the run log {workspace / RUNS_DIR / 'link.jsonl'}: it is a symbolic link",
    ]


def test_the_tracker_the_runner_and_the_agent_add_up_tokens_and_cost_as_one_usage() -> None:
    from teaagent.cost_tracker import Usage
    from teaagent.cost_tracker._tracker import _Totals
    from teaagent.runner._run_state import RunState
    from teaagent_agent._usage import Totals

    usage = Usage()
    usage.add_usage(10, 2, 0.5)
    usage.add_usage(1, 1, 0.25)
    assert (usage.input_tokens, usage.output_tokens, usage.cost_cents) == (11, 3, 0.75)
    assert all(issubclass(counter, Usage) for counter in (_Totals, RunState, Totals))
