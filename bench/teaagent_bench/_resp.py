"""The benches' floor on Redis: commands as RESP packed by hiredis, on a kept connection, no client library.

``bench quorum``'s floor, ``bench relay``'s ``*_raw`` figures and the library comparison all measure
against this one connection: what a round trip costs with nothing of a client around it.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import hiredis

__all__ = ["RespConnection", "pack"]


def pack(*parts: Any) -> bytes:
    """A command as RESP, packed by hiredis (``parts`` as str, bytes or numbers)."""
    packed: bytes = hiredis.pack_command(parts)
    return packed


class RespConnection:
    """A kept connection of the floor: commands written as they are packed, replies read by hiredis."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._replies = hiredis.Reader()

    @classmethod
    async def open(cls, url: str) -> RespConnection:
        """Connect to the Redis at ``url`` (``unix://`` or TCP), logged in with its password if it has one."""
        parts = urlsplit(url)
        if parts.scheme == "unix":  # the embedded server listens on its socket only
            connection = await asyncio.open_unix_connection(parts.path)
        else:
            connection = await asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 6379)
        kept = cls(*connection)
        if parts.password:
            user = [parts.username] if parts.username else []
            await kept.call(pack("AUTH", *user, parts.password))
        return kept

    async def call(self, packed: bytes, replies: int = 1) -> Any:
        """Write ``packed`` (``replies`` commands) and read their replies; return the last one.

        Raises:
            RuntimeError: Redis refused a command or closed the connection.
        """
        self.writer.write(packed)
        reply: Any = None
        while replies:
            reply = self._replies.gets()
            if reply is False:
                data = await self.reader.read(65536)
                if not data:
                    raise RuntimeError("Redis closed a floor connection")
                self._replies.feed(data)
            elif isinstance(reply, Exception):
                raise RuntimeError(f"Redis refused a floor command: {reply}")
            else:
                replies -= 1
        return reply

    def close(self) -> None:
        self.writer.close()
