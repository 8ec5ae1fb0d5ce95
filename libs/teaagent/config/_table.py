"""The TOML file read as tables whose every mistake is one sentence naming the file and the key."""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Final, cast

from teaagent._files import FileSentences, expand_home, read_limited
from teaagent._urls import shown_url, split_url
from teaagent.errors import ConfigError, SignatureError
from teaagent.policy import AGENT_ID_PATTERN
from teaagent.signing import SSHPublicKey, parse_public_key

MAX_CONFIG_BYTES: Final = 1024 * 1024  # a node's settings and its peers' keys, not a data file
AGENT_ID_RULE: Final = "1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"


_TOML_TYPES: Final[tuple[tuple[Any, str], ...]] = (
    (bool, "a boolean"),  # before int: a bool is an int to isinstance
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (list, "an array"),
    (dict, "a table"),
    (datetime | date | time, "a date or time"),
)


def _toml_type(value: object) -> str:
    for kind, name in _TOML_TYPES:
        if isinstance(value, kind):
            return name
    return type(value).__name__  # pragma: no cover - tomllib produces nothing else


class Table:
    """One TOML table being read: every key taken is checked, and any key left over is an error."""

    def __init__(
        self, label: str, data: Mapping[str, Any], prefix: str = "", allowed: tuple[str, ...] | None = None
    ) -> None:
        self.label = label
        self.data = dict(data)
        self.prefix = prefix
        self.known: list[str] = []
        if allowed is not None:
            # Unknown keys first, so that a misspelt key is named as such rather than as a missing one.
            self.known.extend(allowed)
            self.finish()
            self.known.clear()

    def name(self, key: str) -> str:
        return self.prefix + key

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.label}: {self.name(key)} {problem}.")

    def _take(
        self, key: str, kind: Callable[[object], bool], wanted: str, default: object, required: bool
    ) -> Any:
        self.known.append(key)
        if key not in self.data:
            if required:
                raise ConfigError(f"{self.label}: the required key {self.name(key)} is missing.")
            return default
        value = self.data[key]
        if not kind(value):
            raise self.error(key, f"must be {wanted}, not {_toml_type(value)}")
        return value

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        return cast(
            "str | None", self._take(key, lambda v: isinstance(v, str), "a string", default, required)
        )

    def required_string(self, key: str) -> str:
        value = self.string(key, required=True)
        assert value is not None
        if not value.strip():
            raise self.error(key, "is empty")
        return value

    def integer(self, key: str, default: int | None = None, *, required: bool = False) -> int:
        value = self._take(
            key, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer", default, required
        )
        return cast(int, value)

    def number(self, key: str, default: float | None = None, *, required: bool = False) -> float:
        value = self._take(
            key,
            lambda v: isinstance(v, int | float) and not isinstance(v, bool),
            "a number",
            default,
            required,
        )
        return float(value)

    def boolean(self, key: str, default: bool | None = None, *, required: bool = False) -> bool:
        return cast(bool, self._take(key, lambda v: isinstance(v, bool), "true or false", default, required))

    def string_list(self, key: str, *, required: bool = False) -> list[str]:
        value = self._take(
            key,
            lambda v: isinstance(v, list) and all(isinstance(item, str) for item in v),
            "an array of strings",
            [],
            required,
        )
        return list(cast("list[str]", value))

    def table(self, key: str, allowed: tuple[str, ...] | None = None) -> Table | None:
        value = self._take(key, lambda v: isinstance(v, dict), "a table", None, False)
        return None if value is None else Table(self.label, value, self.name(key) + ".", allowed)

    def finish(self) -> None:
        """Refuse the keys nobody took: a typo must not silently switch a setting off."""
        for key in self.data:
            if key not in self.known:
                close = difflib.get_close_matches(key, self.known, n=1, cutoff=0.7)
                hint = f" (did you mean {self.name(close[0])}?)" if close else ""
                raise ConfigError(f"{self.label}: unknown key {self.name(key)}{hint}.")


def check_port(table: Table, key: str, default: int) -> int:
    port = table.integer(key, default)
    if not 1 <= port <= 65535:
        raise table.error(key, f"must be a TCP port between 1 and 65535, not {port}")
    return port


def check_http_url(table: Table, key: str, url: str, *, credentials: bool = True) -> str:
    """Return ``url`` without its final slashes, once it is an http:// or https:// URL with a host.

    A refusal shows the URL as :func:`teaagent._urls.shown_url` does: never its user, password,
    query or path, where a secret may be (a webhook's token). ``credentials=False`` also refuses
    a user or password in it (a relay's URL: a relay's callers prove themselves with the node's
    token or with signatures, and the client that sends a token refuses credentials in the URL).

    Raises:
        ConfigError: Not such a URL (the sentence names the key).
    """
    parts = split_url(url)
    # urlsplit drops tabs and newlines silently (WHATWG): a URL holding any is refused, not mended.
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(ch.isspace() for ch in url)
    ):
        raise table.error(key, f"must be an http:// or https:// URL, not {shown_url(url)!r}")
    if not credentials and (parts.username is not None or parts.password is not None):
        raise table.error(key, f"must not hold a user or password, which no relay takes ({shown_url(url)!r})")
    return url.rstrip("/")


def check_agent_id(label: str, where: str, value: str) -> str:
    if not is_agent_id(value):
        raise ConfigError(f"{label}: {where} {value!r} is not a valid agent id: use {AGENT_ID_RULE}.")
    return value


def parse_key(table: Table, key: str, line: str) -> SSHPublicKey:
    try:
        return parse_public_key(line)
    except SignatureError as exc:
        raise ConfigError(f"{table.label}: {table.name(key)} is not a usable SSH public key: {exc}") from None


def resolve_path(base: Path, value: str) -> Path:
    path = expand_home(value)
    return path if path.is_absolute() else base / path


def read_toml(label: str, path: Path) -> dict[str, Any]:
    folder = f"{label}: this is a folder, not a configuration file."
    subject = f"{label}: the configuration file"
    raw = read_limited(path, MAX_CONFIG_BYTES, FileSentences.of(subject, MAX_CONFIG_BYTES, folder=folder))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: the configuration file is not UTF-8 text.") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)": the sentence names where.
        raise ConfigError(f"{label}: invalid TOML: {exc}.") from None


def is_agent_id(value: str) -> bool:
    return AGENT_ID_PATTERN.fullmatch(value) is not None
