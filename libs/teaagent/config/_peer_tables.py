"""``[peers.NAME]`` and ``[quorum]``: the node's peers, their keys, and what a high-risk call needs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from teaagent.config._model import (
    PeerConfig,
)
from teaagent.config._table import AGENT_ID_RULE, Table, check_http_url, is_agent_id, parse_key, resolve_path
from teaagent.errors import ConfigError
from teaagent.policy import (
    DEFAULT_QUORUM_TIMEOUT_SECONDS,
    MAX_QUORUM_TIMEOUT_SECONDS,
    MultiSigQuorumConfig,
)
from teaagent.signing import SUPPORTED_KEY_TYPES
from teaagent.trust import (
    MAX_ALLOWED_SIGNERS_BYTES,
    POLICY_MODES,
    PolicyMode,
    QuorumRule,
    RuleTerm,
    SignerKey,
    parse_allowed_signers,
    unique_keys,
)

QUORUM_KEYS: Final = (
    "enabled",
    "required_approvals",
    "high_risk_patterns",
    "timeout_seconds",
    "allow_dev_signatures",
    "groups",
    "rules",
)
QUORUM_RULE_KEYS: Final = ("pattern", "required", "all_of", "any_of", "timeout_seconds")
QUORUM_TERM_KEYS: Final = ("group", "required")
PEER_KEYS: Final = ("public_key", "public_keys", "allowed_signers", "relay_url")


def allowed_signers(table: Table, key: str, base: Path, principal: str) -> tuple[SignerKey, ...]:
    """Read the ``allowed_signers`` file named at ``key``: the lines of ``principal``."""
    text = table.string(key)
    if text is None:
        return ()
    if not text.strip():
        raise table.error(key, "is empty")
    path = resolve_path(base, text)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_ALLOWED_SIGNERS_BYTES + 1)
    except FileNotFoundError:
        raise table.error(key, f"names {text}, which does not exist (looked for {path})") from None
    except IsADirectoryError:
        raise table.error(key, f"names {text}, which is a folder, not an allowed_signers file") from None
    except OSError as exc:
        raise table.error(key, f"names {text}, which cannot be read: {exc.strerror or exc}") from None
    try:
        keys = parse_allowed_signers(raw.decode("utf-8"), principal=principal, source=path.name)
    except UnicodeDecodeError:
        raise table.error(key, f"names {text}, which is not UTF-8 text") from None
    except ValueError as exc:
        raise ConfigError(f"{table.label}: {table.name(key)}: {str(exc).rstrip('.')}.") from None
    if not keys:
        raise table.error(key, f"names {text}, which lists no key for {principal}")
    return keys


def _peer_keys(peer: Table, name: str, base: Path) -> tuple[SignerKey, ...]:
    """The keys of ``[peers.NAME]``: ``public_key``, then ``public_keys``, then ``allowed_signers``."""
    keys: list[SignerKey] = []
    line = peer.string("public_key")
    if line is not None:
        parse_key(peer, "public_key", line.strip())
        keys.append(SignerKey(line=line.strip(), source=f"peers.{name}.public_key"))
    for index, item in enumerate(peer.string_list("public_keys")):
        parse_key(peer, f"public_keys[{index}]", item.strip())
        keys.append(SignerKey(line=item.strip(), source=f"peers.{name}.public_keys[{index}]"))
    keys.extend(allowed_signers(peer, "allowed_signers", base, name))
    if not keys:
        raise ConfigError(
            f"{peer.label}: peers.{name} has no key: set public_key, public_keys or allowed_signers."
        )
    return unique_keys(keys)


def peer_settings(root: Table, agent_id: str, base: Path) -> dict[str, PeerConfig]:
    table = root.table("peers")
    if table is None:
        return {}
    peers: dict[str, PeerConfig] = {}
    owners: dict[bytes, tuple[str, str]] = {}  # key identity (key material, PROTOCOL.md) -> (peer, where)
    for name in list(table.data):
        if not is_agent_id(name):
            raise ConfigError(f"{root.label}: peers.{name} is not a valid agent id: use {AGENT_ID_RULE}.")
        if name == agent_id:
            raise ConfigError(
                f"{root.label}: peers.{name} is this node itself (agent_id = {agent_id!r}); "
                "a node cannot approve its own calls."
            )
        peer = table.table(name, PEER_KEYS)
        if peer is None:  # pragma: no cover - table() only returns None for a missing key
            continue
        keys = _peer_keys(peer, name, base)
        for key in keys:
            owner, where = owners.setdefault(key.key.identity, (name, key.source))
            if owner != name:
                raise ConfigError(
                    f"{root.label}: {where} and {key.source} are the same key, which would count twice."
                )
        relay_url = check_http_url(
            peer, "relay_url", peer.required_string("relay_url").strip(), credentials=False
        )
        peer.finish()
        peers[name] = PeerConfig(agent_id=name, public_key=keys[0].line, relay_url=relay_url, keys=keys)
    table.finish()
    return peers


def holds_a_public_key(path: Path) -> bool:
    """Whether ``path`` starts like an OpenSSH public key file (``TYPE BASE64``), not a private key."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError:
        return False  # reading the key later names the problem
    first = head.lstrip().split(None, 1)[:1]
    return bool(first) and first[0].decode("ascii", "replace") in SUPPORTED_KEY_TYPES


