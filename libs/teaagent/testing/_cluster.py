"""LocalCluster: nodes' files written into one folder, their services as processes, one Redis."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent._http import client_verify
from teaagent._signals import interrupts_held
from teaagent.errors import TeaAgentError
from teaagent.signing import SSHPrivateKey, load_private_key
from teaagent.store import EmbeddedRedis

# The keys SSHPrivateKey.from_cryptography signs with.
SigningKey = Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

__all__ = ["ClusterNode", "LocalCluster", "free_port", "star", "wait_healthy"]

Service = Literal["relay", "approver"]
SERVICES: tuple[Service, ...] = ("relay", "approver")
READY_TIMEOUT = 45.0  # seconds for a service to answer /health: a loaded machine starts several at once
STOP_TIMEOUT = 10.0  # seconds a service gets to stop after SIGTERM, then SIGKILL
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, never handed out twice by this process."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def star(origin: str, names: Iterable[str]) -> dict[str, list[str]]:
    """``peers_of`` for a star: ``origin`` asks every other node; each of them knows the origin only."""
    others = [name for name in names if name != origin]
    return {origin: others, **{name: [origin] for name in others}}


def approver_rule(tool: str, decision: str, *, reason: str | None = None, **arguments: str) -> str:
    """One ``[[approver.rules]]`` table, for ``LocalCluster(rules=...)``.

    A call of ``tool`` (an fnmatch pattern) whose string ``arguments`` match their patterns gets
    ``decision`` (``approve``, ``deny`` or ``ask``); a denial signs ``reason``. Rules concatenated
    keep their order: the first that matches decides.
    """
    matched = ", ".join(f'{name} = "{pattern}"' for name, pattern in arguments.items())
    where = f"arguments = {{ {matched} }}\n" if arguments else ""
    because = f'reason = "{reason}"\n' if reason is not None else ""
    return f'\n[[approver.rules]]\ntool = "{tool}"\n{where}decision = "{decision}"\n{because}'


@dataclass(frozen=True)
class ClusterNode:
    """One node of a :class:`LocalCluster`: where its files are, its ports and its token."""

    name: str
    folder: Path  # the cluster's folder: the configuration's relative paths start here
    port: int
    approver_port: int
    token: str
    peers: tuple[str, ...]
    required: int
    redis_prefix: str | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def approver_url(self) -> str:
        return f"http://127.0.0.1:{self.approver_port}"

    @property
    def config_path(self) -> Path:
        return self.folder / f"{self.name}.toml"

    @property
    def key_path(self) -> Path:
        return self.folder / "keys" / self.name

    @property
    def workspace(self) -> Path:
        return self.folder / self.name / "workspace"

    @property
    def data_dir(self) -> Path:
        return self.folder / self.name / "data"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def signer(self) -> SSHPrivateKey:
        """The node's key, loaded from its file."""
        return load_private_key(self.key_path)


