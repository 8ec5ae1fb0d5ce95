"""SessionStore: files, atomic saves (tested with real crashes), loading and listing."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from teaagent.errors import ConfigError
from teaagent.session import (
    SESSIONS_DIR,
    STALE_TEMP_SECONDS,
    ChatMessage,
    ChatSession,
    SessionStore,
    new_session,
)

T0 = "2026-06-05T12:00:00.000000Z"


def make_session(session_id: str, updated_at: str = T0, messages: int = 0, label: str = "") -> ChatSession:
    session = ChatSession(session_id, T0, updated_at, label=label)
    for number in range(messages):
        session.messages.append(ChatMessage("user" if number % 2 == 0 else "assistant", f"message {number}"))
    return session


def test_save_writes_a_private_file_at_the_documented_place(workspace: Path) -> None:
    store = SessionStore(workspace)
    session = new_session("hello")
    session.add_message("user", "ünïcode ✓")
    store.save(session)
    path = workspace / ".teaagent" / "sessions" / f"{session.id}.json"
    assert store.path_for(session.id) == path
    assert store.folder == workspace / SESSIONS_DIR
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text(encoding="utf-8")) == session.to_dict()
    assert "ünïcode ✓" in path.read_text(encoding="utf-8")  # readable, not \\u-escaped
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_load_returns_what_was_saved(workspace: Path) -> None:
    store = SessionStore(workspace)
    session = new_session("focus")
    session.add_message("system", "be brief")
    session.add_message("user", "open parse.py")
    session.focus_stack.push("file", "src/parse.py", "the bug")
    session.focus_stack.push("task", "write the test")
    store.save(session)
    loaded = SessionStore(workspace).load(session.id)
    assert loaded == session
    assert loaded is not session


def test_load_of_an_absent_session_is_none(workspace: Path) -> None:
    assert SessionStore(workspace).load("never-saved") is None


def test_default_root_is_the_current_folder(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(workspace)
    session = new_session()
    SessionStore().save(session)
    assert (workspace / SESSIONS_DIR / f"{session.id}.json").is_file()


def test_save_overwrites(workspace: Path) -> None:
    store = SessionStore(workspace)
    session = new_session()
    store.save(session)
    session.add_message("user", "more")
    session.label = "renamed"
    store.save(session)
    loaded = store.load(session.id)
    assert loaded is not None
    assert (loaded.label, len(loaded.messages)) == ("renamed", 1)


@pytest.mark.parametrize("session_id", ["../outside", "a/b", "", "x" * 65])
def test_ids_that_leave_the_folder_are_refused(workspace: Path, session_id: str) -> None:
    store = SessionStore(workspace)
    with pytest.raises(ValueError, match="must be 1 to 64 letters, digits"):
        store.load(session_id)
    with pytest.raises(ValueError, match="must be 1 to 64 letters, digits"):
        store.delete(session_id)


def test_save_checks_a_session_changed_after_it_was_made(workspace: Path) -> None:
    session = new_session()
    session.id = "../../escape"
    with pytest.raises(ValueError, match="must be 1 to 64 letters"):
        SessionStore(workspace).save(session)
    assert not (workspace / ".teaagent").exists()
    with pytest.raises(TypeError, match=r"^SessionStore.save takes a ChatSession, not dict\.$"):
        SessionStore(workspace).save({"id": "x"})  # type: ignore[arg-type]


# -- corrupt files ----------------------------------------------------------------------------------


def write_raw(workspace: Path, name: str, data: bytes) -> Path:
    folder = workspace / SESSIONS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


def test_load_of_a_file_that_is_not_json_names_the_file(workspace: Path) -> None:
    path = write_raw(workspace, "broken.json", b'{"version": 1, "id": "bro')
    with pytest.raises(
        ConfigError, match=rf"^the session file {path} is not valid JSON \(.*\); fix or remove it\.$"
    ):
        SessionStore(workspace).load("broken")


def test_load_of_a_file_that_is_not_a_session(workspace: Path) -> None:
    path = write_raw(workspace, "odd.json", b'{"hello": "world"}')
    with pytest.raises(
        ConfigError, match=rf"^the session file {path} is not a valid session \(a session must"
    ):
        SessionStore(workspace).load("odd")


def test_load_of_a_file_holding_another_session(workspace: Path) -> None:
    path = write_raw(workspace, "a.json", json.dumps(make_session("b").to_dict()).encode())
    with pytest.raises(
        ConfigError, match=rf"^the session file {path} holds session 'b', not the one its name"
    ):
        SessionStore(workspace).load("a")


def test_load_refuses_a_symbolic_link(workspace: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(make_session("linked").to_dict()))
    folder = workspace / SESSIONS_DIR
    folder.mkdir(parents=True)
    (folder / "linked.json").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"linked\.json is a symbolic link; fix or remove it\.$"):
        SessionStore(workspace).load("linked")


def test_load_refuses_a_folder_in_place_of_a_file(workspace: Path) -> None:
    folder = workspace / SESSIONS_DIR / "dir.json"
    folder.mkdir(parents=True)
    with pytest.raises(
        ConfigError, match=rf"^the session file {folder} is not a regular file; fix or remove it\.$"
    ):
        SessionStore(workspace).load("dir")


def test_size_limit_at_the_boundary(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import teaagent.session._store as store_module

    session = make_session("big", messages=3)
    size = len(json.dumps(session.to_dict(), ensure_ascii=False, indent=2).encode()) + 1
    store = SessionStore(workspace)
    monkeypatch.setattr(store_module, "MAX_SESSION_FILE_BYTES", size)
    store.save(session)  # exactly at the limit
    assert store.load("big") == session
    monkeypatch.setattr(store_module, "MAX_SESSION_FILE_BYTES", size - 1)
    with pytest.raises(
        ValueError, match=rf"^session big takes {size} bytes, more than the {size - 1} a session"
    ):
        store.save(session)
    with pytest.raises(ConfigError, match=rf"big\.json is larger than {size - 1} bytes; fix or remove it\.$"):
        store.load("big")


# -- listing ----------------------------------------------------------------------------------------


def test_list_is_sorted_by_updated_at_descending(workspace: Path) -> None:
    store = SessionStore(workspace)
    store.save(make_session("old", "2026-06-01T00:00:00Z", messages=1, label="first"))
    store.save(make_session("new", "2026-06-03T00:00:00Z", messages=3))
    store.save(make_session("mid", "2026-06-02T00:00:00Z"))
    # Two zones and two precisions: sorted as times, not as text.
    store.save(make_session("zoned", "2026-06-03T01:30:00+02:00"))  # 23:30 UTC on the 2nd
    store.save(make_session("tie-b", "2026-06-02T00:00:00.000000Z"))
    assert [item["id"] for item in store.list_sessions()] == ["new", "zoned", "mid", "tie-b", "old"]
    assert store.list_sessions()[-1] == {
        "id": "old",
        "created_at": T0,
        "updated_at": "2026-06-01T00:00:00Z",
        "label": "first",
        "message_count": 1,
    }


def test_list_without_a_folder_is_empty(workspace: Path) -> None:
    assert SessionStore(workspace).list_sessions() == []


def test_list_skips_and_reports_files_it_cannot_use(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SessionStore(workspace)
    store.save(make_session("good"))
    broken = write_raw(workspace, "broken.json", b"not json")
    write_raw(workspace, ".good.abc123.tmp", b"half a sess")  # a save that was killed
    write_raw(workspace, "notes.txt", b"not a session file name")
    write_raw(workspace, "bad.name.json", b"{}")  # not a session id: not ours
    with caplog.at_level(logging.WARNING, logger="teaagent.session"):
        listed = store.list_sessions()
    assert [item["id"] for item in listed] == ["good"]
    assert [r.getMessage() for r in caplog.records] == [
        f"skipping the session file {broken}: it is not valid JSON"
        " (Expecting value: line 1 column 1 (char 0))"
    ]


def test_list_removes_temporary_files_of_killed_saves_once_stale(workspace: Path) -> None:
    store = SessionStore(workspace)
    store.save(make_session("s"))
    stale = write_raw(workspace, ".s.old12345.tmp", b"half")
    fresh = write_raw(workspace, ".s.new12345.tmp", b"half")
    now = time.time()
    os.utime(stale, (now, now - STALE_TEMP_SECONDS - 60))
    os.utime(fresh, (now, now - STALE_TEMP_SECONDS + 60))  # a slow save may still be writing it
    assert [item["id"] for item in store.list_sessions()] == ["s"]
    assert not stale.exists()
    assert fresh.exists()


def test_list_sees_every_change(workspace: Path) -> None:
    store = SessionStore(workspace)
    session = make_session("s")
    store.save(session)
    assert store.list_sessions()[0]["message_count"] == 0
    for count in range(1, 4):
        session.add_message("user", "x")
        store.save(session)
        assert store.list_sessions()[0]["message_count"] == count
    assert SessionStore(workspace).list_sessions() == store.list_sessions()
    assert store.delete("s") is True
    assert store.list_sessions() == []
    assert store.delete("s") is False


# -- crashes ----------------------------------------------------------------------------------------

FAILING_SAVE = textwrap.dedent(
    """
    import resource, signal, sys
    from teaagent.session import ChatSession, SessionStore
    store = SessionStore(sys.argv[1])
    session = store.load("crash")
    session.add_message("user", "x" * 200_000)
    # A real partial write: the kernel stops the file at 4 KiB and the write fails with EFBIG.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        store.save(session)
    except OSError as exc:
        print("failed", exc.errno)
    else:
        print("saved")
    """
)


@pytest.mark.slow
def test_a_save_that_fails_half_way_leaves_the_old_version(workspace: Path) -> None:
    store = SessionStore(workspace)
    session = make_session("crash", messages=2)
    store.save(session)
    result = subprocess.run(
        [sys.executable, "-c", FAILING_SAVE, str(workspace)], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["failed", "27"]  # EFBIG
    assert store.load("crash") == session
    assert sorted(p.name for p in store.folder.iterdir()) == ["crash.json"]  # the partial file is removed


SAVE_LOOP = textwrap.dedent(
    """
    import sys
    from teaagent.session import SessionStore, new_session
    store = SessionStore(sys.argv[1])
    sessions = [new_session(f"loop {n}", session_id=f"loop-{n}") for n in range(3)]
    for session in sessions:
        store.save(session)
    print("ready", flush=True)
    round = 0
    while True:
        round += 1
        for session in sessions:
            session.add_message("user", f"round {round} " + "y" * (round % 50) * 1000)
            store.save(session)
            if round == 1 and session is sessions[0]:
                print("saving", flush=True)  # a message is on disk: the kill's delay counts from here
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.2, 0.5])
def test_a_process_killed_in_the_middle_of_saves_leaves_every_file_whole(
    workspace: Path, delay: float
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SAVE_LOOP, str(workspace)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        assert child.stdout.readline().strip() == "saving"
        time.sleep(delay)  # where the kill lands among the saves, not a wait for an event
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    store = SessionStore(workspace)
    loaded = [store.load(f"loop-{n}") for n in range(3)]
    assert all(session is not None for session in loaded)
    assert all(session.label.startswith("loop") for session in loaded if session is not None)
    assert sum(len(s.messages) for s in loaded if s is not None) > 0  # the loop really was saving
    listed = store.list_sessions()
    assert sorted(item["id"] for item in listed) == ["loop-0", "loop-1", "loop-2"]
