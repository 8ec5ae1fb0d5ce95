"""What the agent service keeps between its starts: the current session and the run settings.

One small JSON file, ``<data_dir>/agent-state.json`` (mode 0600), replaced atomically on each
change. A file that cannot be read is logged and replaced by the defaults: it only holds choices
a client can make again. When it cannot be written the choices still apply until the service
stops, and ``SettingsOut.unsaved`` says why they were not kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["STATE_FILE_NAME", "Preferences", "PreferencesFile"]

logger = logging.getLogger("teaagent.agent")

STATE_FILE_NAME: Final = "agent-state.json"
MAX_STATE_BYTES: Final = 1024 * 1024  # a few choices per session, not a database


@dataclass
class Preferences:
    """The service's choices.

    Attributes:
        current_session: The session the next prompt continues.
        model: The model name a run starts with; None for the first configured one.
        effort: The reasoning effort; None for the model's first (or none).
        permission: The permission name; None for node.toml's ``permission_mode``.
        compact_percent: Per model name, a compaction threshold set through the settings.
        self_compaction: Per session id, its own choice about self-compaction.
    """

    current_session: str | None = None
    model: str | None = None
    effort: str | None = None
    permission: str | None = None
    compact_percent: dict[str, float] = field(default_factory=dict)
    self_compaction: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: object) -> Preferences:
        """Rebuild from :meth:`asdict` output; whatever is malformed takes its default."""
        if not isinstance(data, dict):
            return cls()

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) and value else None

        compact = data.get("compact_percent")
        choices = data.get("self_compaction")
        return cls(
            current_session=text("current_session"),
            model=text("model"),
            effort=text("effort"),
            permission=text("permission"),
            compact_percent={
                str(k): float(v)
                for k, v in (compact.items() if isinstance(compact, dict) else ())
                if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 100
            },
            self_compaction={
                str(k): v
                for k, v in (choices.items() if isinstance(choices, dict) else ())
                if isinstance(v, bool)
            },
        )


class PreferencesFile:
    """The preferences and their file; thread-safe."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / STATE_FILE_NAME
        self._lock = threading.Lock()
        self.unsaved: str | None = None
        self.value = self._read()

    def _read(self) -> Preferences:
        try:
            raw = self.path.read_bytes()[: MAX_STATE_BYTES + 1]
        except FileNotFoundError:
            return Preferences()
        except OSError as exc:
            logger.warning(
                "the agent state file %s cannot be read (%s); starting from defaults", self.path, exc
            )
            return Preferences()
        try:
            return Preferences.from_dict(json.loads(raw))
        except (ValueError, RecursionError):
            logger.warning("the agent state file %s is not JSON; starting from defaults", self.path)
            return Preferences()

    def update(self, **changes: Any) -> Preferences:
        """Change some choices and keep them; return the preferences now."""
        with self._lock:
            for key, value in changes.items():
                setattr(self.value, key, value)
            self._write()
            return self.value

    def _write(self) -> None:
        body = json.dumps(asdict(self.value), sort_keys=True, indent=1).encode()
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=".agent-state.", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), 0o600)
                    handle.write(body)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temporary, self.path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
        except OSError as exc:
            self.unsaved = (
                f"The settings apply until the service stops: {self.path} cannot be written "
                f"({exc.strerror or exc})."
            )
            logger.warning("%s", self.unsaved)
        else:
            self.unsaved = None
