"""Small file primitives the library's files share: atomic replacement, folder syncs, bounded reads."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from teaagent._json import parse_json
from teaagent.errors import ConfigError

__all__ = [
    "FILE_ID_PATTERN",
    "FileSentences",
    "UnusableFileError",
    "atomic_write",
    "check_file_id",
    "expand_home",
    "read_json_file",
    "read_limited",
    "sync_folder",
]


#: An id that names a file of its own (a run log, a session): letters, digits, ``_`` and ``-`` only,
#: so that no id reaches outside its folder.
FILE_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_file_id(value: object, what: str) -> str:
    """Return ``value`` after checking it can name a file of its own (:data:`FILE_ID_PATTERN`).

    Args:
        value: The id.
        what: What it is, for the message (``run id``, ``session id``).

    Raises:
        ValueError: ``<what> <value!r> must be 1 to 64 letters, digits, '_' or '-'.``
    """
    if not isinstance(value, str) or FILE_ID_PATTERN.fullmatch(value) is None:
        raise ValueError(f"{what} {value!r} must be 1 to 64 letters, digits, '_' or '-'.")
    return value


def expand_home(path: str | os.PathLike[str]) -> Path:
    """``Path(path).expanduser()``, or one sentence when ``~user`` names nobody.

    ``expanduser`` raises a bare ``RuntimeError`` ("Could not determine home directory.") for a
    user this machine does not know, or when it knows no home at all.

    Raises:
        ConfigError: The path starts with a ``~`` whose home this machine cannot tell.
    """
    try:
        return Path(path).expanduser()
    except RuntimeError:
        user = str(path).split("/", 1)[0]
        raise ConfigError(f"{path}: this machine knows no home directory for {user}.") from None


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


@dataclass(frozen=True)
class FileSentences:
    """What a bounded read says when the file is missing, a folder, unreadable or too large.

    ``unreadable`` makes its sentence of the operating system's words; a folder is unreadable too
    unless ``folder`` says otherwise.
    """

    missing: str
    unreadable: Callable[[str], str]
    too_large: str
    folder: str | None = None

    @classmethod
    def of(cls, subject: str, limit: int, *, folder: str | None = None) -> FileSentences:
        """The sentences ``SUBJECT does not exist.``, ``SUBJECT cannot be read: WHY.`` and
        ``SUBJECT is larger than LIMIT bytes.``
        """
        return cls(
            missing=f"{subject} does not exist.",
            unreadable=lambda reason: f"{subject} cannot be read: {reason}.",
            too_large=f"{subject} is larger than {limit} bytes.",
            folder=folder,
        )

    @classmethod
    def named(cls, what: str, path: str | os.PathLike[str], limit: int) -> FileSentences:
        """The sentences ``WHAT PATH cannot be read: WHY.`` (a missing file too) and
        ``WHAT PATH is larger than LIMIT bytes.``
        """
        return cls(
            missing=f"{what} {path} cannot be read: No such file or directory.",
            unreadable=lambda reason: f"{what} {path} cannot be read: {reason}.",
            too_large=f"{what} {path} is larger than {limit} bytes.",
        )


def read_limited(path: str | os.PathLike[str], limit: int, sentences: FileSentences) -> bytes:
    """Read a whole file of at most ``limit`` bytes, without ever reading more than one byte past it.

    Raises:
        ConfigError: The file is missing, a folder, unreadable or larger than ``limit``, in
            ``sentences``' words.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise ConfigError(sentences.missing) from None
    except OSError as exc:
        if isinstance(exc, IsADirectoryError) and sentences.folder is not None:
            raise ConfigError(sentences.folder) from None
        raise ConfigError(sentences.unreadable(str(exc.strerror or exc))) from None
    if len(data) > limit:
        raise ConfigError(sentences.too_large)
    return data


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
        return parse_json(data)
    except ValueError as exc:  # not JSON, not UTF-8, nested too deep, an integer too long to read
        raise UnusableFileError(f"is not valid JSON ({exc})") from None
