"""Reading and checking a node configuration file; every mistake is one sentence naming file and key."""

from __future__ import annotations

import difflib
import math
import os
import ssl
import tomllib
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import urlsplit

from teaagent.config._model import (
    DEFAULT_AGENT_HOST,
    DEFAULT_AGENT_PORT,
    DEFAULT_APPROVER_PORT,
    DEFAULT_PROVIDER,
    MCP_UPSTREAM_NAME_PATTERN,
    MIN_TOKEN_CHARS,
    MODEL_NAME_PATTERN,
    AgentSettings,
    ApproverRule,
    ApproverSettings,
    Decision,
    McpSettings,
    McpUpstream,
    ModelSettings,
    NodeConfig,
    NotifyFormat,
    NotifySettings,
    PeerConfig,
    TlsSettings,
    read_public_key_of_private_key_file,
)
from teaagent.errors import ConfigError, SignatureError
from teaagent.policy import (
    AGENT_ID_PATTERN,
    DEFAULT_QUORUM_TIMEOUT_SECONDS,
    MAX_QUORUM_TIMEOUT_SECONDS,
    MultiSigQuorumConfig,
    PermissionMode,
)
from teaagent.signing import SUPPORTED_KEY_TYPES, SSHPublicKey, parse_public_key
from teaagent.tools import ToolRateLimit
from teaagent.tools._ratelimit import gcra_parameters
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

__all__ = ["CONFIG_ENV_VAR", "load_config"]

CONFIG_ENV_VAR: Final = "TEAAGENT_CONFIG"
MAX_CONFIG_BYTES: Final = 1024 * 1024  # a node's settings and its peers' keys, not a data file
EMBEDDED_REDIS: Final = "embedded"
REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
DECISIONS: Final[tuple[Decision, ...]] = ("approve", "deny", "ask")
AGENT_ID_RULE: Final = "1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
ROOT_KEYS: Final = (
    "agent_id",
    "private_key",
    "public_key",
    "redis_url",
    "redis_cluster",
    "relay_url",
    "workspace",
    "data_dir",
    "token",
    "agent",
    "quorum",
    "peers",
    "approver",
    "models",
    "tls",
    "mcp",
)
TLS_KEYS: Final = ("cert", "key", "ca")
MCP_KEYS: Final = ("upstreams",)
MCP_UPSTREAM_KEYS: Final = ("command", "env", "url")
AGENT_KEYS: Final = (
    "permission_mode",
    "provider",
    "model",
    "base_url",
    "script",
    "port",
    "host",
    "rate_limits",
)
MODEL_KEYS: Final = (
    "model",
    "token",
    "display_model",
    "base_url",
    "anthropic",
    "responses_api",
    "multimodal",
    "context_window",
    "compact_percent",
    "reasoning_efforts",
)
MODEL_NAME_RULE: Final = "1 to 64 letters, digits, '.', '_', ':' or '-', starting with a letter or digit"
RATE_LIMIT_KEYS: Final = ("max_calls", "window_seconds")
DEFAULT_RATE_WINDOW_SECONDS: Final = 60.0  # ToolRateLimit's own default
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
APPROVER_KEYS: Final = ("port", "rules", "operators", "notify")
NOTIFY_KEYS: Final = ("webhook_url", "format")
NOTIFY_FORMATS: Final = ("slack", "json")
RULE_KEYS: Final = ("tool", "arguments", "decision", "reason")


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date or time"
    return type(value).__name__  # pragma: no cover - tomllib produces nothing else


class _Table:
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

    def table(self, key: str, allowed: tuple[str, ...] | None = None) -> _Table | None:
        value = self._take(key, lambda v: isinstance(v, dict), "a table", None, False)
        return None if value is None else _Table(self.label, value, self.name(key) + ".", allowed)

    def finish(self) -> None:
        """Refuse the keys nobody took: a typo must not silently switch a setting off."""
        for key in self.data:
            if key not in self.known:
                close = difflib.get_close_matches(key, self.known, n=1, cutoff=0.7)
                hint = f" (did you mean {self.name(close[0])}?)" if close else ""
                raise ConfigError(f"{self.label}: unknown key {self.name(key)}{hint}.")


