"""Clusters of relays for the relay tests: node configurations, in-process apps, real processes.

Keys are made in-process (``cryptography``) and written as OpenSSH files, so a node's
configuration is a real file that ``teaagent relay serve`` loads; every node's store lives under
the test's Redis prefix (``<prefix>:<agent_id>``), so tests never share keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from port_support import free_port
from port_support import refusing_port as refusing_port  # the relay tests import it from here too
from prometheus_client.parser import text_string_to_metric_families

from teaagent._http import client_verify
from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import build_request, sign_approval, sign_denial, sign_request
from teaagent.relay_client import InboxItem, RelayClient, RelayQuorumGate
from teaagent.signing import SSHPrivateKey
from teaagent.store import Keys
from teaagent.testing import approver_rule as rule  # the tests import it from here

READY_TIMEOUT = 45.0  # seconds for a service process to answer /health: a loaded host starts several at once

# The services' timings in the tests (their environment): an approver takes a dead one's place
# within a second, a relay retries a delivery within half of one.
SERVICE_TIMING = {
    "TEAAGENT_APPROVER_TAKEOVER_SECONDS": "1",
    "TEAAGENT_APPROVER_POLL_SECONDS": "2",
    "TEAAGENT_RELAY_DELIVERY_MIN_IDLE_SECONDS": "2",
    "TEAAGENT_RELAY_DELIVERY_RETRY_BASE_SECONDS": "0.1",
    "TEAAGENT_RELAY_DELIVERY_RETRY_CAP_SECONDS": "0.5",
}


_KEYS: dict[str, Ed25519PrivateKey] = {}


def private_key(name: str) -> Ed25519PrivateKey:
    """One key per node name for the whole session (cheap to make, but stable is easier to read)."""
    if name not in _KEYS:
        _KEYS[name] = Ed25519PrivateKey.generate()
    return _KEYS[name]


def signer(name: str) -> SSHPrivateKey:
    return SSHPrivateKey.from_cryptography(private_key(name), comment=name)


def public_line(name: str) -> str:
    return signer(name).public_key.to_line()


@dataclass
class Node:
    """One node of a test cluster: its configuration file, key, relay URL and token."""

    name: str
    folder: Path
    port: int
    token: str
    peers: tuple[str, ...]
    required: int
    timeout_seconds: int
    prefix: str
    extra_env: dict[str, str] = field(default_factory=dict)
    approver_port: int = 0  # [approver] port
    nested: bool = False  # teaagent.testing.LocalCluster's files: <name>/workspace, <name>/data

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def approver_url(self) -> str:
        return f"http://127.0.0.1:{self.approver_port}"

    @property
    def data_dir(self) -> Path:
        return self.folder / self.name / "data" if self.nested else self.folder / f"data-{self.name}"

    @property
    def workspace(self) -> Path:
        return (
            self.folder / self.name / "workspace" if self.nested else self.folder / f"workspace-{self.name}"
        )

    @property
    def config_path(self) -> Path:
        return self.folder / f"{self.name}.toml"

    @property
    def key(self) -> SSHPrivateKey:
        return signer(self.name)

    @property
    def redis_prefix(self) -> str:
        return f"{self.prefix}:{self.name}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def quorum(self) -> MultiSigQuorumConfig:
        return MultiSigQuorumConfig(
            enabled=True,
            required_approvals=self.required,
            peer_agent_ids=list(self.peers),
            peer_public_keys={peer: public_line(peer) for peer in self.peers},
            peer_relay_urls={peer: "http://127.0.0.1:1" for peer in self.peers},
            high_risk_patterns=["shell.*", "fs.delete"],
            timeout_seconds=self.timeout_seconds,
        )

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("TEAAGENT_CONFIG", None)
        env.update(
            {
                "TEAAGENT_RELAY_REDIS_PREFIX": self.redis_prefix,
                "TEAAGENT_APPROVER_REDIS_PREFIX": self.redis_prefix,
                **SERVICE_TIMING,
            }
        )
        env.update(self.extra_env)
        return env

    def settings(self, **overrides: Any) -> Any:
        from teaagent_relay import Settings

        values: dict[str, Any] = {
            "config": str(self.config_path),
            "redis_prefix": self.redis_prefix,
            "delivery_min_idle_seconds": 2.0,
            "delivery_retry_base_seconds": 0.1,
            "delivery_retry_cap_seconds": 0.5,
        }
        values.update(overrides)
        return Settings(**values)

    def approver_settings(self, **overrides: Any) -> Any:
        from teaagent_approver import Settings

        values: dict[str, Any] = {
            "config": str(self.config_path),
            "redis_prefix": self.redis_prefix,
            "takeover_seconds": 1.0,
            "poll_seconds": 1.0,  # a served relay's shutdown waits for a long-poll in flight
        }
        values.update(overrides)
        return Settings(**values)

    def gate(self, **options: Any) -> RelayQuorumGate:
        """The node's quorum gate on its relay, with its key and quorum; ``options`` are the gate's
        (``timeout``, ``config``, ``on_progress``...)."""
        values: dict[str, Any] = {
            "relay_url": self.url,
            "token": self.token,
            "origin": self.name,
            "private_key_signer": self.key,
            "config": self.quorum(),
        }
        return RelayQuorumGate(**{**values, **options})

    # -- documents ---------------------------------------------------------------------------

    def request(
        self, *, tool_name: str = "shell.run", arguments: Mapping[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        return build_request(
            origin=self.name,
            run_id=fields.pop("run_id", "run-1"),
            call_id=fields.pop("call_id", "call-1"),
            tool_name=tool_name,
            arguments=dict(arguments or {"command": "rm -rf build"}),
            reason=fields.pop("reason", "clean the build"),
            config=self.quorum(),
            **fields,
        )

    def signed(self, request: Mapping[str, Any]) -> dict[str, Any]:
        return {"request": dict(request), "signature": sign_request(request, self.key)}


def shell_request(config: MultiSigQuorumConfig, command: str, **fields: Any) -> dict[str, Any]:
    """``build_request`` of a ``shell.run`` of ``command`` under ``config``: from alpha, run-1, call-1,
    "clean the build" unless ``fields`` (``build_request``'s keywords) say otherwise."""
    values: dict[str, Any] = {
        "origin": "alpha",
        "run_id": "run-1",
        "call_id": "call-1",
        "reason": "clean the build",
    }
    return build_request(
        tool_name="shell.run", arguments={"command": command}, config=config, **{**values, **fields}
    )


def approval(request: Mapping[str, Any], name: str, signed_at: int | None = None) -> dict[str, Any]:
    """A full approval document ``{"statement", "signature"}`` by ``name``."""
    from teaagent.quorum import approval_statement

    compact = sign_approval(request, name, signer(name), signed_at)
    return {
        "statement": approval_statement(request, name, int(compact.timestamp)),
        "signature": compact.signature,
    }


def denial(request: Mapping[str, Any], name: str, reason: str = "not today") -> dict[str, Any]:
    return sign_denial(request, name, signer(name), reason)


def long_polls(node: Node, kind: str) -> float:
    """The relay's own count of the long-polls of ``kind`` (inbox, outcome) it answers now (its metrics).

    Counting blocked XREADs on a shared Redis instead would also see, and then lose, a long-poll an
    earlier test left behind (a killed call's outcome wait goes on to its end).
    """
    text = httpx.get(f"{node.url}/metrics", headers=node.headers, timeout=10, verify=client_verify()).text
    pattern = rf'^teaagent_relay_long_polls_waiting\{{kind="{kind}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def sample(text: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text page (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    return 0.0


MakeCluster = Callable[..., dict[str, Node]]  # the make_cluster fixture: write_cluster in a test's folder


APPROVE_ECHO = rule("shell.run", "approve", command="echo *")
DENY_RM = rule("shell.run", "deny", command="rm *", reason="nothing is removed here")


def write_cluster(
    folder: Path,
    names: Iterable[str],
    *,
    redis_url: str,
    prefix: str,
    required: int = 2,
    timeout_seconds: int = 120,
    peers_of: Mapping[str, Iterable[str]] | None = None,
    ports: Mapping[str, int] | None = None,
    allow_dev_signatures: bool = False,
    operators: Mapping[str, Iterable[str]] | None = None,
    rules: Mapping[str, str] | None = None,
    redis_cluster: bool = False,
    quorum_rules: Mapping[str, str] | None = None,
    high_risk: Iterable[str] = ("shell.*", "fs.delete"),
    star: str | None = None,
) -> dict[str, Node]:
    """Write one configuration file per node; by default every node is a peer of every other.

    ``operators`` names, per node, operators whose own keys (``private_key(operator)``) may sign
    for it: written to ``<node>.operators`` (OpenSSH allowed_signers, principal = the node), which
    the node reads as ``[approver] operators`` and its peers as that peer's ``allowed_signers``.
    ``rules`` gives, per node, the TOML of its ``[[approver.rules]]`` tables. Every node's
    ``[approver] port`` is a free port of its own (``Node.approver_port``). ``redis_cluster``
    writes ``redis_cluster = true``: ``redis_url`` is one node of a Redis Cluster.
    ``quorum_rules`` gives, per node, the TOML of its ``[quorum.groups]`` and ``[[quorum.rules]]``
    (protocol version 2); ``high_risk`` its ``high_risk_patterns``. ``star`` names the node that
    asks every other, each of which knows it alone (in place of ``peers_of``).
    """
    names = list(names)
    if star is not None:
        peers_of = {
            star: [name for name in names if name != star],
            **{name: [star] for name in names if name != star},
        }
    ports = dict(ports or {})
    for name in names:
        ports.setdefault(name, free_port())
    nodes: dict[str, Node] = {}
    for name in names:
        peers = tuple(
            sorted(peers_of[name] if peers_of and name in peers_of else (n for n in names if n != name))
        )
        node = Node(
            name=name,
            folder=folder,
            port=ports[name],
            token=f"token-{name}-{secrets.token_hex(8)}",
            peers=peers,
            required=min(required, len(peers)),
            timeout_seconds=timeout_seconds,
            prefix=prefix,
            approver_port=free_port(),
        )
        key_path = folder / "keys" / name
        key_path.parent.mkdir(parents=True, exist_ok=True)
        key_path.write_bytes(
            private_key(name).private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
            )
        )
        key_path.chmod(0o600)
        staff = {node_name: list(team) for node_name, team in (operators or {}).items()}
        for node_name, team in staff.items():
            lines = "".join(f"{node_name} {public_line(operator)} {operator}\n" for operator in team)
            (folder / f"{node_name}.operators").write_text(lines)
        peer_tables = "".join(
            f'\n[peers.{peer}]\npublic_key = "{public_line(peer)}"\n'
            + (f'allowed_signers = "{peer}.operators"\n' if staff.get(peer) else "")
            + f'relay_url = "http://127.0.0.1:{ports.get(peer, 1)}"\n'
            for peer in peers
        )
        own_operators = f'operators = "{name}.operators"\n' if staff.get(name) else ""
        approver_table = (
            f"\n[approver]\nport = {node.approver_port}\n{own_operators}{(rules or {}).get(name, '')}"
        )
        node.config_path.write_text(
            f"""agent_id = "{name}"
private_key = "keys/{name}"
redis_url = "{redis_url}"
{"redis_cluster = true" if redis_cluster else ""}
relay_url = "{node.url}"
workspace = "workspace-{name}"
data_dir = "data-{name}"
token = "{node.token}"

[quorum]
enabled = true
required_approvals = {node.required}
high_risk_patterns = {json.dumps(list(high_risk))}
timeout_seconds = {timeout_seconds}
allow_dev_signatures = {str(allow_dev_signatures).lower()}
{(quorum_rules or {}).get(name, "")}{peer_tables}{approver_table}"""
        )
        nodes[name] = node
    return nodes


