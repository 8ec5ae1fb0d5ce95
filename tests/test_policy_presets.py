"""teaagent.policy.ApprovalPresetStore: persisted presets, matching, and a corrupt file failing closed."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from teaagent._canonical import payload_digest
from teaagent.errors import ConfigError
from teaagent.policy import PRESETS_FILE, ApprovalPreset, ApprovalPresetStore
from teaagent.policy._presets import MAX_PRESETS

NOW = 1_764_570_000


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def store_at(workspace: Path, now: float = NOW) -> tuple[ApprovalPresetStore, Clock]:
    clock = Clock(now)
    return ApprovalPresetStore(workspace, clock=clock), clock


def corrupt_message(store: ApprovalPresetStore, why: str) -> str:
    return re.escape(
        f"the approval presets file {store.path} {why}; no preset applies until it is fixed or removed."
    )


# -- persistence ------------------------------------------------------------------------------------


def test_an_absent_file_holds_no_preset_and_creates_nothing(workspace: Path) -> None:
    store, _ = store_at(workspace)
    assert store.list() == []
    assert store.matches("fs.write", {}, None) is None
    assert store.problem is None
    assert not (workspace / ".teaagent").exists()


def test_presets_persist_across_store_instances(workspace: Path) -> None:
    first, _ = store_at(workspace)
    added = first.add("shell.*", origin_run_id="run-1", expires_at=NOW + 60)
    pinned = first.add("fs.delete", payload_digest=payload_digest("fs.delete", {"path": "a"}))
    second, _ = store_at(workspace)
    assert second.list() == [added, pinned]
    assert second.matches("shell.run", {"command": "ls"}, "run-1") == added
    assert second.remove(added.preset_id)
    assert first.list() == [pinned]
    assert not first.remove(added.preset_id)


def test_the_file_format(workspace: Path) -> None:
    store, _ = store_at(workspace)
    preset = store.add("fs.delete", expires_at=NOW + 5)
    document = json.loads((workspace / PRESETS_FILE).read_text())
    assert document == {
        "version": 1,
        "presets": [
            {
                "id": preset.preset_id,
                "tool": "fs.delete",
                "payload_digest": None,
                "created_at": NOW,
                "origin_run_id": None,
                "expires_at": NOW + 5,
            }
        ],
    }
    assert re.fullmatch(r"[0-9a-f]{16}", preset.preset_id)


def test_files_are_private_and_writes_leave_no_temporary_file(workspace: Path) -> None:
    store, _ = store_at(workspace)
    old_umask = os.umask(0)
    try:
        store.add("a.*")
        store.add("b.*")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert sorted(path.name for path in store.path.parent.iterdir()) == [
        "approval_presets.json",
        "approval_presets.json.lock",
    ]


def test_concurrent_adds_from_separate_stores_lose_nothing(workspace: Path) -> None:
    threads = 8
    barrier = threading.Barrier(threads)

    def add(worker: int) -> None:
        store = ApprovalPresetStore(workspace)  # one open file each: flock serialises them
        barrier.wait()
        for number in range(5):
            store.add(f"tool.{worker}.{number}")

    workers = [threading.Thread(target=add, args=(worker,)) for worker in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    patterns = sorted(preset.tool_pattern for preset in ApprovalPresetStore(workspace).list())
    assert patterns == sorted(f"tool.{worker}.{number}" for worker in range(threads) for number in range(5))


# -- matching ---------------------------------------------------------------------------------------


def test_the_tool_pattern_is_fnmatch_and_case_sensitive(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.add("shell.*")
    assert store.matches("shell.run", {}, None) is not None
    assert store.matches("shell.", {}, None) is not None
    assert store.matches("Shell.run", {}, None) is None
    assert store.matches("fs.shell.run", {}, None) is None


def test_a_pinned_digest_matches_only_those_arguments(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.add("shell.run", payload_digest=payload_digest("shell.run", {"command": "make"}))
    assert store.matches("shell.run", {"command": "make"}, None) is not None
    assert store.matches("shell.run", {"command": "make install"}, None) is None
    assert store.matches("shell.run", {"command": float("inf")}, None) is None  # no digest at all


def test_run_scoping(workspace: Path) -> None:
    store, _ = store_at(workspace)
    scoped = store.add("fs.delete", origin_run_id="run-1")
    assert store.matches("fs.delete", {}, "run-1") == scoped
    assert store.matches("fs.delete", {}, "run-2") is None
    assert store.matches("fs.delete", {}, None) is None
    unscoped = store.add("fs.*")
    assert store.matches("fs.delete", {}, "run-2") == unscoped
    assert store.matches("fs.delete", {}, None) == unscoped


def test_expiry_boundary(workspace: Path) -> None:
    store, clock = store_at(workspace)
    store.add("fs.delete", expires_at=NOW + 10)
    clock.now = NOW + 10  # applies while now <= expires_at (PROTOCOL.md's convention)
    assert store.matches("fs.delete", {}, None) is not None
    clock.now = NOW + 10.001
    assert store.matches("fs.delete", {}, None) is None
    assert len(store.list()) == 1  # expired presets stay listed until removed


def test_the_first_matching_preset_is_returned(workspace: Path) -> None:
    store, _ = store_at(workspace)
    first = store.add("fs.*")
    store.add("fs.delete")
    assert store.matches("fs.delete", {}, None) == first


def test_a_preset_added_by_another_instance_applies_at_once(workspace: Path) -> None:
    reader, _ = store_at(workspace)
    assert reader.matches("fs.delete", {}, None) is None
    store_at(workspace)[0].add("fs.delete")
    assert reader.matches("fs.delete", {}, None) is not None


# -- add refuses bad presets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "fields", "message"),
    [
        ("", {}, "a preset needs a non-empty tool pattern."),
        ("  ", {}, "a preset needs a non-empty tool pattern."),
        (
            "fs.*",
            {"payload_digest": "sha256:ABC"},
            "payload digest 'sha256:ABC' is not 'sha256:' followed by 64 lowercase hex characters.",
        ),
        ("fs.*", {"origin_run_id": ""}, "origin_run_id must be a non-empty string or None."),
        ("fs.*", {"expires_at": NOW}, f"expires_at {NOW} is not after now ({NOW})."),
        ("fs.*", {"expires_at": True}, "expires_at must be integer Unix seconds or None."),
        ("fs.*", {"expires_at": NOW + 0.5}, "expires_at must be integer Unix seconds or None."),
    ],
)
def test_add_refuses_malformed_presets(
    workspace: Path, pattern: str, fields: dict[str, Any], message: str
) -> None:
    store, _ = store_at(workspace)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        store.add(pattern, **fields)
    assert not store.path.exists()


def test_expires_one_second_after_now_is_accepted(workspace: Path) -> None:
    store, _ = store_at(workspace)
    assert store.add("fs.*", expires_at=NOW + 1).expires_at == NOW + 1


def write_presets(store: ApprovalPresetStore, count: int) -> None:
    store.path.parent.mkdir(mode=0o700, exist_ok=True)
    presets = [
        ApprovalPreset(
            preset_id=f"{number:016x}",
            tool_pattern=f"tool.{number}",
            payload_digest=None,
            created_at=NOW,
            origin_run_id=None,
            expires_at=None,
        ).to_json()
        for number in range(count)
    ]
    store.path.write_text(json.dumps({"version": 1, "presets": presets}))
    store.path.chmod(0o600)


def test_the_preset_limit(workspace: Path) -> None:
    store, _ = store_at(workspace)
    write_presets(store, MAX_PRESETS - 1)
    store.add("one.more")
    with pytest.raises(
        ValueError, match=f"^the approval presets file already holds {MAX_PRESETS} presets\\.$"
    ):
        store.add("too.many")
    write_presets(store, MAX_PRESETS + 1)
    assert store.problem is not None
    assert store.matches("tool.1", {}, None) is None


# -- a corrupt file fails closed --------------------------------------------------------------------

CORRUPTIONS = [
    ('{"version": 1, "presets": [', "is not valid JSON"),
    ("[]", "is not an object with exactly the keys 'version' and 'presets'"),
    ('{"version": 2, "presets": []}', "has version 2, not 1"),
    ('{"version": 1, "presets": {}}', f"does not hold a list of at most {MAX_PRESETS} presets"),
    ('{"version": 1, "presets": [{"tool": "*"}]}', "holds an invalid preset"),
    (
        '{"version": 1, "presets": [{"id": "0000000000000000", "tool": "", "payload_digest": null,'
        ' "created_at": 1, "origin_run_id": null, "expires_at": null}]}',
        "holds an invalid preset (preset 0000000000000000 has no tool pattern)",
    ),
    (
        '{"version": 1, "presets": [{"id": "0000000000000000", "tool": "*", "payload_digest": "md5:x",'
        ' "created_at": 1, "origin_run_id": null, "expires_at": null}]}',
        "holds an invalid preset (preset 0000000000000000 has a malformed payload_digest)",
    ),
    (
        '{"version": 1, "presets": [{"id": "0000000000000000", "tool": "*", "payload_digest": null,'
        ' "created_at": 1, "origin_run_id": null, "expires_at": "soon"}]}',
        "holds an invalid preset (preset 0000000000000000 has an expires_at that is not an integer)",
    ),
    (b"\xff\xfe", "is not valid JSON"),
]


@pytest.mark.parametrize(("content", "why"), CORRUPTIONS)
def test_a_corrupt_file_matches_nothing_and_says_why(
    workspace: Path, content: str | bytes, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = store_at(workspace)
    store.add("*")
    assert store.matches("shell.run", {}, None) is not None
    if isinstance(content, bytes):
        store.path.write_bytes(content)
    else:
        store.path.write_text(content)
    with caplog.at_level(logging.ERROR, logger="teaagent.policy"):
        assert store.matches("shell.run", {}, None) is None
        assert store.matches("shell.run", {}, None) is None
    assert store.problem is not None
    assert store.problem.startswith(f"the approval presets file {store.path} {why}")
    assert store.problem.endswith("; no preset applies until it is fixed or removed.")
    assert [record.getMessage() for record in caplog.records] == [store.problem]  # reported once


def test_list_add_and_remove_refuse_a_corrupt_file_and_leave_it_alone(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.path.parent.mkdir()
    store.path.write_text('{"version": 2, "presets": []}')
    message = corrupt_message(store, "has version 2, not 1")
    with pytest.raises(ConfigError, match=f"^{message}$"):
        store.list()
    with pytest.raises(ConfigError, match=f"^{message}$"):
        store.add("fs.*")
    with pytest.raises(ConfigError, match=f"^{message}$"):
        store.remove("0000000000000000")
    assert store.path.read_text() == '{"version": 2, "presets": []}'


def test_a_repaired_file_applies_again(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.add("fs.*")
    good = store.path.read_text()
    store.path.write_text("{")
    assert store.matches("fs.write", {}, None) is None
    store.path.write_text(good)
    assert store.matches("fs.write", {}, None) is not None
    assert store.problem is None


def test_a_file_others_may_write_is_refused(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.add("*")
    store.path.chmod(0o620)
    assert store.matches("shell.run", {}, None) is None
    with pytest.raises(ConfigError, match=corrupt_message(store, "is writable by other users")):
        store.list()
    store.path.chmod(0o644)  # readable by others is fine: presets are not secrets
    assert store.matches("shell.run", {}, None) is not None


def test_a_symlinked_file_is_refused(workspace: Path, tmp_path: Path) -> None:
    elsewhere, _ = store_at(tmp_path)
    elsewhere.add("*")
    store, _ = store_at(workspace)
    store.path.parent.mkdir()
    store.path.symlink_to(elsewhere.path)
    assert store.matches("shell.run", {}, None) is None
    assert store.problem == (
        f"the approval presets file {store.path} is a symbolic link; "
        "no preset applies until it is fixed or removed."
    )


def test_a_directory_in_place_of_the_file_is_refused(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.path.mkdir(parents=True)
    assert store.matches("shell.run", {}, None) is None
    assert store.problem is not None


def test_an_oversized_file_is_refused(workspace: Path) -> None:
    store, _ = store_at(workspace)
    store.path.parent.mkdir()
    store.path.write_text(" " * (1024 * 1024 + 1))
    assert store.matches("shell.run", {}, None) is None
    assert store.problem is not None
    assert "is larger than 1048576 bytes" in store.problem
