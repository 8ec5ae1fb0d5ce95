"""The keys that may sign for a signer, and OpenSSH ``allowed_signers`` files (PROTOCOL.md "Keys of a peer").

A signer (a node, as a voter) may have several keys: its node key and its operators' own keys. Each
is a :class:`SignerKey`: the key, and the limits its ``allowed_signers`` line sets on it (the
namespaces it may sign in, and the times its signatures may carry). Whichever of them signed, the
signer counts once.

The ``allowed_signers`` format is the one ``ssh-keygen -Y verify`` and git's SSH signing read
(ssh-keygen(1), "ALLOWED SIGNERS"): one key per line, ``principals [options] keytype base64
[comment]``; ``principals`` is a comma-separated list of patterns (``*`` and ``?``); the options are
``namespaces="a,b"``, ``valid-after="YYYYMMDD[HHMM[SS]][Z]"``, ``valid-before=...`` and
``cert-authority``. Certificates are not supported in protocol version 1, so a ``cert-authority``
line is refused rather than skipped: a file that trusts a CA must not silently trust nobody, nor
the CA key itself as a plain key.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Final

from teaagent.errors import SignatureError
from teaagent.signing import SUPPORTED_KEY_TYPES, SSHPublicKey, parse_public_key

__all__ = ["MAX_ALLOWED_SIGNERS_BYTES", "SignerKey", "parse_allowed_signers", "unique_keys"]

MAX_ALLOWED_SIGNERS_BYTES: Final = 1024 * 1024  # thousands of keys; a configuration file, not a database
_TIME = re.compile(r"(\d{8})(\d{4}(\d{2})?)?(Z?)")
_KNOWN_OPTIONS: Final = ("cert-authority", "namespaces", "valid-after", "valid-before")


@dataclass(frozen=True, kw_only=True)
class SignerKey:
    """One key that may sign for a signer, with the limits of the line that listed it.

    Attributes:
        line: The key as an OpenSSH public key line (``TYPE BASE64 [COMMENT]``).
        namespaces: The signature namespaces it may sign in; None for every namespace.
        valid_after: Its signatures must carry a ``signed_at`` at or after this (Unix seconds).
        valid_before: Its signatures must carry a ``signed_at`` before this (Unix seconds).
        source: Where it was listed, for messages (``peers.beta.public_key``, ``ops.allowed_signers:3``).
    """

    line: str
    namespaces: frozenset[str] | None = None
    valid_after: int | None = None
    valid_before: int | None = None
    source: str = field(default="", compare=False)  # where it was listed, not what it is
    _key: SSHPublicKey | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Parse the key once.

        Raises:
            ValueError: The line is not a usable public key (the sentence says why).
        """
        try:
            key = parse_public_key(self.line)
        except SignatureError as exc:
            where = f"{self.source}: " if self.source else ""
            raise ValueError(f"{where}the public key cannot be used: {str(exc).rstrip('.')}.") from None
        object.__setattr__(self, "_key", key)

    @property
    def key(self) -> SSHPublicKey:
        """The parsed public key."""
        assert self._key is not None  # set in __post_init__
        return self._key

    @property
    def fingerprint(self) -> str:
        """``SHA256:...``, as ``ssh-keygen -lf`` prints it."""
        return self.key.fingerprint

    def refusal(self, namespace: str, signed_at: int) -> str | None:
        """Return why this key may not sign in ``namespace`` at ``signed_at``, or None when it may."""
        if self.namespaces is not None and namespace not in self.namespaces:
            allowed = ", ".join(sorted(self.namespaces)) or "no namespace"
            return f"the key {self.fingerprint} may sign only in {allowed}, not in {namespace}"
        if self.valid_after is not None and signed_at < self.valid_after:
            return f"the key {self.fingerprint} is valid only from {_shown(self.valid_after)}"
        if self.valid_before is not None and signed_at >= self.valid_before:
            return f"the key {self.fingerprint} was valid only until {_shown(self.valid_before)}"
        return None


