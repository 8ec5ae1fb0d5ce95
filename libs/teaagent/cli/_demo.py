"""``teaagent demo``: the whole story of one node in one command, with nothing but this machine.

Four nodes' keys are made with OpenSSH's ``ssh-keygen``. Node ``alpha`` runs tool calls through its
gate (schemas, permission mode, rate limits, audit log). Its high-risk call (``shell.run``) is refused
while no quorum can be reached, then runs once two of its three peers have signed it: ``beta`` with
teaagent's own signer, ``gamma`` the way an operator would, with ``ssh-keygen -Y sign``; ``delta``
denies, and a forged signature claiming to be ``beta`` is not counted. The quorum certificate is
verified again by ``teaagent quorum verify`` and the audit log by ``teaagent audit verify``, which
also catches a tampered copy.

The peers answer in-process here; between real nodes, their relays carry the same signed documents.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from teaagent.audit import AuditLogger
from teaagent.config import load_config
from teaagent.errors import ApprovalDeniedError, ConfigError
from teaagent.policy import ApprovalPolicy, MultiSigQuorumConfig, PermissionMode
from teaagent.quorum import (
    approval_statement,
    build_certificate,
    build_request,
    evaluate,
    sign_approval,
    sign_denial,
    sign_request,
    statement_bytes,
)
from teaagent.runner._gate import ToolGate
from teaagent.signing import SSHPrivateKey, load_private_key, signature_to_wire
from teaagent.tools import workspace_registry

NODES = ("alpha", "beta", "delta", "gamma")
PEERS = ("beta", "delta", "gamma")


class _Step:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.number = 0

    def __call__(self, title: str) -> None:
        self.number += 1
        self.console.rule(f"[bold]{self.number}. {title}", align="left")


def _keygen(folder: Path, name: str) -> tuple[Path, str]:
    path = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@demo", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path, path.with_name(name + ".pub").read_text().strip()


def _write_config(folder: Path, public: dict[str, str]) -> Path:
    peers = "".join(
        f'\n[peers.{peer}]\npublic_key = "{public[peer]}"\nrelay_url = "http://127.0.0.1:{8711 + n}"\n'
        for n, peer in enumerate(PEERS)
    )
    text = f"""# Node alpha of the demo cluster (see ARCHITECTURE.md, Node configuration).
agent_id = "alpha"
private_key = "keys/alpha"
redis_url = "embedded"
relay_url = "http://127.0.0.1:8701"
workspace = "workspace"

[agent]
permission_mode = "workspace-write"
provider = "scripted"

[quorum]
enabled = true
required_approvals = 2
high_risk_patterns = ["shell.*", "fs.delete"]
timeout_seconds = 120
{peers}"""
    path = folder / "alpha.toml"
    path.write_text(text)
    return path


class _InProcessPeers:
    """The peers' side of the protocol, answered in this process (their relays carry it between nodes)."""

    def __init__(
        self,
        *,
        origin_key: SSHPrivateKey,
        peer_keys: dict[str, Path],
        config: MultiSigQuorumConfig,
        folder: Path,
        say: Callable[[str], None],
    ) -> None:
        self.origin_key = origin_key
        self.peer_keys = peer_keys
        self.config = config
        self.folder = folder
        self.say = say
        self.certificate: dict[str, Any] | None = None

    def obtain(
        self, *, tool_name: str, arguments: dict[str, Any], call_id: str, run_id: str | None, reason: str
    ) -> dict[str, Any]:
        request = build_request(
            origin="alpha",
            run_id=run_id or "demo",
            call_id=call_id,
            tool_name=tool_name,
            arguments=arguments,
            reason=reason,
            config=self.config,
        )
        request_signature = sign_request(request, self.origin_key)
        self.say(
            f"alpha signs request [cyan]{request['request_id'][:12]}…[/] for {tool_name} "
            f"{json.dumps(arguments)} (namespace teaagent-request), needs 2 of {', '.join(PEERS)}"
        )
        now = int(time.time())

        beta = sign_approval(request, "beta", load_private_key(self.peer_keys["beta"]), signed_at=now)
        self.say("beta's approver signs the approval statement with teaagent's SSHSIG signer")

        statement = self.folder / "gamma-statement.json"
        statement.write_bytes(statement_bytes(approval_statement(request, "gamma", now)))
        command = ["ssh-keygen", "-Y", "sign", "-n", "teaagent-approval", "-f", str(self.peer_keys["gamma"])]
        subprocess.run([*command, str(statement)], check=True, capture_output=True)
        armored = statement.with_name(statement.name + ".sig").read_text()
        gamma = {"statement": json.loads(statement.read_bytes()), "signature": signature_to_wire(armored)}
        self.say("gamma's operator signs the same statement bytes with [bold]ssh-keygen -Y sign[/]")

        delta = sign_denial(request, "delta", load_private_key(self.peer_keys["delta"]), "not on a Friday")
        self.say("delta denies it: one denial of three cannot block a 2-of-3 quorum")

        mallory = self.folder / "keys" / "mallory"
        forged = sign_approval(request, "beta", load_private_key(mallory), signed_at=now)
        outcome = evaluate(request, [forged], [], self.config)
        self.say(f"a forged approval claiming to be beta is refused: [red]{outcome.rejected['beta']}[/]")

        outcome = evaluate(request, [forged, beta, gamma, beta], [delta], self.config)
        self.say(f"alpha counts the signatures itself: [green]{outcome.describe()}[/]")
        self.certificate = build_certificate(request, request_signature, outcome.approvals)
        return self.certificate