@contextlib.asynccontextmanager
async def in_process(node: Node, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The node's relay app in this process, lifespan run, behind an httpx client (no sockets)."""
    from teaagent_relay import create_app

    app = create_app(node.settings(**overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=node.url) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


class ServiceProcess:
    """``teaagent <kind> serve --config <config_path> <args>`` as a real process on a loopback port.

    The one service-process class of the tests: started (and waited for until ``/health``
    answers 200), killed (``kill -9``) or stopped (SIGTERM, then SIGKILL after ``stop_timeout``);
    its output goes to a log file of its own under ``log_folder``, quoted when it does not start.
    """

    ready_timeout = READY_TIMEOUT
    stop_timeout = 10.0

    def __init__(
        self,
        kind: str,
        config_path: Path,
        log_folder: Path,
        *,
        port: int,
        env: Mapping[str, str],
        label: str,
        args: Iterable[str] = ("--no-access-log", "--log-level", "warning"),
    ) -> None:
        self.kind = kind
        self.config_path = config_path
        self.port = port
        self.environment = dict(env)
        self.label = label  # "relay alpha": what the errors call it
        self.args = list(args)
        self.log_path = log_folder / f"{label.replace(' ', '-')}-{port}-{int(time.time() * 1000)}.log"
        self.process: subprocess.Popen[bytes] | None = None
        # What the /health probe verifies: an ssl context for HTTPS. httpx builds a context for each
        # client it makes, each httpx.get included (the CA bundle read: ~20 ms of CPU a probe, while
        # the service starts); the library's one default context is built once a process.
        self.verify: Any = client_verify()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True, new_session: bool = False) -> Any:
        """Start it; ``new_session`` puts it in a process group of its own, as a shell does a command."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "teaagent",
                    self.kind,
                    "serve",
                    "--config",
                    str(self.config_path),
                    *self.args,
                ],
                env=self.environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )
        if wait:
            self.wait_ready()
        return self

    def log(self) -> str:
        return self.log_path.read_text()[-2000:]

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited: {self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(
            f"{self.label} did not answer at {self.url} in {self.ready_timeout}s: {self.log()}"
        )

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5, verify=self.verify).text

    def kill(self) -> None:
        """``kill -9``: no shutdown, no acknowledgement, nothing flushed."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RelayProcess(ServiceProcess):
    """``teaagent relay serve`` for one node, as a real process on its loopback port."""

    def __init__(self, node: Node, log_folder: Path) -> None:
        super().__init__(
            "relay", node.config_path, log_folder, port=node.port, env=node.env(), label=f"relay {node.name}"
        )
        self.node = node


class ApproverProcess(ServiceProcess):
    """``teaagent approver serve`` for one node, as a real process on its ``[approver]`` port or ``port``."""

    def __init__(self, node: Node, log_folder: Path, *, port: int | None = None, **env: str) -> None:
        port = port or node.approver_port
        super().__init__(
            "approver",
            node.config_path,
            log_folder,
            port=port,
            env={**node.env(), **env},
            label=f"approver {node.name}",
            args=["--port", str(port), "--no-access-log", "--log-level", "warning"],
        )
        self.node = node


@contextlib.asynccontextmanager
async def approver_in_process(node: Node, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The node's approver app in this process, lifespan run, behind an httpx client (no sockets).

    Its relay must be served on a real socket (``served``): the approver calls it over HTTP.
    """
    from teaagent_approver import create_app

    app = create_app(node.approver_settings(**overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url=node.approver_url) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


@contextlib.contextmanager
def running(nodes: Iterable[Node], log_folder: Path) -> Any:
    """Start the nodes' relays (in parallel) and stop them all at the end."""
    processes = [RelayProcess(node, log_folder).start(wait=False) for node in nodes]
    try:
        for process in processes:
            process.wait_ready()
        yield {process.node.name: process for process in processes}
    finally:
        for process in processes:
            process.stop()


def kill_process(pid: int, timeout: float = 10.0) -> None:
    """``kill -9`` a process that is not this one's child (a relay's Redis); return once it is gone."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(OSError):
            # A zombie (dead, its parent not yet told) counts as gone: it holds no memory, no port.
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise RuntimeError(f"process {pid} still runs {timeout}s after SIGKILL")


def wait_until(predicate: Any, timeout: float = 15.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` (a test's observer, not the relay) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


async def until(predicate: Any, timeout: float = 20.0, interval: float = 0.02) -> Any:
    """``wait_until`` for a test on an event loop: poll without blocking it, 20 s at most."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


class ServedApp:
    """An ASGI app (a service's, or a stand-in's) served by uvicorn in a thread of this process on a
    loopback port: real sockets, fast start."""

    def __init__(self, app: Any, *, port: int | None = None, name: str = "app") -> None:
        import uvicorn

        self.app = app
        self.port = port or free_port()
        self.name = name
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        )
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Any:
        self.thread.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start in this process")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


class Served(ServedApp):
    """The node's relay app served by uvicorn in a thread of this process: real sockets, fast start."""

    def __init__(self, node: Node, **overrides: Any) -> None:
        from teaagent_relay import create_app

        self.node = node
        super().__init__(create_app(node.settings(**overrides)), port=node.port, name=f"relay {node.name}")


@contextlib.contextmanager
def served(*nodes: Node, **overrides: Any) -> Iterator[dict[str, Served]]:
    with contextlib.ExitStack() as stack:
        yield {node.name: stack.enter_context(Served(node, **overrides)) for node in nodes}


@pytest.fixture(name="nodes")
def fixture_nodes(tmp_path: Path, redis_url: str, redis_prefix: str) -> dict[str, Node]:
    """alpha, beta, gamma, delta: each a peer of every other; 2 approvals required."""
    return write_cluster(
        tmp_path, ["alpha", "beta", "gamma", "delta"], redis_url=redis_url, prefix=redis_prefix
    )


def approve_next(node: Node, *, deny_reason: str | None = None, wait: float = 20.0) -> InboxItem:
    """Act as the node's approver: wait for the next pending request, sign a decision, hand it over."""
    with RelayClient(node.url, token=node.token) as client:
        items = client.list_inbox(wait=wait)
        assert items, f"nothing reached {node.name}'s inbox"
        item = items[0]
        document = (
            approval(item.request, node.name)
            if deny_reason is None
            else denial(item.request, node.name, deny_reason)
        )
        client.submit_decision(item.request_id, document["statement"], document["signature"])
        return item


def undelivered(redis_url: str, node: Node) -> int:
    """Deliveries of ``node`` waiting, in flight or scheduled for a retry (read from Redis directly)."""
    keys = Keys(node.redis_prefix).queue("deliveries")
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.xlen(keys.stream)) + int(client.zcard(keys.schedule))
    finally:
        client.close()


def error(response: httpx.Response) -> tuple[int, str, str]:
    """The status, ``ErrorOut`` code and message of a refusal (and that the body is ErrorOut-shaped)."""
    body = response.json()
    assert set(body) == {"error", "message"}, body
    return response.status_code, body["error"], body["message"]


# -- an origin's own requests, as the relay API takes them ---------------------------------------


async def submit(client: httpx.AsyncClient, node: Node, request: dict[str, Any]) -> httpx.Response:
    """``POST /v1/requests``: ``node`` submits its own signed request to its relay."""
    return await client.post("/v1/requests", json=node.signed(request), headers=node.headers)


def decisions_path(request: dict[str, Any]) -> str:
    """Where the peers' decisions on ``request`` are posted to its origin's relay."""
    return f"/v1/requests/{request['request_id']}/decisions"
