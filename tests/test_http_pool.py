"""``teaagent._http.http_pool`` against a real socket server that answers as told, through each client.

aiohttp's (the services' own) and httpx's (a bench variant, and the pool of in-process tests).

The failure cases a hand-framed client got wrong: an answer whose head or body comes in pieces,
chunked, closed mid-body, 204 and HEAD answers without a body, 1xx answers before the real one,
a body ended by closing the connection, CR/LF in a header value, a timeout that fails only its
own call and never waits longer than it, a kept-alive connection the server closed meanwhile, TLS.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from tls_support import PrivateCA

from teaagent._http import NoAnswer, http_pool

pytestmark = pytest.mark.parametrize("kind", ["aiohttp", "httpx"])

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def _read_call(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


def serve(
    handler: Handler,
    scenario: Callable[[str, list[int]], Awaitable[Any]],
    *,
    tls: ssl.SSLContext | None = None,
) -> tuple[Any, list[int]]:
    """Run ``scenario(url, connections)`` against a server passing each connection to ``handler``."""
    connections: list[int] = []

    async def main() -> Any:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(len(connections))
            try:
                await handler(reader, writer, connections[-1])
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(accepted, "127.0.0.1", 0, ssl=tls)
        port = server.sockets[0].getsockname()[1]
        try:
            scheme = "https" if tls else "http"
            return await scenario(f"{scheme}://127.0.0.1:{port}", connections)
        finally:
            server.close()

    return asyncio.run(main()), connections


def answering(*answers: bytes, keep: bool = True) -> Handler:
    """A handler that answers each call on a connection with the next of ``answers``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        for answer in answers:
            await _read_call(reader)
            writer.write(answer)
            await writer.drain()
        if keep:
            await reader.read()  # until the client closes

    return handler


async def posts(url: str, kind: str, count: int = 3, **options: Any) -> list[tuple[int, bytes]]:
    client = http_pool(url, client=kind, connections=1, timeout=options.pop("timeout", 10), **options)
    try:
        return [await client.post("/v1/x", b"{}") for _ in range(count)]
    finally:
        await client.aclose()


def test_an_answer_in_pieces_and_a_chunked_one_are_read_whole_on_one_connection(kind: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        await _read_call(reader)
        for piece in (b"HTTP/1.1 201 Created\r\nContent-", b"Length: 11\r\n\r\n", b'{"ok": 1}\r\n'):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        await _read_call(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n"
        )
        await writer.drain()
        await reader.read()

    answers, connections = serve(handler, lambda url, _c: posts(url, kind, 2))
    assert answers == [(201, b'{"ok": 1}\r\n'), (200, b"abcdef")]
    assert connections == [0]  # one kept-alive connection for both


def test_a_body_ended_by_closing_the_connection_is_read_to_its_end(kind: str) -> None:
    handler = answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + b"x" * 5000, keep=False)
    answers, connections = serve(handler, lambda url, _c: posts(url, kind, 2))
    assert answers == [(200, b"x" * 5000)] * 2
    assert connections == [0, 1]  # the closed connection is not used again


@pytest.mark.parametrize(
    ("answer", "sent"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", [0]),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab", [0]),
        # No whole head: httpcore reads it as a connection closed before any answer, which
        # is sent once more (the receivers are idempotent), and cut short again.
        (b"HTTP/1.1 200 OK\r\nContent-Len", [0, 1]),
    ],
)
def test_an_answer_the_server_cut_short_is_no_answer_never_a_truncated_body(
    answer: bytes, sent: list[int], kind: str
) -> None:
    async def scenario(url: str, _connections: list[int]) -> NoAnswer:
        with pytest.raises(NoAnswer) as failed:
            await posts(url, kind, 1)
        return failed.value

    failure, connections = serve(answering(answer, keep=False), scenario)
    assert failure.timed_out is False
    assert connections == sent  # a body begun is never a reason to send the call again


def test_204_and_head_answers_without_a_body_return_at_once_and_1xx_answers_are_skipped(kind: str) -> None:
    handler = answering(
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 123\r\n\r\n",  # a HEAD answer: the length, no body
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )

    async def scenario(url: str, _connections: list[int]) -> tuple[list[tuple[int, bytes]], float]:
        client = http_pool(url, client=kind, connections=1, timeout=5)
        begun = time.perf_counter()
        try:
            answers = [
                await client.request("DELETE", "/v1/x"),
                await client.request("HEAD", "/v1/x"),
                await client.post("/v1/x", b"{}"),
            ]
        finally:
            await client.aclose()
        return answers, time.perf_counter() - begun

    (answers, elapsed), connections = serve(handler, scenario)
    assert answers == [(204, b""), (200, b""), (200, b"ok")]
    assert elapsed < 2  # none waited for a body that never comes (the timeout is 5 s)
    assert connections == [0]


