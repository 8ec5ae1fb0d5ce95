"""``teaagent approvals`` tests' node: beta's real relay and approver, alpha's requests, operators' keys.

The node is beta, its relay and approver real processes (``teaagent relay serve``, ``teaagent
approver serve``) shared by a test module (``from approvals_support import fixture_cluster,
fixture_approver_processes, fixture_approver  # noqa: F401``); alpha asks it (each test delivers
requests of its own, signed with alpha's key, to beta's relay as alpha's relay would). Operators'
keys are made by the real ``ssh-keygen`` and listed in beta's ``[approver] operators`` file. Each
refusal is checked for its exit code and its one sentence on stderr (``one_sentence``).
"""

from __future__ import annotations

import contextlib
import secrets
import select
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from conftest import SSHKey
from redis_fixture import delete_prefix, new_prefix
from relay_support import (
    APPROVE_ECHO,
    ApproverProcess,
    Node,
    RelayProcess,
    rule,
    signer,
)
from starlette.applications import Starlette
from starlette.routing import Route
from web_support import beta_with_operators, ssh_keygen_sign

from teaagent.approver_client import ApproverClient
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.errors import RelayError
from teaagent.quorum import sign_request
from teaagent.relay_client import RelayClient

PASSPHRASE = "correct horse battery staple"
STOP_SECONDS = 30.0  # for a watch to exit once told to quit, on a loaded host
DEADLINE = 30.0  # seconds for anything a test waits on (a loaded two-core host)


# -- the cluster -------------------------------------------------------------------------------