def _check_port(table: _Table, key: str, default: int) -> int:
    port = table.integer(key, default)
    if not 1 <= port <= 65535:
        raise table.error(key, f"must be a TCP port between 1 and 65535, not {port}")
    return port


def _check_http_url(table: _Table, key: str, url: str) -> str:
    parts = urlsplit(url)
    # urlsplit drops tabs and newlines silently (WHATWG): a URL holding any is refused, not mended.
    if parts.scheme not in ("http", "https") or not parts.hostname or any(ch.isspace() for ch in url):
        raise table.error(key, f"must be an http:// or https:// URL, not {url!r}")
    return url.rstrip("/")


def _check_agent_id(label: str, where: str, value: str) -> str:
    if not _is_agent_id(value):
        raise ConfigError(f"{label}: {where} {value!r} is not a valid agent id: use {AGENT_ID_RULE}.")
    return value


def _parse_key(table: _Table, key: str, line: str) -> SSHPublicKey:
    try:
        return parse_public_key(line)
    except SignatureError as exc:
        raise ConfigError(f"{table.label}: {table.name(key)} is not a usable SSH public key: {exc}") from None


def _resolve(base: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _read(label: str, path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{label}: the configuration file does not exist.") from None
    except IsADirectoryError:
        raise ConfigError(f"{label}: this is a folder, not a configuration file.") from None
    except OSError as exc:
        raise ConfigError(f"{label}: the configuration file cannot be read: {exc.strerror or exc}.") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{label}: the configuration file is larger than {MAX_CONFIG_BYTES} bytes.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{label}: the configuration file is not UTF-8 text.") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message ends with "(at line L, column C)": the sentence names where.
        raise ConfigError(f"{label}: invalid TOML: {exc}.") from None


def _agent_script(table: _Table, base: Path, provider: str) -> str | None:
    """``[agent] script``: a bundled script's name as it is, a file's path resolved against ``base``."""
    script = table.string("script")
    if script is None:
        return None
    script = script.strip()
    if not script:
        raise table.error("script", "is empty")
    if provider != DEFAULT_PROVIDER:
        raise table.error("script", f"is set, but provider {provider!r} plays no script")
    # Here, not at the top: only a node that names a script needs the LLM package.
    from teaagent.llm import BUNDLED_SCRIPTS

    return script if script in BUNDLED_SCRIPTS else str(_resolve(base, script))


def _agent_settings(table: _Table | None, base: Path) -> AgentSettings:
    if table is None:
        return AgentSettings()
    mode_text = table.string("permission_mode", PermissionMode.PROMPT.value)
    assert mode_text is not None
    try:
        mode = PermissionMode(mode_text)
    except ValueError:
        allowed = ", ".join(mode.value for mode in PermissionMode)
        raise table.error("permission_mode", f"is {mode_text!r}, which is not one of {allowed}") from None
    provider = table.string("provider", DEFAULT_PROVIDER)
    assert provider is not None
    if not provider.strip():
        raise table.error("provider", "is empty")
    port = _check_port(table, "port", DEFAULT_AGENT_PORT)
    host = table.string("host", DEFAULT_AGENT_HOST)
    assert host is not None
    if not host.strip():
        raise table.error("host", "is empty")
    model = table.string("model")
    if model is not None and not model.strip():
        raise table.error("model", "is empty")
    base_url = table.string("base_url")
    if base_url is not None:
        base_url = _check_http_url(table, "base_url", base_url.strip())
        if provider == DEFAULT_PROVIDER:
            raise table.error("base_url", f"is set, but provider {provider!r} calls no server")
    script = _agent_script(table, base, provider)
    rate_limits = _rate_limits(table.table("rate_limits"))
    table.finish()
    return AgentSettings(
        permission_mode=mode,
        provider=provider,
        model=model.strip() if model is not None else None,
        base_url=base_url,
        script=script,
        port=port,
        host=host.strip(),
        rate_limits=rate_limits,
    )


def _models(table: _Table | None) -> dict[str, ModelSettings]:
    """``[models.NAME]``: the keys of the agent HTTP API's ``ModelCreate``, ``model`` required."""
    if table is None:
        return {}
    models: dict[str, ModelSettings] = {}
    for name in list(table.data):
        if MODEL_NAME_PATTERN.fullmatch(name) is None:
            raise ConfigError(
                f"{table.label}: models.{name} is not a usable model name: use {MODEL_NAME_RULE}."
            )
        entry = table.table(name, MODEL_KEYS)
        if entry is None:  # pragma: no cover - table() only returns None for a missing key
            continue
        model = entry.required_string("model").strip()
        token = entry.string("token")
        if token is not None and not token.strip():
            raise entry.error("token", "is empty")
        display = entry.string("display_model")
        base_url = entry.string("base_url")
        if base_url is not None:
            base_url = _check_http_url(entry, "base_url", base_url.strip())
        flags = {flag: entry.boolean(flag, False) for flag in ("anthropic", "responses_api", "multimodal")}
        window: int | None = entry.integer("context_window", 0)
        if "context_window" not in entry.data:
            window = None
        elif window is not None and window < 1:
            raise entry.error("context_window", f"must be at least 1 token, not {window}")
        compact: float | None = entry.number("compact_percent", 0.0)
        if "compact_percent" not in entry.data:
            compact = None
        elif compact is not None and not (math.isfinite(compact) and 0 < compact <= 100):
            raise entry.error("compact_percent", f"must be above 0 and at most 100, not {compact:g}")
        efforts = entry.string_list("reasoning_efforts")
        if any(not effort.strip() for effort in efforts):
            raise entry.error("reasoning_efforts", "holds an empty effort")
        if len(set(efforts)) != len(efforts):
            raise entry.error("reasoning_efforts", "names an effort twice")
        entry.finish()
        models[name] = ModelSettings(
            name=name,
            model=model,
            token=token.strip() if token is not None else None,
            display_model=display,
            base_url=base_url,
            context_window=window,
            compact_percent=compact,
            reasoning_efforts=tuple(efforts),
            **flags,
        )
    table.finish()
    return models


def _rate_limits(table: _Table | None) -> dict[str, ToolRateLimit]:
    """``[agent.rate_limits]``: ``"<tool>" = { max_calls = N, window_seconds = S }`` (S defaults to 60)."""
    if table is None:
        return {}
    limits: dict[str, ToolRateLimit] = {}
    for tool, value in list(table.data.items()):
        if isinstance(value, dict) and value and all(isinstance(inner, dict) for inner in value.values()):
            # shell.run = {...} unquoted is the table shell holding run: say how to write it.
            dotted = f"{tool}.{next(iter(value))}"
            raise table.error(tool, f'is a table of tables: put a dotted tool name in quotes, "{dotted}"')
        limit = table.table(tool, RATE_LIMIT_KEYS)
        if limit is None:  # pragma: no cover - table() refuses a non-table value itself
            continue
        max_calls = limit.integer("max_calls", required=True)
        window = limit.number("window_seconds", DEFAULT_RATE_WINDOW_SECONDS)
        limit.finish()
        if max_calls < 1:
            raise limit.error("max_calls", f"must be at least 1, not {max_calls}")
        if not (math.isfinite(window) and window > 0):
            raise limit.error("window_seconds", f"must be a number of seconds above 0, not {window:g}")
        try:
            gcra_parameters(max_calls, window)  # what the limiters accept, checked now rather than per call
        except ValueError as exc:
            raise ConfigError(f"{limit.label}: {limit.prefix.rstrip('.')}: {exc}.") from None
        limits[tool] = ToolRateLimit(max_calls, window)
    table.finish()
    return limits


def _allowed_signers(table: _Table, key: str, base: Path, principal: str) -> tuple[SignerKey, ...]:
    """Read the ``allowed_signers`` file named at ``key``: the lines of ``principal``."""
    text = table.string(key)
    if text is None:
        return ()
    if not text.strip():
        raise table.error(key, "is empty")
    path = _resolve(base, text)
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


def _peer_keys(peer: _Table, name: str, base: Path) -> tuple[SignerKey, ...]:
    """The keys of ``[peers.NAME]``: ``public_key``, then ``public_keys``, then ``allowed_signers``."""
    keys: list[SignerKey] = []
    line = peer.string("public_key")
    if line is not None:
        _parse_key(peer, "public_key", line.strip())
        keys.append(SignerKey(line=line.strip(), source=f"peers.{name}.public_key"))
    for index, item in enumerate(peer.string_list("public_keys")):
        _parse_key(peer, f"public_keys[{index}]", item.strip())
        keys.append(SignerKey(line=item.strip(), source=f"peers.{name}.public_keys[{index}]"))
    keys.extend(_allowed_signers(peer, "allowed_signers", base, name))
    if not keys:
        raise ConfigError(
            f"{peer.label}: peers.{name} has no key: set public_key, public_keys or allowed_signers."
        )
    return unique_keys(keys)


def _peers(root: _Table, agent_id: str, base: Path) -> dict[str, PeerConfig]:
    table = root.table("peers")
    if table is None:
        return {}
    peers: dict[str, PeerConfig] = {}
    owners: dict[bytes, tuple[str, str]] = {}  # key identity (key material, PROTOCOL.md) -> (peer, where)
    for name in list(table.data):
        if not _is_agent_id(name):
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
        relay_url = _check_http_url(peer, "relay_url", peer.required_string("relay_url").strip())
        peer.finish()
        peers[name] = PeerConfig(agent_id=name, public_key=keys[0].line, relay_url=relay_url, keys=keys)
    table.finish()
    return peers


def _holds_a_public_key(path: Path) -> bool:
    """Whether ``path`` starts like an OpenSSH public key file (``TYPE BASE64``), not a private key."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError:
        return False  # reading the key later names the problem
    first = head.lstrip().split(None, 1)[:1]
    return bool(first) and first[0].decode("ascii", "replace") in SUPPORTED_KEY_TYPES


def _is_agent_id(value: str) -> bool:
    return AGENT_ID_PATTERN.fullmatch(value) is not None


def _quorum_groups(table: _Table) -> dict[str, tuple[str, ...]]:
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


def _quorum_rules(table: _Table) -> tuple[QuorumRule, ...]:
    """``[[quorum.rules]]``: each a pattern and ``required``, ``all_of`` or ``any_of``."""
    table.known.append("rules")
    raw = table.data.get("rules", [])
    if not isinstance(raw, list) or not all(isinstance(rule, dict) for rule in raw):
        raise table.error("rules", "must be an array of tables ([[quorum.rules]])")
    rules: list[QuorumRule] = []
    for index, data in enumerate(raw):
        rule = _Table(table.label, data, f"quorum.rules[{index}].", QUORUM_RULE_KEYS)
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
                term = _Table(table.label, item, f"quorum.rules[{index}].{mode}[{number}].", QUORUM_TERM_KEYS)
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


def _quorum(table: _Table | None, peers: Mapping[str, PeerConfig], relay_url: str) -> MultiSigQuorumConfig:
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


def _ssl_reason(exc: OSError | ssl.SSLError) -> str:
    """OpenSSL's reason (``KEY_VALUES_MISMATCH``) as words, or the OS's sentence."""
    reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
    return str(reason).rstrip(".").lower().replace("_", " ")


def _tls_file(table: _Table, key: str, base: Path) -> Path | None:
    text = table.string(key)
    if text is None:
        return None
    if not text.strip():
        raise table.error(key, "is empty")
    path = _resolve(base, text.strip())
    if not path.is_file():
        raise table.error(key, f"names {text}, which does not exist (looked for {path})")
    return path


def _tls(table: _Table | None, base: Path, relay_url: str) -> TlsSettings:
    """``[tls]``: the relay's certificate and key (both or neither), and the CAs for https:// relays."""
    if table is None:
        return TlsSettings()
    cert = _tls_file(table, "cert", base)
    key = _tls_file(table, "key", base)
    ca = _tls_file(table, "ca", base)
    table.finish()
    if (cert is None) != (key is None):
        raise ConfigError(f"{table.label}: tls.cert and tls.key go together: set both, or neither.")
    if cert is not None and key is not None:
        if urlsplit(relay_url).scheme != "https":
            raise ConfigError(
                f"{table.label}: relay_url is {relay_url!r}, but with tls.cert set the relay serves "
                "HTTPS: make it an https:// URL."
            )
        try:  # now, not when the relay starts: a key of another certificate is a sentence here
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{table.label}: tls.cert and tls.key are not a PEM certificate and its private key: "
                f"{_ssl_reason(exc)}."
            ) from None
    if ca is not None:
        try:
            ssl.create_default_context(cafile=str(ca))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{table.label}: tls.ca names {ca.name}, which holds no PEM CA certificate: "
                f"{_ssl_reason(exc)}."
            ) from None
    return TlsSettings(cert=cert, key=key, ca=ca)


