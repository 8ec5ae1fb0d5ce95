"""The node configuration as frozen dataclasses (ARCHITECTURE.md, Node configuration)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import secrets
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Final, Literal

from teaagent.errors import ConfigError, SignatureError
from teaagent.policy import MultiSigQuorumConfig, PermissionMode
from teaagent.signing import (
    AgentSigner,
    Signer,
    SSHPublicKey,
    load_private_key,
    parse_public_key,
    public_key_from_blob,
)
from teaagent.tools import ToolRateLimit
from teaagent.trust import SignerKey, unique_keys

Decision = Literal["approve", "deny", "ask"]
NotifyFormat = Literal["slack", "json"]

DEFAULT_AGENT_PORT: Final = 8700
DEFAULT_AGENT_HOST: Final = "127.0.0.1"  # the agent runs tools: loopback unless the file says otherwise
#: A ``[models.NAME]`` name: it is a path segment of the agent service's ``/models/{name}``.
MODEL_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
#: An ``[mcp.upstreams.NAME]`` name: the prefix of its tools' names, so it holds no ``.``.
MCP_UPSTREAM_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
DEFAULT_APPROVER_PORT: Final = 8703
DEFAULT_PROVIDER: Final = "scripted"  # runs without any API key, so a fresh node works offline
MIN_TOKEN_CHARS: Final = 16  # a shorter bearer token is within reach of guessing
TOKEN_FILE_NAME: Final = "token"  # noqa: S105 - a file name, not a secret
TOKEN_BYTES: Final = 32  # 256 bits from the OS's CSPRNG
MAX_TOKEN_FILE_BYTES: Final = 4096  # a token, not a document

PASSPHRASE_ENV_VAR: Final = "TEAAGENT_KEY_PASSPHRASE"  # noqa: S105 - a variable name; unlocks the key without a prompt
_OPENSSH_KEY_MAGIC: Final = b"openssh-key-v1\x00"


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """The ``[agent]`` table: how this node's agent service runs.

    Attributes:
        permission_mode: What the agent may do locally without asking.
        provider: The LLM provider name (see :mod:`teaagent.llm`).
        model: The provider's model to run; None for the provider's default. ``teaagent run
            --model`` overrides it.
        base_url: The provider's API base URL (a proxy, a local OpenAI-compatible server); None
            for the provider's ``*_BASE_URL`` variable, else its public URL. It wins over the
            variable: the file is the node's own record of where its prompts go.
        script: For the ``scripted`` provider, the script it plays: a bundled script's name
            (``quorum``...) or a file's absolute path; None for ``$TEAAGENT_LLM_SCRIPT``, else the
            bundled ``demo``. ``--script`` overrides it.
        port: The agent service's TCP port.
        host: The address the agent service listens on (loopback unless set).
        rate_limits: ``[agent.rate_limits]``: a limit per tool name, counted in the node's Redis so
            that every agent process of the node shares it.
    """

    permission_mode: PermissionMode = PermissionMode.PROMPT
    provider: str = DEFAULT_PROVIDER
    model: str | None = None
    base_url: str | None = None
    script: str | None = None
    port: int = DEFAULT_AGENT_PORT
    host: str = DEFAULT_AGENT_HOST
    rate_limits: Mapping[str, ToolRateLimit] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """One ``[models.NAME]`` table: a model the agent service may run with, besides ``[agent] provider``.

    The keys are those of the agent HTTP API's ``ModelCreate``, so what ``POST /models`` writes is
    what this reads. The provider follows from them: ``anthropic = true`` is Anthropic's API (at
    ``base_url`` when set), another ``base_url`` an OpenAI-compatible server, the model id
    ``scripted`` the offline scripted provider, anything else OpenAI.

    Attributes:
        name: The table's name (:data:`MODEL_NAME_PATTERN`).
        model: The model id sent to the provider.
        token: The API key; None to read the provider's variable (``OPENAI_API_KEY``...). Kept out of
            the repr.
        display_model: A name to show instead of the id.
        base_url: The API's base URL, or None for the provider's own.
        anthropic: Speak Anthropic's Messages API.
        responses_api: Kept for the file's sake: the OpenAI adapter speaks Chat Completions.
        multimodal: The model takes images.
        context_window: Its context window in tokens; None for the provider's usual size.
        compact_percent: How full the window may get (percent) before a session is compacted.
        reasoning_efforts: The reasoning efforts it offers, in order.
    """

    name: str
    model: str
    token: str | None = field(default=None, repr=False)
    display_model: str | None = None
    base_url: str | None = None
    anthropic: bool = False
    responses_api: bool = False
    multimodal: bool = False
    context_window: int | None = None
    compact_percent: float | None = None
    reasoning_efforts: tuple[str, ...] = ()

    @property
    def provider(self) -> str:
        """The provider of :mod:`teaagent.llm` that serves it."""
        if self.anthropic:
            return "anthropic"
        if self.base_url is not None:
            return "openai-compatible"
        return "scripted" if self.model == "scripted" else "openai"


@dataclass(frozen=True, kw_only=True)
class PeerConfig:
    """One ``[peers.NAME]`` table: a peer node's identity and mailbox.

    Attributes:
        agent_id: The peer's name (the table's name).
        public_key: Its node key's OpenSSH public key line (the first of ``keys``).
        relay_url: Its relay's base URL.
        keys: Every key that may sign for it (PROTOCOL.md "Keys of a peer"): ``public_key``, then
            ``public_keys``, then the lines of its ``allowed_signers`` file whose principals include
            its name, each with that line's namespaces and validity. It counts once whichever signed.
    """

    agent_id: str
    public_key: str
    relay_url: str
    keys: tuple[SignerKey, ...] = ()

    def __post_init__(self) -> None:
        """Default ``keys`` to the node key alone."""
        if not self.keys:
            object.__setattr__(
                self, "keys", (SignerKey(line=self.public_key, source=f"peers.{self.agent_id}"),)
            )


@dataclass(frozen=True, kw_only=True)
class ApproverRule:
    """One ``[[approver.rules]]`` entry: an automatic decision for matching requests.

    A rule matches when ``fnmatch.fnmatchcase(tool_name, tool)`` holds and, for every entry of
    ``arguments``, the call has that argument, it is a string, and it matches the pattern. Patterns
    are shell-style: ``*`` matches any text, spaces, ``;`` and newlines included, so
    ``{command = "echo *"}`` also matches ``echo hi; rm -rf /``: put narrow ``deny`` rules first.

    Attributes:
        tool: fnmatch pattern on the tool name.
        arguments: fnmatch patterns on string arguments, by argument name.
        decision: ``approve``, ``deny`` or ``ask`` (leave it to an operator).
        reason: The reason a ``deny`` decision signs; informative for the others.
    """

    tool: str
    arguments: Mapping[str, str] = field(default_factory=dict)
    decision: Decision
    reason: str = ""

    def matches(self, tool_name: str, arguments: Mapping[str, Any]) -> bool:
        """Return whether this rule applies to the call ``tool_name(arguments)``."""
        if not fnmatchcase(tool_name, self.tool):
            return False
        for name, pattern in self.arguments.items():
            value = arguments.get(name)
            if not isinstance(value, str) or not fnmatchcase(value, pattern):
                return False
        return True


@dataclass(frozen=True, kw_only=True)
class NotifySettings:
    """``[approver] notify``: where to post each request that waits for an operator.

    Attributes:
        webhook_url: The http(s) URL to POST to (a Slack incoming webhook, or any receiver). It may
            hold a secret (Slack's do), so it is left out of the repr.
        format: ``slack`` (a Slack message) or ``json`` (the request's fields as one object).
    """

    webhook_url: str = field(repr=False)
    format: NotifyFormat = "json"


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """The ``[tls]`` table: HTTPS for the relay, and whom this node trusts for ``https://`` relays.

    Attributes:
        cert: The relay's certificate chain (PEM), or None: ``teaagent relay serve`` then speaks
            plain HTTP (behind a TLS proxy, or on loopback).
        key: The private key of ``cert`` (PEM, unencrypted), or None without ``cert``.
        ca: CA certificates (PEM) that every ``https://`` relay URL of this node (its own and its
            peers') is verified against, instead of the public CAs; None for the public CAs.
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    def client_verify(self) -> ssl.SSLContext | bool:
        """What an HTTP client of a relay verifies the server's certificate with (httpx ``verify=``).

        Returns:
            A context that trusts ``ca`` alone, or True (httpx's public CAs) without ``ca``.

        Raises:
            ConfigError: ``ca`` can no longer be read as PEM certificates.
        """
        if self.ca is None:
            return True
        try:
            return ssl.create_default_context(cafile=str(self.ca))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls.ca {self.ca} holds no usable CA certificate: {exc}.") from exc


@dataclass(frozen=True, kw_only=True)
class ApproverSettings:
    """The ``[approver]`` table: the approver service's port and its rules, first match wins.

    Attributes:
        port: The approver service's TCP port.
        rules: The rules, in file order.
        operators: The ``allowed_signers`` file of this node's operators (principal = this node's
            agent id): keys that may sign for this node besides its node key. None for none.
        operator_keys: The keys read from ``operators``, in file order.
        notify: Where requests waiting for an operator are announced; None for nowhere.
    """

    port: int = DEFAULT_APPROVER_PORT
    rules: tuple[ApproverRule, ...] = ()
    operators: Path | None = None
    operator_keys: tuple[SignerKey, ...] = ()
    notify: NotifySettings | None = None

    def first_matching_rule(self, tool_name: str, arguments: Mapping[str, Any]) -> ApproverRule | None:
        """Return the first rule that matches the call, or None when none does."""
        for rule in self.rules:
            if rule.matches(tool_name, arguments):
                return rule
        return None

    def decision_for(self, tool_name: str, arguments: Mapping[str, Any]) -> Decision:
        """Return the decision of the first matching rule, ``ask`` when none matches."""
        rule = self.first_matching_rule(tool_name, arguments)
        return "ask" if rule is None else rule.decision


@dataclass(frozen=True, kw_only=True)
class McpUpstream:
    """One ``[mcp.upstreams.NAME]`` table: an MCP server that ``teaagent mcp gateway`` fronts.

    Exactly one of ``command`` and ``url`` is set.

    Attributes:
        name: The table's name; the gateway lists the upstream's tools as ``NAME.TOOL``.
        command: The program and its arguments, started as a stdio MCP server; empty with ``url``.
        env: Variables set for ``command`` on top of the SDK's minimal environment (left out of
            the repr: they may hold API keys).
        url: The upstream's streamable HTTP endpoint, or None with ``command``.
    """

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    url: str | None = None


@dataclass(frozen=True, kw_only=True)
class McpSettings:
    """The ``[mcp]`` table.

    Attributes:
        upstreams: The ``[mcp.upstreams.*]`` tables, by name, in file order.
    """

    upstreams: Mapping[str, McpUpstream] = field(default_factory=dict)


def read_public_key_of_private_key_file(path: Path) -> SSHPublicKey | None:
    """Read the public half stored in the clear in an OpenSSH private key file.

    The ``openssh-key-v1`` format keeps each public key unencrypted before the (possibly
    passphrase-protected) private section, so the node's identity is known without its passphrase.

    Args:
        path: The private key file.

    Returns:
        The public key, or None when the file is not an ``openssh-key-v1`` file (a PEM key, say)
        or cannot be read.
    """
    try:
        text = path.read_text(encoding="ascii")
        body = "".join(line for line in text.splitlines() if line and not line.startswith("-----"))
        blob = base64.b64decode(body, validate=True)
    except (OSError, UnicodeDecodeError, binascii.Error, ValueError):
        return None
    if not blob.startswith(_OPENSSH_KEY_MAGIC):
        return None
    offset = len(_OPENSSH_KEY_MAGIC)
    try:
        for _ in range(3):  # cipher name, KDF name, KDF options
            offset += 4 + int.from_bytes(blob[offset : offset + 4], "big")
        offset += 4  # the number of keys; the first public key follows
        length = int.from_bytes(blob[offset : offset + 4], "big")
        key_blob = blob[offset + 4 : offset + 4 + length]
        if len(key_blob) != length or length == 0:
            return None
        return public_key_from_blob(key_blob)
    except SignatureError:
        return None


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    """One node's configuration file, loaded and checked by :func:`load_config`.

    Paths are absolute, resolved against the configuration file's folder.

    Attributes:
        path: The configuration file.
        agent_id: This node's name.
        private_key: The OpenSSH private key file, or None when the key is held by ssh-agent.
        public_key: The public key line of an ssh-agent-held key, or None with ``private_key``.
        redis_url: ``redis://...`` (or ``rediss://``, ``unix://``), or ``embedded`` for a private
            server started on demand.
        redis_cluster: Whether ``redis_url`` names one node of a Redis Cluster (``redis_cluster =
            true``); the store then uses redis-py's cluster client.
        relay_url: This node's relay base URL.
        workspace: The agent's workspace root.
        data_dir: State, audit logs and the generated token.
        token: The bearer token from the file, or None to use the generated one (see :meth:`load_token`).
        agent: The ``[agent]`` table.
        quorum: The ``[quorum]`` table with the ``[peers.*]`` tables; disabled when there is no ``[quorum]``.
        peers: The ``[peers.*]`` tables, by agent id, in file order.
        approver: The ``[approver]`` table.
        models: The ``[models.*]`` tables, by name, in file order.
        tls: The ``[tls]`` table (no certificate, public CAs when absent).
        mcp: The ``[mcp]`` table (no upstreams when absent).
    """

    path: Path
    agent_id: str
    private_key: Path | None
    public_key: str | None
    redis_url: str = field(repr=False)  # may carry a password
    redis_cluster: bool = False
    relay_url: str
    workspace: Path
    data_dir: Path
    token: str | None = field(repr=False)
    agent: AgentSettings
    quorum: MultiSigQuorumConfig
    peers: Mapping[str, PeerConfig]
    approver: ApproverSettings
    models: Mapping[str, ModelSettings] = field(default_factory=dict)
    tls: TlsSettings = field(default_factory=TlsSettings)
    mcp: McpSettings = field(default_factory=McpSettings)

    @property
    def uses_embedded_redis(self) -> bool:
        """Whether ``redis_url`` asks for a private Redis server started on demand."""
        return self.redis_url == "embedded"

    @property
    def token_path(self) -> Path:
        """Where the generated token lives."""
        return self.data_dir / TOKEN_FILE_NAME

    def own_public_key(self) -> SSHPublicKey:
        """Return this node's public key, without needing the private key's passphrase.

        Returns:
            The key of ``public_key``, or the public half stored in ``private_key``'s file (or in
            its ``.pub`` file, for a PEM key).

        Raises:
            ConfigError: The key cannot be read.
        """
        if self.public_key is not None:
            return parse_public_key(self.public_key)
        assert self.private_key is not None  # load_config guarantees exactly one of the two
        key = read_public_key_of_private_key_file(self.private_key)
        if key is not None:
            return key
        pub = self.private_key.with_name(self.private_key.name + ".pub")
        try:
            return parse_public_key(pub.read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError, SignatureError) as exc:
            raise ConfigError(
                f"{self.path}: the public key of private_key {self.private_key} cannot be read "
                f"from the key file or from {pub.name}."
            ) from exc

    def signer(self, passphrase: str | None = None) -> Signer:
        """Return what signs as this node: the loaded private key, or the ssh-agent holding ``public_key``.

        Args:
            passphrase: The private key's passphrase; ``$TEAAGENT_KEY_PASSPHRASE`` when None.

        Returns:
            A :class:`~teaagent.signing.Signer`.

        Raises:
            ConfigError: The private key cannot be loaded (missing passphrase, wrong passphrase...).
            SignatureError: The key is held by ssh-agent and ``SSH_AUTH_SOCK`` is not set.
        """
        if self.private_key is None:
            assert self.public_key is not None  # load_config guarantees exactly one of the two
            return AgentSigner(self.public_key)
        if passphrase is None:
            passphrase = os.environ.get(PASSPHRASE_ENV_VAR) or None
        return load_private_key(self.private_key, passphrase)

    def own_keys(self) -> tuple[SignerKey, ...]:
        """Return the keys that may sign for this node: its node key first, then its operators' keys.

        The node's relay accepts a decision on its inbox only from one of these, and its approver
        records and forwards only decisions they signed.

        Raises:
            ConfigError: The node's own public key cannot be read.
        """
        node_key = SignerKey(line=self.own_public_key().to_line(), source=f"{self.path.name}: the node key")
        return unique_keys((node_key, *self.approver.operator_keys))

    def public_key_of(self, agent_id: str) -> str | None:
        """Return the public key line of this node or of a configured peer, None for anyone else."""
        if agent_id == self.agent_id:
            return self.own_public_key().to_line()
        peer = self.peers.get(agent_id)
        return None if peer is None else peer.public_key

    def load_token(self) -> str:
        """Return the bearer token shared by this node's services and CLI.

        When the file sets ``token`` that is the token. Otherwise it is read from
        ``data_dir/token``, which is generated on first use (256 random bits, mode 0600, in a
        mode-0700 folder) and reused afterwards. Concurrent first uses agree on one token: each
        writes a private temporary file and links it into place, and the losers read the winner's.

        Returns:
            The token.

        Raises:
            ConfigError: The token file is readable or writable by other users, is empty, or
                cannot be read or written.
        """
        if self.token is not None:
            return self.token
        path = self.token_path
        try:
            return self._read_token(path)
        except FileNotFoundError:
            pass
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.data_dir / f".{TOKEN_FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                with os.fdopen(descriptor, "w", encoding="ascii") as handle:
                    handle.write(secrets.token_urlsafe(TOKEN_BYTES) + "\n")
                    handle.flush()
                    os.fsync(handle.fileno())
                # Losing the race is fine: the winner's token is the token.
                with contextlib.suppress(FileExistsError):
                    os.link(temporary, path)
            finally:
                temporary.unlink(missing_ok=True)
            return self._read_token(path)
        except OSError as exc:
            raise ConfigError(
                f"{self.path}: cannot create the token file {path}: {exc.strerror or exc}."
            ) from exc

    def _read_token(self, path: Path) -> str:
        try:
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ConfigError(
                f"{self.path}: cannot read the token file {path}: {exc.strerror or exc}."
            ) from exc
        with os.fdopen(descriptor, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if stat.S_IMODE(mode) & 0o077:
                raise ConfigError(
                    f"{self.path}: the token file {path} is accessible by other users; run chmod 600 {path}."
                )
            token = handle.read(MAX_TOKEN_FILE_BYTES).decode("ascii", "replace").strip()
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{self.path}: the token file {path} holds fewer than {MIN_TOKEN_CHARS} characters; "
                "delete it to generate a new token."
            )
        return token
