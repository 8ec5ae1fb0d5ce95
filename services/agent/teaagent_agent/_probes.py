"""What ``/ready`` asks of the node's Redis and relay: one cheap call each, on a connection of its own."""

from __future__ import annotations

from teaagent.config import NodeConfig
from teaagent.errors import StoreError
from teaagent.relay_client import AsyncRelayClient
from teaagent.store import EMBEDDED_URL, EmbeddedRedis, connect, node_prefix

__all__ = ["redis_ping", "relay_ping"]


async def redis_ping(node: NodeConfig) -> str:
    """PING the Redis that counts the node's rate limits (the relay's embedded one, when embedded).

    Returns:
        How it answered, as a clause.

    Raises:
        StoreError: No server runs (embedded) or it does not answer.
    """
    url = node.redis_url
    if url == EMBEDDED_URL:
        found = EmbeddedRedis.running_url(node.data_dir)
        if found is None:
            raise StoreError(f"{node.agent_id}'s embedded Redis runs with its relay, which runs none")
        url = found
    store = connect(url, prefix=node_prefix(node.agent_id), cluster=node.redis_cluster)
    try:
        seconds = await store.ping()
    finally:
        await store.aclose()
    return f"PING answered in {seconds * 1000:.1f} ms"


async def relay_ping(node: NodeConfig, token: str) -> str:
    """List one item of the node's relay inbox with the node's token (a cheap authenticated call).

    Returns:
        How it answered, as a clause.

    Raises:
        RelayError: The relay does not answer, or refuses the token.
    """
    relay = AsyncRelayClient(node.relay_url, token=token, verify=node.tls.client_verify())
    try:
        await relay.list_inbox("pending", limit=1, wait=0)
    finally:
        await relay.aclose()
    return f"{relay.base_url} answers with this node's token"
