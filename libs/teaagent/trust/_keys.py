"""The keys that may sign for a signer, and OpenSSH ``allowed_signers`` files (PROTOCOL.md "Keys of a peer").

A signer (a node, as a voter) may have several keys: its node key and its operators' own keys. Each
is a :class:`SignerKey`: the key, and the limits its ``allowed_signers`` line sets on it (the
namespaces it may sign in, and the times its signatures may carry). Whichever of them signed, the
signer counts once.

The ``allowed_signers`` format is the one ``ssh-keygen -Y verify`` and git's SSH signing read
(ssh-keygen(1), "ALLOWED SIGNERS"): one key per line, ``principals [options] keytype base64
[comment]``; the options are ``namespaces="a,b"``, ``valid-after="YYYYMMDD[HHMM[SS]][Z]"``,
``valid-before=...`` and ``cert-authority``. OpenSSH is the reference, and this module reads a
line as its ``sshsig.c`` does: ``principals`` (a quoted string or one word) and ``namespaces`` are
pattern lists matched as ``match_pattern_list`` matches them (:func:`match_pattern_list`); a time
without ``Z`` or ``UTC`` is local time as ``mktime`` reads a ``struct tm`` cleared to zero (so
standard time, even in summer); ``valid-before`` still admits its own second. Certificates are
not supported in protocol version 1, so a ``cert-authority`` line is refused rather than skipped:
a file that trusts a CA must not silently trust nobody, nor the CA key itself as a plain key.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from teaagent.errors import SignatureError
from teaagent.signing import SUPPORTED_KEY_TYPES, SSHPublicKey, parse_public_key

__all__ = [
    "MAX_ALLOWED_SIGNERS_BYTES",
    "SignerKey",
    "match_pattern_list",
    "parse_allowed_signers",
    "unique_keys",
]

MAX_ALLOWED_SIGNERS_BYTES: Final = 1024 * 1024  # thousands of keys; a configuration file, not a database
# OpenSSH copies each subpattern into a 1024-byte buffer; a longer one makes the whole list fail.
MAX_SUBPATTERN_BYTES: Final = 1022
_TIME = re.compile(r"(\d{8})(\d{4}(\d{2})?)?(Z|UTC)?", re.IGNORECASE)
_KNOWN_OPTIONS: Final = ("cert-authority", "namespaces", "valid-after", "valid-before")
_WHITESPACE: Final = " \t\r\n"  # OpenSSH's WHITESPACE, which splits the principals from the rest


@functools.lru_cache(maxsize=4096)
def _match_pattern(text: bytes, pattern: bytes) -> bool:
    """OpenSSH's ``match_pattern``: ``*`` is any run of bytes, ``?`` any one byte, the rest literal.

    Run as a set of pattern positions (no backtracking), so no pattern costs more than
    ``len(text) * len(pattern)`` steps.
    """

    def closure(positions: set[int]) -> set[int]:
        for position in sorted(positions):
            while position < len(pattern) and pattern[position] == ord("*"):
                position += 1
                positions.add(position)
        return positions

    positions = closure({0})
    for byte in text:
        following: set[int] = set()
        for position in positions:
            if position == len(pattern):
                continue
            wanted = pattern[position]
            if wanted == ord("*"):
                following.add(position)
            elif wanted in (ord("?"), byte):
                following.add(position + 1)
        positions = closure(following)
        if not positions:
            return False
    return len(pattern) in positions


def _subpatterns(text: str) -> tuple[str, ...]:
    """A pattern list split as ``match_pattern_list`` splits it: at every comma; a final comma ends it."""
    parts = text.split(",")
    if parts[-1] == "":
        parts.pop()
    return tuple(parts)


def match_pattern_list(text: str, patterns: Iterable[str]) -> int:
    """OpenSSH's ``match_pattern_list`` (``match.c``), case-sensitive, over subpatterns already split.

    Only ``*`` and ``?`` are wildcards (``[`` is a literal character); a subpattern starting with
    ``!`` is negated.

    Args:
        text: The principal or namespace.
        patterns: The subpatterns (``beta``, ``ops-*``, ``!mallory``).

    Returns:
        -1 when a negated subpattern matches (the list then matches nobody, whatever else it
        holds), 1 when a plain one does, 0 otherwise (also when a subpattern is longer than
        OpenSSH's buffer, which OpenSSH answers with 0).
    """
    subject = text.encode("utf-8")
    matched = 0
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = (pattern[1:] if negated else pattern).encode("utf-8")
        if len(body) > MAX_SUBPATTERN_BYTES:
            return 0
        if _match_pattern(subject, body):
            if negated:
                return -1
            matched = 1
    return matched


@dataclass(frozen=True, kw_only=True)
class SignerKey:
    """One key that may sign for a signer, with the limits of the line that listed it.

    Attributes:
        line: The key as an OpenSSH public key line (``TYPE BASE64 [COMMENT]``).
        namespaces: The patterns of the namespaces it may sign in (``namespaces="..."`` split at
            its commas, as OpenSSH splits it, ``*``, ``?`` and ``!`` included); None for every
            namespace.
        valid_after: Its signatures must carry a ``signed_at`` at or after this (Unix seconds).
        valid_before: Its signatures must carry a ``signed_at`` at or before this (Unix seconds),
            as OpenSSH refuses only a verify time after ``valid-before``.
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

    def limit(self, namespace: str, signed_at: int) -> str | None:
        """Return which of this key's limits refuses ``namespace`` at ``signed_at`` (a clause), or None.

        OpenSSH's ``check_allowed_keys_line``: the namespace must match the ``namespaces``
        pattern list, and ``valid_after <= signed_at <= valid_before``.
        """
        if self.namespaces is not None and match_pattern_list(namespace, self.namespaces) != 1:
            allowed = ", ".join(sorted(self.namespaces)) or "no namespace"
            return f"may sign only in {allowed}, not in {namespace}"
        if self.valid_after is not None and signed_at < self.valid_after:
            return f"is valid only from {_shown(self.valid_after)}"
        if self.valid_before is not None and signed_at > self.valid_before:
            return f"was valid only until {_shown(self.valid_before)}"
        return None

    def refusal(self, namespace: str, signed_at: int) -> str | None:
        """Return why this key may not sign in ``namespace`` at ``signed_at``, or None when it may."""
        limit = self.limit(namespace, signed_at)
        return None if limit is None else f"the key {self.fingerprint} {limit}"


def _shown(when: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _timestamp(text: str, where: str) -> int:
    """An allowed_signers time, ``YYYYMMDD[HHMM[SS]]``, as OpenSSH's ``parse_absolute_time`` reads it.

    UTC with a final ``Z`` or ``UTC`` (any case); else local time, by ``mktime`` with
    ``tm_isdst = 0`` as OpenSSH calls it (its ``struct tm`` is cleared to zero): standard time
    even while summer time is in force, an hour later than the wall clock then.
    """
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
    try:
        when = calendar.timegm(parsed) if match.group(4) else int(time.mktime((*parsed[:6], 0, 0, 0)))
    except (OverflowError, ValueError):
        raise ValueError(f"{where}: the time {text!r} is not a valid date and time.") from None
    if when <= 0:  # OpenSSH refuses it: zero stands for no limit, and time_t before 1970 for an error
        raise ValueError(f"{where}: the time {text!r} is not after 1970-01-01 00:00:00 UTC.")
    return when


def _principals_field(line: str) -> tuple[str, str]:
    """Split off the principals as OpenSSH's ``strdelimw`` does: one word, or a quoted string.

    Returns the principals (their quotes removed) and the rest of the line.
    """
    for index, char in enumerate(line):
        if char == '"':
            end = line.find('"', index + 1)
            if end < 0:
                raise ValueError("the quoted principals are not closed")
            return line[:index] + line[index + 1 : end], line[end + 1 :].lstrip(_WHITESPACE)
        if char in _WHITESPACE:
            return line[:index], line[index:].lstrip(_WHITESPACE)
    return line, ""


def _split_fields(line: str) -> list[str]:
    """Split on white space outside double quotes (an option's value may hold spaces)."""
    fields, quoted = _split_outside_quotes(line, str.isspace)
    if quoted:
        raise ValueError("a quoted option value is not closed")
    return [field for field in fields if field]


def _split_options(text: str) -> list[str]:
    """Split ``a,b="x,y",c`` on the commas outside quotes."""
    return _split_outside_quotes(text, ",".__eq__)[0]


def _split_outside_quotes(text: str, splits: Callable[[str], bool]) -> tuple[list[str], bool]:
    """Split ``text`` at each character ``splits`` accepts outside double quotes (the quotes are kept).

    Returns:
        The parts, and whether a quote is left open at the end.
    """
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in text:
        if char == '"':
            quoted = not quoted
        if splits(char) and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts, quoted


def _unquote(value: str, where: str, name: str) -> str:
    if len(value) < 2 or not (value.startswith('"') and value.endswith('"')):
        raise ValueError(f'{where}: the option {name} needs a quoted value, {name}="...".')
    return value[1:-1]


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
        ValueError: A line is malformed, names an unknown option or one option twice, has a
            ``valid-before`` not later than its ``valid-after``, holds a key that cannot be used,
            or is a ``cert-authority`` line (the sentence names the file and the line): OpenSSH
            refuses such a line too.
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
            principals, remainder = _principals_field(line)
            rest = _split_fields(remainder)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}.") from None
        if len(rest) < 2:
            raise ValueError(
                f"{where}: a line needs principals, a key type and the key ('PRINCIPALS TYPE BASE64')."
            )
        options: list[str] = []
        if rest[0] not in SUPPORTED_KEY_TYPES:
            options = _split_options(rest[0])
            rest = rest[1:]
        if len(rest) < 2:
            raise ValueError(f"{where}: the line has no key after its options.")
        namespaces: frozenset[str] | None = None
        valid_after: int | None = None
        valid_before: int | None = None
        given: set[str] = set()
        for option in options:
            name, _, value = option.partition("=")
            name = name.strip().lower()
            if name in given:
                raise ValueError(f"{where}: the option {name} is given twice.")
            given.add(name)
            if name == "cert-authority":
                raise ValueError(
                    f"{where}: cert-authority lines are refused: certificates are not supported in "
                    "teaagent's protocol version 1; list the operators' own keys instead."
                )
            if name == "namespaces":
                # Patterns, kept as written: OpenSSH matches " teaagent-denial" with its space.
                namespaces = frozenset(_subpatterns(_unquote(value, where, name)))
            elif name == "valid-after":
                valid_after = _timestamp(_unquote(value, where, name), where)
            elif name == "valid-before":
                valid_before = _timestamp(_unquote(value, where, name), where)
            else:
                known = ", ".join(_KNOWN_OPTIONS)
                raise ValueError(f"{where}: unknown option {name!r} (known: {known}).")
        if valid_after is not None and valid_before is not None and valid_before <= valid_after:
            raise ValueError(f"{where}: valid-before is not later than valid-after.")
        key_line = " ".join(rest)
        key = SignerKey(
            line=key_line,
            namespaces=namespaces,
            valid_after=valid_after,
            valid_before=valid_before,
            source=where,
        )
        # match_pattern_list: -1 (a negated pattern matched) gives the key to nobody of this list.
        if match_pattern_list(principal, _subpatterns(principals)) == 1:
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
