"""``[tls]`` and ``[approver]`` (its rules and notifications): how the node's services serve and decide."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final, cast
from urllib.parse import urlsplit

from teaagent.config._model import (
    DEFAULT_APPROVER_PORT,
    ApproverRule,
    ApproverSettings,
    Decision,
    NotifyFormat,
    NotifySettings,
    TlsSettings,
)
from teaagent.config._peer_tables import allowed_signers
from teaagent.config._table import Table, check_http_url, check_port, resolve_path
from teaagent.errors import ConfigError

DECISIONS: Final[tuple[Decision, ...]] = ("approve", "deny", "ask")
TLS_KEYS: Final = ("cert", "key", "ca")
APPROVER_KEYS: Final = ("port", "rules", "operators", "notify")
NOTIFY_KEYS: Final = ("webhook_url", "format")
NOTIFY_FORMATS: Final = ("slack", "json")
RULE_KEYS: Final = ("tool", "arguments", "decision", "reason")


def _ssl_reason(exc: OSError | ssl.SSLError) -> str:
    """OpenSSL's reason (``KEY_VALUES_MISMATCH``) as words, or the OS's sentence."""
    reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
    return str(reason).rstrip(".").lower().replace("_", " ")


def _tls_file(table: Table, key: str, base: Path) -> Path | None:
    text = table.string(key)
    if text is None:
        return None
    if not text.strip():
        raise table.error(key, "is empty")
    path = resolve_path(base, text.strip())
    if not path.is_file():
        raise table.error(key, f"names {text}, which does not exist (looked for {path})")
    return path


def tls_settings(table: Table | None, base: Path, relay_url: str) -> TlsSettings:
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


def _rule(table: Table) -> ApproverRule:
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


def _notify(approver: Table) -> NotifySettings | None:
    table = approver.table("notify", NOTIFY_KEYS)
    if table is None:
        return None
    url = check_http_url(table, "webhook_url", table.required_string("webhook_url").strip())
    kind = table.string("format", "json")
    if kind not in NOTIFY_FORMATS:
        raise table.error("format", f'must be "slack" or "json", not {kind!r}')
    table.finish()
    return NotifySettings(webhook_url=url, format=cast("NotifyFormat", kind))


def approver_settings(table: Table | None, base: Path, agent_id: str) -> ApproverSettings:
    if table is None:
        return ApproverSettings()
    port = check_port(table, "port", DEFAULT_APPROVER_PORT)
    operators_text = table.string("operators")
    operator_keys = allowed_signers(table, "operators", base, agent_id)
    operators = resolve_path(base, operators_text) if operators_text is not None and operator_keys else None
    notify = _notify(table)
    table.known.append("rules")
    raw_rules = table.data.get("rules", [])
    if not isinstance(raw_rules, list) or not all(isinstance(rule, dict) for rule in raw_rules):
        raise table.error("rules", "must be an array of tables ([[approver.rules]])")
    rules = tuple(
        _rule(Table(table.label, rule, f"approver.rules[{index}].", RULE_KEYS))
        for index, rule in enumerate(raw_rules)
    )
    table.finish()
    return ApproverSettings(
        port=port, rules=rules, operators=operators, operator_keys=operator_keys, notify=notify
    )
