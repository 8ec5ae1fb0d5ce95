"""Workspace locks across processes: live holders block, dead ones are cleaned up, racers get one winner.

The subprocess tests use real processes killed with real signals; nothing is simulated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from teaagent.errors import ConfigError
from teaagent.mcp_server import (
    LOCK_FILE_NAME,
    LOCKS_DIR_NAME,
    Liveness,
    WorkspaceLock,
    WorkspaceLockConflictError,
    WorkspaceRegistry,
    liveness,
    process_start_time,
)
from teaagent.mcp_server._locks import MAX_COMMAND_CHARS

HOLDER = textwrap.dedent(
    """
    import sys
    from teaagent.mcp_server import WorkspaceRegistry, WorkspaceLockConflictError
    registry = WorkspaceRegistry(sys.argv[2] or None)
    try:
        registry.acquire_lock(sys.argv[1])
    except WorkspaceLockConflictError as exc:
        print("lost", exc, flush=True)
        sys.exit(0)
    print("locked", flush=True)
    for command in sys.stdin:
        if command.strip() == "release":
            registry.release_lock(sys.argv[1])
            print("released", flush=True)
    """
)

RACER = textwrap.dedent(
    """
    import os, sys
    from teaagent.mcp_server import WorkspaceRegistry, WorkspaceLockConflictError
    registry = WorkspaceRegistry(sys.argv[2] or None)
    print("ready", flush=True)
    sys.stdin.readline()  # the starting gun
    try:
        registry.acquire_lock(sys.argv[1])
    except WorkspaceLockConflictError as exc:
        print("lost", exc, flush=True)
    else:
        print("won", os.getpid(), flush=True)
    sys.stdin.read()  # hold on until every racer has reported
    """
)


def start(script: str, workspace: Path, state_dir: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, str(workspace), "" if state_dir is None else str(state_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline().strip()


def finish(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=30)


@pytest.fixture
def registry() -> Iterator[WorkspaceRegistry]:
    made = WorkspaceRegistry()
    yield made
    made.release_all()


def lock_file_of(workspace: Path) -> Path:
    return workspace / ".teaagent" / LOCK_FILE_NAME


def write_details(workspace: Path, **fields: object) -> Path:
    details = WorkspaceLock(str(workspace.resolve()), 1, "2026-06-05T12:00:00.000000Z").to_dict()
    details.update(fields)
    path = lock_file_of(workspace)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(details))
    return path


def conflict(workspace: Path, pid: int, command: str | None = None) -> str:
    """The conflict's sentence: the holder's pid, and its command line when the file has one."""
    named = r"(: [^\n]+)?" if command is None else re.escape(f": {command}")
    return (
        rf"^the workspace {re.escape(str(workspace.resolve()))} is locked by another process \(pid {pid}"
        rf"{named}\); one process at a time works in a workspace: stop that one, or wait for it to finish\.$"
    )


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# -- one process ------------------------------------------------------------------------------------


def test_acquire_records_who_holds_the_workspace(workspace: Path, registry: WorkspaceRegistry) -> None:
    lock = registry.acquire_lock(workspace)
    assert lock.workspace_path == str(workspace.resolve())
    assert lock.owner_pid == os.getpid()
    assert datetime.fromisoformat(lock.acquired_at).tzinfo is not None
    assert lock.owner_start_time == process_start_time(os.getpid())
    path = lock_file_of(workspace)
    assert registry.lock_file(workspace) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert WorkspaceLock.from_dict(json.loads(path.read_text())) == lock
    assert registry.held() == [lock]
    assert registry.holder(workspace) == lock


def test_locks_are_not_reentrant(workspace: Path, registry: WorkspaceRegistry) -> None:
    registry.acquire_lock(workspace)
    same_process = (
        rf"^the workspace {re.escape(str(workspace.resolve()))} is already locked by this process"
        rf" \(pid {os.getpid()}\)\.$"
    )
    with pytest.raises(WorkspaceLockConflictError, match=same_process):
        registry.acquire_lock(workspace)
    other = WorkspaceRegistry()
    with pytest.raises(WorkspaceLockConflictError, match=same_process):
        other.acquire_lock(workspace)
    other.release_lock(workspace)  # holds nothing: a no-op that must not free the first registry's lock
    with pytest.raises(WorkspaceLockConflictError, match=same_process):
        other.acquire_lock(workspace)


def test_release_removes_the_lock_and_allows_a_new_one(workspace: Path, registry: WorkspaceRegistry) -> None:
    first = registry.acquire_lock(workspace)
    registry.release_lock(workspace)
    assert not lock_file_of(workspace).exists()
    assert registry.held() == []
    assert registry.holder(workspace) is None
    registry.release_lock(workspace)  # not locked: no-op
    second = WorkspaceRegistry().acquire_lock(workspace)
    assert second.acquired_at >= first.acquired_at


def test_release_of_a_never_locked_workspace_is_a_noop(workspace: Path, tmp_path: Path) -> None:
    registry = WorkspaceRegistry()
    registry.release_lock(workspace)
    registry.release_lock(tmp_path / "does-not-exist")
    assert not (workspace / ".teaagent").exists()


def test_a_path_through_a_symbolic_link_is_the_same_workspace(
    workspace: Path, tmp_path: Path, registry: WorkspaceRegistry
) -> None:
    link = tmp_path / "link"
    link.symlink_to(workspace)
    registry.acquire_lock(link)
    with pytest.raises(WorkspaceLockConflictError, match="already locked by this process"):
        WorkspaceRegistry().acquire_lock(workspace)
    registry.release_lock(link)
    assert not lock_file_of(workspace).exists()


def test_state_dir_keeps_locks_out_of_the_workspace(workspace: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    registry = WorkspaceRegistry(state)
    registry.acquire_lock(workspace)
    digest = hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()
    assert registry.lock_file(workspace) == state / LOCKS_DIR_NAME / f"{digest}.lock"
    assert registry.lock_file(workspace).is_file()
    assert not (workspace / ".teaagent").exists()
    with pytest.raises(WorkspaceLockConflictError, match="already locked by this process"):
        WorkspaceRegistry(state).acquire_lock(workspace)
    registry.release_lock(workspace)
    assert not registry.lock_file(workspace).exists()


def test_workspace_must_be_an_existing_folder(tmp_path: Path) -> None:
    registry = WorkspaceRegistry()
    with pytest.raises(FileNotFoundError, match=r"^the workspace .*missing does not exist\.$"):
        registry.acquire_lock(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"^the workspace .*file is not a folder\.$"):
        registry.acquire_lock(tmp_path / "file")


def test_a_lock_file_that_is_a_symbolic_link_is_refused(workspace: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("precious")
    (workspace / ".teaagent").mkdir()
    lock_file_of(workspace).symlink_to(target)
    with pytest.raises(ConfigError, match=r"workspace\.lock is a symbolic link; remove it\.$"):
        WorkspaceRegistry().acquire_lock(workspace)
    assert target.read_text() == "precious"


def test_garbage_in_a_free_lock_file_is_overwritten(workspace: Path, registry: WorkspaceRegistry) -> None:
    (workspace / ".teaagent").mkdir()
    lock_file_of(workspace).write_bytes(b"\x00not json")
    lock = registry.acquire_lock(workspace)
    assert WorkspaceLock.from_dict(json.loads(lock_file_of(workspace).read_text())) == lock


# -- the details in the file: dead, reused, live without a flock -----------------------------------


@pytest.mark.slow
def test_details_of_an_exited_process_are_cleaned_up(
    workspace: Path, registry: WorkspaceRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    gone = dead_pid()
    path = write_details(workspace, owner_pid=gone, owner_start_time=None)
    with caplog.at_level(logging.WARNING, logger="teaagent.mcp_server"):
        lock = registry.acquire_lock(workspace)
    assert lock.owner_pid == os.getpid()
    assert [r.getMessage() for r in caplog.records] == [
        f"cleaned up the workspace lock {path} left by pid {gone}, which has exited"
        " (acquired 2026-06-05T12:00:00.000000Z)"
    ]


@pytest.fixture
def live_pid() -> int:
    """A running process other than this one, whose start time we can read: pytest's parent."""
    return os.getppid()


