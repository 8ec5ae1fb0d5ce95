"""The Lua scripts, read once from the package and run by EVALSHA; a server that lost one is given it again.

A call is one EVALSHA; a NOSCRIPT answer (a restarted or flushed server) loads the script and sends
the call again. On a Redis Cluster each call goes to the node that owns its keys' slot (every
script's keys share one hash tag, ``teaagent.store._keys``), and the script is loaded on that node,
not on all of them: a replica that a failover promoted starts with an empty script cache (scripts
are not replicated), and so does a node restarted without persistence of it, so each node is given
a script the first time it lacks one it is asked to run.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis.asyncio.cluster
import redis.exceptions

from teaagent.store._connection import AsyncClient, CommandBatches, send_pipeline

__all__ = ["COMPOSITES", "LOAD_ATTEMPTS", "SCRIPT_NAMES", "AsyncScripts", "script_sha", "script_source"]

# Calls sent per script call at most: a NOSCRIPT twice in a row means the key's slot moved to
# another node between the load and the call (a failover); a third is not worth waiting for.
LOAD_ATTEMPTS = 3

SCRIPT_NAMES = (
    "accept_request",
    "record_decision",
    "record_unlist",
    "record_send",
    "ratelimit",
    "enqueue",
    "promote_due",
    "retry_later",
    "prune_consumers",
    "mark_queued",
    "record_delivery",
    "withdraw",
    "settle_elsewhere",
    "receive_request",
    "submit_request",
    "hold",
    "close_pending",
    "charge_once",
    "ack",
    "read_request",
    "read_wait",
)

# A composite script runs other scripts, in one call. Its source is each part's own file as a local
# function of (KEYS, ARGV), then its own file, which calls them: the parts are never written twice.
# receive_request, submit_request, record_unlist and record_send run on one server only (their keys
# have several hash tags); the others' keys share one, as every script's.
COMPOSITES: dict[str, tuple[str, ...]] = {
    "receive_request": ("hold", "ratelimit", "accept_request", "enqueue"),
    "submit_request": ("accept_request", "enqueue"),
    "withdraw": ("close_pending",),
    "settle_elsewhere": ("close_pending",),
    "charge_once": ("ratelimit",),
    "record_unlist": ("record_decision",),
    "record_send": ("record_unlist", "enqueue"),
}


@functools.cache
def script_source(name: str) -> str:
    """Return the text of ``lua/<name>.lua``; for a composite, its parts' texts first (``COMPOSITES``).

    Raises:
        ValueError: ``name`` is not one of ``SCRIPT_NAMES``.
    """
    if name not in SCRIPT_NAMES:
        raise ValueError(f"no Lua script named {name!r}")
    own = resources.files("teaagent.store.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
    parts = [
        f"local function {part}(KEYS, ARGV)\n{script_source(part).rstrip()}\nend\n\n"
        for part in COMPOSITES.get(name, ())
    ]
    return "".join(parts) + own


@functools.cache
def script_sha(name: str) -> str:
    """Return the SHA1 of ``lua/<name>.lua``, the name EVALSHA calls it by.

    Raises:
        ValueError: ``name`` is not one of ``SCRIPT_NAMES``.
    """
    return hashlib.sha1(script_source(name).encode(), usedforsecurity=False).hexdigest()


class AsyncScripts:
    """Every script, run on one asyncio client (a server or a cluster): EVALSHA, loaded on NOSCRIPT.

    With ``batches``, each call goes out in the batch of its moment (:class:`CommandBatches`);
    a NOSCRIPT reply (the script did not run) loads it and sends that call again.
    """

    def __init__(self, client: AsyncClient, batches: CommandBatches | None = None) -> None:
        self._client = client
        # The client each call of run() goes through: a NOSCRIPT is answered by loading the script
        # where that client routed the call (on a cluster, its own map of the slots).
        self._runner = client if batches is None else batches.client
        self._execute = client.execute_command if batches is None else batches.execute
        self._shas = {name: script_sha(name) for name in SCRIPT_NAMES}

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name`` with ``keys`` and ``args`` (one round trip once loaded).

        Raises:
            redis.exceptions.RedisError: the server failed or refused the call (callers convert it).
            redis.exceptions.RedisClusterException: ``keys`` span two slots, or no node answered.
        """
        command = self.command(name, keys, args)
        for _attempt in range(LOAD_ATTEMPTS - 1):
            try:
                return await self._execute(*command)
            except redis.exceptions.NoScriptError:
                await _load(self._runner, name, keys)
        return await self._execute(*command)

    async def run_many(self, name: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run script ``name`` once per ``(keys, args)`` in one pipeline (no transaction), in order.

        Each reply is the call's own, or the error Redis answered for that call alone. Calls that
        met a NOSCRIPT (they did not run) are sent again once the script is loaded where they run.

        Raises:
            redis.exceptions.RedisError: the server failed (the whole pipeline; callers convert it).
            redis.exceptions.RedisClusterException: no node of the cluster answered.
        """

        async def send(chosen: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
            commands = [self.command(name, keys, args) for keys, args in chosen]
            return await send_pipeline(self._client, commands)

        replies = await send(calls)
        lost = [
            index for index, reply in enumerate(replies) if isinstance(reply, redis.exceptions.NoScriptError)
        ]
        if lost:
            # A restarted, flushed or promoted node lost the script: load it where those calls run
            # (their nodes, on a cluster) and send them again.
            await self.load(name, [key for index in lost for key in calls[index][0][:1]])
            for index, reply in zip(lost, await send([calls[index] for index in lost]), strict=True):
                replies[index] = reply
        return replies

    def command(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
        """The EVALSHA command of one call, for a pipeline: ``pipe.execute_command(*command)``.

        A cluster pipeline refuses ``pipe.evalsha`` (redis-py blocks the method) but routes this
        command by its keys like any other, each call to its own node.
        """
        return ("EVALSHA", self._shas[name], len(keys), *keys, *args)

    def sha(self, name: str) -> str:
        """The SHA1 of script ``name``, for an EVALSHA the caller sends itself."""
        return self._shas[name]

    async def load(self, name: str, keys: Sequence[str] = ()) -> None:
        """Load script ``name`` where it runs (after a NOSCRIPT: a restarted, flushed or promoted node).

        On one server, there. On a cluster, on the nodes that own the slots of ``keys`` (the keys
        of the calls that were refused), or on every primary when no key is given.

        Raises:
            redis.exceptions.RedisError: the server failed.
            redis.exceptions.RedisClusterException: no node of the cluster answered.
        """
        await _load(self._client, name, keys)


async def _load(client: AsyncClient, name: str, keys: Sequence[str]) -> None:
    """:meth:`AsyncScripts.load` through ``client``, on the nodes its map says own ``keys``."""
    source = script_source(name)
    if not isinstance(client, redis.asyncio.cluster.RedisCluster):
        await client.script_load(source)
        return
    owners = [client.get_node_from_key(key) for key in keys]
    # No key, or a slot no node serves (the cluster is reshaping): every primary learns it.
    chosen = owners if owners and None not in owners else client.get_primaries()
    nodes = {node.name: node for node in chosen if node is not None}
    await client.execute_command("SCRIPT LOAD", source, target_nodes=list(nodes.values()))
