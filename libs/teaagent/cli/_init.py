"""``teaagent init``: scaffold a node (its key, its node.toml, its data folder), or a whole local cluster.

One node, in ``DIR``::

    DIR/node.toml          the configuration, commented
    DIR/keys/<id>          its ed25519 key, made by ssh-keygen (and keys/<id>.pub)
    DIR/data/              state, audit logs and the bearer token (mode 0700, the token 0600)
    DIR/workspace/         the agent's workspace root

``--cluster alpha,beta,gamma DIR`` makes one such folder per node (``DIR/alpha/`` ...) whose
configurations already name each other as peers (keys and relay URLs), with the quorum on.

Ports: each node takes three consecutive ports from ``--base-port`` (or ``$TEAAGENT_BASE_PORT``;
8700 by default: agent, relay, approver), the
next node the three after. On a loopback host the block is moved up until every port is free.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
import ssl
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Final

import typer

from teaagent._files import expand_home
from teaagent._urls import shown_url, split_url
from teaagent.cli._exit import bad_usage
from teaagent.config import load_config
from teaagent.errors import ConfigError
from teaagent.policy import AGENT_ID_PATTERN, PermissionMode

__all__ = ["DEFAULT_BASE_PORT", "PORTS_PER_NODE", "NodePlan", "init", "plan_cluster", "required_for"]

DEFAULT_BASE_PORT: Final = 8700
PORTS_PER_NODE: Final = 3  # agent, relay, approver
HIGH_RISK_PATTERNS: Final = ("shell.*", "fs.delete")
MAX_PORT_SEARCH: Final = 1000  # how far up a loopback cluster's block of ports may move


@dataclass(frozen=True)
class NodePlan:
    """One node to scaffold: its id, folder and ports."""

    name: str
    folder: Path
    host: str
    agent_port: int
    relay_port: int
    approver_port: int
    relay_url: str

    @property
    def config_path(self) -> Path:
        return self.folder / "node.toml"

    @property
    def key_path(self) -> Path:
        return self.folder / "keys" / self.name


def required_for(peers: int) -> int:
    """Approvals a cluster's high-risk call needs by default: half the peers, rounded up (1 of 2, 2 of 3)."""
    return max(1, (peers + 1) // 2)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", port))
        except OSError:
            return False
    return True


def _first_free_block(host: str, base: int, count: int) -> int:
    for start in range(base, base + MAX_PORT_SEARCH):
        if start + count - 1 > 65535:
            break
        if all(_port_free(host, port) for port in range(start, start + count)):
            return start
    bad_usage(f"no {count} consecutive free ports from {base} on {host}: pass --base-port.")


def plan_cluster(
    names: Sequence[str],
    directory: Path,
    *,
    host: str,
    base_port: int,
    single: bool = False,
    scheme: str = "http",
) -> list[NodePlan]:
    """Give each node its folder, host and three consecutive ports (moved up to free ones on loopback).

    Raises:
        typer.Exit: Exit code 2: the ports run past 65535, or no free block was found.
    """
    count = len(names) * PORTS_PER_NODE
    hosts = [host.replace("{name}", name) for name in names]
    if base_port + count - 1 > 65535:
        bad_usage(f"--base-port {base_port} leaves no room for {count} ports below 65536.")
    if all(_is_loopback(each) for each in hosts):
        base_port = _first_free_block(hosts[0], base_port, count)
    plans = []
    for index, (name, node_host) in enumerate(zip(names, hosts, strict=True)):
        first = base_port + index * PORTS_PER_NODE
        url_host = f"[{node_host}]" if ":" in node_host else node_host
        plans.append(
            NodePlan(
                name=name,
                folder=directory if single else directory / name,
                host=node_host,
                agent_port=first,
                relay_port=first + 1,
                approver_port=first + 2,
                relay_url=f"{scheme}://{url_host}:{first + 1}",
            )
        )
    return plans


def _keygen(plan: NodePlan) -> str:
    """Make the node's ed25519 key with ssh-keygen; return its public key line.

    Raises:
        typer.Exit: Exit code 2: ssh-keygen is not on PATH, or it failed.
    """
    if shutil.which("ssh-keygen") is None:
        bad_usage("ssh-keygen is not on PATH: install OpenSSH's client tools.")
    plan.key_path.parent.mkdir(parents=True, exist_ok=True)
    plan.key_path.parent.chmod(0o700)
    made = subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"teaagent-{plan.name}",
            "-f",
            str(plan.key_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        bad_usage(f"ssh-keygen could not make {plan.key_path}: {made.stderr.strip() or made.returncode}.")
    return plan.key_path.with_name(plan.name + ".pub").read_text(encoding="utf-8").strip()


def _rules_example(peers: Sequence[str]) -> str:
    """A commented ``[quorum.groups]`` and ``[[quorum.rules]]`` example over these peers (version 2)."""
    names = sorted(peers) or ["beta", "gamma", "delta"]
    ops = names[:-1] or names
    security = names[-1:]
    listed = ", ".join(_toml_string(name) for name in ops)
    return f"""# Per-tool rules (docs/configuration.md, [[quorum.rules]]): first match wins; a high-risk call
# that no rule matches needs required_approvals of all peers. Uncomment to ask more of pushes
# (and add "git.push*" to high_risk_patterns: rules only say what a high-risk call needs):
# [quorum.groups]
# ops = [{listed}]
# security = [{_toml_string(security[0])}]
# [[quorum.rules]]
# pattern = "git.push*"
# all_of = [{{ group = "ops", required = {len(ops)} }}, {{ group = "security", required = 1 }}]
# timeout_seconds = 600
# [[quorum.rules]]
# pattern = "fs.delete"
# required = 1                           # any one peer
"""


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tls_table(cert: Path | None, key: Path | None, ca: Path | None) -> str:
    lines = [
        f"{name} = {_toml_string(str(path))}{note}"
        for name, path, note in (
            ("cert", cert, "  # the relay's certificate chain: relay serve speaks HTTPS"),
            ("key", key, "  # its private key (PEM, mode 0600)"),
            ("ca", ca, "  # the CA that https:// relays are verified against, instead of the public CAs"),
        )
        if path is not None
    ]
    return "\n[tls]\n" + "\n".join(lines) + "\n" if lines else ""


def _node_toml(
    plan: NodePlan,
    *,
    redis_url: str,
    peers: Sequence[tuple[NodePlan, str]],
    required: int,
    tls: str = "",
    permission_mode: str | None = None,
) -> str:
    """The commented node.toml of one node (docs/configuration.md explains every key)."""
    quorum_on = bool(peers)
    peer_tables = "".join(
        f"\n[peers.{peer.name}]\npublic_key = {_toml_string(line)}\n"
        f"relay_url = {_toml_string(peer.relay_url)}\n"
        for peer, line in peers
    )
    redis_note = "  # a private server in data/redis, run by the relay" if redis_url == "embedded" else ""
    # With the quorum on, every destructive tool (shell.run, fs.delete) is high risk: the peers
    # decide it, so the local mode lets it through to them instead of refusing it unattended.
    mode = permission_mode or ("danger-full-access" if quorum_on else "workspace-write")
    mode_note = (
        '  # shell.* and fs.delete still need the quorum; "allow" asks locally too'
        if quorum_on and mode == "danger-full-access"
        else "  # read-only, workspace-write, prompt, allow, danger-full-access"
    )
    if not peers:
        peer_tables = (
            "\n# Peers: add each with `teaagent peers add NAME KEY URL --config node.toml`\n"
            "# (KEY: the peer's public key line or its .pub file; URL: its relay, https:// across hosts).\n"
        )
    patterns = ", ".join(_toml_string(pattern) for pattern in HIGH_RISK_PATTERNS)
    quorum_note = (
        "# a high-risk call runs only after required_approvals peers have signed it"
        if quorum_on
        else "# off until this node has peers: `teaagent peers add ... --quorum N` turns it on"
    )
    return f"""# teaagent node {plan.name!r}, made by `teaagent init`. Every key: docs/configuration.md.
# Relative paths are relative to this file's folder.
agent_id = {_toml_string(plan.name)}
private_key = "keys/{plan.name}"  # OpenSSH private key; `ssh-keygen -p -f keys/{plan.name}` adds a passphrase
redis_url = {_toml_string(redis_url)}{redis_note}
relay_url = {_toml_string(plan.relay_url)}  # this node's relay; its peers reach it here
workspace = "workspace"                  # the agent's workspace root
data_dir = "data"                        # state, audit logs, and the bearer token (data/token, 0600)

[agent]
permission_mode = {_toml_string(mode)}{mode_note}
provider = "scripted"                    # offline; anthropic, openai, openai-compatible: docs/llm.md
# script = "quorum"                      # what scripted plays: demo (default), quorum, denied, question
port = {plan.agent_port}

[quorum]
enabled = {"true" if quorum_on else "false"}  {quorum_note}
required_approvals = {required}
high_risk_patterns = [{patterns}]
timeout_seconds = 120
{_rules_example([peer.name for peer, _line in peers])}{peer_tables}
[approver]                               # this node's signing authority for its peers' requests
port = {plan.approver_port}
# First matching rule wins; a request no rule matches waits for an operator
# (`teaagent approvals list`, `approve ID`, `deny ID`). Patterns are fnmatch's: "*" matches
# anything, spaces and ";" included, so deny narrowly first and approve only what is harmless.
[[approver.rules]]
tool = "shell.run"
arguments = {{ command = "*sudo*" }}
decision = "deny"
reason = "no sudo from an agent"

[[approver.rules]]
tool = "fs.delete"
arguments = {{ path = ".git*" }}
decision = "deny"
reason = "the repository's history stays"

[[approver.rules]]
tool = "*"
decision = "ask"                         # everything else: an operator decides
{tls}"""


def _refuse_existing(plans: Sequence[NodePlan]) -> None:
    for plan in plans:
        for path in (plan.config_path, plan.key_path, plan.key_path.with_name(plan.name + ".pub")):
            if path.exists():
                bad_usage(f"{path} already exists: teaagent init never overwrites a configuration or a key.")


def _already_done(plans: Sequence[NodePlan]) -> bool:
    """With --if-missing: True when every node is there and loads; exit 2 when only some are."""
    present = [plan for plan in plans if plan.config_path.exists()]
    if not present:
        return False
    if len(present) != len(plans):
        missing = ", ".join(str(plan.config_path) for plan in plans if plan not in present)
        bad_usage(f"the cluster is half made: {missing} is missing; remove the folder and run init again.")
    for plan in plans:
        load_config(plan.config_path)
    return True


def _scaffold(
    plans: Sequence[NodePlan],
    *,
    redis_url: str,
    required: int | None,
    cluster: bool,
    tls: str = "",
    permission_mode: str | None = None,
) -> None:
    keys = {plan.name: _keygen(plan) for plan in plans}
    for plan in plans:
        peers = [(other, keys[other.name]) for other in plans if other.name != plan.name] if cluster else []
        need = required if required is not None else (required_for(len(peers)) if peers else 1)
        if peers and not 1 <= need <= len(peers):
            bad_usage(f"--required {need} is not between 1 and the {len(peers)} peers of each node.")
        plan.config_path.write_text(
            _node_toml(
                plan,
                redis_url=redis_url,
                peers=peers,
                required=need,
                tls=tls,
                permission_mode=permission_mode,
            ),
            encoding="utf-8",
        )
        (plan.folder / "workspace").mkdir(exist_ok=True)
        data = plan.folder / "data"
        data.mkdir(exist_ok=True)
        data.chmod(0o700)
        try:
            load_config(plan.config_path).load_token()  # checked, and its token made now, 0600
        except ConfigError as exc:  # pragma: no cover - what init writes always loads
            raise ConfigError(f"teaagent init wrote a configuration that does not load: {exc}") from exc


def _check_tls(cert: Path | None, key: Path | None, ca: Path | None) -> None:
    """Load the TLS files now, as node.toml's loader will: a wrong pair stops init before any key is made."""
    try:
        if cert is not None and key is not None:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(expand_home(cert), expand_home(key))
        if ca is not None:
            ssl.create_default_context(cafile=str(expand_home(ca)))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        bad_usage(f"the TLS files do not load: {str(reason).rstrip('.').lower().replace('_', ' ')}.")


def _names(cluster: str) -> list[str]:
    names = [name.strip() for name in cluster.split(",") if name.strip()]
    for name in names:
        if AGENT_ID_PATTERN.fullmatch(name) is None:
            bad_usage(
                f"{name!r} is not a valid agent id: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
                "starting with a letter or digit."
            )
    if len(set(names)) != len(names):
        bad_usage(f"--cluster names a node twice: {cluster}.")
    if len(names) < 2:
        bad_usage("--cluster needs at least two node names, separated by commas (alpha,beta,gamma).")
    return names


def init(
    directory: Annotated[Path, typer.Argument(help="The folder to scaffold (created if missing).")],
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            help="Comma-separated agent ids: a whole cluster, one folder per node under DIRECTORY.",
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The node's agent id (default: the folder's name).")
    ] = None,
    host: Annotated[
        str,
        typer.Option(
            "--host", help="The relays' host in their URLs; {name} stands for each node ('relay-{name}')."
        ),
    ] = "127.0.0.1",
    base_port: Annotated[
        int,
        typer.Option(
            "--base-port",
            envvar="TEAAGENT_BASE_PORT",
            help="The first port; each node takes three (agent, relay, approver). $TEAAGENT_BASE_PORT "
            "when set.",
        ),
    ] = DEFAULT_BASE_PORT,
    redis_url: Annotated[
        str,
        typer.Option("--redis-url", help="The nodes' Redis: 'embedded' (one private server each) or a URL."),
    ] = "embedded",
    required: Annotated[
        int | None,
        typer.Option(
            "--required", help="Approvals a high-risk call needs (default: half the peers, rounded up)."
        ),
    ] = None,
    if_missing: Annotated[
        bool,
        typer.Option("--if-missing", help="Do nothing (exit 0) when DIRECTORY already holds these nodes."),
    ] = False,
    https: Annotated[
        bool, typer.Option("--https", help="Relay URLs with https:// (relays on other hosts speak HTTPS).")
    ] = False,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", help="One node: its relay's certificate chain (PEM); implies --https."),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="One node: that certificate's key (PEM).")
    ] = None,
    permission_mode: Annotated[
        str | None,
        typer.Option(
            "--permission-mode",
            help="[agent] permission_mode (default: workspace-write alone; danger-full-access in a cluster, "
            "whose destructive tools all need the quorum).",
        ),
    ] = None,
    tls_ca: Annotated[
        Path | None, typer.Option("--tls-ca", help="The CA (PEM) that https:// relays are verified against.")
    ] = None,
) -> None:
    """Scaffold a node in DIRECTORY (key by ssh-keygen, node.toml, data folder), or a --cluster of them."""
    directory = expand_home(directory)
    if cluster is not None and name is not None:
        bad_usage("--name is for one node; with --cluster the names are the cluster's.")
    if not 1 <= base_port <= 65535:
        bad_usage(f"--base-port must be a TCP port between 1 and 65535, not {base_port}.")
    if cluster is not None:
        names = _names(cluster)
    else:
        names = [name if name is not None else directory.resolve().name]
        if AGENT_ID_PATTERN.fullmatch(names[0]) is None:
            bad_usage(
                f"{names[0]!r} is not a valid agent id: pass --name (1 to 64 lowercase letters, digits, "
                "'.', '_' or '-', starting with a letter or digit)."
            )
    redis_parts = split_url(redis_url)
    if required is not None and required < 1:  # checked against the peers later, when there are some
        bad_usage(f"--required {required} is not a number of approvals: give 1 or more.")
    if redis_url != "embedded" and (
        redis_parts is None or redis_parts.scheme not in ("redis", "rediss", "unix")
    ):
        bad_usage(
            "--redis-url must be 'embedded' or a redis://, rediss:// or unix:// URL, "
            f"not {shown_url(redis_url)!r}."
        )
    if (tls_cert is None) != (tls_key is None):
        bad_usage("--tls-cert and --tls-key go together: give both, or neither.")
    if tls_cert is not None and cluster is not None:
        bad_usage("--tls-cert is one relay's certificate: give it to each node's own teaagent init.")
    for option, given in (("--tls-cert", tls_cert), ("--tls-key", tls_key), ("--tls-ca", tls_ca)):
        if given is not None and not expand_home(given).is_file():
            bad_usage(f"{option} {given} is not a file.")
    _check_tls(tls_cert, tls_key, tls_ca)
    tls = _tls_table(*(None if p is None else expand_home(p).resolve() for p in (tls_cert, tls_key, tls_ca)))
    scheme = "https" if https or tls_cert is not None else "http"
    plans = plan_cluster(
        names, directory, host=host, base_port=base_port, single=cluster is None, scheme=scheme
    )
    for plan in plans:
        # The URL must say this very host and port: "a/b" would be host a on port 80, path /b.
        relay_parts = split_url(plan.relay_url)
        if (
            relay_parts is None
            or relay_parts.hostname != plan.host.lower()
            or relay_parts.port != plan.relay_port
            or any(character.isspace() for character in plan.host)
        ):
            bad_usage(f"--host {host!r} does not make a usable relay URL ({plan.relay_url}).")
    if if_missing and _already_done(plans):
        typer.echo(f"{directory}: {', '.join(names)} already initialised; nothing changed.")
        return
    _refuse_existing(plans)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for plan in plans:
            plan.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file where a folder goes (FileExistsError, NotADirectoryError)...
        bad_usage(f"{exc.filename or directory} cannot be made a folder: {exc.strerror or exc}.")
    if permission_mode is not None and permission_mode not in {mode.value for mode in PermissionMode}:
        allowed = ", ".join(mode.value for mode in PermissionMode)
        bad_usage(f"--permission-mode {permission_mode!r} is not one of {allowed}.")
    _scaffold(
        plans,
        redis_url=redis_url,
        required=required,
        cluster=cluster is not None,
        tls=tls,
        permission_mode=permission_mode,
    )
    for plan in plans:
        typer.echo(
            f"{plan.name}: {plan.config_path}  relay {plan.relay_url}  agent :{plan.agent_port}  "
            f"approver :{plan.approver_port}  key {plan.key_path}"
        )
    typer.echo("Run each node's services, one terminal each (or with &):")
    for plan in plans:
        for service in ("relay", "approver", "agent"):
            typer.echo(f"  teaagent {service} serve --config {plan.config_path}")
