"""Redaction of audit payloads (level L2): field rules, secret detectors, and coercion to JSON values.

Field rules (``redaction_config``) map a field name to a rule. Names match case-insensitively at any
depth of the payload; a rule given for a field wins over the built-in sensitive names.

=============== ==================================================================================
rule            what is written in place of the value
=============== ==================================================================================
``redact``      ``"[REDACTED:field]"``, whatever the value's type
``hash``        ``"[SHA256:<hex>]"``: of the UTF-8 text for a string, of its canonical JSON otherwise
``truncate:N``  every string inside, secrets removed first, cut to N characters followed by
                ``"[TRUNCATED:<length> chars]"`` (1 <= N <= :data:`MAX_TRUNCATE_CHARS`)
``keep``        the value, walked as usual: only the sensitive-name rule is lifted for this field
=============== ==================================================================================

Built-in sensitive names: a field whose name (lowercased, ``-`` read as ``_``) contains ``password``,
``passwd``, ``passphrase``, ``secret``, ``token``, ``api_key``, ``apikey``, ``access_key``,
``private_key``, ``authorization``, ``credential``, ``cookie`` or ``session_key`` is written as
``"[REDACTED:field]"`` unless its value is a number, a boolean or null (so ``input_tokens`` stays).

Secret detectors run on every string of the payload and on every field name, and replace what they
find with ``[REDACTED:<kind>]``:

================ =================================================================================
kind             what
================ =================================================================================
``private_key``  ``-----BEGIN ... PRIVATE KEY-----`` blocks (PEM, OpenSSH, PGP), to the END line
                 or, when it is missing, to the end of the string
``bearer_token`` ``Authorization: Bearer|Basic|Token <value>`` and ``Bearer <16+ characters>``
                 (the words before the value are kept)
``api_key``      OpenAI and Anthropic ``sk-...``, AWS ``AKIA...``/``ASIA...``, Google ``AIza...``,
                 GitHub ``ghp_ gho_ ghu_ ghs_ ghr_ github_pat_``, Slack ``xox[abposr]-...``;
                 ``api_key=`` / ``access_key:`` assignments of 12+ characters
``secret``       ``secret=`` / ``client_secret:`` assignments of 12+ characters
``token``        ``token=`` / ``access_token:`` assignments of 12+ characters
``password``     ``password=`` / ``passwd:`` / ``pwd=`` assignments of 4+ characters
================ =================================================================================

Assignments match ``name=value``, ``name: value`` and the JSON form ``"name": "value"``, with the name
in any case; the name is kept and the value replaced.

Speed: a string shorter than :data:`MIN_SCAN_CHARS` cannot hold a secret and is skipped at once;
otherwise each detector runs only when its trigger (a short lowercase literal every match contains)
occurs in the lowercased string, and each detector's pattern starts with that literal so that the
regular-expression engine scans for it in C. Field-name decisions are cached. A payload's strings
are not scanned one by one as the walk meets them: the walk notes where each one went, and at
the end one search looks for every trigger at once in all of them, lowercased together; only the
strings from the first one holding a trigger onwards are then scanned and replaced where they
stand (see :func:`_settle`). Most payloads hold no trigger at all and cost that one search.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass
from datetime import date, time
from enum import Enum
from typing import Any

from teaagent.audit._event import canonical_json

__all__ = [
    "MAX_DEPTH",
    "MAX_TRUNCATE_CHARS",
    "MIN_SCAN_CHARS",
    "REDACTION_RULES",
    "Redactor",
    "redact_secrets",
]

REDACTION_RULES = ("redact", "hash", "keep", "truncate:N")
"""The rules a ``redaction_config`` may name."""

MIN_SCAN_CHARS = 8  # the shortest text any detector matches: "pwd=" and four characters
MAX_TRUNCATE_CHARS = 1_000_000  # a larger limit is no limit; it is a typo for something smaller
MAX_DEPTH = 64  # payloads are shallow JSON; deeper (or cyclic) structures are cut, never recursed forever
_KEY_CACHE_SIZE = 4096  # field names repeat from event to event; past this many the cache stops growing

_REDACTED_FIELD = "[REDACTED:field]"
_TOO_DEEP = "[TRUNCATED:depth]"
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}

_ASSIGN = r"[\"']?[ \t]*[:=][ \t]*[\"']?"  # name=value, name: value, "name": "value"
_VALUE = r"[^\s\"',;&]"


@dataclass(frozen=True)
class _Detector:
    trigger: str  # lowercase literal that every match contains, looked for before the pattern runs
    pattern: re.Pattern[str]  # starts with that literal; group "keep" is the part left in place
    on_lowered: bool  # match the lowercased text (names in any case) rather than the original
    kind: str


def _detector(trigger: str, pattern: str, kind: str, *, on_lowered: bool = False) -> _Detector:
    return _Detector(trigger, re.compile(pattern), on_lowered, kind)


def _assignment(trigger: str, name: str, min_chars: int, kind: str) -> _Detector:
    return _detector(trigger, rf"(?P<keep>{name}{_ASSIGN}){_VALUE}{{{min_chars},}}", kind, on_lowered=True)


_KEY_END = r"PRIVATE KEY(?: BLOCK)?-----"
_DETECTORS: tuple[_Detector, ...] = (
    _detector(
        "private key",
        rf"-----BEGIN[A-Z0-9 ]{{0,40}}{_KEY_END}(?s:.*?-----END[A-Z0-9 ]{{0,40}}{_KEY_END}|.*)",
        "private_key",
    ),
    _detector(
        "authorization",
        rf"(?P<keep>authorization{_ASSIGN}(?:(?:bearer|basic|token)[ \t]+)?){_VALUE}{{8,}}",
        "bearer_token",
        on_lowered=True,
    ),
    # The lookbehinds sit after the literal so that each pattern still starts with it.
    _detector(
        "bearer",
        r"(?P<keep>bearer(?<![a-z0-9_]bearer)[ \t]+)[a-z0-9._~+/=-]{16,}",
        "bearer_token",
        on_lowered=True,
    ),
    _detector("sk-", r"sk-(?<![A-Za-z0-9]sk-)(?=[A-Za-z0-9_-]*[0-9])[A-Za-z0-9_-]{20,}", "api_key"),
    _detector("akia", r"AKIA(?<![A-Z0-9]AKIA)[A-Z0-9]{16}(?![A-Z0-9])", "api_key"),
    _detector("asia", r"ASIA(?<![A-Z0-9]ASIA)[A-Z0-9]{16}(?![A-Z0-9])", "api_key"),
    _detector("aiza", r"AIza(?<![A-Za-z0-9]AIza)[0-9A-Za-z_-]{35}", "api_key"),
    _detector("gh", r"gh[pousr]_(?<![A-Za-z0-9]gh[pousr]_)[A-Za-z0-9]{36,}", "api_key"),
    _detector("github_pat_", r"github_pat_(?<![A-Za-z0-9]github_pat_)[A-Za-z0-9_]{22,}", "api_key"),
    _detector("xox", r"xox[abposr]-(?<![A-Za-z0-9]xox[abposr]-)[A-Za-z0-9-]{10,}", "api_key"),
    _assignment("passw", r"passw(?:or)?d", 4, "password"),
    _assignment("pwd", "pwd", 4, "password"),
    _assignment("api", r"api[_-]?key", 12, "api_key"),
    _assignment("access", r"access[_-]?key", 12, "api_key"),
    _assignment("secret", "secret", 12, "secret"),
    _assignment("token", "token", 12, "token"),
)

# str.lower() may change the length of a few non-ASCII strings; then only ASCII letters are lowered.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _any_of(words: list[str]) -> str:
    """Return a pattern that finds where any of ``words`` starts, shaped as a trie.

    ``a(?:ccess|iza|...)|bearer|...`` rather than ``access|aiza|...``: the engine tries one
    branch per first character instead of every word at every position, a quarter faster. A word
    that another starts with stands for both, since it starts wherever the longer one does.
    """
    if "" in words:
        return ""
    tails: dict[str, list[str]] = {}
    for word in words:
        tails.setdefault(word[0], []).append(word[1:])
    branches = []
    for first, rest in sorted(tails.items()):
        tail = _any_of(rest)
        branches.append(re.escape(first) + (f"(?:{tail})" if "|" in tail else tail))
    return "|".join(branches)


# Every trigger at once: a string in whose lowercased text this finds nothing holds no secret.
_ANY_TRIGGER = re.compile(_any_of([detector.trigger for detector in _DETECTORS]))
_SEPARATOR = "\0"  # between the strings searched together; in no trigger, so no match spans two

_Pending = list[tuple[Any, Any, str]]  # (the dict or list a string went to, its key or index, the string)


def redact_secrets(text: str) -> str:
    """Replace every secret the built-in detectors find in ``text`` with ``[REDACTED:<kind>]``.

    Args:
        text: Any text: a tool's output, an error message, a command line.

    Returns:
        ``text`` itself when nothing was found, else a copy with each secret replaced.
    """
    if len(text) < MIN_SCAN_CHARS:
        return text
    lowered = text.lower()
    if len(lowered) != len(text):
        lowered = text.translate(_ASCII_LOWER)
    spans: list[tuple[int, int, int, str]] = []
    for detector in _DETECTORS:
        if detector.trigger in lowered:
            source = lowered if detector.on_lowered else text
            for match in detector.pattern.finditer(source):
                keep_end = match.end("keep") if "keep" in detector.pattern.groupindex else match.start()
                spans.append((match.start(), match.end(), keep_end, detector.kind))
    if not spans:
        return text
    spans.sort()
    pieces: list[str] = []
    position = 0
    for start, end, keep_end, kind in spans:
        if start < position:  # overlaps a secret already replaced: the earlier marker covers it
            position = max(position, end)
            continue
        pieces.append(text[position:keep_end])
        pieces.append(f"[REDACTED:{kind}]")
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


def _settle(pending: _Pending) -> None:
    """Replace the secrets in the strings a walk left in place, as :func:`redact_secrets` would.

    :func:`redact_secrets` changes a string only when a trigger (ASCII) occurs in its lowercased
    text. ``str.lower`` maps each character to one character, except U+0130 which becomes two
    (and shows as a change of length); of the other non-ASCII characters only U+212A becomes
    ASCII (``k``), and it does so wherever it stands. So a trigger in a string's lowercased text
    is also in the lowercased text of all the strings joined by :data:`_SEPARATOR`, at the
    string's own offset when the length did not change; a search there that finds nothing
    proves that no string holds a secret. Otherwise each string from the one where the leftmost
    trigger starts is scanned, and the search goes on after it (every string is scanned when the
    offsets moved). A string is replaced where it stands only if it is still there: a later
    field of the same name may have taken its place.
    """
    joined = _SEPARATOR.join([text for _, _, text in pending])
    lowered = joined.lower()
    found = _ANY_TRIGGER.search(lowered)
    if found is None:
        return
    same_offsets = len(lowered) == len(joined)
    start = found.start() if same_offsets else 0
    position = 0
    for container, slot, text in pending:
        end = position + len(text)
        if start < end:  # a trigger starts in this string (or the offsets moved): scan it
            if container[slot] is text:
                container[slot] = redact_secrets(text)
            if same_offsets:
                found = _ANY_TRIGGER.search(lowered, end)
                if found is None:
                    return
                start = found.start()
        position = end + len(_SEPARATOR)


_SENSITIVE_NAME = re.compile(
    r"password|passwd|passphrase|secret|token|api_key|apikey|access_key|private_key|authorization"
    r"|credential|cookie|session_key"
)


@dataclass(frozen=True)
class _Rule:
    kind: str  # "redact" | "hash" | "keep" | "truncate" | "sensitive" (the built-in names)
    limit: int = 0


_SENSITIVE = _Rule("sensitive")


def _parse_rule(field_name: object, rule: object) -> _Rule:
    if not isinstance(field_name, str) or not field_name:
        raise ValueError(f"redaction_config field names must be non-empty strings, not {field_name!r}.")
    if rule in ("redact", "hash", "keep"):
        return _Rule(str(rule))
    if isinstance(rule, str) and rule.startswith("truncate:"):
        digits = rule.removeprefix("truncate:")
        if digits.isascii() and digits.isdigit() and 1 <= int(digits) <= MAX_TRUNCATE_CHARS:
            return _Rule("truncate", int(digits))
        raise ValueError(
            f"redaction rule {rule!r} for field {field_name!r} needs a length from 1 to {MAX_TRUNCATE_CHARS}."
        )
    raise ValueError(
        f"redaction rule {rule!r} for field {field_name!r} is not one of redact, hash, keep, truncate:N."
    )


def _parse_rules(rules: Mapping[str, str] | None) -> dict[str, _Rule]:
    if rules is None:
        return {}
    if not isinstance(rules, Mapping):
        raise ValueError(
            f"redaction_config must be a mapping of field name to rule, not {type(rules).__name__}."
        )
    parsed: dict[str, _Rule] = {}
    for field_name, rule in rules.items():
        parsed_rule = _parse_rule(field_name, rule)
        name = field_name.lower()
        if parsed.get(name, parsed_rule) != parsed_rule:
            raise ValueError(f"redaction_config gives field {field_name!r} two different rules.")
        parsed[name] = parsed_rule
    return parsed


class Redactor:
    """Turns a payload into JSON values with field rules and secret detectors applied (level L2).

    Every output is a fresh structure of dicts with string keys, lists, strings, ints, finite floats,
    booleans and None, so it can be hashed with :func:`teaagent.audit.canonical_json` and later changes
    to the caller's payload do not reach the log. Values JSON cannot carry are coerced: tuples and sets
    become lists (sets sorted), enums their values, dates ``isoformat()``, bytes ``"[BYTES:<n>]"``,
    NaN and infinities ``"NaN"``/``"Infinity"``/``"-Infinity"``, anything else ``str(value)``;
    non-string keys become ``str(key)``; nesting deeper than :data:`MAX_DEPTH` becomes
    ``"[TRUNCATED:depth]"``.
    """

    def __init__(self, *, rules: Mapping[str, str] | None = None, detect_secrets: bool = True) -> None:
        """Compile the field rules.

        Args:
            rules: Field name to rule (see the module docstring); None for none.
            detect_secrets: False only for level L3, which writes payloads in full: then neither the
                detectors nor the built-in sensitive names apply (the field rules still do).

        Raises:
            ValueError: ``rules`` is not a mapping, names a rule that does not exist, gives a
                truncation length out of range, or gives one field two different rules.
        """
        self._rules = _parse_rules(rules)
        self._detect = detect_secrets
        self._keys: dict[str, tuple[str, _Rule | None]] = {}

    def redact(self, payload: Mapping[Any, Any]) -> dict[str, Any]:
        """Return the redacted JSON copy of ``payload``.

        Args:
            payload: The event's details.

        Returns:
            A new dict of JSON values.
        """
        pending: _Pending | None = [] if self._detect else None
        shaped: dict[str, Any] = self._mapping(payload, 0, 0, pending)  # depth 0 is never cut
        if pending:
            _settle(pending)
        return shaped

    def redact_value(self, value: Any) -> Any:
        """Return the redacted JSON copy of any value (a payload's field, a list, a string)."""
        pending: _Pending | None = [] if self._detect else None
        shaped = self._value(value, 0, 0, pending)
        if pending:
            _settle(pending)
        return shaped

    def _redact_each(self, payload: Mapping[Any, Any]) -> dict[str, Any]:
        """:meth:`redact` scanning each string as the walk meets it: what the one search must equal."""
        shaped: dict[str, Any] = self._mapping(payload, 0, 0, None)
        return shaped

    def scrub(self, text: str) -> str:
        """Return ``text`` with the secret detectors applied (unchanged when they are off)."""
        return redact_secrets(text) if self._detect else text

    def _key(self, key: object) -> tuple[str, _Rule | None]:
        name = key if type(key) is str else self._other_key(key)
        lowered = name.lower()
        rule = self._rules.get(lowered)
        if rule is None and self._detect and _SENSITIVE_NAME.search(lowered.replace("-", "_")):
            rule = _SENSITIVE
        entry = (self.scrub(name), rule)
        # Only str keys are cached: 1, 1.0 and True are equal dict keys but different names.
        if type(key) is str and len(self._keys) < _KEY_CACHE_SIZE:
            self._keys[key] = entry
        return entry

    @staticmethod
    def _other_key(key: object) -> str:
        if isinstance(key, Enum):
            key = key.value
        return str.__str__(key) if isinstance(key, str) else str(key)

    # The walk. ``pending`` is where strings to scan are noted (see _settle) instead of scanned at
    # once; None scans each at once, which a set needs (its items are sorted by their redacted
    # text), and so does a truncated string (its secrets go before the cut).

    def _mapping(
        self, mapping: Mapping[Any, Any], depth: int, truncate: int, pending: _Pending | None
    ) -> Any:
        if depth > MAX_DEPTH:
            return _TOO_DEEP
        # The hot path of every append: the common cases are inlined, the rest goes through _value.
        cache = self._keys
        detect = self._detect
        depth += 1
        out: dict[str, Any] = {}
        for key, value in mapping.items():
            entry = cache.get(key)  # only str keys are stored, and no other key equals a str
            name, rule = entry if entry is not None else self._key(key)
            if rule is not None:
                out[name] = self._apply(rule, value, depth, truncate, pending)
                continue
            kind = type(value)
            if kind is str:
                if truncate:
                    value = self._text(value, truncate)
                elif detect and len(value) >= MIN_SCAN_CHARS:
                    if pending is None:
                        value = redact_secrets(value)
                    else:
                        pending.append((out, name, value))
                out[name] = value
            elif kind is int or kind is bool or value is None:
                out[name] = value
            elif kind is dict:
                out[name] = self._mapping(value, depth, truncate, pending)
            else:
                out[name] = self._value(value, depth, truncate, pending)
        return out

    def _sequence(self, items: Any, depth: int, truncate: int, pending: _Pending | None) -> list[Any]:
        if pending is None or truncate:
            return [self._value(item, depth, truncate, pending) for item in items]
        out: list[Any] = []
        for item in items:
            if type(item) is str and len(item) >= MIN_SCAN_CHARS:
                pending.append((out, len(out), item))
                out.append(item)
            else:
                out.append(self._value(item, depth, truncate, pending))
        return out

    def _apply(self, rule: _Rule, value: Any, depth: int, truncate: int, pending: _Pending | None) -> Any:
        kind = rule.kind
        if kind == "sensitive":
            if value is None or isinstance(value, (bool, int, float)):
                return self._value(value, depth, truncate, pending)
            return _REDACTED_FIELD
        if kind == "redact":
            return _REDACTED_FIELD
        if kind == "hash":
            if isinstance(value, str):
                data = str.__str__(value).encode("utf-8", "surrogatepass")
            else:
                data = canonical_json(_PASSTHROUGH.redact_value(value)).encode("ascii")
            return f"[SHA256:{hashlib.sha256(data).hexdigest()}]"
        if kind == "truncate":
            truncate = rule.limit
        return self._value(value, depth, truncate, pending)

    def _text(self, text: str, truncate: int) -> str:
        if self._detect and len(text) >= MIN_SCAN_CHARS:
            text = redact_secrets(text)
        if truncate and len(text) > truncate:
            return f"{text[:truncate]}[TRUNCATED:{len(text)} chars]"
        return text

    def _value(self, value: Any, depth: int, truncate: int, pending: _Pending | None) -> Any:
        kind = type(value)
        if kind is str:
            return self._text(value, truncate)
        if kind is int or kind is bool or value is None:
            return value
        if kind is float:
            return value if math.isfinite(value) else _NON_FINITE[repr(value)]
        if kind is dict:
            return self._mapping(value, depth, truncate, pending)
        if kind is list or kind is tuple:
            if depth > MAX_DEPTH:
                return _TOO_DEEP
            return self._sequence(value, depth + 1, truncate, pending)
        return self._other(value, depth, truncate, pending)

    def _other(self, value: Any, depth: int, truncate: int, pending: _Pending | None) -> Any:
        if isinstance(value, Enum):
            return self._value(value.value, depth, truncate, pending)
        if isinstance(value, str):
            return self._text(str.__str__(value), truncate)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return self._value(float(value), depth, truncate, pending)
        if isinstance(value, Mapping):
            return self._mapping(value, depth, truncate, pending)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return f"[BYTES:{memoryview(value).nbytes}]"
        if isinstance(value, (list, tuple)):
            return self._value(list(value), depth, truncate, pending)
        if isinstance(value, Set):
            if depth > MAX_DEPTH:
                return _TOO_DEEP
            return sorted(
                (self._value(item, depth + 1, truncate, None) for item in value), key=canonical_json
            )
        if isinstance(value, (date, time)):
            return value.isoformat()
        return self._text(str(value), truncate)


_PASSTHROUGH = Redactor(detect_secrets=False)
"""Coercion to JSON values and nothing else: level L3, and what ``hash`` digests."""