def test_a_reused_pid_does_not_keep_the_lock(
    workspace: Path, registry: WorkspaceRegistry, live_pid: int
) -> None:
    """The recorded pid runs, but it started at another time: it is another process under an old number."""
    started = process_start_time(live_pid)
    assert started is not None
    write_details(workspace, owner_pid=live_pid, owner_start_time=started + 1)
    assert registry.acquire_lock(workspace).owner_pid == os.getpid()


def test_details_from_an_earlier_boot_do_not_keep_the_lock(
    workspace: Path, registry: WorkspaceRegistry, live_pid: int
) -> None:
    write_details(
        workspace,
        owner_pid=live_pid,
        owner_start_time=process_start_time(live_pid),
        boot_id="00000000-0000-0000-0000-000000000000",
    )
    assert registry.acquire_lock(workspace).owner_pid == os.getpid()


def test_a_live_process_named_in_the_file_keeps_the_lock_even_without_its_flock(
    workspace: Path, registry: WorkspaceRegistry, live_pid: int
) -> None:
    """Fail closed: the recorded holder is the very same process, still running."""
    write_details(workspace, owner_pid=live_pid, owner_start_time=process_start_time(live_pid))
    with pytest.raises(WorkspaceLockConflictError, match=conflict(workspace, live_pid)):
        registry.acquire_lock(workspace)
    assert registry.holder(workspace) is not None
    assert registry.held() == []


