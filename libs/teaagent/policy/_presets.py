"""Approval presets: standing local approvals kept in the workspace, shared by every run.

The file is ``<workspace_root>/.teaagent/approval_presets.json``::

    {"version": 1, "presets": [{"id": "3f2a9c0d1e4b5a6f", "tool": "fs.delete",
      "payload_digest": null, "created_at": 1764570000, "origin_run_id": "run-7",
      "expires_at": 1764573600}]}

A preset approves a call when its ``tool`` fnmatch pattern matches the tool name, its
``payload_digest`` (when set) equals the call's digest, it has not expired (it applies while
``now <= expires_at``, PROTOCOL.md's convention), and its ``origin_run_id`` is None (an unscoped
preset, for every run) or equals the run id the policy scopes presets to.

Writes are atomic (a temporary file in the same directory, fsync, ``os.replace``), the file is
mode 0600, and a read-modify-write holds an ``flock`` on a sidecar lock file so that two
processes do not lose each other's presets. A file that cannot be read, is not the format above,
is a symlink, or is writable by other users makes the store fail closed: no preset matches, the
problem is logged once at ERROR and kept in :attr:`ApprovalPresetStore.problem`, and ``list``,
``add`` and ``remove`` raise :class:`~teaagent.errors.ConfigError` rather than overwrite it.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from teaagent._canonical import payload_digest
from teaagent._fields import json_fields
from teaagent._files import UnusableFileError, atomic_write, read_json_file
from teaagent.errors import ConfigError

__all__ = ["PRESETS_FILE", "ApprovalPreset", "ApprovalPresetStore"]

logger = logging.getLogger("teaagent.policy")

CONTROL_DIR = ".teaagent"
PRESETS_FILE = f"{CONTROL_DIR}/approval_presets.json"
PRESETS_FORMAT_VERSION = 1
MAX_PRESETS = 1000  # a list kept by hand; more means a runaway writer, not a person
MAX_PRESETS_FILE_BYTES = 1024 * 1024  # a thousand presets fit in a fifth of it
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_PRESET_ID = re.compile(r"[0-9a-f]{16}")
_FIELDS = frozenset({"id", "tool", "payload_digest", "created_at", "origin_run_id", "expires_at"})


class _CorruptPresetsError(UnusableFileError):
    """The presets file is not usable; the message completes 'the approval presets file P ...'."""


def _check_digest(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or _DIGEST.fullmatch(value) is None:
        raise ValueError(
            f"payload digest {value!r} is not 'sha256:' followed by 64 lowercase hex characters."
        )
    return value


@dataclass(frozen=True, kw_only=True)
class ApprovalPreset:
    """One standing approval.

    Attributes:
        preset_id: 16 lowercase hex characters, chosen at random when the preset is added.
        tool_pattern: An fnmatch pattern on tool names (``fs.delete``, ``shell.*``).
        payload_digest: When set, only the call with exactly this digest matches.
        created_at: Unix seconds.
        origin_run_id: The run the preset belongs to, or None for every run.
        expires_at: Unix seconds after which it no longer applies, or None.
    """

    preset_id: str
    tool_pattern: str
    payload_digest: str | None
    created_at: int
    origin_run_id: str | None
    expires_at: int | None

    def applies(
        self, tool_name: str, digest: Callable[[], str | None], run_id: str | None, now: float
    ) -> bool:
        """Return True when the preset approves this call.

        Args:
            tool_name: The call's tool.
            digest: Returns the call's payload digest (None when it has none); called only when needed.
            run_id: The run id presets are scoped to, or None.
            now: The current Unix time.
        """
        if self.expires_at is not None and now > self.expires_at:
            return False
        if self.origin_run_id is not None and self.origin_run_id != run_id:
            return False
        if not fnmatchcase(tool_name, self.tool_pattern):
            return False
        return self.payload_digest is None or self.payload_digest == digest()

    def to_json(self) -> dict[str, Any]:
        """Return the preset as stored in the file."""
        return json_fields(self, keys={"preset_id": "id", "tool_pattern": "tool"})

    @classmethod
    def from_json(cls, item: object) -> ApprovalPreset:
        """Parse one stored preset.

        Raises:
            ValueError: ``item`` is not a preset of the stored format.
        """
        if not isinstance(item, dict) or set(item) != _FIELDS:
            raise ValueError(f"a preset must be an object with exactly the keys {sorted(_FIELDS)}")
        preset_id, tool, created_at = item["id"], item["tool"], item["created_at"]
        run_id, expires_at = item["origin_run_id"], item["expires_at"]
        if not isinstance(preset_id, str) or _PRESET_ID.fullmatch(preset_id) is None:
            raise ValueError(f"preset id {preset_id!r} is not 16 lowercase hex characters")
        if not isinstance(tool, str) or not tool.strip():
            raise ValueError(f"preset {preset_id} has no tool pattern")
        if isinstance(created_at, bool) or not isinstance(created_at, int):
            raise ValueError(f"preset {preset_id} has no integer created_at")
        if expires_at is not None and (isinstance(expires_at, bool) or not isinstance(expires_at, int)):
            raise ValueError(f"preset {preset_id} has an expires_at that is not an integer")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError(f"preset {preset_id} has an origin_run_id that is not a non-empty string")
        try:
            digest = _check_digest(item["payload_digest"])
        except ValueError:
            raise ValueError(f"preset {preset_id} has a malformed payload_digest") from None
        return cls(
            preset_id=preset_id,
            tool_pattern=tool,
            payload_digest=digest,
            created_at=created_at,
            origin_run_id=run_id,
            expires_at=expires_at,
        )


class ApprovalPresetStore:
    """The presets of one workspace, read from and written to its presets file.

    Every call reads the file afresh, so presets added by another process apply at once.
    Safe to share between threads and between processes.
    """

    def __init__(
        self, workspace_root: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> None:
        """Open the store of a workspace; nothing is read or created until it is used.

        Args:
            workspace_root: The workspace directory; the file is ``<root>/.teaagent/approval_presets.json``.
            clock: Returns the current Unix time (tests pass their own).
        """
        self._path = Path(os.fspath(workspace_root)) / PRESETS_FILE
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[ApprovalPreset, ...] = ()
        self._problem: str | None = None

    def __repr__(self) -> str:
        return f"ApprovalPresetStore({str(self._path.parent.parent)!r})"

    @property
    def path(self) -> Path:
        """The presets file."""
        return self._path

    @property
    def problem(self) -> str | None:
        """The sentence describing why the file is unusable as last read, or None when it is fine."""
        with self._lock:
            self._refresh()
            return self._problem

    # -- reading ------------------------------------------------------------------------------

    def _read(self) -> tuple[ApprovalPreset, ...]:
        try:
            document = read_json_file(self._path, MAX_PRESETS_FILE_BYTES, private=True)
        except FileNotFoundError:
            return ()
        if not isinstance(document, dict) or set(document) != {"version", "presets"}:
            raise _CorruptPresetsError("is not an object with exactly the keys 'version' and 'presets'")
        if document["version"] != PRESETS_FORMAT_VERSION:
            raise _CorruptPresetsError(f"has version {document['version']!r}, not {PRESETS_FORMAT_VERSION}")
        items = document["presets"]
        if not isinstance(items, builtins.list) or len(items) > MAX_PRESETS:
            raise _CorruptPresetsError(f"does not hold a list of at most {MAX_PRESETS} presets")
        try:
            presets = tuple(ApprovalPreset.from_json(item) for item in items)
        except ValueError as exc:
            raise _CorruptPresetsError(f"holds an invalid preset ({exc})") from None
        if len({preset.preset_id for preset in presets}) != len(presets):
            raise _CorruptPresetsError("holds two presets with one id")
        return presets

    def _refresh(self) -> None:
        """Read the file again; the caller holds ``self._lock``.

        The file is small and read only for calls that need an approval, so it is read every time
        rather than cached on (inode, size, mtime), which a quick rewrite can leave unchanged.
        """
        try:
            presets = self._read()
        except UnusableFileError as exc:
            problem = (
                f"the approval presets file {self._path} {exc}; "
                "no preset applies until it is fixed or removed."
            )
            if problem != self._problem:
                logger.error("%s", problem)
            self._problem = problem
            self._cached = ()
        else:
            self._problem = None
            self._cached = presets

    def _presets_or_raise(self) -> tuple[ApprovalPreset, ...]:
        self._refresh()
        if self._problem is not None:
            raise ConfigError(self._problem)
        return self._cached

    # -- public API -----------------------------------------------------------------------------

    def list(self) -> builtins.list[ApprovalPreset]:
        """Return every preset in the file, expired ones included, in the order they were added.

        Raises:
            ConfigError: The presets file is unusable (the message says why).
        """
        with self._lock:
            return builtins.list(self._presets_or_raise())

    def matches(self, tool_name: str, arguments: dict[str, Any], run_id: str | None) -> ApprovalPreset | None:
        """Return the first preset that approves this call, or None. Never raises.

        Args:
            tool_name: The call's tool.
            arguments: The call's arguments (digested only when a candidate preset pins a digest).
            run_id: The run id presets are scoped to: presets of this run and unscoped presets apply.

        Returns:
            The matching preset, or None (also when the file is unusable: fail closed).
        """
        with self._lock:
            try:
                self._refresh()
            except Exception:  # a policy input must never turn into an approval or a crash
                logger.exception("reading %s failed; no preset applies", self._path)
                return None
            presets = self._cached
        if not presets:
            return None
        computed: builtins.list[str | None] = []

        def digest() -> str | None:
            if not computed:
                try:
                    computed.append(payload_digest(tool_name, arguments))
                except ValueError:
                    computed.append(None)  # arguments that have no digest match no pinned preset
            return computed[0]

        now = self._clock()
        for preset in presets:
            if preset.applies(tool_name, digest, run_id, now):
                return preset
        return None

    def add(
        self,
        tool_pattern: str,
        *,
        payload_digest: str | None = None,
        origin_run_id: str | None = None,
        expires_at: int | None = None,
    ) -> ApprovalPreset:
        """Add a preset and write the file.

        Args:
            tool_pattern: An fnmatch pattern on tool names.
            payload_digest: Pin the preset to one exact call (``teaagent.quorum.payload_digest``).
            origin_run_id: Limit the preset to one run; None applies it to every run.
            expires_at: Unix seconds after which it no longer applies; None for never.

        Returns:
            The stored preset.

        Raises:
            ValueError: A field is malformed, ``expires_at`` is not after now, or the file already
                holds ``MAX_PRESETS`` presets.
            ConfigError: The presets file is unusable and is left untouched.
            OSError: The file cannot be written.
        """
        if not isinstance(tool_pattern, str) or not tool_pattern.strip():
            raise ValueError("a preset needs a non-empty tool pattern.")
        digest = _check_digest(payload_digest)
        if origin_run_id is not None and (not isinstance(origin_run_id, str) or not origin_run_id):
            raise ValueError("origin_run_id must be a non-empty string or None.")
        now = int(self._clock())
        if expires_at is not None:
            if isinstance(expires_at, bool) or not isinstance(expires_at, int):
                raise ValueError("expires_at must be integer Unix seconds or None.")
            if expires_at <= now:
                raise ValueError(f"expires_at {expires_at} is not after now ({now}).")
        with self._lock, self._file_lock():
            presets = self._presets_or_raise()
            if len(presets) >= MAX_PRESETS:
                raise ValueError(f"the approval presets file already holds {MAX_PRESETS} presets.")
            taken = {preset.preset_id for preset in presets}
            preset_id = secrets.token_hex(8)
            while preset_id in taken:  # pragma: no cover - 64 random bits
                preset_id = secrets.token_hex(8)
            preset = ApprovalPreset(
                preset_id=preset_id,
                tool_pattern=tool_pattern,
                payload_digest=digest,
                created_at=now,
                origin_run_id=origin_run_id,
                expires_at=expires_at,
            )
            self._write((*presets, preset))
        logger.info("approval preset %s added for %s", preset_id, tool_pattern)
        return preset

    def remove(self, preset_id: str) -> bool:
        """Remove a preset by id.

        Returns:
            True when a preset was removed, False when none has that id.

        Raises:
            ConfigError: The presets file is unusable and is left untouched.
            OSError: The file cannot be written.
        """
        with self._lock, self._file_lock():
            presets = self._presets_or_raise()
            kept = tuple(preset for preset in presets if preset.preset_id != preset_id)
            if len(kept) == len(presets):
                return False
            self._write(kept)
        logger.info("approval preset %s removed", preset_id)
        return True

    # -- writing --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        folder = self._path.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_path = folder / (self._path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _write(self, presets: tuple[ApprovalPreset, ...]) -> None:
        body = json.dumps(
            {"version": PRESETS_FORMAT_VERSION, "presets": [preset.to_json() for preset in presets]},
            indent=2,
            sort_keys=True,
        ).encode("utf-8")
        atomic_write(self._path, body + b"\n")
