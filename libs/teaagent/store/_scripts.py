"""The Lua scripts, read once from the package and registered on each client (EVALSHA, NOSCRIPT reload)."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript

__all__ = ["SCRIPT_NAMES", "AsyncScripts", "script_source"]

SCRIPT_NAMES = (
    "accept_request",
    "record_decision",
    "ratelimit",
    "enqueue",
    "promote_due",
    "retry_later",
    "prune_consumers",
    "mark_queued",
)


@functools.cache
def script_source(name: str) -> str:
    """Return the text of ``lua/<name>.lua``.

    Raises:
        ValueError: ``name`` is not one of ``SCRIPT_NAMES``.
    """
    if name not in SCRIPT_NAMES:
        raise ValueError(f"no Lua script named {name!r}")
    return resources.files("teaagent.store.lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")


class AsyncScripts:
    """Every script registered on one asyncio client; a call is an EVALSHA, loading the script on NOSCRIPT."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    async def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` with ``keys`` and ``args`` (one round trip once loaded)."""
        return await self._scripts[name](keys=keys, args=args)

    def sha(self, name: str) -> str:
        """The SHA1 of script ``name``, for an EVALSHA the caller sends itself (in a pipeline)."""
        return str(self._scripts[name].sha)

    async def load(self, name: str) -> None:
        """Load script ``name`` on the server (after a NOSCRIPT: a restarted or flushed server)."""
        await self._client.script_load(script_source(name))
