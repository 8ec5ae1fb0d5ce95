"""Relays across hosts speak HTTPS: ``[tls] cert``/``key`` serve it, ``[tls] ca`` trusts a private CA.

A story with a self-signed CA made by ``cryptography``: beta's relay serves HTTPS with a
certificate that CA signed; alpha's relay, not trusting that CA, cannot deliver its request (the
delivery waits, its error naming the failed verification) and beta's inbox stays empty; once
alpha's configuration names the CA (``[tls] ca``), the same queued delivery reaches beta.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from relay_support import MakeCluster, Node, RelayProcess, wait_until
from tls_support import PrivateCA

from teaagent.config import load_config
from teaagent.store import open_store

pytestmark = pytest.mark.slow

WAIT = 20.0


class HttpsRelay(RelayProcess):
    """``teaagent relay serve`` of a node whose relay_url is https://, waited for over HTTPS."""

    def __init__(self, node: Node, log_folder: Path, ca: Path) -> None:
        super().__init__(node, log_folder)
        self.verify = ssl.create_default_context(cafile=str(ca))

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.node.port}"

    def inbox(self) -> list[dict[str, object]]:
        response = httpx.get(f"{self.url}/v1/inbox", headers=self.node.headers, verify=self.verify, timeout=5)
        response.raise_for_status()
        items: list[dict[str, object]] = response.json()
        return items


def _delivery_errors(redis_url: str, node: Node) -> list[str]:
    async def read() -> list[str]:
        async with open_store(redis_url, prefix=node.redis_prefix) as store:
            queue = store.queue("deliveries")
            # Waiting in the stream, or waiting out a retry's backoff in the schedule.
            entries = [*await queue.entries(), *(delivery for _due, delivery in await queue.scheduled())]
            return [entry.last_error for entry in entries if entry.last_error]

    return asyncio.run(read())


def test_a_relay_delivers_over_https_only_to_a_peer_whose_ca_it_trusts(
    tmp_path: Path, redis_url: str, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha, beta = nodes["alpha"], nodes["beta"]
    # A 4 s bound on each delivery (not the suite's 1 s): a TLS handshake with a relay that has
    # just started, on a loaded host, may take longer, and a timeout names no certificate.
    alpha.extra_env["TEAAGENT_RELAY_DELIVERY_MIN_IDLE_SECONDS"] = "8"  # taken over in 8 s
    ca = PrivateCA(tmp_path / "tls")
    served = ca.issue("beta")
    https_beta = f"https://127.0.0.1:{beta.port}"
    for node in (alpha, beta):
        node.config_path.write_text(node.config_path.read_text().replace(beta.url, https_beta))
    with beta.config_path.open("a") as handle:
        handle.write(f'\n[tls]\ncert = "tls/{served.cert.name}"\nkey = "tls/{served.key.name}"\n')
    assert load_config(beta.config_path).tls.cert == served.cert

    beta_relay = HttpsRelay(beta, tmp_path, ca.cert_path)
    alpha_relay = RelayProcess(alpha, tmp_path)
    beta_relay.start()
    try:
        # A client that does not know the CA is refused by beta's relay: it is HTTPS for real.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{https_beta}/health", timeout=5)
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.get(f"http://127.0.0.1:{beta.port}/health", timeout=5)

        alpha_relay.start()
        request = alpha.request()
        submitted = httpx.post(f"{alpha.url}/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        assert submitted.status_code == 201, submitted.text

        # 1. Without [tls] ca, alpha verifies beta against the public CAs: refused, retried. (An
        # attempt may time out first on a loaded host: its 1 s bound; the retries go on.)
        def refused() -> list[str]:
            errors = _delivery_errors(redis_url, alpha)
            return errors if any("CERTIFICATE_VERIFY_FAILED" in error for error in errors) else []

        errors = wait_until(refused, timeout=WAIT)
        assert errors, f"beta never refused alpha its certificate: {_delivery_errors(redis_url, alpha)}"
        assert all("beta's relay at " + https_beta in error for error in errors), errors
        assert beta_relay.inbox() == []

        # 2. Alpha trusts the CA: the same queued delivery reaches beta over HTTPS.
        alpha_relay.stop()
        with alpha.config_path.open("a") as handle:
            handle.write('\n[tls]\nca = "tls/ca.crt"\n')
        assert load_config(alpha.config_path).tls.ca == ca.cert_path
        alpha_relay = RelayProcess(alpha, tmp_path).start()
        items = wait_until(beta_relay.inbox, timeout=WAIT)
    finally:
        alpha_relay.stop()
        beta_relay.stop()

    assert [item["request_id"] for item in items] == [request["request_id"]]
    assert items[0]["origin"] == "alpha"


def test_relay_serve_refuses_a_tls_key_of_another_certificate(tmp_path: Path) -> None:
    ca = PrivateCA(tmp_path / "tls")
    one, other = ca.issue("one"), ca.issue("other")
    (tmp_path / "keys").mkdir()
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "alpha",
            "-f",
            str(tmp_path / "keys" / "alpha"),
        ],
        check=True,
    )
    config = tmp_path / "alpha.toml"
    config.write_text(
        'agent_id = "alpha"\nprivate_key = "keys/alpha"\nrelay_url = "https://127.0.0.1:8701"\n'
        f'[tls]\ncert = "tls/{one.cert.name}"\nkey = "tls/{other.key.name}"\n'
    )

    finished = subprocess.run(
        [sys.executable, "-m", "teaagent", "relay", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )

    assert finished.returncode == 2
    assert finished.stderr == (
        f"teaagent: {config}: tls.cert and tls.key are not a PEM certificate and its private key: "
        "key values mismatch.\n"
    )