def _rule(table: _Table) -> ApproverRule:
    tool = table.required_string("tool")
    decision = table.string("decision", required=True)
    if decision not in DECISIONS:
        raise table.error("decision", f"is {decision!r}, which is not one of approve, deny, ask")
    reason = table.string("reason", "")
    patterns: dict[str, str] = {}
    arguments = table.table("arguments")
    if arguments is not None:
        for name in list(arguments.data):
            pattern = arguments.string(name, required=True)
            assert pattern is not None
            patterns[name] = pattern
    table.finish()
    assert reason is not None
    return ApproverRule(tool=tool, arguments=patterns, decision=decision, reason=reason)


def _notify(approver: _Table) -> NotifySettings | None:
    table = approver.table("notify", NOTIFY_KEYS)
    if table is None:
        return None
    url = _check_http_url(table, "webhook_url", table.required_string("webhook_url").strip())
    kind = table.string("format", "json")
    if kind not in NOTIFY_FORMATS:
        raise table.error("format", f'must be "slack" or "json", not {kind!r}')
    table.finish()
    return NotifySettings(webhook_url=url, format=cast("NotifyFormat", kind))


def _approver(table: _Table | None, base: Path, agent_id: str) -> ApproverSettings:
    if table is None:
        return ApproverSettings()
    port = _check_port(table, "port", DEFAULT_APPROVER_PORT)
    operators_text = table.string("operators")
    operator_keys = _allowed_signers(table, "operators", base, agent_id)
    operators = _resolve(base, operators_text) if operators_text is not None and operator_keys else None
    notify = _notify(table)
    table.known.append("rules")
    raw_rules = table.data.get("rules", [])
    if not isinstance(raw_rules, list) or not all(isinstance(rule, dict) for rule in raw_rules):
        raise table.error("rules", "must be an array of tables ([[approver.rules]])")
    rules = tuple(
        _rule(_Table(table.label, rule, f"approver.rules[{index}].", RULE_KEYS))
        for index, rule in enumerate(raw_rules)
    )
    table.finish()
    return ApproverSettings(
        port=port, rules=rules, operators=operators, operator_keys=operator_keys, notify=notify
    )


