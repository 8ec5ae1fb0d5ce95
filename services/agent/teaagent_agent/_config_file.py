"""Writing the node's ``[models.NAME]`` tables into its configuration file, atomically and checked.

The rest of the file is kept byte for byte: the ``[models.*]`` tables are cut out of the text and
written again at its end, in a plain form. Before the new file replaces the old one it must parse
to exactly the old document with the new models, and ``load_config`` must accept it, so a write
never leaves a file that the node cannot start with. The new text goes to a temporary file in the
same folder, reaches the disk, and is renamed over the old one (readers see the old file or the
new one, never a mix); an ``flock`` beside it serialises writers of every process.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import tempfile
import threading
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError

__all__ = ["ModelsFileError", "read_model_tables", "write_model_tables"]

_MODELS_HEADER: Final = re.compile(r"""^\s*\[\s*(?:models|"models"|'models')\s*[.\]]""")
_ANY_HEADER: Final = re.compile(r"^\s*\[")
_THREAD_LOCK = threading.Lock()


class ModelsFileError(ValueError):
    """The configuration file cannot take the change; the message is the sentence to show."""


def _toml_string(text: str) -> str:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in a JSON body): no UTF-8, so no TOML
        raise ConfigError(
            f"{text!r} holds a lone surrogate, which a configuration file cannot hold."
        ) from None
    # JSON's escapes are TOML's, but TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ModelsFileError(f"{value!r} cannot be written to the configuration file.")
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise ModelsFileError(f"a {type(value).__name__} cannot be written to the configuration file.")


def render_models(tables: Mapping[str, Mapping[str, object]]) -> str:
    """The ``[models.NAME]`` tables as TOML text."""
    blocks = []
    for name, table in tables.items():
        lines = [f"[models.{_toml_string(name)}]"]
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks)


def _without_models(text: str) -> str:
    """The text with every ``[models...]`` table cut out (a header up to the next non-models header)."""
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if _MODELS_HEADER.match(line):
            inside = True
            continue
        if inside and _ANY_HEADER.match(line):
            inside = False
        if not inside:
            kept.append(line)
    return "".join(kept)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(f".{path.name}.lock")
    with _THREAD_LOCK:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _parse(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelsFileError(f"{path} is not valid TOML: {exc}.") from None


def read_model_tables(path: Path) -> dict[str, dict[str, Any]]:
    """The ``[models.*]`` tables of the file as it is now, keys as written.

    Raises:
        ModelsFileError: The file cannot be read or parsed.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelsFileError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    models = _parse(text, path).get("models", {})
    if not isinstance(models, dict):
        raise ModelsFileError(f"{path}: models must be a table of tables.")
    return {name: dict(table) for name, table in models.items() if isinstance(table, dict)}


def write_model_tables(path: Path, change: Any, *, label: str = "the configuration file") -> NodeConfig:
    """Apply ``change`` to the file's model tables and write the file; return the loaded result.

    Args:
        path: The node's configuration file.
        change: Called with the current tables (a dict it may change in place), under the lock.
        label: How errors name the file.

    Returns:
        The configuration as loaded from the new file.

    Raises:
        ModelsFileError: The file's ``[models]`` tables are written in a form this cannot rewrite,
            or ``change`` refused.
        ConfigError: The new file would not load (the sentence says why); nothing was written.
        OSError: The file cannot be written; it is unchanged.
    """
    with _locked(path):
        text = path.read_text(encoding="utf-8")
        document = _parse(text, path)
        tables = read_model_tables(path)
        change(tables)
        rest = _without_models(text)
        rest_document = _parse(rest, path)
        expected_rest = {key: value for key, value in document.items() if key != "models"}
        if rest_document != expected_rest:
            raise ModelsFileError(
                f"{path}: its models are written in a form this service does not rewrite (an inline "
                "table or dotted keys); write them as [models.NAME] tables."
            )
        new_text = rest.rstrip("\n") + "\n"
        if tables:
            new_text += "\n" + render_models(tables)
        new_document = _parse(new_text, path)
        if {key: value for key, value in new_document.items() if key != "models"} != expected_rest or (
            new_document.get("models", {}) != tables
        ):  # pragma: no cover - the renderer writes what it was given; this guards the file
            raise ModelsFileError(
                f"{path}: the new models did not read back as written; nothing was changed."
            )
        mode = os.stat(path).st_mode & 0o777
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), mode)
                handle.write(new_text)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                load_config(temporary)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(temporary, label)) from None
            os.replace(temporary, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        return load_config(path)
