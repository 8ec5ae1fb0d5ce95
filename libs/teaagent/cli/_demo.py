"""``teaagent demo``: a four-node cluster on this machine, one embedded Redis, one story.

Keys are made with OpenSSH's ``ssh-keygen``; one embedded Redis-compatible server carries every
node's queues under its own key prefix; each node runs its relay as a real process. Node ``alpha``
shows its gate (schemas, permission mode, path confinement, audit log), then its agent runs a
task whose high-risk ``shell.run`` waits for 2 of its 3 peers: ``beta``'s operator signs with
teaagent, ``gamma``'s with ``ssh-keygen -Y sign``, ``delta`` denies, and a forged signature
claiming to be ``beta`` is refused. The certificate is verified offline by ``teaagent quorum
verify`` and the audit log by ``teaagent audit verify``, which also catches a tampered copy.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console

from teaagent.audit import AuditLogger
from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError, RelayError, TeaAgentError
from teaagent.quorum import approval_statement, denial_statement, statement_bytes
from teaagent.relay_client import InboxItem, RelayClient
from teaagent.runner._gate import ToolGate
from teaagent.runner._node import node_audit_path, node_policy
from teaagent.signing import load_private_key, signature_to_wire, sshsig_sign
from teaagent.store import EmbeddedRedis
from teaagent.tools import workspace_registry

NODES = ("alpha", "beta", "delta", "gamma")
PEERS = ("beta", "delta", "gamma")
READY_TIMEOUT_SECONDS = 30  # a relay starts in about a second; a slow machine gets thirty
RUN_TIMEOUT_SECONDS = 120  # the quorum's own timeout is 120 s: the run ends by then either way
TASK = "Clean the build folder."


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _keygen(folder: Path, name: str) -> str:
    path = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@demo", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_name(name + ".pub").read_text().strip()


def _write_configs(folder: Path, public: dict[str, str], redis_url: str) -> dict[str, Path]:
    """One node.toml per node: alpha asks its three peers; each peer knows alpha."""
    urls = {node: f"http://127.0.0.1:{_free_port()}" for node in NODES}
    paths: dict[str, Path] = {}
    for node in NODES:
        others = PEERS if node == "alpha" else ("alpha",)
        peers = "".join(
            f'\n[peers.{peer}]\npublic_key = "{public[peer]}"\nrelay_url = "{urls[peer]}"\n'
            for peer in others
        )
        quorum = (
            "\n[quorum]\nenabled = true\nrequired_approvals = 2\n"
            'high_risk_patterns = ["shell.*", "fs.delete"]\ntimeout_seconds = 120\n'
            if node == "alpha"
            else ""
        )
        mode = "danger-full-access" if node == "alpha" else "workspace-write"
        text = (
            f"# Node {node} of the demo cluster (ARCHITECTURE.md, Node configuration).\n"
            f'agent_id = "{node}"\nprivate_key = "keys/{node}"\nredis_url = "{redis_url}"\n'
            f'relay_url = "{urls[node]}"\nworkspace = "{node}/workspace"\ndata_dir = "{node}/data"\n\n'
            f'[agent]\npermission_mode = "{mode}"\nprovider = "scripted"\n{quorum}{peers}'
        )
        (folder / node / "workspace").mkdir(parents=True)
        paths[node] = folder / f"{node}.toml"
        paths[node].write_text(text)
    return paths


def _script(folder: Path) -> Path:
    """The model's turns for the task, played by the offline scripted provider."""
    turns = [
        {
            "content": "Let me see what the workspace holds.",
            "tool_calls": [{"tool_name": "fs.list", "arguments": {"recursive": True}}],
        },
        {
            "content": "There is a stale build folder; removing it needs my peers' sign-off.",
            "tool_calls": [
                {"tool_name": "shell.run", "arguments": {"command": "rm -rf build && echo cleaned"}}
            ],
            "expect": ["build/app.log"],
        },
        {"content": "The build folder is gone: the command printed 'cleaned'.", "expect": ["cleaned"]},
    ]
    path = folder / "alpha-script.json"
    path.write_text(json.dumps({"format": 1, "turns": turns}, indent=2))
    return path