def _mcp(table: _Table | None) -> McpSettings:
    """``[mcp.upstreams.NAME]``: a stdio ``command`` (with its ``env``) or a streamable HTTP ``url``."""
    if table is None:
        return McpSettings()
    upstreams_table = table.table("upstreams")
    table.finish()
    if upstreams_table is None:
        return McpSettings()
    upstreams: dict[str, McpUpstream] = {}
    for name in list(upstreams_table.data):
        if MCP_UPSTREAM_NAME_PATTERN.fullmatch(name) is None:
            raise ConfigError(
                f"{upstreams_table.label}: mcp.upstreams.{name} is not a usable upstream name: use 1 to "
                "64 letters, digits, '_' or '-', starting with a letter or digit (no '.': its tools "
                "are named NAME.TOOL)."
            )
        entry = upstreams_table.table(name, MCP_UPSTREAM_KEYS)
        if entry is None:  # pragma: no cover - table() only returns None for a missing key
            continue
        command = entry.string_list("command")
        url = entry.string("url")
        env_table = entry.table("env")
        env: dict[str, str] = {}
        if env_table is not None:
            for variable in list(env_table.data):
                value = env_table.string(variable, required=True)
                assert value is not None
                env[variable] = value
        if ("command" in entry.data) == (url is not None):
            raise ConfigError(
                f"{entry.label}: mcp.upstreams.{name} needs exactly one of command (a stdio server) "
                "and url (a streamable HTTP server)."
            )
        if url is not None:
            url = _check_http_url(entry, "url", url.strip())
            if env:
                raise entry.error("env", "only applies to a command, not to a url")
        elif not command or not command[0].strip():
            raise entry.error("command", 'must name a program to run, as in ["python", "server.py"]')
        entry.finish()
        upstreams[name] = McpUpstream(name=name, command=tuple(command), env=env, url=url)
    upstreams_table.finish()
    return McpSettings(upstreams=upstreams)


