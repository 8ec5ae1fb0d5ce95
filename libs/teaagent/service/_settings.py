"""The settings every service shares: read from the environment with pydantic-settings.

``config`` comes from ``TEAAGENT_CONFIG`` (shared by the services and the CLI); a service's own
knobs from ``TEAAGENT_<SERVICE>_<NAME>``, the prefix its subclass sets
(``model_config = SettingsConfigDict(env_prefix="TEAAGENT_RELAY_")``).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from teaagent.config import NodeConfig
from teaagent.errors import ConfigError
from teaagent.store import Keys, node_prefix

__all__ = ["ServiceSettings", "StoreSettings"]


class ServiceSettings(BaseSettings):
    """A service's settings, read from the environment; unknown names are refused.

    Attributes:
        config: The node configuration file (``node.toml``); required.
    """

    model_config = SettingsConfigDict(populate_by_name=True, extra="forbid")

    config: str | None = Field(default=None, validation_alias="TEAAGENT_CONFIG")


class StoreSettings(ServiceSettings):
    """The settings of a service that keeps the node's state in its Redis (the relay, the approver).

    Attributes:
        redis_prefix: The key prefix of this node's store; ``ta:<agent_id>`` when None. Tests and
            demos that put several nodes on one Redis give each its own.
    """

    redis_prefix: str | None = None

    def store_prefix(self, config: NodeConfig) -> str:
        """The key prefix of the node's store: ``redis_prefix``, else the node's own.

        Raises:
            ConfigError: ``redis_prefix`` is malformed (named by its environment variable).
        """
        prefix = self.redis_prefix or node_prefix(config.agent_id)
        try:
            Keys(prefix)
        except ValueError as exc:
            name = f"{self.model_config.get('env_prefix', '')}REDIS_PREFIX"
            raise ConfigError(f"{name} is not usable: {exc}.") from exc
        return prefix
