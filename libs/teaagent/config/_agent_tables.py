"""``[agent]``, ``[agent.rate_limits]``, ``[models.NAME]`` and ``[mcp]``: what the node's agent runs with."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Final

from teaagent.config._model import (
    DEFAULT_AGENT_HOST,
    DEFAULT_AGENT_PORT,
    DEFAULT_PROVIDER,
    MCP_UPSTREAM_NAME_PATTERN,
    MODEL_NAME_PATTERN,
    AgentSettings,
    McpSettings,
    McpUpstream,
    ModelSettings,
)
from teaagent.config._table import Table, check_http_url, check_port, resolve_path
from teaagent.errors import ConfigError
from teaagent.policy import (
    PermissionMode,
)
from teaagent.tools import ToolRateLimit
from teaagent.tools._ratelimit import gcra_parameters

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


def _agent_script(table: Table, base: Path, provider: str) -> str | None:
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

    return script if script in BUNDLED_SCRIPTS else str(resolve_path(base, script))


def agent_settings(table: Table | None, base: Path) -> AgentSettings:
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
    port = check_port(table, "port", DEFAULT_AGENT_PORT)
    host = table.string("host", DEFAULT_AGENT_HOST)
    assert host is not None
    if not host.strip():
        raise table.error("host", "is empty")
    model = table.string("model")
    if model is not None and not model.strip():
        raise table.error("model", "is empty")
    base_url = table.string("base_url")
    if base_url is not None:
        base_url = check_http_url(table, "base_url", base_url.strip())
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


def model_settings(table: Table | None) -> dict[str, ModelSettings]:
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
            base_url = check_http_url(entry, "base_url", base_url.strip())
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


def _rate_limits(table: Table | None) -> dict[str, ToolRateLimit]:
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


def mcp_settings(table: Table | None) -> McpSettings:
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
            url = check_http_url(entry, "url", url.strip())
            if env:
                raise entry.error("env", "only applies to a command, not to a url")
        elif not command or not command[0].strip():
            raise entry.error("command", 'must name a program to run, as in ["python", "server.py"]')
        entry.finish()
        upstreams[name] = McpUpstream(name=name, command=tuple(command), env=env, url=url)
    upstreams_table.finish()
    return McpSettings(upstreams=upstreams)
