"""The built-in workspace tools: ``fs.read``, ``fs.write``, ``fs.list``, ``fs.search``, ``fs.delete``,
``shell.run``.

Every path argument is relative to the workspace root and must stay inside it: absolute paths and
``..`` components are refused outright, and the path is resolved (symbolic links followed) and
checked against the resolved root. Files are opened with ``O_NOFOLLOW`` on the resolved path, so a
link swapped in after the check makes the call fail instead of escaping. The state folder
``.teaagent/`` (the audit log lives there) is never written or deleted by these tools.

What the confinement does not claim: ``shell.run`` can do anything the node's user can, which is
why it is annotated destructive and tier Critical and goes through the quorum.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import secrets
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Final

from teaagent.errors import SchemaValidationError, ToolError, WorkspaceEscapeError
from teaagent.tools._definitions import ToolAnnotations, ToolRateLimit
from teaagent.tools._ratelimit import RateLimiter
from teaagent.tools._registry import ToolRegistry
from teaagent.tools._shell import DEFAULT_SHELL_TIMEOUT, MAX_SHELL_OUTPUT_BYTES, run_shell
from teaagent.tools._workspace_schemas import (
    FS_DELETE_INPUT,
    FS_DELETE_OUTPUT,
    FS_LIST_INPUT,
    FS_LIST_OUTPUT,
    FS_READ_INPUT,
    FS_READ_OUTPUT,
    FS_SEARCH_INPUT,
    FS_SEARCH_OUTPUT,
    FS_WRITE_INPUT,
    FS_WRITE_OUTPUT,
    MAX_LIST_ENTRIES,
    MAX_READ_BYTES,
    MAX_SEARCH_FILE_BYTES,
    MAX_SEARCH_FILES,
    MAX_SEARCH_LINE_CHARS,
    MAX_SEARCH_MATCHES,
    SHELL_RUN_INPUT,
    SHELL_RUN_OUTPUT,
)

WORKSPACE_TOOL_NAMES: Final = ("fs.read", "fs.write", "fs.list", "fs.search", "fs.delete", "shell.run")
STATE_DIR_NAME: Final = ".teaagent"  # the workspace's state folder: audit log, sessions; never modified here

_BINARY_SNIFF_BYTES: Final = 8192  # a NUL byte in the first 8 KiB marks a binary file, as git does
SKIPPED_DIR_NAMES: Final = frozenset({".git", STATE_DIR_NAME})  # recursive listing and search skip them

SHELL_ENV_NAMES: Final = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "TERM",
)
"""The variables ``shell.run`` passes on by default: the node's API keys and tokens stay out of reach."""

_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)  # so that opening a FIFO cannot hang the agent


# -- the workspace -----------------------------------------------------------------------------------


