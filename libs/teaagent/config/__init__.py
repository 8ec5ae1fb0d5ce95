"""The node configuration file (ARCHITECTURE.md, Node configuration): TOML, checked in full when loaded.

``load_config(path)`` (or ``load_config(None)`` for ``$TEAAGENT_CONFIG``) returns a frozen
:class:`NodeConfig`; every mistake is a :class:`~teaagent.errors.ConfigError` whose one sentence
names the file and the key, such as
``alpha.toml: quorum.required_approvals is 4 but only 3 peers are configured.``
"""

from __future__ import annotations

from teaagent.config._load import CONFIG_ENV_VAR, load_config
from teaagent.config._model import (
    DEFAULT_AGENT_HOST,
    DEFAULT_AGENT_PORT,
    DEFAULT_APPROVER_PORT,
    DEFAULT_PROVIDER,
    MIN_TOKEN_CHARS,
    MODEL_NAME_PATTERN,
    TOKEN_FILE_NAME,
    AgentSettings,
    ApproverRule,
    ApproverSettings,
    Decision,
    ModelSettings,
    NodeConfig,
    NotifyFormat,
    NotifySettings,
    PeerConfig,
    TlsSettings,
)
from teaagent.errors import ConfigError

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_AGENT_HOST",
    "DEFAULT_AGENT_PORT",
    "DEFAULT_APPROVER_PORT",
    "DEFAULT_PROVIDER",
    "MIN_TOKEN_CHARS",
    "MODEL_NAME_PATTERN",
    "TOKEN_FILE_NAME",
    "AgentSettings",
    "ApproverRule",
    "ApproverSettings",
    "ConfigError",
    "Decision",
    "ModelSettings",
    "NodeConfig",
    "NotifyFormat",
    "NotifySettings",
    "PeerConfig",
    "TlsSettings",
    "load_config",
]