def test_a_holder_on_another_host_without_its_flock_is_taken_over(
    workspace: Path, registry: WorkspaceRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_details(workspace, owner_pid=os.getppid(), host="some-other-host")
    with caplog.at_level(logging.WARNING, logger="teaagent.mcp_server"):
        registry.acquire_lock(workspace)
    assert [r.getMessage() for r in caplog.records] == [
        f"took the workspace lock {path} left by pid {os.getppid()} on host some-other-host,"
        " which no longer holds it"
    ]


def test_liveness_of_a_running_process(live_pid: int) -> None:
    started = process_start_time(live_pid)
    assert started is not None
    assert liveness(live_pid, started, None, "") is Liveness.ALIVE
    assert liveness(live_pid, None, None, "") is Liveness.ALIVE
    assert liveness(live_pid, started + 1, None, "") is Liveness.DEAD
    assert liveness(live_pid, started, "another boot", "") is Liveness.DEAD
    assert liveness(live_pid, started, None, "elsewhere") is Liveness.UNKNOWN


@pytest.mark.slow
def test_liveness_of_an_exited_process() -> None:
    gone = dead_pid()
    assert liveness(gone, None, None, "") is Liveness.DEAD
    with pytest.raises(ProcessLookupError, match=rf"^there is no process {gone}\.$"):
        process_start_time(gone)


@pytest.mark.slow
def test_a_zombie_is_dead() -> None:
    """A killed child that its parent has not reaped yet still has a pid, but holds nothing."""
    child = subprocess.Popen(["sleep", "60"])
    started = process_start_time(child.pid)
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        assert liveness(child.pid, started, None, "") is Liveness.DEAD
    finally:
        child.wait()


def test_lock_details_round_trip_and_reject_other_shapes() -> None:
    lock = WorkspaceLock("/w", 42, "2026-06-05T12:00:00Z", owner_start_time=7, boot_id="b", host="h")
    assert WorkspaceLock.from_dict(lock.to_dict()) == lock
    for bad in ({**lock.to_dict(), "owner_pid": 0}, {**lock.to_dict(), "version": 2}, {"owner_pid": 42}):
        with pytest.raises(ValueError, match=r"not the details of a workspace lock|pid is not a positive"):
            WorkspaceLock.from_dict(bad)


@pytest.mark.slow
def test_a_forked_child_cannot_release_its_parents_lock(workspace: Path, registry: WorkspaceRegistry) -> None:
    registry.acquire_lock(workspace)
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 0
        try:
            registry.release_lock(workspace)  # the parent's lock, inherited: must stay
            if not lock_file_of(workspace).exists():
                code = 1
            try:
                WorkspaceRegistry().acquire_lock(workspace)
                code = 2
            except WorkspaceLockConflictError as exc:
                if f"(pid {os.getppid()}: " not in str(exc):
                    code = 3
        except BaseException:
            code = 4
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert lock_file_of(workspace).exists()
    assert registry.held()[0].owner_pid == os.getpid()


# -- several processes ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_live_holder_blocks_until_it_releases(workspace: Path) -> None:
    holder = start(HOLDER, workspace)
    try:
        assert read_line(holder) == "locked"
        registry = WorkspaceRegistry()
        with pytest.raises(WorkspaceLockConflictError, match=conflict(workspace, holder.pid)):
            registry.acquire_lock(workspace)
        registry.release_lock(workspace)  # never releases another process's lock
        assert lock_file_of(workspace).exists()
        with pytest.raises(WorkspaceLockConflictError, match=conflict(workspace, holder.pid)):
            registry.acquire_lock(workspace)
        holder_details = registry.holder(workspace)
        assert holder_details is not None
        assert holder_details.owner_pid == holder.pid
        assert holder.stdin is not None
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert read_line(holder) == "released"
        assert registry.acquire_lock(workspace).owner_pid == os.getpid()
        registry.release_lock(workspace)
    finally:
        finish(holder)


@pytest.mark.slow
@pytest.mark.parametrize("reap_first", [True, False], ids=["reaped", "zombie"])
def test_a_holder_killed_with_sigkill_is_cleaned_up(
    workspace: Path, caplog: pytest.LogCaptureFixture, reap_first: bool
) -> None:
    holder = start(HOLDER, workspace)
    try:
        assert read_line(holder) == "locked"
        os.kill(holder.pid, signal.SIGKILL)
        if reap_first:
            holder.wait()
        else:  # not reaped: still in the process table, as a zombie
            deadline = time.monotonic() + 10
            while Path(f"/proc/{holder.pid}/stat").read_text().split(") ")[1][0] != "Z":
                assert time.monotonic() < deadline
                time.sleep(0.01)
        assert json.loads(lock_file_of(workspace).read_text())["owner_pid"] == holder.pid  # left behind
        registry = WorkspaceRegistry()
        with caplog.at_level(logging.WARNING, logger="teaagent.mcp_server"):
            lock = registry.acquire_lock(workspace)
        assert lock.owner_pid == os.getpid()
        assert json.loads(lock_file_of(workspace).read_text())["owner_pid"] == os.getpid()
        assert [r.getMessage().split(", which")[0] for r in caplog.records] == [
            f"cleaned up the workspace lock {lock_file_of(workspace)} left by pid {holder.pid}"
        ]
        registry.release_lock(workspace)
    finally:
        finish(holder)


def race(workspace: Path, racers: int, state_dir: Path | None = None) -> list[str]:
    processes = [start(RACER, workspace, state_dir) for _ in range(racers)]
    try:
        assert [read_line(p) for p in processes] == ["ready"] * racers
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return [read_line(p) for p in processes]
    finally:
        for process in processes:
            finish(process)


@pytest.mark.slow
@pytest.mark.parametrize("round_number", range(3))
def test_racers_for_a_stale_lock_get_exactly_one_winner(workspace: Path, round_number: int) -> None:
    # The stale lock of a holder killed with SIGKILL: the file is there, its flock is not.
    holder = start(HOLDER, workspace)
    assert read_line(holder) == "locked"
    holder.kill()
    holder.wait()
    finish(holder)
    results = race(workspace, 8)
    winners = [line for line in results if line.startswith("won ")]
    assert len(winners) == 1, results
    winner_pid = int(winners[0].split()[1])
    losers = [line for line in results if not line.startswith("won ")]
    assert all(re.fullmatch(r"lost " + conflict(workspace, winner_pid)[1:-1], line) for line in losers), (
        results
    )


@pytest.mark.slow
def test_racers_sharing_a_state_dir_get_exactly_one_winner(workspace: Path, tmp_path: Path) -> None:
    results = race(workspace, 8, tmp_path / "state")
    assert sum(line.startswith("won ") for line in results) == 1, results
    assert sum(line.startswith("lost ") for line in results) == 7, results


def test_the_lock_file_records_the_holders_command_line_and_an_older_file_without_it_still_reads(
    workspace: Path, registry: WorkspaceRegistry
) -> None:
    lock = registry.acquire_lock(workspace)
    assert lock.command == " ".join(shlex.join(sys.orig_argv).split())[:MAX_COMMAND_CHARS]
    assert json.loads(lock_file_of(workspace).read_text())["command"] == lock.command
    older = {key: value for key, value in lock.to_dict().items() if key != "command"}
    assert WorkspaceLock.from_dict(older).command == ""
    shown = WorkspaceLock.from_dict({**lock.to_dict(), "command": "evil\x1b[2J\nrm -rf /"})
    assert shown.command == "evil [2J rm -rf /"  # one line, no control characters, in an error
    with pytest.raises(ValueError, match="command is not a string"):
        WorkspaceLock.from_dict({**lock.to_dict(), "command": 3})
