"""Small file primitives the library's files share: atomic replacement, folder syncs, bounded reads."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from teaagent.errors import ConfigError

__all__ = ["UnusableFileError", "atomic_write", "read_json_file", "read_limited", "sync_folder"]


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """Flush a folder's entries to the disk, so that a rename or a new file in it survives a crash."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so that a crash at any point leaves the old or the new file, whole.

    The bytes go to a temporary file in the same folder, reach the disk (``fsync``), are renamed
    over ``path`` (``os.replace``), and the folder is synced so the rename survives too.

    Args:
        path: The file to write; its folder must exist.
        data: The whole new content.
        mode: The file's permissions, whatever the umask.

    Raises:
        OSError: The file could not be written; ``path`` is unchanged and no temporary file is left.
    """
    folder = path.parent
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())  # the data reaches the disk before the name points at it
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    sync_folder(folder)


def read_limited(path: Path, limit: int, what: str) -> bytes:
    """Read a whole file the user names, refusing one larger than ``limit`` bytes.

    Args:
        path: The file.
        limit: The most bytes it may hold.
        what: The file as the sentences start it (``The price file``).

    Raises:
        ConfigError: ``{what} {path} cannot be read: ...`` or ``{what} {path} is larger than ...``.
    """
    try:
        with path.open("rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror or exc}.") from exc
    if len(raw) > limit:
        raise ConfigError(f"{what} {path} is larger than {limit} bytes.")
    return raw


class UnusableFileError(Exception):
    """A state file is not usable; the message completes "the ... file P ..." (``is a symbolic link``)."""


def read_json_file(path: Path, limit: int, *, private: bool = False) -> Any:
    """Read the JSON document of a state file the library keeps (presets, sessions).

    Never through a symbolic link, only a regular file, at most ``limit`` bytes.

    Args:
        path: The file.
        limit: The most bytes it may hold.
        private: Refuse a file that the group or others may write: like OpenSSH's StrictModes,
            such a file could hold what its owner never wrote.

    Raises:
        FileNotFoundError: There is no such file.
        UnusableFileError: Naming why it cannot be used: a link, not a regular file, writable by
            others, unreadable, too large, not JSON.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnusableFileError("is a symbolic link") from None
        raise UnusableFileError(f"cannot be read ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnusableFileError("is not a regular file")
        if private and mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnusableFileError("is writable by other users")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UnusableFileError(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnusableFileError(f"is larger than {limit} bytes")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnusableFileError(f"is not valid JSON ({exc})") from None