@dataclass
class Cluster:
    """beta (the node under test), alpha (the origin) and gamma, beta's operators' keys."""

    nodes: dict[str, Node]
    operator: SSHKey  # listed in beta's operators file
    second_operator: SSHKey  # listed too
    locked: SSHKey  # listed, passphrase-protected
    stranger: SSHKey  # listed nowhere
    approver_port: int

    @property
    def beta(self) -> Node:
        return self.nodes["beta"]

    @property
    def config(self) -> str:
        return str(self.beta.config_path)

    def request(
        self, *, tool_name: str = "shell.run", arguments: dict[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        return self.nodes["alpha"].request(tool_name=tool_name, arguments=arguments, **fields)


RULES = APPROVE_ECHO + rule("fs.delete", "ask")


@pytest.fixture(scope="module", name="cluster")
def fixture_cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str, ssh_key_factory: Callable[..., SSHKey]
) -> Iterator[Cluster]:
    """One cluster for the module (each test sends requests of its own), its keys under one prefix."""
    folder = tmp_path_factory.mktemp("approvals")
    prefix = new_prefix()
    operator = ssh_key_factory("ops-one")
    second = ssh_key_factory("ops-two")
    locked = ssh_key_factory("ops-locked", passphrase=PASSPHRASE)
    stranger = ssh_key_factory("stranger")
    nodes = beta_with_operators(
        folder, redis_server, prefix, [operator, second, locked], rules={"beta": RULES}
    )
    yield Cluster(nodes, operator, second, locked, stranger, nodes["beta"].approver_port)
    delete_prefix(redis_server, prefix)


def config_with_approver_port(cluster: Cluster, port: int) -> str:
    """A copy of beta's configuration whose approver is on ``port`` (nobody's, or a stand-in's)."""
    text = cluster.beta.config_path.read_text()
    marker = f"[approver]\nport = {cluster.approver_port}\n"
    assert marker in text
    path = cluster.beta.folder / f"beta-{port}.toml"
    path.write_text(text.replace(marker, f"[approver]\nport = {port}\n"))
    return str(path)


class Approver:
    """beta's relay and approver, real processes, and the way alpha's requests reach beta."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        logs = cluster.beta.folder / "logs"
        logs.mkdir(exist_ok=True)
        self.relay = RelayProcess(cluster.beta, logs)
        self.process = ApproverProcess(cluster.beta, logs)
        self.token = load_config(cluster.beta.config_path).load_token()

    def client(self) -> ApproverClient:
        return ApproverClient(self.cluster.beta.approver_url, token=self.token)

    def deliver(self, request: dict[str, Any]) -> dict[str, Any]:
        """Deliver the request to beta's inbox as alpha's relay would; wait until the approver shows it."""
        with RelayClient(self.cluster.beta.url) as relay:
            relay.deliver_request(request, sign_request(request, signer("alpha")))
        with self.client() as client:
            deadline = time.monotonic() + DEADLINE
            while True:
                try:
                    client.get_request(request["request_id"])
                    return request
                except RelayError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def decision(self, request_id: str) -> Any:
        """beta's own decision on the request, as its approver tells it."""
        with self.client() as client:
            return client.get_request(request_id).decision

    def ensure_running(self) -> None:
        if self.relay.process is None or self.relay.process.poll() is not None:
            self.relay.start()
        if self.process.process is None or self.process.process.poll() is not None:
            self.start()

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        self.process.stop()
        self.relay.stop()


@pytest.fixture(scope="module", name="approver_processes")
def fixture_approver_processes(cluster: Cluster) -> Iterator[Approver]:
    served = Approver(cluster)
    try:
        served.ensure_running()
        yield served
    finally:
        served.close()


@pytest.fixture(name="approver")
def fixture_approver(approver_processes: Approver) -> Approver:
    approver_processes.ensure_running()  # a test that stopped it (watch) has it started again
    return approver_processes


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(["approvals", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def approve_with_key(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, request_id: str, key: SSHKey
) -> tuple[int, str, str]:
    """``teaagent approvals approve ID --key`` an operator's private key file, on beta."""
    return cli(capsys, "approve", request_id, "--key", str(key.private_path), "--config", cluster.config)


def submit(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, request_id: str, statement: Path, signature: Path
) -> tuple[int, str, str]:
    """``teaagent approvals submit ID --statement FILE --signature FILE``, on beta."""
    args = ["--statement", str(statement), "--signature", str(signature), "--config", cluster.config]
    return cli(capsys, "submit", request_id, *args)


def statement_signed_by(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, request_id: str, path: Path, key: SSHKey
) -> Path:
    """``teaagent approvals statement ID --out PATH`` signed by ``ssh-keygen -Y sign``; its signature file."""
    cli(capsys, "statement", request_id, "--out", str(path), "--config", cluster.config)
    return ssh_keygen_sign(key, path)


def one_sentence(err: str) -> str:
    """The stderr of a refusal: exactly one line, ``teaagent: ...``, one sentence, no traceback."""
    assert err.startswith("teaagent: "), err
    assert err.endswith(".\n"), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err[len("teaagent: ") : -1]


def sharing(prefix: str, marker: str) -> str:
    """A request id that starts with ``prefix`` then ``marker`` (an origin chooses its ids)."""
    return (prefix + marker + secrets.token_hex(16))[:32]


# -- stand-ins: an approver that answers what the real one never does --------------------------------


@contextlib.contextmanager
def serving(port: int, *routes: Route) -> Iterator[list[str]]:
    """An HTTP server on ``port`` with ``routes``, in a thread; yields the calls it received."""
    calls: list[str] = []

    async def record(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            calls.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    app = Starlette(routes=list(routes))
    server = uvicorn.Server(
        uvicorn.Config(record, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE
    while not server.started:
        assert thread.is_alive(), "the stand-in did not start"
        assert time.monotonic() < deadline, "the stand-in did not start in time"
        time.sleep(0.01)
    try:
        yield calls
    finally:
        server.should_exit = True
        thread.join(timeout=DEADLINE)


def item_json(request: dict[str, Any]) -> dict[str, Any]:
    """The approver's ``Item`` of a pending request, as a stand-in serves it."""
    return {
        **{name: request[name] for name in ("request_id", "origin", "tool_name", "arguments", "reason")},
        **{name: request[name] for name in ("payload_digest", "run_id", "call_id", "required_approvals")},
        **{name: request[name] for name in ("peers", "created_at", "expires_at")},
        "seconds_left": max(0, request["expires_at"] - int(time.time())),
        "state": "pending",
        "decision": None,
        "rule": None,
        "request": request,
        "signature": sign_request(request, signer(request["origin"])),
    }


def readable(descriptor: int, seconds: float) -> bool:
    """Whether ``descriptor`` (a pty) has something to read within ``seconds``.

    ``select.poll``, not ``select.select``: a test worker that has run many modules can hold a
    descriptor numbered past select's limit of 1024 ("filedescriptor out of range in select()").
    """
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    return bool(poller.poll(max(0, int(seconds * 1000))))
