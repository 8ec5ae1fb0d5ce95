"""Reading and checking a node configuration file; every mistake is one sentence naming file and key.

Here: the file's top level and the whole it makes. Its tables are read by :mod:`._table` (the
sentences), and checked by the modules of their sections: :mod:`._agent_tables` (``[agent]``,
``[models]``, ``[mcp]``), :mod:`._peer_tables` (``[peers]``, ``[quorum]``) and
:mod:`._service_tables` (``[tls]``, ``[approver]``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from teaagent._files import expand_home
from teaagent._urls import shown_url, split_url
from teaagent.config._agent_tables import AGENT_KEYS, MCP_KEYS, agent_settings, mcp_settings, model_settings
from teaagent.config._model import (
    MIN_TOKEN_CHARS,
    NodeConfig,
    read_public_key_of_private_key_file,
)
from teaagent.config._peer_tables import QUORUM_KEYS, holds_a_public_key, peer_settings, quorum_settings
from teaagent.config._service_tables import APPROVER_KEYS, TLS_KEYS, approver_settings, tls_settings
from teaagent.config._table import (
    Table,
    check_agent_id,
    check_http_url,
    parse_key,
    read_toml,
    resolve_path,
)
from teaagent.errors import ConfigError
from teaagent.signing import SSHPublicKey

__all__ = ["CONFIG_ENV_VAR", "load_config"]

CONFIG_ENV_VAR: Final = "TEAAGENT_CONFIG"
EMBEDDED_REDIS: Final = "embedded"
REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
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
    file = expand_home(path).absolute()
    base = file.parent
    root = Table(label, read_toml(label, file), allowed=ROOT_KEYS)

    agent_id = check_agent_id(label, "agent_id", root.required_string("agent_id"))
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
        private_key = resolve_path(base, private_text)
        try:
            found = private_key.is_file()
        except OSError:  # no file can have that name (too long...)
            found = False
        if not found:
            raise ConfigError(
                f"{label}: private_key {private_text} does not exist (looked for {private_key})."
            )
        if holds_a_public_key(private_key):
            raise ConfigError(
                f"{label}: private_key {private_text} is the public half of the key; "
                "name the private key file (the one without .pub)."
            )
        own_key = read_public_key_of_private_key_file(private_key)
    else:
        assert public_text is not None
        public_text = public_text.strip()
        own_key = parse_key(root, "public_key", public_text)

    redis_url = root.string("redis_url", EMBEDDED_REDIS)
    assert redis_url is not None
    redis_parts = split_url(redis_url)
    if redis_url != EMBEDDED_REDIS and (redis_parts is None or redis_parts.scheme not in REDIS_SCHEMES):
        raise root.error(
            "redis_url",
            f'must be "embedded" or a redis://, rediss:// or unix:// URL, not {shown_url(redis_url)!r}',
        )
    redis_cluster = root.boolean("redis_cluster", False)
    if redis_cluster and redis_url == EMBEDDED_REDIS:
        raise ConfigError(
            f'{label}: redis_cluster = true needs redis_url to name a node of the cluster: "embedded" '
            "is one private server, never a cluster."
        )
    if redis_cluster and redis_parts is not None and redis_parts.scheme == "unix":
        raise ConfigError(
            f"{label}: redis_cluster = true needs a redis:// or rediss:// redis_url: a cluster's nodes "
            "are reached over TCP, not unix://."
        )
    if redis_cluster and redis_parts is not None and redis_parts.path not in ("", "/", "/0"):
        raise ConfigError(
            f"{label}: redis_cluster = true needs database 0 in redis_url: a cluster has no other."
        )
    relay_url = check_http_url(
        root, "relay_url", root.required_string("relay_url").strip(), credentials=False
    )
    workspace = resolve_path(base, root.string("workspace", "workspace") or "workspace")
    data_dir_text = root.string("data_dir", f".teaagent-{agent_id}")
    assert data_dir_text is not None
    if not data_dir_text.strip():
        raise root.error("data_dir", "is empty")
    data_dir = resolve_path(base, data_dir_text)
    token = root.string("token")
    if token is not None and len(token.strip()) < MIN_TOKEN_CHARS:
        raise root.error("token", f"must be at least {MIN_TOKEN_CHARS} characters long")

    agent = agent_settings(root.table("agent", AGENT_KEYS), base)
    peers = peer_settings(root, agent_id, base)
    quorum = quorum_settings(root.table("quorum", QUORUM_KEYS), peers, relay_url)
    approver = approver_settings(root.table("approver", APPROVER_KEYS), base, agent_id)
    models = model_settings(root.table("models"))
    tls = tls_settings(root.table("tls", TLS_KEYS), base, relay_url)
    mcp = mcp_settings(root.table("mcp", MCP_KEYS))
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
