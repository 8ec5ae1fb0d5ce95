"""The models a run may use, the permissions it may start with, and the adapters that speak to them.

Models: the ``[agent] provider`` of node.toml is always one, named after the provider (``scripted``
on a fresh node, which runs offline); each ``[models.NAME]`` table adds one (a table of the same
name replaces it). A model is *ready* when its adapter can be made: its API key is in the table
(``token``) or in the provider's variable, or the provider needs none.

Permissions name the node's permission modes (``teaagent.policy``) as the HTTP API's seed does:

=========  ======================  ===================================================
name       mode                    what runs without an approval
=========  ======================  ===================================================
``deny``   ``read-only``           reads only; every other call is refused
``safe``   ``workspace-write``     reads and writes inside the workspace; shell refused
``ask``    ``prompt``              reads; writes and shell go to the run's approvals
``auto``   ``allow``               reads and writes; shell goes to the run's approvals
=========  ======================  ===================================================

A node configured with ``danger-full-access`` starts with that mode and shows it as ``auto``. A
high-risk call needs the peers' quorum whatever the permission.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from teaagent.config import NodeConfig
from teaagent.errors import MissingAPIKeyError
from teaagent.llm import (
    BUNDLED_SCRIPTS,
    PROVIDER_CONFIGS,
    SCRIPT_PATH_ENV,
    LLMAdapter,
    ScriptedAdapter,
    create_llm_adapter,
)
from teaagent.policy import PermissionMode

__all__ = [
    "DEFAULT_COMPACT_PERCENT",
    "MODES_BY_PERMISSION",
    "ModelEntry",
    "make_adapter",
    "models_of",
    "permission_of",
]

DEFAULT_COMPACT_PERCENT: Final = 80.0
#: The usual context window of each provider's models, when a table does not say.
DEFAULT_CONTEXT_WINDOWS: Final = {
    "openai": 128_000,
    "anthropic": 200_000,
    "openai-compatible": 32_768,
    "scripted": 128_000,
}
MODES_BY_PERMISSION: Final = {
    "deny": PermissionMode.READ_ONLY,
    "safe": PermissionMode.WORKSPACE_WRITE,
    "ask": PermissionMode.PROMPT,
    "auto": PermissionMode.ALLOW,
}


def permission_of(mode: PermissionMode) -> str:
    """The permission name of a mode (``danger-full-access`` reads as ``auto``)."""
    for name, known in MODES_BY_PERMISSION.items():
        if known is mode:
            return name
    return "auto"


@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """One model a run may use.

    Attributes:
        name: Its name (the ``[models.NAME]`` table, or the ``[agent] provider``).
        model: The model id sent to the provider.
        provider: The :mod:`teaagent.llm` provider.
        context_window: Its window in tokens.
        multimodal: Whether it takes images.
        efforts: The reasoning efforts it offers.
        compact_percent: How full the window may get before the session is compacted.
        token: The API key of the table, or None for the provider's variable.
        base_url: The API's base URL of the table, or None.
        builtin: It is the ``[agent] provider`` (not a table: it cannot be changed or removed here).
        script: The ``[agent] script`` the built-in ``scripted`` model plays, or None.
    """

    name: str
    model: str
    provider: str
    context_window: int
    multimodal: bool
    efforts: tuple[str, ...]
    compact_percent: float
    token: str | None = None
    base_url: str | None = None
    builtin: bool = False
    script: str | None = None

    def environment(self) -> Mapping[str, str]:
        """The environment its adapter is made with: the process's, with the table's key and URL."""
        config = PROVIDER_CONFIGS[self.provider]
        overrides = {}
        if self.token is not None and config.api_key_env:
            overrides[config.api_key_env] = self.token
        if self.base_url is not None and config.base_url_env:
            overrides[config.base_url_env] = self.base_url
        # A view, not a copy: a run starts with this, and os.environ holds a hundred variables.
        return collections.ChainMap(overrides, os.environ) if overrides else os.environ

    def ready(self) -> bool:
        """Whether its API key is known (or not needed), so that a run can start."""
        try:
            PROVIDER_CONFIGS[self.provider].resolve_api_key(self.environment())
        except MissingAPIKeyError:
            return False
        return True


def models_of(node: NodeConfig) -> list[ModelEntry]:
    """The node's models: the ``[agent] provider`` first (unless a table takes its name), then the tables."""
    entries: list[ModelEntry] = []
    provider = node.agent.provider
    if provider not in node.models and provider in PROVIDER_CONFIGS:
        entries.append(
            ModelEntry(
                name=provider,
                model=node.agent.model or PROVIDER_CONFIGS[provider].default_model,
                provider=provider,
                context_window=DEFAULT_CONTEXT_WINDOWS.get(provider, 128_000),
                multimodal=False,
                efforts=(),
                compact_percent=DEFAULT_COMPACT_PERCENT,
                builtin=True,
                base_url=node.agent.base_url,  # [agent] base_url, over the provider's variable
                script=node.agent.script,
            )
        )
    for table in node.models.values():
        entries.append(
            ModelEntry(
                name=table.name,
                model=table.model,
                provider=table.provider,
                context_window=table.context_window or DEFAULT_CONTEXT_WINDOWS[table.provider],
                multimodal=table.multimodal,
                efforts=table.reasoning_efforts,
                compact_percent=table.compact_percent or DEFAULT_COMPACT_PERCENT,
                token=table.token,
                base_url=table.base_url,
            )
        )
    return entries


_SCRIPTS: dict[tuple[str, int, int, int], tuple[Any, ...]] = {}
_SCRIPTS_LOCK = threading.Lock()


def _scripted(model: str, script_path: str | None) -> LLMAdapter | None:
    """A fresh scripted adapter from a script read once per version of its file (None: no file named)."""
    path = script_path or os.environ.get(SCRIPT_PATH_ENV, "").strip()
    if not path or path in BUNDLED_SCRIPTS:
        return None  # the factory plays the bundled ones
    try:
        info = os.stat(path)
    except OSError:
        return None  # the factory says why, in its own sentence
    key = (path, info.st_ino, info.st_mtime_ns, info.st_size)
    with _SCRIPTS_LOCK:
        turns = _SCRIPTS.get(key)
    if turns is None:
        turns = ScriptedAdapter.from_file(Path(path), model=model).turns
        with _SCRIPTS_LOCK:
            _SCRIPTS.clear()  # one script at a time in practice; never a growing cache
            _SCRIPTS[key] = turns
    return ScriptedAdapter(turns, model=model, source=path)


def make_adapter(
    entry: ModelEntry, *, script_path: str | None, environ: Mapping[str, str] | None = None
) -> LLMAdapter:
    """Make a fresh adapter of ``entry`` (a scripted one starts its script from the first turn).

    Args:
        entry: The model.
        script_path: The script the ``scripted`` provider plays (a bundled name or a file); None
            for the entry's ``[agent] script``, else ``$TEAAGENT_LLM_SCRIPT``, else the bundled demo.
        environ: The environment; ``entry.environment()`` when None.

    Raises:
        MissingAPIKeyError: The provider needs a key that is nowhere.
        ConfigError: The script cannot be read, or a base URL is not http(s).
        ValueError: The provider is unknown.
    """
    script_path = script_path or entry.script
    if entry.provider == "scripted":
        adapter = _scripted(entry.model, script_path)
        if adapter is not None:
            return adapter
    return create_llm_adapter(
        entry.provider,
        entry.model,
        environ=entry.environment() if environ is None else environ,
        script_path=script_path,
    )