def test_a_header_value_with_cr_or_lf_is_refused_and_nothing_is_sent(kind: str) -> None:
    async def scenario(url: str, _connections: list[int]) -> list[str]:
        refused = []
        with pytest.raises(ValueError, match="CR, LF or NUL") as made:
            http_pool(url, client=kind, headers={"Authorization": "Bearer x\r\nX-Evil: 1"})
        refused.append(str(made.value))
        client = http_pool(url, client=kind, connections=1, timeout=5)
        try:
            for value in ("a\rb", "a\nb", "a\r\n\r\nGET / HTTP/1.1"):
                with pytest.raises(ValueError, match="CR, LF or NUL") as sent:
                    await client.request("GET", "/v1/x", headers={"X-Token": value})
                refused.append(str(sent.value))
        finally:
            await client.aclose()
        return refused

    refused, connections = serve(answering(), scenario)
    assert len(refused) == 4
    assert all("CR, LF or NUL" in sentence for sentence in refused)
    assert connections == []  # not one connection was opened


TIMEOUT = 1.0  # seconds: the timeouts of the timeout test's calls


def test_a_timeout_fails_only_its_own_call_and_never_waits_longer_than_it(kind: str) -> None:
    slow_calls: list[bytes] = []  # the /slow calls the server has read, each holding its connection

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        while True:
            call = await _read_call(reader)
            if b"/slow" in call.split(b"\r\n", 1)[0]:
                slow_calls.append(call)
                # The head, then nothing: a call that would wait for its body for ever.
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
                await writer.drain()
                await reader.read()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def scenario(
        url: str, _connections: list[int]
    ) -> tuple[NoAnswer, float, list[Any], NoAnswer, float]:
        client = http_pool(url, client=kind, connections=4, timeout=10)
        try:
            slow = asyncio.ensure_future(client.request("GET", "/slow", timeout=TIMEOUT))
            others = await asyncio.gather(*(client.post("/v1/x", b"{}") for _ in range(6)))
            begun = time.perf_counter()
            with pytest.raises(NoAnswer) as late:
                await slow
            waited = time.perf_counter() - begun
            # Every connection held by a call that never ends: a queued call waits its own timeout.
            held = [asyncio.ensure_future(client.request("GET", "/slow", timeout=30)) for _ in range(4)]
            deadline = time.monotonic() + 30
            while len(slow_calls) < 5:  # the first /slow, then the four that hold every connection
                assert time.monotonic() < deadline, "the held calls never reached the server"
                await asyncio.sleep(0.01)
            begun = time.perf_counter()
            with pytest.raises(NoAnswer) as queued:
                await client.request("GET", "/next", timeout=TIMEOUT)
            queued_wait = time.perf_counter() - begun
            for call in held:
                call.cancel()
            await asyncio.gather(*held, return_exceptions=True)
            after = await client.post("/v1/x", b"{}")  # the pool is whole again
            others.append(after)
        finally:
            await client.aclose()
        return late.value, waited, others, queued.value, queued_wait

    (late, waited, others, queued, queued_wait), _connections = serve(handler, scenario)
    assert late.timed_out
    assert queued.timed_out
    # The whole call within its timeout, not each of its phases (connection, head, body) in turn;
    # the margin is for a loaded machine, well short of a second timeout.
    assert waited < 1.7 * TIMEOUT
    assert 0.7 * TIMEOUT < queued_wait < 1.7 * TIMEOUT
    assert others == [(200, b"ok")] * 7  # the other calls were not failed with it


