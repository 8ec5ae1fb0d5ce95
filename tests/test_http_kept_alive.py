"""KeptAlive against a real socket server that answers as told: whole, in pieces, cut short, or not at all."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from teaagent._http import KeptAlive, NoAnswer

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_call(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def serve(handler: Handler, scenario: Callable[[str, list[int]], Awaitable[Any]]) -> tuple[Any, list[int]]:
    """Run ``scenario(url, connections)`` against a server passing each connection to ``handler``."""
    connections: list[int] = []

    async def main() -> Any:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections))
            try:
                await handler(reader, writer, connections[-1])
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await scenario(f"http://127.0.0.1:{port}", connections)
        finally:
            server.close()
            await server.wait_closed()

    return asyncio.run(main()), connections


async def three_posts(url: str, _connections: list[int]) -> list[tuple[int, bytes]]:
    """Three calls, one after the other, by a client of one connection."""
    client = KeptAlive(url, connections=1, timeout=10)
    try:
        return [await client.post("/v1/x", b"{}") for _ in range(3)]
    finally:
        await client.aclose()


def test_an_answer_whose_head_comes_in_pieces_is_read_whole() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        while True:
            await _read_call(reader)
            for piece in (
                b"HTTP/1.1 201 Created\r\nContent-",
                b"Type: application/json\r\n",
                b"Content-Length: 11",
            ):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b'\r\n\r\n{"ok": 1}\r\n')
            await writer.drain()

    answers, connections = serve(handler, three_posts)
    assert answers == [(201, b'{"ok": 1}\r\n')] * 3
    assert connections == [0]  # one kept-alive connection for all three


def test_a_chunked_answer_and_a_closing_one_are_read_to_their_end() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await _read_call(reader)
        if number == 0:
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n"
            )
            await writer.drain()
            await _read_call(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    answers, connections = serve(handler, three_posts)
    assert answers == [(200, b"abcdef"), (200, b"ok"), (200, b"ok")]
    assert connections == [0, 1]  # "Connection: close" is honoured: the third call opens a new one


def test_a_kept_alive_connection_the_server_closed_is_replaced_and_the_call_sent_once_more() -> None:
    calls: list[bytes] = []
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        calls.append(await _read_call(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + str(number).encode())
        await writer.drain()
        if number == 0:
            closed.set()
            return  # serve() closes the connection after one answer, without saying so

        while True:
            calls.append(await _read_call(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + str(number).encode())
            await writer.drain()

    async def scenario(url: str, _connections: list[int]) -> list[tuple[int, bytes]]:
        client = KeptAlive(url, connections=1, timeout=10)
        try:
            first = await client.post("/v1/x", b"{}")
            await asyncio.wait_for(closed.wait(), 30)  # the server is done with the first connection
            return [first, await client.post("/v1/x", b"{}"), await client.post("/v1/x", b"{}")]
        finally:
            await client.aclose()

    answers, connections = serve(handler, scenario)
    assert answers == [(200, b"0"), (200, b"1"), (200, b"1")]
    assert connections == [0, 1]
    assert len(calls) == 3  # the second call reached the server once, on the new connection


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Len", "the answer's head was cut short"),
        (b"SMTP ready\r\n\r\n", "the answer is not HTTP/1.1"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", "the answer's head is too large"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", "5 bytes read on a total of 9 expected bytes"),
    ],
)
def test_an_answer_cut_short_or_malformed_is_no_answer_and_is_not_sent_again(
    answer: bytes, message: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        await _read_call(reader)
        writer.write(answer)
        await writer.drain()

    async def scenario(url: str, _connections: list[int]) -> NoAnswer:
        client = KeptAlive(url, connections=1, timeout=10)
        try:
            with pytest.raises(NoAnswer) as failed:
                await client.post("/v1/x", b"{}")
            return failed.value
        finally:
            await client.aclose()

    failure, connections = serve(handler, scenario)
    assert message in str(failure)
    assert failure.timed_out is False
    assert connections == [0]  # sent once: a begun answer is never a reason to send the call again