@contextmanager
def _relays(configs: dict[str, Path], logs: Path) -> Iterator[None]:
    """Start every node's relay as its own process, and stop them all at the end."""
    logs.mkdir()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for node, config in configs.items():
            with (logs / f"relay-{node}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "teaagent", "relay", "serve", "--config", str(config)],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for node, process in zip(configs, processes, strict=True):
            _wait_ready(load_config(configs[node]).relay_url, process, logs / f"relay-{node}.log")
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-800:]
            raise TeaAgentError(f"the relay at {url} exited while starting: {tail}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TeaAgentError(f"the relay at {url} did not answer within {READY_TIMEOUT_SECONDS} s.")


class _Operators:
    """The peers' operators, each with their own key and their own relay."""

    def __init__(self, folder: Path, configs: dict[str, Path], say: Callable[[str], None]) -> None:
        self.folder = folder
        self.nodes: dict[str, NodeConfig] = {node: load_config(configs[node]) for node in NODES}
        self.say = say

    def client(self, node: str) -> RelayClient:
        config = self.nodes[node]
        return RelayClient(config.relay_url, token=config.load_token())

    def wait_for_request(self, node: str) -> InboxItem:
        with self.client(node) as relay:
            deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
            while time.monotonic() < deadline:
                items = relay.list_inbox(wait=5.0)
                if items:
                    return items[0]
        raise TeaAgentError(f"{node}'s relay received no request from alpha.")

    def approve_with_teaagent(self, node: str, item: InboxItem) -> None:
        statement = approval_statement(item.request, node, int(time.time()))
        key = load_private_key(self.nodes[node].private_key or "")
        signature = signature_to_wire(sshsig_sign(statement_bytes(statement), key, "teaagent-approval"))
        with self.client(node) as relay:
            relay.submit_decision(item.request_id, statement, signature)
        self.say(f"[bold]{node}[/]'s operator approves, signed by teaagent with {node}'s key")

    def approve_with_ssh_keygen(self, node: str, item: InboxItem) -> None:
        statement = approval_statement(item.request, node, int(time.time()))
        path = self.folder / f"{node}-approval.json"
        path.write_bytes(statement_bytes(statement))
        key = self.nodes[node].private_key
        subprocess.run(
            ["ssh-keygen", "-Y", "sign", "-n", "teaagent-approval", "-f", str(key), str(path)],
            check=True,
            capture_output=True,
        )
        armored = path.with_name(path.name + ".sig").read_text()
        with self.client(node) as relay:
            relay.submit_decision(item.request_id, statement, signature_to_wire(armored))
        self.say(
            f"[bold]{node}[/]'s operator approves with [bold]ssh-keygen -Y sign -n teaagent-approval[/] "
            f"over the statement's bytes ({path.name})"
        )

    def deny(self, node: str, item: InboxItem, reason: str) -> None:
        statement = denial_statement(item.request, node, int(time.time()), reason)
        key = load_private_key(self.nodes[node].private_key or "")
        signature = signature_to_wire(sshsig_sign(statement_bytes(statement), key, "teaagent-denial"))
        with self.client(node) as relay:
            relay.submit_decision(item.request_id, statement, signature)
        self.say(f"[bold]{node}[/]'s operator denies it ({reason!r}): one denial cannot block 2 of 3")

    def forge(self, claimed: str, item: InboxItem) -> None:
        """Mallory signs as ``claimed`` with her own key and sends it straight to alpha's relay."""
        statement = approval_statement(item.request, claimed, int(time.time()))
        key = load_private_key(self.folder / "keys" / "mallory")
        signature = signature_to_wire(sshsig_sign(statement_bytes(statement), key, "teaagent-approval"))
        with RelayClient(self.nodes["alpha"].relay_url) as relay:
            try:
                relay.deliver_decision(item.request_id, statement, signature)
            except RelayError as exc:
                self.say(
                    f"a forged approval claiming to be {claimed} is [red]refused[/] by alpha's relay: {exc}"
                )
                return
        raise TeaAgentError("alpha's relay accepted a forged approval.")


def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Keep the demo's files (keys, configs, audit logs, Redis data) in this folder."
        ),
    ] = None,
) -> None:
    """Show teaagent at work: four nodes, relays on an embedded Redis, an SSH-signed 2-of-3 quorum."""
    if shutil.which("ssh-keygen") is None:
        raise ConfigError("the demo needs OpenSSH's ssh-keygen on PATH.")
    console = Console(highlight=False, soft_wrap=True)
    with tempfile.TemporaryDirectory(prefix="teaagent-demo-") as scratch:
        folder = Path(directory) if directory is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            raise ConfigError(f"the demo folder {folder} is not empty; give an empty or new one.")
        _run(folder.resolve(), console)
        if directory is not None:
            console.print(f"The demo's files are in {folder}.")


def _run(folder: Path, console: Console) -> None:
    number = 0

    def step(title: str) -> None:
        nonlocal number
        number += 1
        console.rule(f"[bold]{number}. {title}", align="left")

    def cli(argv: list[str]) -> int:
        console.print(f"$ teaagent {' '.join(argv)}")
        sys.stdout.flush()  # the command writes to the same terminal: keep the lines in order
        # A process of its own, as a user would run it (and no import of teaagent.cli._main,
        # which imports this module).
        return subprocess.run([sys.executable, "-m", "teaagent", *argv], check=False).returncode

    say = console.print
    step("Four nodes, four SSH keys (ssh-keygen), one embedded Redis")
    keys = folder / "keys"
    keys.mkdir()
    public = {name: _keygen(keys, name) for name in (*NODES, "mallory")}
    with EmbeddedRedis(folder / "redis") as redis_server:
        say("an embedded Redis-compatible server on loopback (append-only, in redis/), a key prefix per node")
        configs = _write_configs(folder, public, redis_server.url)
        alpha = load_config(configs["alpha"])
        say(f"alpha.toml: {alpha.quorum.describe_quorum()} for shell.* and fs.delete")
        cli(["keys", "fingerprint", "--config", str(configs["alpha"])])
        _story(folder, configs, alpha, console, say, step, cli)


