"""The approver tests' cluster: beta's relay on a real socket, its approver in-process, alpha's requests."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_support import APPROVE_ECHO, DENY_RM, MakeCluster, Node, approver_in_process, served

from teaagent._http import client_verify
from teaagent_approver import AUDIT_FILE_NAME, DECISION_EVENT

WAIT = 20.0  # seconds a test waits for what takes well under one on an idle host

APPROVE_ECHO_DENY_RM = DENY_RM + APPROVE_ECHO


@pytest.fixture(name="cluster")
def fixture_cluster(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks beta and gamma (2 of 2); beta's rules deny ``rm *``, approve ``echo *``, ask the rest."""
    return make_cluster("alpha", "beta", "gamma", star="alpha", rules={"beta": APPROVE_ECHO_DENY_RM})


@pytest.fixture(name="beta_relay")
def fixture_beta_relay(cluster: dict[str, Node]) -> Iterator[Node]:
    """beta's relay on its port (delivering nowhere: alpha's relay does not run)."""
    with served(cluster["beta"]):
        yield cluster["beta"]


@asynccontextmanager
async def beta_approver(node: Node, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with approver_in_process(node, **overrides) as client:
        client.headers["Authorization"] = f"Bearer {node.token}"
        yield client


def deliver(alpha: Node, beta: Node, **fields: Any) -> dict[str, Any]:
    """Post one of alpha's signed requests to beta's inbox, as alpha's relay would."""
    request = alpha.request(**fields)
    response = httpx.post(
        f"{beta.url}/v1/inbox", json=alpha.signed(request), timeout=10, verify=client_verify()
    )
    assert response.status_code == 201, response.text
    return request


def metric(client: httpx.AsyncClient, name: str, **labels: str) -> float:
    registry = client.app.state.metrics.registry  # type: ignore[attr-defined]
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def audit_records(node: Node) -> list[dict[str, Any]]:
    path = node.data_dir / AUDIT_FILE_NAME
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [event["payload"] for event in events if event["event_type"] == DECISION_EVENT]


async def relay_item(beta: Node, request_id: str) -> dict[str, Any]:
    async with httpx.AsyncClient(verify=client_verify()) as client:
        response = await client.get(f"{beta.url}/v1/inbox/{request_id}", headers=beta.headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def ssh_sign(key_path: Path, data: bytes, folder: Path, namespace: str = "teaagent-approval") -> str:
    """Sign ``data`` with the real ``ssh-keygen -Y sign``; return the armored signature."""
    path = folder / f"statement-{time.monotonic_ns()}"
    path.write_bytes(data)
    subprocess.run(
        ["ssh-keygen", "-q", "-Y", "sign", "-n", namespace, "-f", str(key_path), str(path)],
        check=True,
        capture_output=True,
    )
    return Path(f"{path}.sig").read_text()
