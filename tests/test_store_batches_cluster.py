"""The calls of one moment as one pipeline on a real Redis Cluster (``CommandBatches``).

redis-py's cluster pipeline sends each command to the node of its key's slot: a batch of calls on
keys of several slots answers each caller with its own reply, or its own error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
import redis.exceptions
from redis_cluster_fixture import RedisCluster

from teaagent.store import StoreOptions
from teaagent.store._connection import make_batches

SLOTTED = 12  # keys of this many hash tags land on every one of three masters with odds near 1


@pytest.mark.slow
def test_a_batch_on_a_cluster_reaches_every_keys_node_and_fails_a_bad_call_alone(
    redis_cluster: RedisCluster, cluster_prefix: str
) -> None:
    keys = [f"{cluster_prefix}:batch:{{{n}}}" for n in range(SLOTTED)]

    async def scenario() -> list[Any]:
        batches = make_batches(redis_cluster.url, StoreOptions(), cluster=True)
        assert batches is not None
        try:
            calls = [
                batches.execute("EVAL", "return redis.call('SET', KEYS[1], ARGV[1])", 1, key, key)
                for key in keys
            ]
            calls.append(batches.execute("EVALSHA", "0" * 40, 1, keys[0]))
            written = await asyncio.gather(*calls, return_exceptions=True)
            read = await asyncio.gather(*(batches.execute("GET", key) for key in keys))
            return [*written, *read]
        finally:
            with contextlib.suppress(Exception):
                await batches.client.delete(*keys[:1])
            await batches.aclose()

    answers = run(scenario)
    assert answers[:SLOTTED] == [b"OK"] * SLOTTED
    assert isinstance(answers[SLOTTED], redis.exceptions.NoScriptError)
    assert answers[SLOTTED + 1 :] == [key.encode() for key in keys]


def run(scenario: Any) -> Any:
    return asyncio.run(scenario())