def _story(
    folder: Path,
    configs: dict[str, Path],
    alpha: NodeConfig,
    console: Console,
    say: Callable[[str], None],
    step: Callable[[str], None],
    cli: Callable[[list[str]], int],
) -> None:
    step("Tool calls through alpha's gate, into its hash-chained audit log")
    audit_path = node_audit_path(alpha)
    with AuditLogger(audit_path, run_id="demo-setup") as audit:
        gate = ToolGate(
            registry=workspace_registry(alpha.workspace),
            policy=node_policy(alpha, mode="workspace-write"),
            audit=audit,
            run_id="demo-setup",
        )
        gate.call(
            "fs.write", {"path": "build/app.log", "content": "old build\n", "create_dirs": True}, call_id="c1"
        )
        say("fs.write build/app.log: allowed by the permission mode (workspace-write)")
        try:
            gate.call("fs.read", {"path": "../../etc/passwd"}, call_id="c2")
        except TeaAgentError as exc:
            say(f"fs.read ../../etc/passwd: [red]refused[/]: {exc}")

    step("No relay up yet: shell.run fails closed, even in danger-full-access")
    code = cli(
        ["tools", "call", "--config", str(configs["alpha"]), "shell.run", '{"command": "rm -rf build"}']
    )
    say(f"exit {code} (3: approval denied); build/ is still there: {(alpha.workspace / 'build').exists()}")

    step("Each node starts its relay; alpha's agent runs a task")
    with _relays(configs, folder / "logs"):
        say(
            "relays up: "
            + ", ".join(f"{node} {load_config(path).relay_url}" for node, path in configs.items())
        )
        operators = _Operators(folder, configs, lambda text: say(f"  {text}"))
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        command = [sys.executable, "-m", "teaagent", "run", "--config", str(configs["alpha"])]
        command += ["--script", str(_script(folder)), TASK]
        console.print(f'$ teaagent run --config alpha.toml --script alpha-script.json "{TASK}"')
        sys.stdout.flush()
        agent = subprocess.Popen(command, env=environment)
        try:
            item = operators.wait_for_request("beta")
            say(
                f"  the peers' relays received request {item.request_id[:12]}… "
                f"for {item.tool_name} {item.arguments}"
            )
            operators.forge("beta", item)
            operators.deny("delta", operators.wait_for_request("delta"), "not on a Friday")
            operators.approve_with_teaagent("beta", item)
            operators.approve_with_ssh_keygen("gamma", operators.wait_for_request("gamma"))
            code = agent.wait(timeout=RUN_TIMEOUT_SECONDS)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    say(f"exit {code}; build/ is gone: {not (alpha.workspace / 'build').exists()}")
    if code != 0:
        raise TeaAgentError(f"the agent's run ended with exit code {code}.")

    step("Anyone with the cluster's public keys can verify the certificate offline")
    certificate = _certificate_from(audit_path)
    certificate_path = folder / "certificate.json"
    certificate_path.write_text(json.dumps(certificate, indent=2))
    say(f"exit {cli(['quorum', 'verify', str(certificate_path), '--config', str(configs['alpha'])])}")

    step("The audit log verifies; a tampered copy does not")
    say(f"exit {cli(['audit', 'verify', str(audit_path)])}")
    tampered = audit_path.with_name("tampered.jsonl")
    lines = audit_path.read_text().splitlines(keepends=True)
    lines[0] = lines[0].replace("build/app.log", "build/app.lag")
    tampered.write_text("".join(lines))
    shutil.copy(audit_path.with_name(audit_path.name + ".key"), tampered.with_name(tampered.name + ".key"))
    say(f"exit {cli(['audit', 'verify', str(tampered)])}   (one path changed on line 1)")
    console.rule()


def _certificate_from(audit_path: Path) -> dict[str, Any]:
    """The quorum certificate alpha's gate verified and recorded before it ran the command."""
    for line in audit_path.read_text().splitlines():
        record = json.loads(line)
        if record["event_type"] == "approval_granted" and "certificate" in record["payload"]:
            certificate: dict[str, Any] = record["payload"]["certificate"]
            return certificate
    raise TeaAgentError(f"no quorum certificate was recorded in {audit_path}.")
