"""Agent services for the agent tests: a node's configuration, the app in this process, a real process.

A node here is a real configuration file with a real key (written by ``relay_support``), a
workspace folder and a script for the offline ``scripted`` model, which every run plays from
its first turn.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from relay_support import ServiceProcess, free_port, private_key

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


class AgentProcess(ServiceProcess):
    """``teaagent agent serve`` for one node, as a real process on its loopback port."""

    stop_timeout = 15.0

    def __init__(
        self,
        node: AgentNode,
        log_folder: Path,
        env: Mapping[str, str] | None = None,
        *,
        own_script: bool = True,
    ) -> None:
        """``own_script=False`` leaves the script to node.toml and the environment (no test script)."""
        environment = dict(os.environ)
        environment.pop("TEAAGENT_CONFIG", None)
        environment.pop("TEAAGENT_LLM_SCRIPT", None)
        environment.pop("TEAAGENT_AGENT_LLM_SCRIPT", None)
        if own_script:
            environment["TEAAGENT_AGENT_LLM_SCRIPT"] = str(node.script_path)
        environment.update(env or {})
        super().__init__(
            "agent", node.config_path, log_folder, port=node.port, env=environment, label="agent"
        )
        self.node = node