def load_config(path: str | os.PathLike[str] | None = None) -> NodeConfig:
    """Load and check a node configuration file (ARCHITECTURE.md, Node configuration).

    Decisions worth knowing:

    * The node's key is either ``private_key`` (an OpenSSH key file, relative to this file) or
      ``public_key`` (the public line of a key held by ssh-agent), exactly one of the two.
    * ``redis_url`` defaults to ``embedded``; ``redis_cluster = true`` makes it one node of a Redis
      Cluster (a redis:// or rediss:// URL); ``workspace`` to ``workspace`` and ``data_dir`` to
      ``.teaagent-<agent_id>``, both beside the file; every relative path is relative to the file.
    * With no ``[quorum]`` table the quorum is disabled; a ``[quorum]`` table must say
      ``enabled`` explicitly, and an enabled one must give ``required_approvals`` and a non-empty
      ``high_risk_patterns``. ``[peers.*]`` may exist without a quorum (to approve others).
    * Unknown keys are errors everywhere.

    Args:
        path: The configuration file; when None, the file named by ``TEAAGENT_CONFIG``.

    Returns:
        The checked configuration.

    Raises:
        ConfigError: No path is given and ``TEAAGENT_CONFIG`` is not set; the file is missing,
            unreadable, not UTF-8 or not valid TOML (the sentence gives the line); a key is
            unknown, missing, of the wrong type or out of range; a public key does not parse; a
            peer is this node itself or shares a key with another; the private key file is
            missing; or the quorum cannot be reached with the configured peers.
    """
    if path is None:
        from_env = os.environ.get(CONFIG_ENV_VAR, "")
        if not from_env:
            raise ConfigError(f"no configuration file was given: pass --config PATH or set {CONFIG_ENV_VAR}.")
        path = from_env
    label = os.fspath(path)
    file = Path(path).expanduser().absolute()
    base = file.parent
    root = _Table(label, _read(label, file), allowed=ROOT_KEYS)

    agent_id = _check_agent_id(label, "agent_id", root.required_string("agent_id"))
    private_text = root.string("private_key")
    public_text = root.string("public_key")
    if private_text is not None and public_text is not None:
        raise ConfigError(
            f"{label}: set private_key (a key file) or public_key (a key held by ssh-agent), not both."
        )
    if private_text is None and public_text is None:
        raise ConfigError(
            f"{label}: the required key private_key (a key file) or public_key "
            "(a key held by ssh-agent) is missing."
        )
    private_key: Path | None = None
    own_key: SSHPublicKey | None = None
    if private_text is not None:
        if not private_text.strip():
            raise root.error("private_key", "is empty")
        private_key = _resolve(base, private_text)
        if not private_key.is_file():
            raise ConfigError(
                f"{label}: private_key {private_text} does not exist (looked for {private_key})."
            )
        if _holds_a_public_key(private_key):
            raise ConfigError(
                f"{label}: private_key {private_text} is the public half of the key; "
                "name the private key file (the one without .pub)."
            )
        own_key = read_public_key_of_private_key_file(private_key)
    else:
        assert public_text is not None
        public_text = public_text.strip()
        own_key = _parse_key(root, "public_key", public_text)

    redis_url = root.string("redis_url", EMBEDDED_REDIS)
    assert redis_url is not None
    if redis_url != EMBEDDED_REDIS and urlsplit(redis_url).scheme not in REDIS_SCHEMES:
        raise root.error(
            "redis_url", f'must be "embedded" or a redis://, rediss:// or unix:// URL, not {redis_url!r}'
        )
    redis_cluster = root.boolean("redis_cluster", False)
    if redis_cluster and redis_url == EMBEDDED_REDIS:
        raise ConfigError(
            f'{label}: redis_cluster = true needs redis_url to name a node of the cluster: "embedded" '
            "is one private server, never a cluster."
        )
    if redis_cluster and urlsplit(redis_url).scheme == "unix":
        raise ConfigError(
            f"{label}: redis_cluster = true needs a redis:// or rediss:// redis_url: a cluster's nodes "
            "are reached over TCP, not unix://."
        )
    if redis_cluster and urlsplit(redis_url).path not in ("", "/", "/0"):
        raise ConfigError(
            f"{label}: redis_cluster = true needs database 0 in redis_url: a cluster has no other."
        )
    relay_url = _check_http_url(root, "relay_url", root.required_string("relay_url").strip())
    workspace = _resolve(base, root.string("workspace", "workspace") or "workspace")
    data_dir_text = root.string("data_dir", f".teaagent-{agent_id}")
    assert data_dir_text is not None
    if not data_dir_text.strip():
        raise root.error("data_dir", "is empty")
    data_dir = _resolve(base, data_dir_text)
    token = root.string("token")
    if token is not None and len(token.strip()) < MIN_TOKEN_CHARS:
        raise root.error("token", f"must be at least {MIN_TOKEN_CHARS} characters long")

    agent = _agent_settings(root.table("agent", AGENT_KEYS), base)
    peers = _peers(root, agent_id, base)
    quorum = _quorum(root.table("quorum", QUORUM_KEYS), peers, relay_url)
    approver = _approver(root.table("approver", APPROVER_KEYS), base, agent_id)
    models = _models(root.table("models"))
    tls = _tls(root.table("tls", TLS_KEYS), base, relay_url)
    mcp = _mcp(root.table("mcp", MCP_KEYS))
    # Key identity, not the exact blob: the same key in its sk- form is still this node's. A key
    # of this node (its own or an operator's) listed for a peer would count this node as a peer.
    own = {own_key.identity: "this node's own key"} if own_key is not None else {}
    for key in approver.operator_keys:
        own.setdefault(key.key.identity, f"the key of this node's operator ({key.source})")
    for peer in peers.values():
        for key in peer.keys:
            whose = own.get(key.key.identity)
            if whose is not None:
                raise ConfigError(f"{label}: {key.source} is {whose}, which would count this node as a peer.")
    if agent.port == approver.port:
        raise ConfigError(f"{label}: agent.port and approver.port are both {agent.port}.")
    root.finish()
    return NodeConfig(
        path=file,
        agent_id=agent_id,
        private_key=private_key,
        public_key=public_text,
        redis_url=redis_url,
        redis_cluster=redis_cluster,
        relay_url=relay_url,
        workspace=workspace,
        data_dir=data_dir,
        token=token.strip() if token is not None else None,
        agent=agent,
        quorum=quorum,
        peers=peers,
        approver=approver,
        models=models,
        tls=tls,
        mcp=mcp,
    )