def test_a_kept_alive_connection_the_server_closed_is_replaced_and_the_call_sent_once_more(kind: str) -> None:
    calls: list[bytes] = []
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        while True:
            calls.append(await _read_call(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n" + str(number).encode())
            await writer.drain()
            if number == 0:
                closed.set()
                return  # closes the connection after one answer, without saying so

    async def scenario(url: str, _connections: list[int]) -> list[tuple[int, bytes]]:
        client = http_pool(url, client=kind, connections=1, timeout=10)
        try:
            first = await client.post("/v1/x", b"{}")
            await asyncio.wait_for(closed.wait(), 30)
            await asyncio.sleep(0.05)
            return [first, await client.post("/v1/x", b"{}"), await client.post("/v1/x", b"{}")]
        finally:
            await client.aclose()

    answers, connections = serve(handler, scenario)
    assert answers == [(200, b"0"), (200, b"1"), (200, b"1")]
    assert connections == [0, 1]
    assert len(calls) == 3  # the second call reached the server once, on the new connection


def test_a_cookie_the_server_sets_is_never_sent_back(kind: str) -> None:
    calls: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        while True:
            calls.append(await _read_call(reader))
            writer.write(
                b"HTTP/1.1 200 OK\r\nSet-Cookie: session=s3cret; Path=/\r\nContent-Length: 2\r\n\r\nok"
            )
            await writer.drain()

    async def scenario(url: str, _connections: list[int]) -> list[tuple[int, bytes]]:
        # By name: aiohttp's own jar would refuse a cookie of an IP address anyway.
        return await posts(url.replace("127.0.0.1", "localhost"), kind, 3)

    answers, _ = serve(handler, scenario)
    assert answers == [(200, b"ok")] * 3
    assert len(calls) == 3
    for call in calls:
        head = call.split(b"\r\n\r\n", 1)[0].lower()
        assert b"\r\ncookie:" not in head, head
        assert b"s3cret" not in head


def test_an_unreachable_server_and_a_too_large_answer_are_no_answer(kind: str) -> None:
    async def scenario(url: str, _connections: list[int]) -> tuple[NoAnswer, NoAnswer]:
        client = http_pool(url, client=kind, connections=1, timeout=5, max_response_bytes=100)
        try:
            with pytest.raises(NoAnswer) as large:
                await client.post("/v1/x", b"{}")
        finally:
            await client.aclose()
        gone = http_pool("http://127.0.0.1:1", client=kind, timeout=5)
        try:
            with pytest.raises(NoAnswer) as unreachable:
                await gone.post("/v1/x", b"{}")
        finally:
            await gone.aclose()
        return large.value, unreachable.value

    handler = answering(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + (b"64\r\n" + b"x" * 100 + b"\r\n") * 2
        + b"0\r\n\r\n"
    )
    (large, unreachable), _ = serve(handler, scenario)
    assert str(large) == "the answer is too large"
    assert not unreachable.timed_out


def test_tls_a_server_signed_by_the_given_ca_is_reached_and_one_it_does_not_sign_is_refused(
    tmp_path: Path, kind: str
) -> None:
    ca = PrivateCA(tmp_path / "ca")
    files = ca.issue("server")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    trusting = ssl.create_default_context(cafile=str(ca.cert_path))

    async def scenario(url: str, _connections: list[int]) -> tuple[list[tuple[int, bytes]], NoAnswer]:
        answers = await posts(url, kind, 2, verify=trusting)
        with pytest.raises(NoAnswer) as refused:
            await posts(url, kind, 1)  # the public CAs: not this one
        return answers, refused.value

    handler = answering(*[b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"] * 2)
    (answers, refused), connections = serve(handler, scenario, tls=server)
    assert answers == [(200, b"ok")] * 2
    assert "certificate" in str(refused).lower()
    assert connections[0] == 0


def test_the_environments_proxy_is_used_with_its_credentials_and_no_netrc_file_is_read(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # aiohttp's trust_env read the proxy, and ~/.netrc, in a thread on every call; the pool reads
    # the proxy once, as httpx does, and no netrc file (httpx reads none either).
    netrc = tmp_path / "netrc"
    netrc.write_text("machine origin.invalid login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    for name in ("HTTP_PROXY", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    heads: list[bytes] = []

    async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _number: int) -> None:
        heads.append(await _read_call(reader))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async def scenario(url: str, _connections: list[int]) -> list[tuple[int, bytes]]:
        monkeypatch.setenv("http_proxy", url.replace("http://", "http://who:p%40ss@"))
        return await posts("http://origin.invalid:8080", kind, 1)

    answers, _connections = serve(proxy, scenario)
    assert answers == [(200, b"ok")]
    lines = heads[0].lower().split(b"\r\n")
    assert lines[0] == b"post http://origin.invalid:8080/v1/x http/1.1"
    assert b"proxy-authorization: basic d2hvonbac3m=" in lines  # who:p@ss
    assert not [line for line in lines if line.startswith(b"authorization:")]