class Workspace:
    """A workspace root and the handlers of the built-in tools, confined to it."""

    def __init__(self, root: str | os.PathLike[str], *, shell_env: Mapping[str, str] | None = None) -> None:
        """Bind the tools to ``root``.

        Args:
            root: An existing directory; symbolic links in it are resolved once, here.
            shell_env: The environment of ``shell.run`` commands; when None, the variables named in
                ``SHELL_ENV_NAMES`` are copied from this process.

        Raises:
            FileNotFoundError: root does not exist.
            NotADirectoryError: root is not a directory.
        """
        resolved = os.path.realpath(os.fspath(root))
        if not os.path.exists(resolved):
            raise FileNotFoundError(f"the workspace root {os.fspath(root)} does not exist")
        if not os.path.isdir(resolved):
            raise NotADirectoryError(f"the workspace root {os.fspath(root)} is not a directory")
        self.root = Path(resolved)
        self._root = resolved
        self._root_prefix = resolved if resolved.endswith(os.sep) else resolved + os.sep
        self._state = os.path.join(resolved, STATE_DIR_NAME)
        if shell_env is None:
            shell_env = {name: os.environ[name] for name in SHELL_ENV_NAMES if name in os.environ}
        self._shell_env = dict(shell_env)

    # -- confinement ------------------------------------------------------------------------------

    def _inside(self, resolved: str) -> bool:
        return resolved == self._root or resolved.startswith(self._root_prefix)

    def _in_state_dir(self, resolved: str) -> bool:
        return resolved == self._state or resolved.startswith(self._state + os.sep)

    def _relative(self, tool: str, raw: str) -> PurePosixPath:
        """The lexical checks: a relative path with no ``..`` and no NUL."""
        if "\x00" in raw:
            raise SchemaValidationError(f"{tool}: path {raw!r} contains a NUL character")
        relative = PurePosixPath(raw)
        if relative.is_absolute() or os.path.isabs(raw):
            raise WorkspaceEscapeError(
                f"{tool}: path {raw!r} is absolute; give a path relative to the workspace root"
            )
        if ".." in relative.parts:
            raise WorkspaceEscapeError(
                f"{tool}: path {raw!r} contains '..'; workspace paths must stay inside the workspace root"
            )
        return relative

    def resolve(self, tool: str, raw: str, *, modify: bool = False) -> tuple[PurePosixPath, str]:
        """Confine ``raw`` to the workspace, following symbolic links.

        Args:
            tool: The tool name, for messages.
            raw: The path argument, relative to the root.
            modify: The tool will write there: refuse the state folder too.

        Returns:
            The normalised relative path and the resolved absolute path.

        Raises:
            WorkspaceEscapeError: The path is absolute, holds ``..``, resolves outside the root, or
                (with ``modify``) lies in the state folder.
            SchemaValidationError: The path holds a NUL character.
        """
        relative = self._relative(tool, raw)
        resolved = os.path.realpath(os.path.join(self._root, relative))
        if not self._inside(resolved):
            raise WorkspaceEscapeError(
                f"{tool}: path {raw!r} resolves outside the workspace root through a symbolic link"
            )
        if modify and self._in_state_dir(resolved):
            raise WorkspaceEscapeError(
                f"{tool}: path {raw!r} is inside the workspace's {STATE_DIR_NAME} state folder, "
                "which workspace tools do not modify"
            )
        return relative, resolved

    def _resolve_entry(self, tool: str, raw: str) -> tuple[PurePosixPath, str]:
        """Confine ``raw`` without following a link in its last component (to delete the link itself)."""
        relative = self._relative(tool, raw)
        if relative == PurePosixPath("."):
            raise WorkspaceEscapeError(f"{tool}: path {raw!r} is the workspace root, which cannot be deleted")
        parent = os.path.realpath(os.path.join(self._root, relative.parent))
        if not self._inside(parent):
            raise WorkspaceEscapeError(
                f"{tool}: path {raw!r} resolves outside the workspace root through a symbolic link"
            )
        target = os.path.join(parent, relative.name)
        if self._in_state_dir(target):
            raise WorkspaceEscapeError(
                f"{tool}: path {raw!r} is inside the workspace's {STATE_DIR_NAME} state folder, "
                "which workspace tools do not modify"
            )
        return relative, target

    def _display(self, resolved: str) -> str:
        return PurePosixPath(os.path.relpath(resolved, self._root)).as_posix()

    # -- fs.read ----------------------------------------------------------------------------------

    def read(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """fs.read: ``{"path", "max_bytes"?}`` -> ``{"content", "size", "truncated"}``.

        Raises:
            WorkspaceEscapeError: The path leaves the workspace.
            ToolError: The path is missing, a directory, not a regular file, or unreadable.
        """
        raw = arguments["path"]
        limit = arguments.get("max_bytes", MAX_READ_BYTES)
        _, resolved = self.resolve("fs.read", raw)
        try:
            fd = os.open(resolved, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
        except OSError as exc:
            raise _os_error("fs.read", "read", raw, exc) from exc
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"fs.read: {raw!r} is a directory; use fs.list to see what it holds")
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"fs.read: {raw!r} is not a regular file")
            handle = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with handle:
            try:
                data = handle.read(limit + 1)
            except OSError as exc:
                raise _os_error("fs.read", "read", raw, exc) from exc
        truncated = len(data) > limit
        if truncated:
            data = data[:limit]
        # A character cut by the limit is dropped, not shown as a replacement character.
        content = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=not truncated)
        return {"content": content, "size": max(info.st_size, len(data)), "truncated": truncated}

    # -- fs.write ---------------------------------------------------------------------------------

    def write(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """fs.write: ``{"path", "content", "create_dirs"?}`` -> ``{"path", "bytes_written"}``.

        The file is written to a temporary file beside it, flushed to disk, and renamed over the
        target, so readers see the old content or the new, never a mix. An existing file keeps its
        permission bits.

        Raises:
            WorkspaceEscapeError: The path leaves the workspace or lies in the state folder.
            SchemaValidationError: The content cannot be encoded as UTF-8 (a lone surrogate).
            ToolError: The folder is missing (and create_dirs is false), the path is a directory,
                or the disk refused.
        """
        raw = arguments["path"]
        relative, resolved = self.resolve("fs.write", raw, modify=True)
        if resolved == self._root:
            raise ToolError(f"fs.write: {raw!r} is the workspace root, not a file")
        try:
            data = arguments["content"].encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SchemaValidationError(
                f"fs.write: the content of {raw!r} is not valid Unicode text"
            ) from exc
        parent = os.path.dirname(resolved)
        if not os.path.isdir(parent):
            if not arguments.get("create_dirs", False):
                raise ToolError(
                    f"fs.write: the folder of {raw!r} does not exist; pass create_dirs true to create it"
                )
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                raise _os_error("fs.write", "create the folder of", raw, exc) from exc
        try:
            existing = os.lstat(resolved)
        except FileNotFoundError:
            existing = None
        except OSError as exc:
            raise _os_error("fs.write", "write", raw, exc) from exc
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise ToolError(f"fs.write: {raw!r} is a directory")
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            raise ToolError(f"fs.write: {raw!r} is not a regular file")
        temporary = os.path.join(parent, f".{os.path.basename(resolved)}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o666)
            try:
                if existing is not None:
                    os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, resolved)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise _os_error("fs.write", "write", raw, exc) from exc
        return {"path": relative.as_posix(), "bytes_written": len(data)}

    # -- fs.list ----------------------------------------------------------------------------------

    def list(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """fs.list: ``{"path"?, "recursive"?}`` -> ``{"entries": [{"path", "type", "size"}], "truncated"}``.

        Entries are sorted by name within each folder, folders before their contents; paths are
        relative to the workspace root. Symbolic links are listed, never followed; a recursive
        listing does not descend into ``.git`` or the state folder.

        Raises:
            WorkspaceEscapeError: The path leaves the workspace.
            ToolError: The path is missing or not a directory.
        """
        raw = arguments.get("path", ".")
        relative, resolved = self.resolve("fs.list", raw)
        if not os.path.isdir(resolved):
            if not os.path.exists(resolved):
                raise ToolError(f"fs.list: {raw!r} does not exist")
            raise ToolError(f"fs.list: {raw!r} is not a directory; use fs.read to read a file")
        entries: list[dict[str, Any]] = []
        truncated = False
        for entry in self._walk(resolved, relative, recursive=bool(arguments.get("recursive", False))):
            if len(entries) == MAX_LIST_ENTRIES:
                truncated = True
                break
            entries.append(entry)
        return {"entries": entries, "truncated": truncated}

    def _walk(self, folder: str, shown: PurePosixPath, *, recursive: bool) -> Iterator[dict[str, Any]]:
        try:
            with os.scandir(folder) as scan:
                children = sorted(scan, key=lambda item: item.name)
        except OSError:
            return  # an unreadable sub-folder is left out, not fatal
        for child in children:
            path = (shown / child.name).as_posix()
            kind, size = _kind_and_size(child)
            yield {"path": path, "type": kind, "size": size}
            if recursive and kind == "directory" and child.name not in SKIPPED_DIR_NAMES:
                yield from self._walk(child.path, shown / child.name, recursive=True)

    # -- fs.search --------------------------------------------------------------------------------

    def search(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """fs.search: ``{"pattern", "path"?, "glob"?}`` -> ``{"matches": [{"path", "line", "text"}], ...}``.

        Searches text files line by line (lines split on ``\\n``; numbers from 1). Binary files,
        files above ``MAX_SEARCH_FILE_BYTES``, symbolic links, ``.git`` and the state folder are
        skipped. ``truncated`` says a bound (matches or files) stopped the search early.

        Raises:
            SchemaValidationError: The pattern is not a valid regular expression.
            WorkspaceEscapeError: The path leaves the workspace.
            ToolError: The path does not exist.
        """
        try:
            expression = re.compile(arguments["pattern"])
        except re.error as exc:
            raise SchemaValidationError(
                f"fs.search: pattern {arguments['pattern']!r} is not a valid regular expression: {exc}"
            ) from exc
        raw = arguments.get("path", ".")
        glob = arguments.get("glob")
        relative, resolved = self.resolve("fs.search", raw)
        if not os.path.exists(resolved):
            raise ToolError(f"fs.search: {raw!r} does not exist")
        matches: list[dict[str, Any]] = []
        files = 0
        for path, shown in _files(resolved, relative):
            if glob is not None and not PurePosixPath(shown).match(glob):
                continue
            if files == MAX_SEARCH_FILES:
                return {"matches": matches, "truncated": True}
            files += 1
            text = _read_text(path)
            if text is None:
                continue
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()  # the newline that ends the last line does not start another
            for number, line in enumerate(lines, start=1):
                line = line.removesuffix("\r")
                if expression.search(line) is None:
                    continue
                if len(matches) == MAX_SEARCH_MATCHES:
                    return {"matches": matches, "truncated": True}
                matches.append({"path": shown, "line": number, "text": line[:MAX_SEARCH_LINE_CHARS]})
        return {"matches": matches, "truncated": False}

    # -- fs.delete --------------------------------------------------------------------------------

    def delete(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """fs.delete: ``{"path"}`` -> ``{"path", "deleted"}``; ``deleted`` is false when nothing was there.

        Deletes a file, a symbolic link (the link, never its target) or an empty directory.

        Raises:
            WorkspaceEscapeError: The path leaves the workspace, is the root, or lies in the state folder.
            ToolError: The path is a directory that is not empty, or the disk refused.
        """
        raw = arguments["path"]
        relative, target = self._resolve_entry("fs.delete", raw)
        try:
            info = os.lstat(target)
        except FileNotFoundError:
            return {"path": relative.as_posix(), "deleted": False}
        except OSError as exc:
            raise _os_error("fs.delete", "delete", raw, exc) from exc
        try:
            if stat.S_ISDIR(info.st_mode):
                os.rmdir(target)
            else:
                os.unlink(target)
        except FileNotFoundError:
            return {"path": relative.as_posix(), "deleted": False}
        except OSError as exc:
            if stat.S_ISDIR(info.st_mode) and os.path.isdir(target) and os.listdir(target):
                raise ToolError(
                    f"fs.delete: {raw!r} is a directory that is not empty; "
                    "only files and empty directories can be deleted"
                ) from exc
            raise _os_error("fs.delete", "delete", raw, exc) from exc
        return {"path": relative.as_posix(), "deleted": True}

    # -- shell.run --------------------------------------------------------------------------------

    def shell(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """shell.run: ``{"command", "timeout"?}`` -> ``{"exit_code", "stdout", "stderr", "timed_out", ...}``.

        Runs ``/bin/sh -c command`` in the workspace root with stdin empty. After ``timeout``
        seconds (default ``DEFAULT_SHELL_TIMEOUT``, at most ``MAX_SHELL_TIMEOUT``) the whole process
        group is killed, ``timed_out`` is true and ``exit_code`` is -9 (``TIMEOUT_EXIT_CODE``); a
        negative exit code always means "killed by that signal". stdout and stderr keep their first
        ``MAX_SHELL_OUTPUT_BYTES`` bytes each; ``truncated`` says one was cut. Background jobs are
        killed when the shell exits.

        Raises:
            ToolError: The shell could not be started.
        """
        timeout = float(arguments.get("timeout", DEFAULT_SHELL_TIMEOUT))
        try:
            result = run_shell(
                arguments["command"],
                cwd=self._root,
                timeout=timeout,
                env=self._shell_env,
                max_output_bytes=MAX_SHELL_OUTPUT_BYTES,
            )
        except OSError as exc:
            raise ToolError(f"shell.run: the shell could not be started: {exc.strerror or exc}") from exc
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
        }


def _kind_and_size(entry: os.DirEntry[str]) -> tuple[str, int]:
    try:
        if entry.is_symlink():
            return "symlink", 0
        if entry.is_dir(follow_symlinks=False):
            return "directory", 0
        if entry.is_file(follow_symlinks=False):
            return "file", entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return "other", 0


def _files(resolved: str, shown: PurePosixPath) -> Iterator[tuple[str, str]]:
    """Regular files under ``resolved`` (or itself), as (absolute path, path relative to the root)."""
    if os.path.isfile(resolved):
        yield resolved, shown.as_posix()
        return
    stack: list[tuple[str, PurePosixPath]] = [(resolved, shown)]
    while stack:
        folder, folder_shown = stack.pop()
        try:
            with os.scandir(folder) as scan:
                children = sorted(scan, key=lambda item: item.name)
        except OSError:
            continue
        subfolders: list[tuple[str, PurePosixPath]] = []
        for child in children:
            try:
                if child.is_symlink():
                    continue  # a link's target is searched where it lives, if it lives inside
                if child.is_dir(follow_symlinks=False):
                    if child.name not in SKIPPED_DIR_NAMES:
                        subfolders.append((child.path, folder_shown / child.name))
                elif child.is_file(follow_symlinks=False):
                    yield child.path, (folder_shown / child.name).as_posix()
            except OSError:
                continue
        stack.extend(reversed(subfolders))  # depth first, in name order


def _read_text(path: str) -> str | None:
    """The file's text, or None when it is too big, binary or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SEARCH_FILE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_SEARCH_FILE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_SEARCH_FILE_BYTES or b"\x00" in data[:_BINARY_SNIFF_BYTES]:
        return None
    return data.decode("utf-8", errors="replace")


def _os_error(tool: str, verb: str, raw: str, exc: OSError) -> ToolError:
    reason = (exc.strerror or str(exc)).lower()
    return ToolError(f"{tool}: cannot {verb} {raw!r}: {reason}")


# -- registration ------------------------------------------------------------------------------------


def register_workspace_tools(
    registry: ToolRegistry,
    root: str | os.PathLike[str],
    *,
    rate_limits: Mapping[str, ToolRateLimit] | None = None,
    shell_env: Mapping[str, str] | None = None,
    allow_override: bool = False,
) -> Workspace:
    """Register ``fs.read``, ``fs.write``, ``fs.list``, ``fs.search``, ``fs.delete`` and ``shell.run``.

    Args:
        registry: Where to register them.
        root: The workspace root every path is confined to.
        rate_limits: Optional rate limit per tool name.
        shell_env: The environment of ``shell.run`` (see :class:`Workspace`).
        allow_override: Replace tools of the same names already registered.

    Returns:
        The workspace the handlers are bound to.

    Raises:
        FileNotFoundError: root does not exist.
        NotADirectoryError: root is not a directory.
        ValueError: A tool of one of these names is already registered and allow_override is false,
            or rate_limits names a tool that is not one of them.
    """
    limits = dict(rate_limits or {})
    unknown = sorted(set(limits) - set(WORKSPACE_TOOL_NAMES))
    if unknown:
        raise ValueError(f"rate_limits names tools that are not workspace tools: {', '.join(unknown)}")
    workspace = Workspace(root, shell_env=shell_env)
    tools: list[tuple[str, str, dict[str, Any], dict[str, Any], ToolAnnotations, Any, str]] = [
        (
            "fs.read",
            "Read a text file of the workspace (UTF-8). Returns its content, its size in bytes, and "
            "whether the content was cut at max_bytes.",
            FS_READ_INPUT,
            FS_READ_OUTPUT,
            ToolAnnotations(read_only=True, idempotent=True, security_tier="Low"),
            workspace.read,
            "read",
        ),
        (
            "fs.write",
            "Create or replace a text file of the workspace with the given content (UTF-8), atomically. "
            "Set create_dirs to create missing folders.",
            FS_WRITE_INPUT,
            FS_WRITE_OUTPUT,
            ToolAnnotations(idempotent=True, security_tier="Medium"),
            workspace.write,
            "write",
        ),
        (
            "fs.list",
            "List a folder of the workspace: each entry's path, type (file, directory, symlink, other) "
            "and size; recursive to descend into sub-folders.",
            FS_LIST_INPUT,
            FS_LIST_OUTPUT,
            ToolAnnotations(read_only=True, idempotent=True, security_tier="Low"),
            workspace.list,
            "read",
        ),
        (
            "fs.search",
            "Search the text files of the workspace for a regular expression, line by line; glob "
            "narrows the files. Returns path, line number and text of each matching line.",
            FS_SEARCH_INPUT,
            FS_SEARCH_OUTPUT,
            ToolAnnotations(read_only=True, idempotent=True, security_tier="Low"),
            workspace.search,
            "read",
        ),
        (
            "fs.delete",
            "Delete a file, a symbolic link or an empty folder of the workspace. deleted is false "
            "when nothing was there.",
            FS_DELETE_INPUT,
            FS_DELETE_OUTPUT,
            ToolAnnotations(destructive=True, idempotent=True, security_tier="High"),
            workspace.delete,
            "delete",
        ),
        (
            "shell.run",
            "Run a command with /bin/sh in the workspace root and return its exit code, stdout and "
            "stderr. The command and its children are killed after timeout seconds.",
            SHELL_RUN_INPUT,
            SHELL_RUN_OUTPUT,
            ToolAnnotations(destructive=True, stateful=True, idempotent=False, security_tier="Critical"),
            workspace.shell,
            "execute",
        ),
    ]
    for name, description, input_schema, output_schema, tool_annotations, handler, access in tools:
        registry.register(
            name,
            description,
            input_schema,
            output_schema,
            tool_annotations,
            handler,
            rate_limit=limits.get(name),
            capability_manifest={"scope": "workspace", "access": access, "root": str(workspace.root)},
            allow_override=allow_override,
        )
    return workspace


def workspace_registry(
    root: str | os.PathLike[str],
    *,
    rate_limiter: RateLimiter | None = None,
    rate_limits: Mapping[str, ToolRateLimit] | None = None,
    shell_env: Mapping[str, str] | None = None,
) -> ToolRegistry:
    """A new registry holding the built-in workspace tools bound to ``root``.

    Args:
        root: The workspace root.
        rate_limiter: Where rate limits are counted (an in-memory limiter when None).
        rate_limits: Optional rate limit per tool name.
        shell_env: The environment of ``shell.run`` (see :class:`Workspace`).

    Raises:
        FileNotFoundError: root does not exist.
        NotADirectoryError: root is not a directory.
        ValueError: rate_limits names a tool that is not a workspace tool.
    """
    registry = ToolRegistry(rate_limiter=rate_limiter)
    register_workspace_tools(registry, root, rate_limits=rate_limits, shell_env=shell_env)
    return registry
