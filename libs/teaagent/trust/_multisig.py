"""The multi-signature quorum configuration and the compact peer signature (PROTOCOL.md).

Re-exported by :mod:`teaagent.policy`, the seed's import path.

:class:`MultiSigQuorumConfig` checks itself when it is built: an enabled configuration that could
never reach its quorum, or that would let one key count twice, is refused with a ``ValueError``
(PROTOCOL.md, the last paragraphs of "Counting"). A disabled configuration is only type-checked.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import translate
from typing import Any

from teaagent._fields import json_fields
from teaagent._urls import shown_url, split_url
from teaagent._words import needed_from
from teaagent.errors import SignatureError
from teaagent.signing import parse_public_key
from teaagent.trust._keys import SignerKey, unique_keys
from teaagent.trust._rules import QuorumPolicy, QuorumRule

__all__ = [
    "AGENT_ID_PATTERN",
    "DEFAULT_QUORUM_TIMEOUT_SECONDS",
    "MAX_QUORUM_TIMEOUT_SECONDS",
    "MultiSigQuorumConfig",
    "PeerSignature",
    "check_agent_id",
]

logger = logging.getLogger("teaagent.trust")

AGENT_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
DEFAULT_QUORUM_TIMEOUT_SECONDS = 120  # time for an operator to read a request, short enough to wait for
MAX_QUORUM_TIMEOUT_SECONDS = 24 * 60 * 60  # a request is a question about one call, not a standing grant

# The public key types PROTOCOL.md accepts ("Keys"); an RSA key's type is ssh-rsa even though it
# signs with rsa-sha2-256/512. teaagent.signing checks the rest (RSA size, curve points).
ACCEPTED_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "ssh-rsa",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
_AGENT_ID_RULE = "1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_agent_id(agent_id: object, what: str = "agent id") -> str:
    """Return ``agent_id`` when it is a valid node name (``[a-z0-9][a-z0-9._-]{0,63}``).

    Args:
        agent_id: The candidate name.
        what: How the message names it ("peer id", "agent id").

    Returns:
        The same string.

    Raises:
        TypeError: ``agent_id`` is not a string.
        ValueError: ``agent_id`` does not match the pattern.
    """
    if not isinstance(agent_id, str):
        raise TypeError(f"the {what} must be a string, not {type(agent_id).__name__}.")
    if AGENT_ID_PATTERN.fullmatch(agent_id) is None:
        raise ValueError(f"{what} {agent_id!r} is not valid: use {_AGENT_ID_RULE}.")
    return agent_id


def _key_identity(peer: str, line: str) -> bytes:
    """Return the key material of an OpenSSH public key line (PROTOCOL.md "Key identity").

    The line's form is checked first, for a sentence that names what is wrong with it; the key
    is then parsed in full by :mod:`teaagent.signing`, so a key that could never verify anything
    is refused here rather than at the first count. Two lines are one key when their identities
    are equal, whatever their comments, and whatever SSH form (plain or ``sk-``) they use.
    """
    parts = line.split()
    if len(parts) < 2:
        raise ValueError(
            f"peer {peer}'s public key is not an OpenSSH public key line ('TYPE BASE64 [COMMENT]')."
        )
    key_type, encoded = parts[0], parts[1]
    if key_type not in ACCEPTED_KEY_TYPES:
        raise ValueError(
            f"peer {peer}'s public key type {key_type!r} is not accepted: use ssh-ed25519, ECDSA or RSA."
        )
    try:
        blob = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"peer {peer}'s public key is not valid base64.") from None
    # The blob starts with its own key type as an SSH string; a mismatch means a pasted fragment.
    name_length = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if blob[4 : 4 + name_length] != key_type.encode("ascii") or len(blob) <= 4 + name_length:
        raise ValueError(f"peer {peer}'s public key blob does not hold a {key_type} key.")
    try:
        key = parse_public_key(f"{key_type} {encoded}")
    except SignatureError as exc:
        reason = str(exc).strip().rstrip(".")
        raise ValueError(f"peer {peer}'s public key cannot be used: {reason}.") from None
    return key.identity


def _check_relay_url(peer: str, url: str) -> None:
    parts = split_url(url)  # None: an unclosed IPv6 bracket, a port out of range...
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
        raise ValueError(f"the relay URL {shown_url(url)!r} of {peer} is not an http or https URL.")
    if parts.username is not None or parts.password is not None:  # no client sends them and a token
        raise ValueError(f"the relay URL {shown_url(url)!r} of {peer} must not hold a user or password.")


def _str_list(name: str, value: object) -> list[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be a list of strings, not {type(value).__name__}.")
    items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{name} must hold only strings, not {type(item).__name__}.")
    return items


def _str_dict(name: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of agent id to string, not {type(value).__name__}.")
    copied: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(f"{name} must map strings to strings.")
        copied[key] = item
    return copied


def _key_dict(value: object) -> dict[str, tuple[SignerKey, ...]]:
    if not isinstance(value, Mapping):
        raise TypeError(f"peer_keys must be a mapping of agent id to keys, not {type(value).__name__}.")
    copied: dict[str, tuple[SignerKey, ...]] = {}
    for peer, keys in value.items():
        if not isinstance(peer, str) or isinstance(keys, str | bytes) or not isinstance(keys, Sequence):
            raise TypeError("peer_keys must map agent ids to sequences of SignerKey.")
        if not all(isinstance(key, SignerKey) for key in keys):
            raise TypeError("peer_keys must hold only SignerKey objects.")
        copied[peer] = tuple(keys)
    return copied


def _groups(value: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise TypeError(f"groups must be a mapping of group name to peer ids, not {type(value).__name__}.")
    return {str(name): tuple(_str_list(f"group {name}", members)) for name, members in value.items()}


def _rules(value: object) -> tuple[QuorumRule, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise TypeError(f"rules must be a sequence of QuorumRule, not {type(value).__name__}.")
    if not all(isinstance(rule, QuorumRule) for rule in value):
        raise TypeError("rules must hold only QuorumRule objects.")
    return tuple(value)


def _strict_int(name: str, value: object) -> int:
    # bool is an int subclass; True as a count or a timeout is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}.")
    return value


@dataclass(frozen=True, kw_only=True)
class MultiSigQuorumConfig:
    """Who must sign a high-risk tool call before it runs, and which calls are high risk.

    A tool call is high risk when ``fnmatch.fnmatchcase(tool_name, pattern)`` holds for any
    of ``high_risk_patterns``; with ``enabled`` set, such a call runs only with a verified quorum
    certificate, whatever the permission mode. ``enabled`` has no default, so that a
    configuration is never switched off by omission; use :meth:`disabled` for the off case.

    The lists and mappings are copied when the object is built, and every check uses the
    copies that were validated: mutating them afterwards changes nothing.

    Attributes:
        enabled: Whether high-risk calls need a quorum at all.
        required_approvals: How many distinct peers must approve (N of M).
        peer_agent_ids: The peers (M), never the origin itself.
        peer_public_keys: Each peer's OpenSSH public key line, its identity.
        peer_relay_urls: Each peer's relay base URL.
        local_relay_base_url: This node's own relay, where requests are submitted.
        allow_dev_signatures: Let ``dev:<signer>`` signatures count without cryptography (local
            experiments only; logged at WARNING).
        high_risk_patterns: fnmatch patterns on tool names.
        timeout_seconds: How long a request waits for its quorum before it expires.
        peer_keys: Each peer's further keys (its operators' own keys, PROTOCOL.md "Keys of a
            peer"), beside its node key in ``peer_public_keys``; any of them may sign for the
            peer, which still counts once. Not in the seed; keyword, empty by default.
        groups: Named sets of peers (``[quorum.groups]``, version 2), each member a peer.
        rules: Per-tool rules (``[[quorum.rules]]``, version 2), first match wins; a high-risk call
            that no rule matches needs ``required_approvals`` of all peers, as in version 1.
    """

    enabled: bool
    required_approvals: int = 1
    peer_agent_ids: list[str] = field(default_factory=list)
    peer_public_keys: dict[str, str] = field(default_factory=dict)
    peer_relay_urls: dict[str, str] = field(default_factory=dict)
    local_relay_base_url: str | None = None
    allow_dev_signatures: bool = False
    high_risk_patterns: list[str] = field(default_factory=list)
    timeout_seconds: int = DEFAULT_QUORUM_TIMEOUT_SECONDS
    peer_keys: dict[str, tuple[SignerKey, ...]] = field(default_factory=dict)
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rules: tuple[QuorumRule, ...] = ()
    _high_risk: re.Pattern[str] | None = field(init=False, repr=False, compare=False, default=None)
    _keys: dict[str, tuple[SignerKey, ...]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        """Copy the collections, check the types, and check an enabled configuration in full.

        Raises:
            TypeError: A field has the wrong type.
            ValueError: The configuration is enabled and breaks a rule of PROTOCOL.md (one sentence
                names the rule).
        """
        if not isinstance(self.enabled, bool):
            raise TypeError(f"enabled must be true or false, not {type(self.enabled).__name__}.")
        if not isinstance(self.allow_dev_signatures, bool):
            raise TypeError("allow_dev_signatures must be true or false.")
        if self.local_relay_base_url is not None and not isinstance(self.local_relay_base_url, str):
            raise TypeError("local_relay_base_url must be a string or None.")
        _strict_int("required_approvals", self.required_approvals)
        _strict_int("timeout_seconds", self.timeout_seconds)
        object.__setattr__(self, "peer_agent_ids", _str_list("peer_agent_ids", self.peer_agent_ids))
        object.__setattr__(
            self, "high_risk_patterns", _str_list("high_risk_patterns", self.high_risk_patterns)
        )
        object.__setattr__(self, "peer_public_keys", _str_dict("peer_public_keys", self.peer_public_keys))
        object.__setattr__(self, "peer_relay_urls", _str_dict("peer_relay_urls", self.peer_relay_urls))
        object.__setattr__(self, "peer_keys", _key_dict(self.peer_keys))
        object.__setattr__(self, "groups", _groups(self.groups))
        object.__setattr__(self, "rules", _rules(self.rules))
        if not self.enabled:
            return
        self._validate_enabled()
        # One compiled alternation: the check runs before every tool call, read-only ones included.
        joined = "|".join(f"(?:{translate(pattern)})" for pattern in self.high_risk_patterns)
        object.__setattr__(self, "_high_risk", re.compile(joined))
        if self.allow_dev_signatures:
            logger.warning(
                "multi-sig accepts dev:<signer> signatures without cryptography; for local experiments only"
            )

    def _validate_enabled(self) -> None:
        peers = self.peer_agent_ids
        for peer in peers:
            check_agent_id(peer, "peer id")
        seen: set[str] = set()
        for peer in peers:
            if peer in seen:
                raise ValueError(f"peer {peer} is listed twice in peer_agent_ids.")
            seen.add(peer)
        if self.required_approvals < 1:
            raise ValueError(
                "required_approvals must be at least 1 when multi-sig is enabled, "
                f"not {self.required_approvals}."
            )
        if self.required_approvals > len(peers):
            raise ValueError(
                f"required_approvals is {self.required_approvals} but only {len(peers)} peers are configured."
            )
        for name, mapping in (
            ("peer_public_keys", self.peer_public_keys),
            ("peer_relay_urls", self.peer_relay_urls),
        ):
            strangers = sorted(set(mapping) - seen)
            if strangers:
                raise ValueError(f"{name} names {strangers[0]!r}, which is not in peer_agent_ids.")
        strangers = sorted(set(self.peer_keys) - seen)
        if strangers:
            raise ValueError(f"peer_keys names {strangers[0]!r}, which is not in peer_agent_ids.")
        owners: dict[bytes, str] = {}  # key identity -> the peer holding it
        keys: dict[str, tuple[SignerKey, ...]] = {}
        for peer in peers:
            line = self.peer_public_keys.get(peer, "").strip()
            if not line:
                raise ValueError(f"peer {peer} has no public key.")
            _key_identity(peer, line)  # the line's form, in the sentences of this configuration
            node_key = SignerKey(line=line, source=f"peer_public_keys[{peer!r}]")
            keys[peer] = unique_keys((node_key, *self.peer_keys.get(peer, ())))
            for key in keys[peer]:
                # Key identity is key material, across every key of every peer: one key in two
                # forms, or listed for two peers, would count twice.
                owner = owners.setdefault(key.key.identity, peer)
                if owner != peer:
                    raise ValueError(
                        f"peers {owner} and {peer} share one public key, which would count twice."
                    )
            url = self.peer_relay_urls.get(peer, "").strip()
            if not url:
                raise ValueError(f"peer {peer} has no relay URL.")
            _check_relay_url(peer, url)
        if self.local_relay_base_url is not None:
            _check_relay_url("this node", self.local_relay_base_url)
        object.__setattr__(self, "_keys", keys)
        if not self.high_risk_patterns:
            raise ValueError(
                "multi-sig is enabled but high_risk_patterns is empty, so no call would need a quorum."
            )
        for pattern in self.high_risk_patterns:
            if not pattern.strip():
                raise ValueError("high_risk_patterns holds an empty pattern.")
        if not 1 <= self.timeout_seconds <= MAX_QUORUM_TIMEOUT_SECONDS:
            raise ValueError(
                f"timeout_seconds must be between 1 and {MAX_QUORUM_TIMEOUT_SECONDS}, "
                f"not {self.timeout_seconds}."
            )
        self._validate_rules()

    def _validate_rules(self) -> None:
        """Version 2: every group is a set of configured peers, every rule can be met."""
        peers = set(self.peer_agent_ids)
        for name, members in self.groups.items():
            check_agent_id(name, "group name")
            strangers = [member for member in members if member not in peers]
            if strangers:
                raise ValueError(f"quorum group {name} names {strangers[0]}, which is not a configured peer.")
            if len(set(members)) != len(members):
                raise ValueError(f"quorum group {name} lists a peer twice.")
        for number, rule in enumerate(self.rules, 1):
            problem = rule.problem(self.groups, self.peer_agent_ids)
            timeout = rule.timeout_seconds
            if problem is None and timeout is not None and not 1 <= timeout <= MAX_QUORUM_TIMEOUT_SECONDS:
                problem = f"its timeout_seconds is not between 1 and {MAX_QUORUM_TIMEOUT_SECONDS}"
            if problem is not None:
                raise ValueError(f"quorum rule {number} ({rule.pattern!r}) cannot be met: {problem}.")

    def rule_for(self, tool_name: str) -> QuorumRule | None:
        """The first rule whose pattern matches ``tool_name``, or None (version 1 counting)."""
        return next((rule for rule in self.rules if rule.matches(tool_name)), None)

    def policy_for(self, tool_name: str) -> QuorumPolicy | None:
        """The version 2 policy a request for ``tool_name`` carries here, or None for version 1."""
        rule = self.rule_for(tool_name)
        return None if rule is None else rule.policy(self.groups, self.peer_agent_ids)

    def timeout_for(self, tool_name: str) -> int:
        """How long a request for ``tool_name`` waits: its rule's ``timeout_seconds``, else the quorum's."""
        rule = self.rule_for(tool_name)
        if rule is None or rule.timeout_seconds is None:
            return self.timeout_seconds
        return rule.timeout_seconds

    @classmethod
    def disabled(cls) -> MultiSigQuorumConfig:
        """Return the configuration of a node without multi-sig: no call needs a quorum."""
        return cls(enabled=False)

    def is_high_risk(self, tool_name: str) -> bool:
        """Return True when multi-sig is enabled and ``tool_name`` matches a high-risk pattern."""
        matcher = self._high_risk
        return matcher is not None and matcher.match(tool_name) is not None

    def check_origin(self, agent_id: str) -> None:
        """Check that the node ``agent_id`` may use this configuration as its own.

        PROTOCOL.md refuses an enabled configuration whose origin is among its peers; the
        configuration alone does not know its origin, so this check runs where it is known
        (``ApprovalPolicy`` calls it with its ``agent_id``).

        Args:
            agent_id: The origin node's name.

        Raises:
            ValueError: Multi-sig is enabled and ``agent_id`` is one of its own peers.
        """
        if self.enabled and agent_id in self.peer_agent_ids:
            raise ValueError(
                f"agent {agent_id} is listed among its own peers; a node cannot approve its own calls."
            )

    def keys_of(self, peer: str) -> tuple[SignerKey, ...]:
        """Return the keys that may sign for ``peer``: its node key first, then its further keys.

        Empty for a peer that is not configured. A disabled configuration was never checked, so
        its keys are read here, each call, and a line that is not a usable key is left out.

        Args:
            peer: The peer's agent id.

        Returns:
            The keys, node key first.
        """
        found = self._keys.get(peer)
        if found is not None:
            return found
        line = self.peer_public_keys.get(peer, "").strip()
        if not line:
            return ()
        try:
            node_key = SignerKey(line=line, source=f"peer_public_keys[{peer!r}]")
        except ValueError:
            return self.peer_keys.get(peer, ())
        return (node_key, *self.peer_keys.get(peer, ()))

    def describe_quorum(self) -> str:
        """Return the quorum as a phrase for messages, such as ``2 approvals from 3 peers``."""
        return needed_from(self.required_approvals, len(self.peer_agent_ids))


@dataclass(frozen=True)
class PeerSignature:
    """One peer's approval in its compact form (PROTOCOL.md, "Approval statement").

    The receiver rebuilds the approval statement from the request, with ``signer = peer_id`` and
    ``signed_at = int(timestamp)``, and checks ``signature`` over its canonical bytes.

    Attributes:
        peer_id: The signer's agent id.
        signature: The base64 SSHSIG blob (no armor, no line breaks).
        timestamp: ``signed_at`` as a float of Unix seconds.
        ssh_key_id: The signer's ``SHA256:...`` key fingerprint; informative, must match when present.
    """

    peer_id: str
    signature: str
    timestamp: float
    ssh_key_id: str | None = None

    def __post_init__(self) -> None:
        """Check the field types.

        Raises:
            TypeError: A field has the wrong type.
        """
        if not isinstance(self.peer_id, str) or not isinstance(self.signature, str):
            raise TypeError("peer_id and signature must be strings.")
        if isinstance(self.timestamp, bool) or not isinstance(self.timestamp, int | float):
            raise TypeError(
                f"timestamp must be a number of Unix seconds, not {type(self.timestamp).__name__}."
            )
        if self.ssh_key_id is not None and not isinstance(self.ssh_key_id, str):
            raise TypeError("ssh_key_id must be a string or None.")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a JSON-ready dict."""
        return json_fields(self)
