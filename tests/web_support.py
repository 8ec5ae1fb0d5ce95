"""The web inbox's tests: beta's real relay and approver processes, alpha's requests delivered to them.

beta is the node under test (its approver serves ``/web``); alpha is the origin, whose requests
are signed with alpha's key and delivered to beta's relay as alpha's relay would deliver them.
beta's ``[approver] operators`` lists an operator key made by the real ``ssh-keygen``.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import SSHKey
from redis_fixture import delete_prefix, new_prefix
from relay_support import ApproverProcess, Node, RelayProcess, free_port, signer, write_cluster

from teaagent.approver_client import ApproverClient
from teaagent.config import load_config
from teaagent.errors import RelayError
from teaagent.quorum import sign_request
from teaagent.relay_client import RelayClient

DEADLINE = 30.0  # seconds for anything a test waits on (a loaded two-core host)


@dataclass
class WebCluster:
    """beta's relay and approver (real processes), alpha the origin, an operator key of beta's."""

    nodes: dict[str, Node]
    operator: SSHKey
    stranger: SSHKey
    relay: RelayProcess
    approver: ApproverProcess
    token: str

    @property
    def beta(self) -> Node:
        return self.nodes["beta"]

    @property
    def url(self) -> str:
        return self.approver.url

    def request(self, **fields: Any) -> dict[str, Any]:
        return self.nodes["alpha"].request(**fields)

    def client(self) -> ApproverClient:
        return ApproverClient(self.url, token=self.token)

    def short_session_approver(self, seconds: int) -> ApproverProcess:
        """Another approver of beta's, started, whose web sessions last ``seconds``."""
        return ApproverProcess(
            self.beta,
            self.approver.log_path.parent,
            port=free_port(),
            TEAAGENT_APPROVER_WEB_SESSION_SECONDS=str(seconds),
        ).start()

    def deliver(self, request: dict[str, Any], *, wait: bool = True) -> dict[str, Any]:
        """Deliver the request to beta's inbox as alpha's relay would; wait until beta's approver shows it."""
        with RelayClient(self.beta.url) as relay:
            relay.deliver_request(request, sign_request(request, signer("alpha")))
        if wait:
            with self.client() as client:
                deadline = time.monotonic() + DEADLINE
                while True:
                    try:
                        client.get_request(request["request_id"])
                        break
                    except RelayError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
        return request

    def decision(self, request_id: str) -> Any:
        with self.client() as client:
            return client.get_request(request_id).decision

    def link(self, base: str | None = None) -> str:
        """A one-time sign-in link, as ``teaagent approvals web`` gets it."""
        answer = httpx.post(
            f"{base or self.url}/web/links", headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )
        answer.raise_for_status()
        return (base or self.url) + answer.json()["path"]

    def ensure_running(self) -> None:
        if self.relay.process is None or self.relay.process.poll() is not None:
            self.relay.start()
        if self.approver.process is None or self.approver.process.poll() is not None:
            self.approver.start()


def beta_with_operators(
    folder: Path, redis_url: str, prefix: str, operators: Sequence[SSHKey], **options: Any
) -> dict[str, Node]:
    """alpha, beta and gamma written in ``folder``; beta's ``[approver] operators`` lists ``operators``."""
    nodes = write_cluster(
        folder,
        ["alpha", "beta", "gamma"],
        redis_url=redis_url,
        prefix=prefix,
        operators={"beta": ["ops-placeholder"]},
        **options,
    )
    # beta's operators are keys of the real ssh-keygen (beta reads the file as [approver] operators).
    (folder / "beta.operators").write_text("".join(f"beta {key.public_line}\n" for key in operators))
    return nodes


@pytest.fixture(scope="module", name="web_cluster")
def fixture_web_cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str, ssh_key_factory: Callable[..., SSHKey]
) -> Iterator[WebCluster]:
    """beta's relay and approver for the module (each test sends requests of its own)."""
    folder = tmp_path_factory.mktemp("web")
    prefix = new_prefix()
    operator = ssh_key_factory("web-ops")
    stranger = ssh_key_factory("web-stranger")
    nodes = beta_with_operators(folder, redis_server, prefix, [operator])
    logs = folder / "logs"
    logs.mkdir()
    beta = nodes["beta"]
    cluster = WebCluster(
        nodes=nodes,
        operator=operator,
        stranger=stranger,
        relay=RelayProcess(beta, logs),
        approver=ApproverProcess(beta, logs),
        token=load_config(beta.config_path).load_token(),
    )
    try:
        cluster.relay.start()
        cluster.approver.start()
        yield cluster
    finally:
        cluster.approver.stop()
        cluster.relay.stop()
        delete_prefix(redis_server, prefix)


def ssh_keygen_sign(key: SSHKey, path: Path, namespace: str = "teaagent-approval") -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-Y", "sign", "-n", namespace, "-f", str(key.private_path), str(path)],
        check=True,
        capture_output=True,
    )
    return Path(f"{path}.sig")


def fingerprint_of(key: SSHKey) -> str:
    result = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(key.public_path)], check=True, capture_output=True, text=True
    )
    return result.stdout.split()[1]


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page carries no CSRF token"
    return found.group(1)


HOSTILE_SCRIPT = "<script>window.__pwned = 'script'</script>"
HOSTILE_IMG = '"><img src=x onerror="window.__pwned=\'img\'">'
BIDI = "invoice\u202egpj.exe"
MEGABYTE = 1_000_000  # 1 MB; the store holds a document of at most 1 MiB, signature and all


def hostile_arguments() -> dict[str, Any]:
    return {
        "command": HOSTILE_SCRIPT,
        "path": HOSTILE_IMG,
        "name": BIDI,
        "blob": "A" * MEGABYTE,
    }


def store_past_the_relay(cluster: WebCluster, request: dict[str, Any]) -> dict[str, Any]:
    """File a request in beta's inbox straight in its store (past the relay's 64 KiB body limit)."""

    from teaagent._canonical import canonical
    from teaagent.store import open_store

    async def put() -> None:
        async with open_store(
            load_config(cluster.beta.config_path).redis_url, prefix=cluster.beta.redis_prefix
        ) as store:
            document = canonical({"request": request, "signature": sign_request(request, signer("alpha"))})
            await store.inbox.accept(
                "alpha", request["request_id"], document, expires_at=request["expires_at"]
            )

    # In a thread of its own: Playwright's sync API keeps an event loop running in this one.
    failures: list[BaseException] = []
    thread = threading.Thread(target=lambda: _run(put(), failures))
    thread.start()
    thread.join()
    if failures:
        raise failures[0]
    return request


def _run(coroutine: Any, failures: list[BaseException]) -> None:
    import asyncio

    try:
        asyncio.run(coroutine)
    except BaseException as exc:
        failures.append(exc)
