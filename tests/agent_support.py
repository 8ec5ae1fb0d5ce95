"""Agent services for the agent tests: a node's configuration, the app in this process, a real process.

A node here is a real configuration file with a real key (written by ``relay_support``), a
workspace folder and a script for the offline ``scripted`` model, which every run plays from
its first turn.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from relay_support import free_port, private_key

READY_TIMEOUT = 20.0
TOKEN = "agent-test-token-0123456789"


@dataclass
class AgentNode:
    """One node's files for the agent service."""

    folder: Path
    config_path: Path
    script_path: Path
    port: int
    token: str = TOKEN

    @property
    def workspace(self) -> Path:
        return self.folder / "workspace"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def script(self, turns: Iterable[Mapping[str, Any]]) -> None:
        self.script_path.write_text(json.dumps(list(turns)))

    def settings(self, **overrides: Any) -> Any:
        from teaagent_agent import Settings

        values: dict[str, Any] = {"config": str(self.config_path), "llm_script": str(self.script_path)}
        values.update(overrides)
        return Settings(**values)


def write_node(
    folder: Path,
    *,
    name: str = "alpha",
    permission_mode: str = "prompt",
    turns: Iterable[Mapping[str, Any]] = ({"content": "Done."},),
    extra: str = "",
) -> AgentNode:
    """A node without a quorum: its key, workspace, configuration file and script."""
    folder.mkdir(parents=True, exist_ok=True)
    key_path = folder / "keys" / name
    key_path.parent.mkdir(parents=True, exist_ok=True)
    key_path.write_bytes(
        private_key(name).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    (folder / "workspace").mkdir(exist_ok=True)
    port = free_port()
    config = folder / f"{name}.toml"
    config.write_text(
        f"""agent_id = "{name}"
private_key = "keys/{name}"
relay_url = "http://127.0.0.1:{free_port()}"
workspace = "workspace"
data_dir = "data-{name}"
token = "{TOKEN}"

[agent]
permission_mode = "{permission_mode}"
provider = "scripted"
port = {port}
{extra}"""
    )
    node = AgentNode(folder=folder, config_path=config, script_path=folder / "script.json", port=port)
    node.script(turns)
    return node


@contextlib.asynccontextmanager
async def in_app(node: AgentNode, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The node's agent app in this process, lifespan run, behind an httpx client (no sockets)."""
    from teaagent_agent import create_app

    app = create_app(node.settings(**overrides))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://agent.test", headers=node.headers, timeout=60
        ) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def frames(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The ``(event, data)`` frames of an SSE body (comments skipped)."""
    found = []
    for block in text.split("\n\n"):
        event, data = "message", None
        for line in block.splitlines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
        if data is not None:
            found.append((event, data))
    return found


class AgentProcess:
    """``teaagent agent serve`` for one node, as a real process on its loopback port."""

    def __init__(
        self,
        node: AgentNode,
        log_folder: Path,
        env: Mapping[str, str] | None = None,
        *,
        own_script: bool = True,
    ) -> None:
        """``own_script=False`` leaves the script to node.toml and the environment (no test script)."""
        self.node = node
        self.log_path = log_folder / f"agent-{int(time.time() * 1000)}.log"
        self.env = dict(env or {})
        self.own_script = own_script
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        env = dict(os.environ)
        env.pop("TEAAGENT_CONFIG", None)
        env.pop("TEAAGENT_LLM_SCRIPT", None)
        env.pop("TEAAGENT_AGENT_LLM_SCRIPT", None)
        if self.own_script:
            env["TEAAGENT_AGENT_LLM_SCRIPT"] = str(self.node.script_path)
        env.update(self.env)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "teaagent",
                    "agent",
                    "serve",
                    "--config",
                    str(self.node.config_path),
                    "--no-access-log",
                    "--log-level",
                    "warning",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the agent exited: {self.log_path.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.node.url}/health", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(
            f"the agent did not answer in {READY_TIMEOUT}s: {self.log_path.read_text()[-2000:]}"
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> AgentProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