def _quorum_groups(table: Table) -> dict[str, tuple[str, ...]]:
    """``[quorum.groups]``: each a name and a list of peer ids (checked against the peers later)."""
    groups = table.table("groups")
    if groups is None:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for name in list(groups.data):
        members = groups.string_list(name, required=True)
        if not members:
            raise groups.error(name, "is empty, so no term could ever count toward it")
        found[name] = tuple(members)
    groups.finish()
    return found


def _quorum_rules(table: Table) -> tuple[QuorumRule, ...]:
    """``[[quorum.rules]]``: each a pattern and ``required``, ``all_of`` or ``any_of``."""
    table.known.append("rules")
    raw = table.data.get("rules", [])
    if not isinstance(raw, list) or not all(isinstance(rule, dict) for rule in raw):
        raise table.error("rules", "must be an array of tables ([[quorum.rules]])")
    rules: list[QuorumRule] = []
    for index, data in enumerate(raw):
        rule = Table(table.label, data, f"quorum.rules[{index}].", QUORUM_RULE_KEYS)
        pattern = rule.required_string("pattern")
        required = rule.integer("required") if "required" in rule.data else None
        timeout = rule.integer("timeout_seconds") if "timeout_seconds" in rule.data else None
        modes: list[PolicyMode] = [mode for mode in POLICY_MODES if mode in rule.data]
        if (required is not None) + len(modes) != 1:
            raise ConfigError(
                f"{table.label}: quorum rule {index + 1} ({pattern!r}) needs exactly one of "
                "required, all_of or any_of."
            )
        terms: list[RuleTerm] = []
        for mode in modes:
            rule.known.append(mode)
            items = rule.data[mode]
            if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
                raise rule.error(mode, 'must be an array of tables such as { group = "ops", required = 2 }')
            for number, item in enumerate(items):
                term = Table(table.label, item, f"quorum.rules[{index}].{mode}[{number}].", QUORUM_TERM_KEYS)
                group = term.required_string("group")
                count = term.integer("required", required=True)
                term.finish()
                terms.append(RuleTerm(group=group, required=count))
        rule.finish()
        rules.append(
            QuorumRule(
                pattern=pattern,
                required=required,
                mode=modes[0] if modes else None,
                terms=tuple(terms),
                timeout_seconds=timeout,
            )
        )
    return tuple(rules)


def quorum_settings(
    table: Table | None, peers: Mapping[str, PeerConfig], relay_url: str
) -> MultiSigQuorumConfig:
    base: dict[str, Any] = {
        "peer_agent_ids": list(peers),
        "peer_public_keys": {name: peer.public_key for name, peer in peers.items()},
        "peer_keys": {name: peer.keys[1:] for name, peer in peers.items() if len(peer.keys) > 1},
        "peer_relay_urls": {name: peer.relay_url for name, peer in peers.items()},
        "local_relay_base_url": relay_url,
    }
    if table is None:
        return MultiSigQuorumConfig(enabled=False, **base)
    # No default: a [quorum] table whose `enabled` was forgotten or misspelt must not be silently off.
    enabled = table.boolean("enabled", required=True)
    required = table.integer("required_approvals", 1, required=enabled)
    patterns = table.string_list("high_risk_patterns", required=enabled)
    timeout = table.integer("timeout_seconds", DEFAULT_QUORUM_TIMEOUT_SECONDS)
    dev = table.boolean("allow_dev_signatures", False)
    groups = _quorum_groups(table)
    rules = _quorum_rules(table)
    table.finish()
    if enabled:
        if required < 1:
            raise table.error("required_approvals", f"must be at least 1, not {required}")
        if required > len(peers):
            configured = (
                "no peers are"
                if not peers
                else f"only {len(peers)} peer{'s are' if len(peers) > 1 else ' is'}"
            )
            raise table.error("required_approvals", f"is {required} but {configured} configured")
        if not patterns:
            raise table.error("high_risk_patterns", "is empty, so no tool call would need the quorum")
        if any(not pattern.strip() for pattern in patterns):
            raise table.error("high_risk_patterns", "holds an empty pattern")
        if not 1 <= timeout <= MAX_QUORUM_TIMEOUT_SECONDS:
            raise table.error(
                "timeout_seconds", f"must be between 1 and {MAX_QUORUM_TIMEOUT_SECONDS}, not {timeout}"
            )
    try:
        return MultiSigQuorumConfig(
            enabled=enabled,
            required_approvals=required,
            high_risk_patterns=patterns,
            timeout_seconds=timeout,
            allow_dev_signatures=dev,
            groups=groups,
            rules=rules,
            **base,
        )
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(("quorum rule ", "quorum group ")):
            # Version 2: the sentence names the rule or the group already.
            raise ConfigError(f"{table.label}: {exc}") from None
        # The checks above mirror the policy's; this names the table for anything they missed.
        raise ConfigError(f"{table.label}: the [quorum] and [peers] tables are refused: {exc}") from None