def _shown(when: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _timestamp(text: str, where: str) -> int:
    """An allowed_signers time, ``YYYYMMDD[HHMM[SS]]``: UTC with a final Z, else local time (OpenSSH)."""
    match = _TIME.fullmatch(text)
    if match is None:
        raise ValueError(f"{where}: the time {text!r} is not YYYYMMDD, YYYYMMDDHHMM or YYYYMMDDHHMMSS.")
    digits = match.group(1) + (match.group(2) or "0000")
    if match.group(3) is None:
        digits += "00"
    try:
        parsed = time.strptime(digits, "%Y%m%d%H%M%S")
    except ValueError:
        raise ValueError(f"{where}: the time {text!r} is not a valid date and time.") from None
    if match.group(4):
        return calendar.timegm(parsed)
    return int(time.mktime(parsed))


def _split_fields(line: str) -> list[str]:
    """Split on white space outside double quotes (an option's value may hold spaces)."""
    fields: list[str] = []
    current: list[str] = []
    quoted = False
    for char in line:
        if char == '"':
            quoted = not quoted
            current.append(char)
        elif char.isspace() and not quoted:
            if current:
                fields.append("".join(current))
                current = []
        else:
            current.append(char)
    if quoted:
        raise ValueError("a quoted option value is not closed")
    if current:
        fields.append("".join(current))
    return fields


def _split_options(text: str) -> list[str]:
    """Split ``a,b="x,y",c`` on the commas outside quotes."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _unquote(value: str, where: str, name: str) -> str:
    if len(value) < 2 or not (value.startswith('"') and value.endswith('"')):
        raise ValueError(f'{where}: the option {name} needs a quoted value, {name}="...".')
    return value[1:-1]


def _principals_match(principals: str, principal: str) -> bool:
    return any(fnmatchcase(principal, pattern) for pattern in principals.split(",") if pattern)


def parse_allowed_signers(text: str, *, principal: str, source: str) -> tuple[SignerKey, ...]:
    """Return the keys an ``allowed_signers`` text lists for ``principal``, in file order.

    Lines for other principals are skipped; every line is still checked, so a mistake anywhere in
    the file is reported (a typo would otherwise leave a key silently unusable).

    Args:
        text: The file's content.
        principal: The signer whose keys are wanted (its agent id).
        source: The file's name, for messages and for each key's ``source``.

    Returns:
        The keys, each with its namespaces and validity.

    Raises:
        ValueError: A line is malformed, names an unknown option, holds a key that cannot be used,
            or is a ``cert-authority`` line (the sentence names the file and the line).
    """
    if len(text.encode("utf-8")) > MAX_ALLOWED_SIGNERS_BYTES:
        raise ValueError(f"{source} is larger than {MAX_ALLOWED_SIGNERS_BYTES} bytes.")
    keys: list[SignerKey] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            fields = _split_fields(line)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}.") from None
        if len(fields) < 3:
            raise ValueError(
                f"{where}: a line needs principals, a key type and the key ('PRINCIPALS TYPE BASE64')."
            )
        principals, rest = fields[0], fields[1:]
        options: list[str] = []
        if rest[0] not in SUPPORTED_KEY_TYPES:
            options = _split_options(rest[0])
            rest = rest[1:]
        if len(rest) < 2:
            raise ValueError(f"{where}: the line has no key after its options.")
        namespaces: frozenset[str] | None = None
        valid_after: int | None = None
        valid_before: int | None = None
        for option in options:
            name, _, value = option.partition("=")
            name = name.strip().lower()
            if name == "cert-authority":
                raise ValueError(
                    f"{where}: cert-authority lines are refused: certificates are not supported in "
                    "teaagent's protocol version 1; list the operators' own keys instead."
                )
            if name == "namespaces":
                namespaces = frozenset(
                    part.strip() for part in _unquote(value, where, name).split(",") if part.strip()
                )
            elif name == "valid-after":
                valid_after = _timestamp(_unquote(value, where, name), where)
            elif name == "valid-before":
                valid_before = _timestamp(_unquote(value, where, name), where)
            else:
                known = ", ".join(_KNOWN_OPTIONS)
                raise ValueError(f"{where}: unknown option {name!r} (known: {known}).")
        key_line = " ".join(rest)
        key = SignerKey(
            line=key_line,
            namespaces=namespaces,
            valid_after=valid_after,
            valid_before=valid_before,
            source=where,
        )
        if _principals_match(principals, principal):
            keys.append(key)
    return tuple(keys)


def unique_keys(keys: Iterable[SignerKey]) -> tuple[SignerKey, ...]:
    """``keys`` without repeats of one key (same key material and the same limits), in order."""
    seen: set[tuple[bytes, frozenset[str] | None, int | None, int | None]] = set()
    kept: list[SignerKey] = []
    for key in keys:
        marker = (key.key.identity, key.namespaces, key.valid_after, key.valid_before)
        if marker not in seen:
            seen.add(marker)
            kept.append(key)
    return tuple(kept)
