"""teaagent.policy's path checks: what a tool call may touch under each permission mode."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from policy_support import ScriptedPrompter, exactly

from teaagent.errors import ApprovalDeniedError
from teaagent.policy import ApprovalPolicy, PromptAnswer

# -- paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["path", "cwd", "directory"])
def test_workspace_write_denies_a_path_outside(workspace: Path, key: str) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(
            f"fs.write's {key} '/etc/passwd' is outside the workspace "
            "and the permission mode is workspace-write."
        ),
    ):
        policy.assert_allowed("fs.write", "c1", False, {key: "/etc/passwd"})


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/", str(Path("/tmp") / "elsewhere")])
def test_workspace_write_denies_climbing_out(workspace: Path, path: str) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(ApprovalDeniedError, match="is outside the workspace"):
        policy.assert_allowed("fs.write", "c1", False, {"path": path})


def test_a_sibling_with_the_root_as_prefix_is_outside(workspace: Path) -> None:
    (workspace.parent / (workspace.name + "-evil")).mkdir()
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(ApprovalDeniedError, match="is outside the workspace"):
        policy.assert_allowed("fs.write", "c1", False, {"path": str(workspace) + "-evil/x"})


@pytest.mark.parametrize(
    "path", ["notes.txt", "deep/new/dir/file", "", ".", "./a//b/./c", "sub/", "sub/../notes.txt", "@ABS@/x"]
)
def test_workspace_write_allows_paths_inside(workspace: Path, path: str) -> None:
    (workspace / "sub").mkdir()
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.assert_allowed("fs.write", "c1", False, {"path": path.replace("@ABS@", str(workspace))})


def test_a_symlink_out_of_the_workspace_is_outside(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / "link").symlink_to(outside)
    policy = ApprovalPolicy.for_workspace(workspace)
    for path in ("link", "link/new.txt", "link/a/b"):
        with pytest.raises(ApprovalDeniedError, match="is outside the workspace"):
            policy.assert_allowed("fs.write", "c1", False, {"path": path})


def test_dot_dot_after_a_symlink_climbs_from_its_target(workspace: Path, tmp_path: Path) -> None:
    # The kernel reads "link/../x" as "outside/deeper/../x", that is "outside/x", not "x".
    deep = tmp_path / "outside" / "deeper"
    deep.mkdir(parents=True)
    (workspace / "link").symlink_to(deep)
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(ApprovalDeniedError, match="is outside the workspace"):
        policy.assert_allowed("fs.write", "c1", False, {"path": "link/../x"})


def test_a_symlink_that_stays_inside_is_inside(workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "alias").symlink_to(workspace / "real")
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.assert_allowed("fs.write", "c1", False, {"path": "alias/file.txt"})


def test_a_symlinked_workspace_root_is_resolved(workspace: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias-root"
    alias.symlink_to(workspace)
    policy = ApprovalPolicy.for_workspace(alias)
    policy.assert_allowed("fs.write", "c1", False, {"path": str(alias / "a.txt")})
    policy.assert_allowed("fs.write", "c1", False, {"path": str(workspace / "a.txt")})


def test_a_relative_workspace_root_resolves_against_the_working_directory(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace.parent)
    policy = ApprovalPolicy.for_workspace(workspace.name)
    policy.assert_allowed("fs.write", "c1", False, {"path": str(workspace / "a.txt")})
    with pytest.raises(ApprovalDeniedError):
        policy.assert_allowed("fs.write", "c1", False, {"path": str(workspace.parent / "a.txt")})


def test_every_entry_of_paths_is_checked(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.assert_allowed("fs.move", "c1", False, {"paths": ["a", "b/c"]})
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(
            "fs.move's paths '/etc' is outside the workspace and the permission mode is workspace-write."
        ),
    ):
        policy.assert_allowed("fs.move", "c1", False, {"paths": ["a", "/etc"]})


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"path": 7},
            "fs.write's path argument is not a path, so it cannot be checked against the workspace.",
        ),
        (
            {"paths": {"a": 1}},
            "fs.write's paths argument is not a path, so it cannot be checked against the workspace.",
        ),
        ({"paths": ["a", 3]}, "fs.write's paths argument holds something that is not a path."),
        ({"path": "a\0b"}, "fs.write's path 'a\\x00b' is not a valid path."),
    ],
)
def test_path_arguments_that_are_not_paths_are_denied(
    workspace: Path, arguments: dict[str, Any], message: str
) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(ApprovalDeniedError, match=exactly(message)):
        policy.assert_allowed("fs.write", "c1", False, arguments)


def test_a_null_path_argument_is_absent(workspace: Path) -> None:
    ApprovalPolicy.for_workspace(workspace).assert_allowed("shell.cd", "c1", False, {"cwd": None})


def test_other_keys_and_nested_values_are_not_read_as_paths(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.assert_allowed(
        "fs.write", "c1", False, {"path": "a", "target": "/etc/passwd", "opts": {"path": "/etc"}}
    )


def test_read_only_calls_are_not_path_checked(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.assert_allowed("fs.read", "c1", False, {"path": "/etc/passwd"}, read_only=True)
    policy.assert_allowed("fs.read", "c1", False, {"path": ".teaagent/approval_presets.json"}, read_only=True)


@pytest.mark.parametrize("mode", ["workspace-write", "prompt", "allow"])
@pytest.mark.parametrize("path", [".teaagent/approval_presets.json", ".teaagent", "sub/../.teaagent/x"])
def test_the_control_directory_is_off_limits_whatever_approves(workspace: Path, mode: str, path: str) -> None:
    (workspace / "sub").mkdir()
    prompter = ScriptedPrompter(PromptAnswer.SESSION)
    policy = dataclasses.replace(
        ApprovalPolicy.for_workspace(workspace, mode=mode, prompter=prompter), allow_all_destructive=True
    )
    policy.jit_state.approve_session("fs.write")
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(
            f"fs.write's path {path!r} is inside the workspace's .teaagent directory, "
            "whose approval state agents may not change."
        ),
    ):
        policy.assert_allowed("fs.write", "c1", True, {"path": path})
    assert prompter.asked == []


def test_a_symlink_into_the_control_directory_is_caught(workspace: Path) -> None:
    (workspace / ".teaagent").mkdir()
    (workspace / "innocent").symlink_to(workspace / ".teaagent")
    policy = ApprovalPolicy.for_workspace(workspace, mode="allow")
    with pytest.raises(ApprovalDeniedError, match=r"inside the workspace's \.teaagent directory"):
        policy.assert_allowed("fs.write", "c1", False, {"path": "innocent/approval_presets.json"})


def test_a_look_alike_of_the_control_directory_is_fine(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.assert_allowed("fs.write", "c1", False, {"path": ".teaagent-notes/x"})
    policy.assert_allowed("fs.write", "c1", False, {"path": "sub/.teaagent/x"})


def test_prompt_and_allow_do_not_confine_paths(workspace: Path) -> None:
    # Only workspace-write confines; the tools layer confines the paths it opens in every mode.
    ApprovalPolicy.for_workspace(workspace, mode="allow").assert_allowed(
        "x.write", "c1", False, {"path": "/tmp/x"}
    )


def test_danger_full_access_checks_no_path(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="danger-full-access")
    policy.assert_allowed("fs.write", "c1", True, {"path": "/etc/passwd"})
    policy.assert_allowed("fs.write", "c1", True, {"path": ".teaagent/approval_presets.json"})


def test_outside_paths_beat_every_approval_in_workspace_write(workspace: Path) -> None:
    policy = dataclasses.replace(ApprovalPolicy.for_workspace(workspace), allow_all_destructive=True)
    policy.jit_state.approve_session("fs.delete")
    with pytest.raises(ApprovalDeniedError, match="is outside the workspace"):
        policy.assert_allowed("fs.delete", "c1", True, {"path": "../precious"})
    assert policy.jit_state.session_approved_tools == {"fs.delete"}
