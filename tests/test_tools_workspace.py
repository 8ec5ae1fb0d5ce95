"""The built-in workspace tools: fs.read, fs.write, fs.list, fs.search, fs.delete, and their confinement."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from teaagent.tools import (
    MAX_LIST_ENTRIES,
    MAX_READ_BYTES,
    MAX_SEARCH_FILE_BYTES,
    MAX_SEARCH_LINE_CHARS,
    MAX_SEARCH_MATCHES,
    WORKSPACE_TOOL_NAMES,
    SchemaValidationError,
    ToolError,
    ToolRateLimit,
    ToolRateLimitError,
    ToolRegistry,
    WorkspaceEscapeError,
    register_workspace_tools,
    workspace_registry,
)


@pytest.fixture
def tools(workspace: Path) -> ToolRegistry:
    return workspace_registry(workspace)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the workspace, holding a secret the tools must never reach."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret\n")
    return folder


# -- registration -----------------------------------------------------------------------------------------


def test_the_built_in_tools_are_registered_in_order(tools: ToolRegistry) -> None:
    assert [tool.name for tool in tools.list_tools()] == list(WORKSPACE_TOOL_NAMES)
    assert WORKSPACE_TOOL_NAMES == ("fs.read", "fs.write", "fs.list", "fs.search", "fs.delete", "shell.run")


@pytest.mark.parametrize(
    ("name", "tier", "read_only", "destructive", "idempotent", "stateful"),
    [
        ("fs.read", "Low", True, False, True, False),
        ("fs.list", "Low", True, False, True, False),
        ("fs.search", "Low", True, False, True, False),
        ("fs.write", "Medium", False, False, True, False),
        ("fs.delete", "High", False, True, True, False),
        ("shell.run", "Critical", False, True, False, True),
    ],
)
def test_annotations_are_honest(
    tools: ToolRegistry,
    name: str,
    tier: str,
    read_only: bool,
    destructive: bool,
    idempotent: bool,
    stateful: bool,
) -> None:
    tool = tools.lookup(name)
    assert tool is not None
    assert tool.get_security_tier() == tier
    annotations = tool.annotations
    assert (annotations.read_only, annotations.destructive) == (read_only, destructive)
    assert (annotations.idempotent, annotations.stateful) == (idempotent, stateful)
    assert tool.input_schema["type"] == "object"
    assert tool.output_schema["additionalProperties"] is False
    assert tool.description


def test_the_root_must_be_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"^the workspace root .*missing does not exist$"):
        workspace_registry(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"^the workspace root .*file is not a directory$"):
        workspace_registry(tmp_path / "file")


def test_registering_twice_is_refused_unless_overridden(workspace: Path) -> None:
    registry = workspace_registry(workspace)
    with pytest.raises(ValueError, match=r"^a tool named 'fs.read' is already registered"):
        register_workspace_tools(registry, workspace)
    register_workspace_tools(registry, workspace, allow_override=True)
    assert len(registry) == len(WORKSPACE_TOOL_NAMES)


def test_rate_limits_apply_to_the_named_tools(workspace: Path) -> None:
    (workspace / "a.txt").write_text("a")
    registry = workspace_registry(workspace, rate_limits={"fs.read": ToolRateLimit(1, 3600)})
    registry.call("fs.read", {"path": "a.txt"})
    with pytest.raises(ToolRateLimitError, match=r"^fs.read: rate limit of 1 call per 3600 s reached"):
        registry.call("fs.read", {"path": "a.txt"})
    registry.call("fs.list", {})  # other tools are not limited
    with pytest.raises(ValueError, match=r"^rate_limits names tools that are not workspace tools: fs.nope$"):
        workspace_registry(workspace, rate_limits={"fs.nope": ToolRateLimit(1)})


# -- confinement: every path stays inside the root -------------------------------------------------------

PATH_CALLS = [
    ("fs.read", {}),
    ("fs.write", {"content": "x"}),
    ("fs.list", {}),
    ("fs.search", {"pattern": "x"}),
    ("fs.delete", {}),
]


@pytest.mark.parametrize(("tool", "extra"), PATH_CALLS)
@pytest.mark.parametrize("path", ["../outside/secret.txt", "a/../../outside/secret.txt", "..", "a/.."])
def test_dot_dot_is_refused(
    tools: ToolRegistry, outside: Path, tool: str, extra: dict[str, Any], path: str
) -> None:
    with pytest.raises(
        WorkspaceEscapeError,
        match=rf"^{tool}: path '{path}' contains '\.\.'; "
        r"workspace paths must stay inside the workspace root$",
    ):
        tools.call(tool, {"path": path, **extra})
    assert (outside / "secret.txt").read_text() == "top secret\n"


@pytest.mark.parametrize(("tool", "extra"), PATH_CALLS)
def test_absolute_paths_are_refused(
    tools: ToolRegistry, outside: Path, tool: str, extra: dict[str, Any]
) -> None:
    path = str(outside / "secret.txt")
    with pytest.raises(
        WorkspaceEscapeError,
        match=rf"^{tool}: path '.*secret.txt' is absolute; give a path relative to the workspace root$",
    ):
        tools.call(tool, {"path": path, **extra})
    assert (outside / "secret.txt").read_text() == "top secret\n"


@pytest.mark.parametrize(("tool", "extra"), [call for call in PATH_CALLS if call[0] != "fs.delete"])
def test_a_symlink_to_a_folder_outside_is_refused(
    tools: ToolRegistry, workspace: Path, outside: Path, tool: str, extra: dict[str, Any]
) -> None:
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    path = "link/secret.txt" if tool != "fs.list" else "link"
    with pytest.raises(
        WorkspaceEscapeError,
        match=rf"^{tool}: path '{path}' resolves outside the workspace root through a symbolic link$",
    ):
        tools.call(tool, {"path": path, **extra})
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_a_symlink_to_a_file_outside_is_refused_for_read_and_write(
    tools: ToolRegistry, workspace: Path, outside: Path
) -> None:
    (workspace / "secret").symlink_to(outside / "secret.txt")
    with pytest.raises(
        WorkspaceEscapeError, match=r"^fs.read: path 'secret' resolves outside the workspace root"
    ):
        tools.call("fs.read", {"path": "secret"})
    with pytest.raises(
        WorkspaceEscapeError, match=r"^fs.write: path 'secret' resolves outside the workspace root"
    ):
        tools.call("fs.write", {"path": "secret", "content": "pwned"})
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_a_symlink_through_a_folder_outside_is_refused_for_delete(
    tools: ToolRegistry, workspace: Path, outside: Path
) -> None:
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(
        WorkspaceEscapeError, match=r"^fs.delete: path 'link/secret.txt' resolves outside the workspace root"
    ):
        tools.call("fs.delete", {"path": "link/secret.txt"})
    assert (outside / "secret.txt").exists()


def test_a_symlink_that_stays_inside_is_followed(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "real").mkdir()
    (workspace / "real" / "notes.txt").write_text("inside\n")
    (workspace / "alias").symlink_to("real", target_is_directory=True)
    (workspace / "notes-link").symlink_to("real/notes.txt")
    assert tools.call("fs.read", {"path": "alias/notes.txt"})["content"] == "inside\n"
    assert tools.call("fs.read", {"path": "notes-link"})["content"] == "inside\n"
    tools.call("fs.write", {"path": "notes-link", "content": "changed\n"})
    assert (workspace / "real" / "notes.txt").read_text() == "changed\n"
    assert (workspace / "notes-link").is_symlink()
    listing = tools.call("fs.list", {"path": "alias"})
    assert listing["entries"] == [{"path": "alias/notes.txt", "type": "file", "size": 8}]


def test_a_workspace_root_reached_through_a_symlink_works(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    (real / "a.txt").write_text("a")
    (tmp_path / "root-link").symlink_to(real, target_is_directory=True)
    tools = workspace_registry(tmp_path / "root-link")
    assert tools.call("fs.read", {"path": "a.txt"})["content"] == "a"


def test_a_nul_character_is_refused(tools: ToolRegistry) -> None:
    with pytest.raises(SchemaValidationError, match=r"^fs.read: path 'a\\x00b' contains a NUL character$"):
        tools.call("fs.read", {"path": "a\x00b"})


@pytest.mark.parametrize(
    "path", [".teaagent/audit.jsonl", ".teaagent", "./.teaagent/x", "state-link/audit.jsonl"]
)
def test_the_state_folder_cannot_be_written(tools: ToolRegistry, workspace: Path, path: str) -> None:
    state = workspace / ".teaagent"
    state.mkdir()
    (state / "audit.jsonl").write_text("{}\n")
    (workspace / "state-link").symlink_to(".teaagent", target_is_directory=True)
    with pytest.raises(
        WorkspaceEscapeError, match=r"^fs.write: path .* is inside the workspace's \.teaagent state folder"
    ):
        tools.call("fs.write", {"path": path, "content": "forged"})
    assert (state / "audit.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("path", [".teaagent/audit.jsonl", ".teaagent", "state-link/audit.jsonl"])
def test_the_state_folder_cannot_be_deleted(tools: ToolRegistry, workspace: Path, path: str) -> None:
    state = workspace / ".teaagent"
    state.mkdir()
    (state / "audit.jsonl").write_text("{}\n")
    (workspace / "state-link").symlink_to(".teaagent", target_is_directory=True)
    with pytest.raises(
        WorkspaceEscapeError, match=r"^fs.delete: path .* is inside the workspace's \.teaagent state folder"
    ):
        tools.call("fs.delete", {"path": path})
    assert (state / "audit.jsonl").exists()


def test_the_state_folder_can_be_read(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / ".teaagent").mkdir()
    (workspace / ".teaagent" / "audit.jsonl").write_text("{}\n")
    assert tools.call("fs.read", {"path": ".teaagent/audit.jsonl"})["content"] == "{}\n"


# -- fs.read ------------------------------------------------------------------------------------------------


def test_read_returns_content_size_and_truncated(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "hello.txt").write_text("héllo\n", encoding="utf-8")
    assert tools.call("fs.read", {"path": "hello.txt"}) == {
        "content": "héllo\n",
        "size": 7,
        "truncated": False,
    }


def test_read_boundary_at_max_bytes(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "ten.txt").write_text("0123456789")
    assert tools.call("fs.read", {"path": "ten.txt", "max_bytes": 10}) == {
        "content": "0123456789",
        "size": 10,
        "truncated": False,
    }
    assert tools.call("fs.read", {"path": "ten.txt", "max_bytes": 9}) == {
        "content": "012345678",
        "size": 10,
        "truncated": True,
    }


def test_read_drops_a_character_cut_by_the_limit(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "e.txt").write_text("aé", encoding="utf-8")  # b"a\xc3\xa9"
    assert tools.call("fs.read", {"path": "e.txt", "max_bytes": 2})["content"] == "a"


def test_read_replaces_invalid_utf8(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "bin").write_bytes(b"ok\xff\n")
    assert tools.call("fs.read", {"path": "bin"})["content"] == "ok\ufffd\n"


def test_read_max_bytes_is_bounded_by_the_schema(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "a").write_text("a")
    tools.call("fs.read", {"path": "a", "max_bytes": MAX_READ_BYTES})
    with pytest.raises(SchemaValidationError, match=r"^fs.read: arguments are invalid at \$.max_bytes: "):
        tools.call("fs.read", {"path": "a", "max_bytes": MAX_READ_BYTES + 1})


def test_read_defaults_to_the_bound(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "big").write_bytes(b"x" * (MAX_READ_BYTES + 1))
    result = tools.call("fs.read", {"path": "big"})
    assert (len(result["content"]), result["size"], result["truncated"]) == (
        MAX_READ_BYTES,
        MAX_READ_BYTES + 1,
        True,
    )


def test_read_refuses_what_is_not_a_regular_file(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "folder").mkdir()
    with pytest.raises(
        ToolError, match=r"^fs.read: 'folder' is a directory; use fs.list to see what it holds$"
    ):
        tools.call("fs.read", {"path": "folder"})
    os.mkfifo(workspace / "pipe")
    with pytest.raises(ToolError, match=r"^fs.read: 'pipe' is not a regular file$"):
        tools.call("fs.read", {"path": "pipe"})  # and does not hang waiting for a writer
    with pytest.raises(ToolError, match=r"^fs.read: cannot read 'missing.txt': no such file or directory$"):
        tools.call("fs.read", {"path": "missing.txt"})


# -- fs.write ----------------------------------------------------------------------------------------------


def test_write_creates_a_file(tools: ToolRegistry, workspace: Path) -> None:
    result = tools.call(
        "fs.write", {"path": "./src//main.py", "content": "print('é')\n", "create_dirs": True}
    )
    assert result == {"path": "src/main.py", "bytes_written": 12}
    assert (workspace / "src" / "main.py").read_text(encoding="utf-8") == "print('é')\n"


def test_write_replaces_atomically_and_keeps_the_mode(tools: ToolRegistry, workspace: Path) -> None:
    target = workspace / "run.sh"
    target.write_text("old")
    target.chmod(0o750)
    tools.call("fs.write", {"path": "run.sh", "content": "new"})
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert sorted(path.name for path in workspace.iterdir()) == ["run.sh"]  # no temporary file left


def test_write_without_create_dirs_needs_the_folder(tools: ToolRegistry, workspace: Path) -> None:
    with pytest.raises(
        ToolError,
        match=r"^fs.write: the folder of 'a/b.txt' does not exist; pass create_dirs true to create it$",
    ):
        tools.call("fs.write", {"path": "a/b.txt", "content": "x"})
    assert not (workspace / "a").exists()


def test_write_refuses_a_directory_and_the_root(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "folder").mkdir()
    with pytest.raises(ToolError, match=r"^fs.write: 'folder' is a directory$"):
        tools.call("fs.write", {"path": "folder", "content": "x"})
    with pytest.raises(ToolError, match=r"^fs.write: '\.' is the workspace root, not a file$"):
        tools.call("fs.write", {"path": ".", "content": "x"})


def test_write_refuses_content_that_is_not_unicode(tools: ToolRegistry) -> None:
    with pytest.raises(
        SchemaValidationError, match=r"^fs.write: the content of 'a.txt' is not valid Unicode text$"
    ):
        tools.call("fs.write", {"path": "a.txt", "content": "\ud800"})


def test_write_then_read_round_trips(tools: ToolRegistry) -> None:
    text = "line 1\nligne 2 — ü\n"
    tools.call("fs.write", {"path": "r.txt", "content": text})
    assert tools.call("fs.read", {"path": "r.txt"})["content"] == text


# -- fs.list -----------------------------------------------------------------------------------------------


def make_tree(root: Path) -> None:
    (root / "b.txt").write_text("bb")
    (root / "a").mkdir()
    (root / "a" / "z.py").write_text("z")
    (root / "a" / "inner").mkdir()
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    (root / "to-b").symlink_to("b.txt")


def test_list_one_level_sorted(tools: ToolRegistry, workspace: Path) -> None:
    make_tree(workspace)
    assert tools.call("fs.list", {}) == {
        "entries": [
            {"path": ".git", "type": "directory", "size": 0},
            {"path": "a", "type": "directory", "size": 0},
            {"path": "b.txt", "type": "file", "size": 2},
            {"path": "to-b", "type": "symlink", "size": 0},
        ],
        "truncated": False,
    }


def test_list_recursive_skips_git_and_does_not_follow_links(tools: ToolRegistry, workspace: Path) -> None:
    make_tree(workspace)
    paths = [entry["path"] for entry in tools.call("fs.list", {"recursive": True})["entries"]]
    assert paths == [".git", "a", "a/inner", "a/z.py", "b.txt", "to-b"]


def test_list_a_sub_folder(tools: ToolRegistry, workspace: Path) -> None:
    make_tree(workspace)
    entries = tools.call("fs.list", {"path": "a"})["entries"]
    assert entries == [
        {"path": "a/inner", "type": "directory", "size": 0},
        {"path": "a/z.py", "type": "file", "size": 1},
    ]


def test_list_boundary_at_max_entries(tools: ToolRegistry, workspace: Path) -> None:
    folder = workspace / "many"
    folder.mkdir()
    for index in range(MAX_LIST_ENTRIES):
        (folder / f"{index:05}").touch()
    full = tools.call("fs.list", {"path": "many"})
    assert (len(full["entries"]), full["truncated"]) == (MAX_LIST_ENTRIES, False)
    (folder / "one-more").touch()
    cut = tools.call("fs.list", {"path": "many"})
    assert (len(cut["entries"]), cut["truncated"]) == (MAX_LIST_ENTRIES, True)


def test_list_refuses_a_file_and_a_missing_path(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "f").write_text("x")
    with pytest.raises(ToolError, match=r"^fs.list: 'f' is not a directory; use fs.read to read a file$"):
        tools.call("fs.list", {"path": "f"})
    with pytest.raises(ToolError, match=r"^fs.list: 'nope' does not exist$"):
        tools.call("fs.list", {"path": "nope"})


# -- fs.search ---------------------------------------------------------------------------------------------


def test_search_finds_lines_with_numbers(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("import os\n\ndef main():\n    os.exit(0)\n")
    (workspace / "notes.md").write_text("os is mentioned\r\nnot here\n")
    result = tools.call("fs.search", {"pattern": r"\bos\b"})
    assert result == {
        "matches": [
            {"path": "notes.md", "line": 1, "text": "os is mentioned"},
            {"path": "src/a.py", "line": 1, "text": "import os"},
            {"path": "src/a.py", "line": 4, "text": "    os.exit(0)"},
        ],
        "truncated": False,
    }


def test_search_narrowed_by_glob_and_path(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "src" / "a.py").write_text("needle\n")
    (workspace / "src" / "b.txt").write_text("needle\n")
    (workspace / "c.py").write_text("needle\n")
    by_glob = tools.call("fs.search", {"pattern": "needle", "glob": "*.py"})
    assert [match["path"] for match in by_glob["matches"]] == ["c.py", "src/a.py"]
    by_path = tools.call("fs.search", {"pattern": "needle", "path": "src"})
    assert [match["path"] for match in by_path["matches"]] == ["src/a.py", "src/b.txt"]
    one_file = tools.call("fs.search", {"pattern": "needle", "path": "src/b.txt"})
    assert [match["path"] for match in one_file["matches"]] == ["src/b.txt"]
    by_folder_glob = tools.call("fs.search", {"pattern": "needle", "path": "src", "glob": "src/*.py"})
    assert [match["path"] for match in by_folder_glob["matches"]] == ["src/a.py"]


def test_search_skips_binary_big_git_and_state_files(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "bin.dat").write_bytes(b"needle\x00\x01")
    (workspace / "big.txt").write_bytes(b"needle\n" + b"x" * MAX_SEARCH_FILE_BYTES)
    (workspace / "edge.txt").write_bytes(
        b"needle\n" + b"x" * (MAX_SEARCH_FILE_BYTES - 7)
    )  # exactly the bound
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("needle\n")
    (workspace / ".teaagent").mkdir()
    (workspace / ".teaagent" / "audit.jsonl").write_text("needle\n")
    (workspace / "link.txt").symlink_to("edge.txt")
    result = tools.call("fs.search", {"pattern": "needle"})
    assert [match["path"] for match in result["matches"]] == ["edge.txt"]


def test_search_boundary_at_max_matches(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "hits.txt").write_text("hit\n" * MAX_SEARCH_MATCHES)
    full = tools.call("fs.search", {"pattern": "hit"})
    assert (len(full["matches"]), full["truncated"]) == (MAX_SEARCH_MATCHES, False)
    (workspace / "hits.txt").write_text("hit\n" * (MAX_SEARCH_MATCHES + 1))
    cut = tools.call("fs.search", {"pattern": "hit"})
    assert (len(cut["matches"]), cut["truncated"]) == (MAX_SEARCH_MATCHES, True)


def test_search_clips_long_lines(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "min.js").write_text("x" * (MAX_SEARCH_LINE_CHARS * 3) + "\n")
    (match,) = tools.call("fs.search", {"pattern": "x"})["matches"]
    assert len(match["text"]) == MAX_SEARCH_LINE_CHARS


def test_search_refuses_an_invalid_regular_expression(tools: ToolRegistry) -> None:
    with pytest.raises(
        SchemaValidationError,
        match=r"^fs.search: pattern '\(unclosed' is not a valid regular expression: "
        r"missing \), unterminated subpattern",
    ):
        tools.call("fs.search", {"pattern": "(unclosed"})


def test_search_of_a_missing_path(tools: ToolRegistry) -> None:
    with pytest.raises(ToolError, match=r"^fs.search: 'nope' does not exist$"):
        tools.call("fs.search", {"pattern": "x", "path": "nope"})


# -- fs.delete ---------------------------------------------------------------------------------------------


def test_delete_a_file_then_nothing(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "a.txt").write_text("a")
    assert tools.call("fs.delete", {"path": "a.txt"}) == {"path": "a.txt", "deleted": True}
    assert not (workspace / "a.txt").exists()
    assert tools.call("fs.delete", {"path": "a.txt"}) == {"path": "a.txt", "deleted": False}


def test_delete_an_empty_folder_but_not_a_full_one(tools: ToolRegistry, workspace: Path) -> None:
    (workspace / "empty").mkdir()
    (workspace / "full").mkdir()
    (workspace / "full" / "keep").write_text("k")
    assert tools.call("fs.delete", {"path": "empty"}) == {"path": "empty", "deleted": True}
    with pytest.raises(
        ToolError,
        match=r"^fs.delete: 'full' is a directory that is not empty; "
        r"only files and empty directories can be deleted$",
    ):
        tools.call("fs.delete", {"path": "full"})
    assert (workspace / "full" / "keep").exists()


@pytest.mark.parametrize("path", [".", "./", "a/.."])
def test_delete_refuses_the_root(tools: ToolRegistry, workspace: Path, path: str) -> None:
    with pytest.raises(WorkspaceEscapeError):
        tools.call("fs.delete", {"path": path})
    assert workspace.is_dir()


def test_delete_refuses_the_root_with_a_sentence(tools: ToolRegistry) -> None:
    with pytest.raises(
        WorkspaceEscapeError, match=r"^fs.delete: path '\.' is the workspace root, which cannot be deleted$"
    ):
        tools.call("fs.delete", {"path": "."})


def test_delete_removes_a_link_never_its_target(tools: ToolRegistry, workspace: Path, outside: Path) -> None:
    (workspace / "out").symlink_to(outside / "secret.txt")
    (workspace / "dir-out").symlink_to(outside, target_is_directory=True)
    assert tools.call("fs.delete", {"path": "out"}) == {"path": "out", "deleted": True}
    assert tools.call("fs.delete", {"path": "dir-out"}) == {"path": "dir-out", "deleted": True}
    assert not (workspace / "out").is_symlink()
    assert (outside / "secret.txt").read_text() == "top secret\n"