def demo(
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Keep the demo's files (keys, config, workspace, audit log) in this folder."
        ),
    ] = None,
) -> None:
    """Show teaagent at work, end to end: gate, audit log, SSH-signed N-of-M quorum, verification."""
    if shutil.which("ssh-keygen") is None:
        raise ConfigError("the demo needs OpenSSH's ssh-keygen on PATH.")
    console = Console(highlight=False, soft_wrap=True)
    step = _Step(console)
    with tempfile.TemporaryDirectory(prefix="teaagent-demo-") as scratch:
        folder = Path(directory) if directory is not None else Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        if any(folder.iterdir()):
            raise ConfigError(f"the demo folder {folder} is not empty; give an empty or new one.")
        _run(folder, console, step)


def _run(folder: Path, console: Console, step: _Step) -> None:
    from teaagent.cli._main import run

    def cli(argv: list[str]) -> int:
        # The command writes its errors to stderr: keep them in order with what was printed.
        sys.stdout.flush()
        code = run(argv)
        sys.stderr.flush()
        return code

    say = console.print
    step("Four nodes, four SSH keys (made by ssh-keygen)")
    keys = folder / "keys"
    keys.mkdir()
    paths: dict[str, Path] = {}
    public: dict[str, str] = {}
    for name in (*NODES, "mallory"):
        paths[name], public[name] = _keygen(keys, name)
    (folder / "workspace").mkdir()
    config_path = _write_config(folder, public)
    node = load_config(config_path)
    say(f"node alpha: {config_path} ({node.quorum.describe_quorum()})")
    cli(["keys", "fingerprint", "--config", str(config_path)])

    step("Tool calls through alpha's gate, into a hash-chained audit log")
    audit_path = folder / "audit" / "alpha.jsonl"
    audit = AuditLogger(audit_path)
    registry = workspace_registry(node.workspace)
    peers = _InProcessPeers(
        origin_key=load_private_key(paths["alpha"]),
        peer_keys=paths,
        config=node.quorum,
        folder=folder,
        say=lambda text: say(f"  {text}"),
    )

    def gate(mode: PermissionMode, quorum_gate: Any = None) -> ToolGate:
        policy = ApprovalPolicy.for_workspace(
            node.workspace,
            mode=mode,
            agent_id="alpha",
            multi_sig_config=node.quorum,
            quorum_gate=quorum_gate,
            use_presets=False,
        )
        return ToolGate(registry=registry, policy=policy, audit=audit, run_id="demo-run")

    local = gate(PermissionMode.WORKSPACE_WRITE)
    local.call(
        "fs.write", {"path": "build/app.log", "content": "old build\n", "create_dirs": True}, call_id="c1"
    )
    say("fs.write build/app.log: allowed by the permission mode (workspace-write)")
    listing = local.call("fs.list", {"recursive": True}, call_id="c2")
    say(f"fs.list: {[entry['path'] for entry in listing['entries']]}")
    try:
        local.call("fs.read", {"path": "../../etc/passwd"}, call_id="c3")
    except Exception as exc:
        say(f"fs.read ../../etc/passwd: [red]refused[/]: {exc}")

    try:
        local.call("shell.run", {"command": "rm -rf build"}, call_id="c4", reason="clean the build")
    except ApprovalDeniedError as exc:
        say(f"shell.run rm -rf build: [red]denied[/]: {exc}")

    step("No quorum reachable: the high-risk call fails closed, even in danger-full-access")
    try:
        gate(PermissionMode.DANGER_FULL_ACCESS).call(
            "shell.run", {"command": "rm -rf build"}, call_id="c5", reason="clean the build"
        )
    except ApprovalDeniedError as exc:
        say(f"shell.run rm -rf build: [red]denied[/]: {exc}")

    step("The same call with the peers answering: 2 of 3 SSH signatures")
    result = gate(PermissionMode.DANGER_FULL_ACCESS, peers).call(
        "shell.run", {"command": "rm -rf build && echo cleaned"}, call_id="c6", reason="clean the build"
    )
    say(f"shell.run ran after the quorum: exit {result['exit_code']}, stdout {result['stdout'].strip()!r}")
    certificate_path = folder / "certificate.json"
    certificate_path.write_text(json.dumps(peers.certificate, indent=2))

    step("Anyone with the cluster's public keys can verify the certificate offline")
    console.print(f"$ teaagent quorum verify {certificate_path.name} --config alpha.toml")
    code = cli(["quorum", "verify", str(certificate_path), "--config", str(config_path)])
    say(f"exit {code}")

    step("The audit log verifies; a tampered copy does not")
    audit.close()
    console.print(f"$ teaagent audit verify {audit_path.relative_to(folder)}")
    say(f"exit {cli(['audit', 'verify', str(audit_path)])}")
    tampered = audit_path.with_name("tampered.jsonl")
    lines = audit_path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace("build/app.log", "build/app.lag")
    tampered.write_text("".join(lines))
    shutil.copy(audit_path.with_name(audit_path.name + ".key"), tampered.with_name(tampered.name + ".key"))
    console.print(f"$ teaagent audit verify {tampered.relative_to(folder)}   # one path changed on line 2")
    say(f"exit {cli(['audit', 'verify', str(tampered)])}")
    console.rule()
    say(
        f"files: {folder}"
        if "teaagent-demo-" not in str(folder)
        else "done (run with --dir DIR to keep the files)"
    )