def wait_healthy(
    process: subprocess.Popen[bytes], url: str, what: str, log: Path, timeout: float = READY_TIMEOUT
) -> None:
    """Wait until ``url/health`` answers 200.

    Raises:
        TeaAgentError: ``process`` exited, or did not answer within ``timeout`` seconds (the tail
            of its ``log`` said).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise TeaAgentError(f"{what} exited while starting: {_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            # The process's one SSL context: httpx would build one for each probe (~20 ms of CPU
            # each, taken from the services starting beside it).
            if httpx.get(f"{url}/health", timeout=1.0, verify=client_verify()).status_code == 200:
                return
        time.sleep(0.05)
    raise TeaAgentError(f"{what} at {url} did not answer within {timeout:g} s: {_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-1500:]


class LocalCluster:
    """Nodes on this machine: their files, an embedded Redis (or ``redis_url``), relays and approvers.

    Construction writes nothing. :meth:`start` (or ``with``) starts the embedded Redis unless
    ``redis_url`` is given, writes every node's files (:meth:`write`), starts the services and
    waits until each answers ``/health``; :meth:`stop` (or leaving the ``with``) stops every
    service at once, then the Redis it started. Processes are labelled ``<node>-<service>``, their
    output in ``logs/<label>.log``.

    Files, in ``folder``: ``<node>.toml``; ``keys/<name>`` and ``keys/<name>.pub`` for every node,
    peer and operator (a key file already there is kept: made by ``ssh-keygen``, say; else the key
    of ``keys`` is written; else a new Ed25519 key); ``<node>.operators`` (OpenSSH
    allowed_signers) for a node with operators; ``<node>/workspace`` and ``<node>/data``.

    Args:
        folder: Where every file goes.
        names: The nodes.
        redis_url: A running Redis to use; None starts an embedded one in ``folder/redis``.
        appendfsync: The embedded Redis's setting (``everysec`` only for a benchmark).
        prefix: Each node's store lives under ``<prefix>:<node>`` (the services' environment);
            None leaves the services' own default.
        required: Approvals a node's requests need (at most its number of peers), or per node.
        peers_of: Each node's peers (default: every other node; see :func:`star`). A peer outside
            ``names`` gets a key, and a relay URL on ``ports`` or port 1.
        ports: Relay ports to use, by node (or outside peer); others are ``port_factory()``'s.
        operators: Per node, names of operators whose own keys may sign for it.
        rules: Per node, the TOML of its ``[[approver.rules]]``.
        quorum_rules: Per node, the TOML of its ``[quorum.groups]`` and ``[[quorum.rules]]``.
        extra_toml: Per node, more TOML tables (``[agent]``...), at the end of its file.
        high_risk: Every node's ``high_risk_patterns``.
        timeout_seconds: Every node's quorum timeout.
        allow_dev_signatures: Every node's ``allow_dev_signatures``.
        redis_cluster: ``redis_url`` is one node of a Redis Cluster.
        keys: Private keys to write, by name (cryptography keys).
        approvers: The nodes whose approver :meth:`start` runs (None: every node).
        env: More environment for every service.
        port_factory: Makes a free loopback port.
        ready_timeout: Seconds each service gets to answer ``/health``.
        interpreter: The argv before ``-m teaagent`` for a label (default ``[sys.executable]``):
            a profiler, say.
        new_session: Start the services in sessions of their own (a terminal's Ctrl-C reaches the
            owner only, which stops them in order).
    """

    def __init__(
        self,
        folder: Path,
        names: Iterable[str] = ("alpha", "beta", "gamma"),
        *,
        redis_url: str | None = None,
        appendfsync: Literal["always", "everysec"] = "always",
        prefix: str | None = None,
        required: int | Mapping[str, int] = 2,
        peers_of: Mapping[str, Iterable[str]] | None = None,
        ports: Mapping[str, int] | None = None,
        operators: Mapping[str, Iterable[str]] | None = None,
        rules: Mapping[str, str] | None = None,
        quorum_rules: Mapping[str, str] | None = None,
        extra_toml: Mapping[str, str] | None = None,
        high_risk: Iterable[str] = ("shell.*", "fs.delete"),
        timeout_seconds: int = 120,
        allow_dev_signatures: bool = False,
        redis_cluster: bool = False,
        keys: Mapping[str, SigningKey] | None = None,
        approvers: Collection[str] | None = None,
        env: Mapping[str, str] | None = None,
        port_factory: Callable[[], int] = free_port,
        ready_timeout: float = READY_TIMEOUT,
        interpreter: Callable[[str], Sequence[str]] | None = None,
        new_session: bool = False,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.names = tuple(names)
        self._redis_url = redis_url
        self._appendfsync: Literal["always", "everysec"] = appendfsync
        self.prefix = prefix
        self._required = required
        self.peers_of = {
            name: tuple(sorted(peers_of[name] if peers_of and name in peers_of else set(self.names) - {name}))
            for name in self.names
        }
        self._ports = dict(ports or {})
        self._operators = {name: tuple(team) for name, team in (operators or {}).items()}
        self._rules = dict(rules or {})
        self._quorum_rules = dict(quorum_rules or {})
        self._extra = dict(extra_toml or {})
        self._high_risk = list(high_risk)
        self._timeout_seconds = timeout_seconds
        self._allow_dev = allow_dev_signatures
        self._redis_cluster = redis_cluster
        self._keys = dict(keys or {})
        self.approvers = tuple(self.names if approvers is None else approvers)
        self.env = dict(env or {})
        self._port = port_factory
        self.ready_timeout = ready_timeout
        self._interpreter = interpreter or (lambda label: [sys.executable])
        self._new_session = new_session
        self.nodes: dict[str, ClusterNode] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.redis: EmbeddedRedis | None = None

    # -- the files ----------------------------------------------------------------------------

    @property
    def redis_url(self) -> str:
        """The Redis every node uses (the embedded one's URL once started)."""
        if self._redis_url is not None:
            return self._redis_url
        if self.redis is None:
            raise TeaAgentError("the local cluster's embedded Redis is not started.")
        return self.redis.url

    def public_line(self, name: str) -> str:
        """The public key line of a node, peer or operator (``keys/<name>.pub``, written by :meth:`write`)."""
        return (self.folder / "keys" / f"{name}.pub").read_text().strip()

    def write(self) -> dict[str, ClusterNode]:
        """Write every node's configuration, keys, operators' files and folders; return the nodes."""
        outside = {peer for peers in self.peers_of.values() for peer in peers} - set(self.names)
        team = {operator for members in self._operators.values() for operator in members}
        for name in (*self.names, *sorted(outside), *sorted(team)):
            self._write_key(name)
        for name in self.names:
            self._ports.setdefault(name, self._port())
        for name in self.names:
            peers = self.peers_of[name]
            required = self._required if isinstance(self._required, int) else self._required[name]
            node = ClusterNode(
                name=name,
                folder=self.folder,
                port=self._ports[name],
                approver_port=self._port(),
                token=f"token-{name}-{secrets.token_hex(16)}",
                peers=peers,
                required=min(required, len(peers)),
                redis_prefix=None if self.prefix is None else f"{self.prefix}:{name}",
            )
            node.workspace.mkdir(parents=True, exist_ok=True)
            if self._operators.get(name):
                lines = "".join(f"{name} {self.public_line(who)}\n" for who in self._operators[name])
                (self.folder / f"{name}.operators").write_text(lines)
            node.config_path.write_text(self._toml(node))
            self.nodes[name] = node
        return self.nodes

    def _write_key(self, name: str) -> None:
        path = self.folder / "keys" / name
        if path.exists():
            if not path.with_name(f"{name}.pub").exists():
                path.with_name(f"{name}.pub").write_text(load_private_key(path).public_key.to_line() + "\n")
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        key: SigningKey = self._keys.get(name) or Ed25519PrivateKey.generate()
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        path.chmod(0o600)
        line = SSHPrivateKey.from_cryptography(key, comment=name).public_key.to_line()
        path.with_name(f"{name}.pub").write_text(line + "\n")

    def _toml(self, node: ClusterNode) -> str:
        name = node.name
        peers = "".join(
            f'\n[peers.{peer}]\npublic_key = "{self.public_line(peer)}"\n'
            + (f'allowed_signers = "{peer}.operators"\n' if self._operators.get(peer) else "")
            + f'relay_url = "http://127.0.0.1:{self._ports.get(peer, 1)}"\n'
            for peer in node.peers
        )
        operators = f'operators = "{name}.operators"\n' if self._operators.get(name) else ""
        return (
            f'agent_id = "{name}"\nprivate_key = "keys/{name}"\nredis_url = "{self.redis_url}"\n'
            + ("redis_cluster = true\n" if self._redis_cluster else "")
            + f'relay_url = "{node.url}"\nworkspace = "{name}/workspace"\ndata_dir = "{name}/data"\n'
            f'token = "{node.token}"\n\n'
            f"[quorum]\nenabled = true\nrequired_approvals = {node.required}\n"
            f"high_risk_patterns = {json.dumps(self._high_risk)}\n"
            f"timeout_seconds = {self._timeout_seconds}\n"
            f"allow_dev_signatures = {str(self._allow_dev).lower()}\n"
            f"{self._quorum_rules.get(name, '')}{peers}"
            f"\n[approver]\nport = {node.approver_port}\n{operators}{self._rules.get(name, '')}"
            f"{self._extra.get(name, '')}"
        )

    # -- the processes ------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start the Redis (unless given), write the files, start every relay and approver, wait for them.

        On any failure, whatever it started is stopped before the error is raised.
        """
        try:
            self.start_redis()
            if not self.nodes:
                self.write()
            self.start_services()
        except BaseException:
            self.stop()
            raise
        return self

    def start_redis(self) -> None:
        """Start the embedded Redis in ``folder/redis``, unless ``redis_url`` was given or it runs."""
        if self._redis_url is None and self.redis is None:
            self.redis = EmbeddedRedis(self.folder, appendfsync=self._appendfsync)
            self.redis.start()

    def start_services(self) -> None:
        """Start every relay and every approver of ``approvers`` at once, then wait for each."""
        started = [
            (name, service)
            for service in SERVICES
            for name in self.names
            if service == "relay" or name in self.approvers
        ]
        for name, service in started:
            self.start_service(name, service, wait=False)
        for name, service in started:
            self.wait_ready(name, service)

    def service_env(self, name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment a node's service starts with: this one's, less ``TEAAGENT_CONFIG``, plus
        the node's key prefix, ``env`` and ``extra``."""
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        environment.pop("TEAAGENT_CONFIG", None)
        prefix = self.nodes[name].redis_prefix
        if prefix is not None:
            environment["TEAAGENT_RELAY_REDIS_PREFIX"] = environment["TEAAGENT_APPROVER_REDIS_PREFIX"] = (
                prefix
            )
        return {**environment, **self.env, **(extra or {})}

    def start_service(
        self, name: str, service: Service, *, env: Mapping[str, str] | None = None, wait: bool = True
    ) -> subprocess.Popen[bytes]:
        """Start ``teaagent <service> serve`` for node ``name`` (labelled ``<name>-<service>``)."""
        label = f"{name}-{service}"
        logs = self.folder / "logs"
        logs.mkdir(exist_ok=True)
        argv = [*self._interpreter(label), "-m", "teaagent", service, "serve"]
        argv += ["--config", str(self.nodes[name].config_path), "--no-access-log", "--log-level", "warning"]
        # A service in a session of its own hears no Ctrl-C: it must be listed to be stopped.
        with (logs / f"{label}.log").open("ab") as log, interrupts_held():
            self.processes[label] = subprocess.Popen(
                argv,
                cwd=self.folder,
                env=self.service_env(name, env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=self._new_session,
            )
        if wait:
            self.wait_ready(name, service)
        return self.processes[label]

    def wait_ready(self, name: str, service: Service) -> None:
        """Wait until the service answers ``/health`` (see :func:`wait_healthy`)."""
        label = f"{name}-{service}"
        node = self.nodes[name]
        url = node.url if service == "relay" else node.approver_url
        log = self.folder / "logs" / f"{label}.log"
        wait_healthy(self.processes[label], url, f"{name}'s {service}", log, self.ready_timeout)

    def exited(self) -> dict[str, int]:
        """The services that stopped by themselves, and their exit codes."""
        return {
            label: code for label, process in self.processes.items() if (code := process.poll()) is not None
        }

    def stop_service(self, label: str) -> None:
        """Stop one service (``<node>-<service>``): SIGTERM, then SIGKILL after ``STOP_TIMEOUT``."""
        self._stop([self.processes.pop(label)])

    def stop_services(self) -> None:
        """Stop every service at once: a relay's graceful stop may wait for its approver's long-poll,
        one after the other would add the waits up."""
        processes, self.processes = list(self.processes.values()), {}
        self._stop(processes)

    def stop(self) -> None:
        """Stop every service (:meth:`stop_services`), then the embedded Redis."""
        try:
            self.stop_services()
        finally:
            if self.redis is not None:
                self.redis.stop()
                self.redis = None

    @staticmethod
    def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
