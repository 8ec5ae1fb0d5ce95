"""The floor: a quorum's raw work (signatures, verifications, round trips, hops), nothing around it.

Two of them, the same work and plan: the raw floor (HTTP framed by h11 to a bare ASGI callable,
Redis packed and parsed by hiredis on kept connections), and the library floor, the same hops
and round trips through the services' own libraries used as documented and nothing of the
project's around them (aiohttp's client, to a FastAPI app's Starlette route; redis-py's asyncio
client with hiredis). The second tells what the libraries cost by themselves, apart from what
the services do with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import h11
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    REQUEST_NAMESPACE,
    approval_statement,
    build_request,
    canonical,
    request_statement,
    statement_bytes,
)
from teaagent.signing import SSHPrivateKey, sshsig_sign, sshsig_verify
from teaagent.testing import wait_healthy
from teaagent.trust import MultiSigQuorumConfig
from teaagent_bench import python_code
from teaagent_bench._processes import free_port, stop
from teaagent_bench._resp import RespConnection, pack
from teaagent_bench.quorum._asking import MIN_TIMED, WARMUP_FRACTION, _Run, _summarise
from teaagent_bench.quorum._cluster import DEFAULT_SIZE, READY_TIMEOUT, _Size
from teaagent_bench.quorum._counting import _Counters

FLOOR_CLIENT_HOPS: Final = 2  # the origin's own: its submission and its outcome
PRIMITIVE_SAMPLES: Final = 200  # each raw cost of the profile is the median of this many
_FLOOR_SCRIPT: Final = b"return redis.call('SET', KEYS[1], ARGV[1], 'EX', 600)"
_SERVE_FLOOR: Final = "from teaagent_bench.quorum import serve_floor; serve_floor"
_FLOOR_BODY: Final = b'{"state":"pending","request_id":"00000000000000000000000000000000"}'


async def _floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A raw ASGI app: every HTTP call answered 200 with the same small JSON body."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_FLOOR_BODY)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _FLOOR_BODY})


def _library_app() -> Any:
    """The library floor's server: a FastAPI app whose one route answers as the bare app does.

    A Starlette ``Route`` at the head of the app's router, as the relay's hot routes are
    (``teaagent_relay._fast``): the framework's middlewares and router, none of the project's.
    """
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def answer(request: Request) -> Response:
        await request.body()
        return Response(_FLOOR_BODY, media_type="application/json")

    return FastAPI(
        routes=[Route("/v1/requests", answer, methods=["POST"]), Route("/health", answer, methods=["GET"])],
        openapi_url=None,
    )


def serve_floor(port: int, libraries: bool = False) -> None:
    """Serve the floor's HTTP app on ``127.0.0.1:port`` until SIGTERM (one uvicorn worker).

    The bare ASGI callable, or with ``libraries`` the library floor's FastAPI app.
    """
    import uvicorn

    app = _library_app() if libraries else _floor_app
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off")


@dataclass(frozen=True)
class _Plan:
    """What one floor quorum does besides its cryptography: per peer branch, hops, writes, reads."""

    branch_hops: tuple[int, ...]
    branch_writes: tuple[int, ...]
    branch_reads: tuple[int, ...]


def _split(total: float, ways: int) -> tuple[int, ...]:
    whole = max(0, round(total))
    return tuple(whole // ways + (index < whole % ways) for index in range(ways))


def _plan(per_quorum: _Counters, size: _Size = DEFAULT_SIZE) -> _Plan:
    ways = len(size.peers)
    return _Plan(
        branch_hops=_split(per_quorum.hops - FLOOR_CLIENT_HOPS, ways),
        branch_writes=_split(per_quorum.writes, ways),
        branch_reads=_split(per_quorum.reads, ways),
    )


class _FloorHTTP:
    """One kept-alive connection of the floor's bare HTTP hops, framed and parsed by h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.state = h11.Connection(our_role=h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> _FloorHTTP:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def close(self) -> None:
        self.writer.close()


def _floor_call(body: bytes) -> list[h11.Request | h11.Data | h11.EndOfMessage]:
    """The floor's one call: ``POST /v1/requests`` with ``body``, as h11 events."""
    headers = [
        ("Host", "127.0.0.1"),
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
    ]
    return [
        h11.Request(method="POST", target="/v1/requests", headers=headers),
        h11.Data(data=body),
        h11.EndOfMessage(),
    ]


async def _hop(connection: _FloorHTTP, call: list[h11.Request | h11.Data | h11.EndOfMessage]) -> None:
    state = connection.state
    connection.writer.write(b"".join(state.send(event) or b"" for event in call))
    status = 0
    while True:
        event = state.next_event()
        if event is h11.NEED_DATA:
            data = await connection.reader.read(65536)
            if not data:
                raise RuntimeError("the floor's server closed the connection")
            state.receive_data(data)
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            break
    state.start_next_cycle()
    if status != 200:
        raise RuntimeError(f"the floor's server answered {status}")


@dataclass(frozen=True)
class _FloorJob:
    http_port: int
    redis_url: str
    callers: int
    seconds: float
    plan: _Plan
    nodes: int = DEFAULT_SIZE.nodes
    libraries: bool = False  # the library floor's clients (the module docstring)


_Call = Callable[[], Awaitable[Any]]


class _RawClients:
    """The raw floor's connections of one caller: h11 on its own sockets, hiredis on its own."""

    def __init__(self, job: _FloorJob, body: bytes, sha: bytes, value: bytes) -> None:
        self.job, self.sha, self.value = job, sha, value
        self.http_request = _floor_call(body)
        self.kept: list[_FloorHTTP | RespConnection] = []

    async def hop(self) -> _Call:
        connection = await _FloorHTTP.open(self.job.http_port)
        self.kept.append(connection)
        return functools.partial(_hop, connection, self.http_request)

    async def redis(self, key: bytes) -> tuple[_Call, _Call]:
        connection = await RespConnection.open(self.job.redis_url)
        self.kept.append(connection)
        write, read = pack(b"EVALSHA", self.sha, b"1", key, self.value), pack(b"GET", key)
        return functools.partial(connection.call, write), functools.partial(connection.call, read)

    async def aclose(self) -> None:
        for kept in self.kept:
            kept.close()


class _LibraryClients:
    """The library floor's clients, shared by a process's callers as a service shares them.

    One ``aiohttp.ClientSession`` whose connector holds a connection for every hop that may be in
    flight, configured as the services' pools are (``teaagent._http``); one redis-py asyncio
    client (hiredis parses its replies) on a blocking pool as large. They run on the floor's
    event loop, asyncio's own, as the raw floor's connections and the asking process do.
    """

    def __init__(self, job: _FloorJob, body: bytes, sha: bytes, value: bytes) -> None:
        import aiohttp
        import redis.asyncio

        self.sha, self.value, self.body = sha, value, body
        in_flight = job.callers * job.nodes  # as many as the raw floor keeps: the origin's and a peer's each
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=in_flight, limit_per_host=in_flight),
            timeout=aiohttp.ClientTimeout(total=None),
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self.url = f"http://127.0.0.1:{job.http_port}/v1/requests"
        pool = redis.asyncio.BlockingConnectionPool.from_url(job.redis_url, max_connections=in_flight)
        self.client = redis.asyncio.Redis(connection_pool=pool)

    async def _post(self) -> None:
        headers = {"Content-Type": "application/json"}
        async with self.session.post(self.url, data=self.body, headers=headers) as response:
            await response.read()
            if response.status != 200:
                raise RuntimeError(f"the floor's server answered {response.status}")

    async def hop(self) -> _Call:
        return self._post

    async def redis(self, key: bytes) -> tuple[_Call, _Call]:
        client, sha, value = self.client, self.sha.decode(), self.value
        return functools.partial(client.evalsha, sha, 1, key, value), functools.partial(client.get, key)

    async def aclose(self) -> None:
        await self.session.close()
        await self.client.aclose()


class _FloorCrypto:
    """One floor quorum's cryptography, the protocol's minimum, each step as the floor's load runs it.

    Alpha signs the request; each peer's relay and its approver verify it for themselves, and the
    approver signs its approval; alpha's relay verifies each approval; alpha's agent verifies the
    certificate (the request and ``required`` approvals). The documents are made once, up front.
    """

    def __init__(self, size: _Size) -> None:
        self.size = size
        self.keys = {
            name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment=name)
            for name in size.names
        }
        self.public = {name: key.public_key for name, key in self.keys.items()}
        peers = size.peers
        self.request = build_request(
            origin="alpha",
            run_id="bench-floor",
            call_id="call-0",
            tool_name="shell.run",
            arguments={"command": "make target-0"},
            reason="benchmark",
            config=MultiSigQuorumConfig(
                enabled=True,
                required_approvals=size.required,
                peer_agent_ids=list(peers),
                peer_public_keys={peer: self.public[peer].to_line() for peer in peers},
                peer_relay_urls={peer: "http://127.0.0.1:1" for peer in peers},
                high_risk_patterns=["shell.*"],
                timeout_seconds=600,
            ),
        )
        self.request_bytes = request_statement(self.request)
        self.request_signature = sshsig_sign(self.request_bytes, self.keys["alpha"], REQUEST_NAMESPACE)
        self.statements = {
            peer: statement_bytes(approval_statement(self.request, peer, int(time.time()))) for peer in peers
        }
        self.approvals = {
            peer: sshsig_sign(self.statements[peer], self.keys[peer], APPROVAL_NAMESPACE) for peer in peers
        }

    def _request_verified(self) -> None:
        sshsig_verify(self.request_bytes, self.request_signature, self.public["alpha"], REQUEST_NAMESPACE)

    def _approval_verified(self, peer: str) -> None:
        sshsig_verify(self.statements[peer], self.approvals[peer], self.public[peer], APPROVAL_NAMESPACE)

    def origin_signs(self) -> None:
        sshsig_sign(self.request_bytes, self.keys["alpha"], REQUEST_NAMESPACE)

    def peer_approves(self, peer: str) -> None:
        """The peer's relay takes the request in; its approver checks it again, then signs."""
        self._request_verified()
        self._request_verified()
        sshsig_sign(self.statements[peer], self.keys[peer], APPROVAL_NAMESPACE)

    def origin_counts(self, peer: str) -> None:
        self._approval_verified(peer)

    def certificate_checked(self) -> None:
        self._request_verified()
        for peer in self.size.peers[: self.size.required]:
            self._approval_verified(peer)


async def _floor_load(job: _FloorJob) -> tuple[list[tuple[float, float]], float, float]:
    """Run one process's floor callers: set up, say ``ready`` on stdout, start on a line on stdin."""
    size = _Size(job.nodes)
    peers = size.peers
    crypto = _FloorCrypto(size)
    request, request_signature = crypto.request, crypto.request_signature
    body = canonical({"request": request, "signature": request_signature})
    value = canonical(
        {"statement": approval_statement(request, "beta", 0), "signature": crypto.approvals["beta"]}
    )
    loader = await RespConnection.open(job.redis_url)
    sha = await loader.call(pack(b"SCRIPT", b"LOAD", _FLOOR_SCRIPT))
    loader.close()
    plan = job.plan
    clients = (_LibraryClients if job.libraries else _RawClients)(job, body, sha, value)

    spans: list[tuple[float, float]] = []
    opened = 0

    async def caller(index: int) -> None:
        origin_hop = await clients.hop()
        branch_hops = [await clients.hop() for _ in peers]
        key = f"bench:floor:{{{os.getpid()}-{index}}}:decision".encode()
        branch_redis = [await clients.redis(key) for _ in peers]
        await branch_redis[0][0]()  # the key exists before the first GET
        nonlocal opened
        opened += 1
        await started.wait()

        async def branch(side: int, peer: str) -> None:
            crypto.peer_approves(peer)
            for _ in range(plan.branch_hops[side]):
                await branch_hops[side]()
            write, read = branch_redis[side]
            for _ in range(plan.branch_writes[side]):
                await write()
            for _ in range(plan.branch_reads[side]):
                await read()
            crypto.origin_counts(peer)

        while time.perf_counter() < stop_at or sum(1 for start, _end in spans if start >= warm) < MIN_TIMED:
            begun = time.perf_counter()
            crypto.origin_signs()
            await origin_hop()
            await asyncio.gather(*(branch(side, peer) for side, peer in enumerate(peers)))
            await origin_hop()
            crypto.certificate_checked()
            spans.append((begun, time.perf_counter()))

    started = asyncio.Event()
    stop_at = warm = 0.0
    try:
        tasks = [asyncio.ensure_future(caller(index)) for index in range(job.callers)]
        while sum(1 for task in tasks if task.done()) == 0 and opened < job.callers:
            await asyncio.sleep(0.01)  # every caller opens its connections before the start
        for task in tasks:
            if task.done():
                task.result()  # a caller that could not connect says why
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        if not sys.stdin.readline():
            raise RuntimeError("the bench went away before the start")
        begin = time.perf_counter()
        stop_at, warm = begin + job.seconds, begin + job.seconds * WARMUP_FRACTION
        started.set()
        await asyncio.gather(*tasks)
    finally:
        await clients.aclose()
    return spans, begin, time.perf_counter()


def floor_main() -> None:
    """One process of the floor's callers: its job as JSON on stdin, its figures as JSON on stdout."""
    data = json.loads(sys.stdin.readline())
    data["plan"] = _Plan(**{name: tuple(value) for name, value in data["plan"].items()})
    job = _FloorJob(**data)
    spans, begin, end = asyncio.run(_floor_load(job))
    timed, throughput = _summarise(spans, begin, end, job.seconds)
    sys.stdout.write(json.dumps({"latencies": timed, "throughput": throughput}) + "\n")
    sys.stdout.flush()


def _floor(
    concurrency: int,
    seconds: float,
    http_port: int,
    store: tuple[str],
    plan: _Plan,
    size: _Size = DEFAULT_SIZE,
    *,
    libraries: bool = False,
) -> _Run:
    count = 1 if concurrency == 1 else max(1, min(concurrency, os.cpu_count() or 1))
    shares = [concurrency // count + (index < concurrency % count) for index in range(count)]
    command = [
        sys.executable,
        "-c",
        python_code("from teaagent_bench.quorum import floor_main; floor_main()"),
    ]
    workers = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in shares
    ]
    try:
        for worker, share in zip(workers, shares, strict=True):
            job = _FloorJob(http_port, *store, share, seconds, plan, size.nodes, libraries)
            _send(worker, json.dumps(dataclasses.asdict(job)))
        for worker in workers:
            _expect(worker, "ready")
        for worker in workers:
            _send(worker, "go")
        outcomes = [json.loads(_expect(worker, None)) for worker in workers]
    finally:
        for worker in workers:
            stop(worker)
    latencies = sorted(latency for outcome in outcomes for latency in outcome["latencies"])
    return _Run(latencies, sum(outcome["throughput"] for outcome in outcomes), len(latencies))


def _send(worker: subprocess.Popen[bytes], line: str) -> None:
    assert worker.stdin is not None
    worker.stdin.write(line.encode() + b"\n")
    worker.stdin.flush()


def _expect(worker: subprocess.Popen[bytes], line: str | None) -> str:
    """Read the worker's next line (``line`` exactly, when given); its stderr is the error otherwise."""
    assert worker.stdout is not None
    assert worker.stderr is not None
    got = worker.stdout.readline().decode().strip()
    if not got or (line is not None and got != line):
        worker.kill()
        worker.wait()
        error = worker.stderr.read().decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"a floor process failed: {error[-1] if error else got or 'no answer'}")
    return got


@contextlib.contextmanager
def bare_http_server(folder: Path, libraries: bool = False) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The floor's HTTP server (:func:`serve_floor`) in a process of its own: its port and process.

    The bare one, or with ``libraries`` the library floor's. Its log goes to ``folder``; the
    process is stopped on the way out.

    Raises:
        TeaAgentError: The server did not answer ``/health`` in time (``teaagent.testing``).
    """
    port = free_port()
    log = folder / ("library-floor-http.log" if libraries else "floor-http.log")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                python_code(f"{_SERVE_FLOOR}({port}, {libraries})"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        what = "the library floor's HTTP server" if libraries else "the floor's HTTP server"
        wait_healthy(process, f"http://127.0.0.1:{port}", what, log, READY_TIMEOUT)
        yield port, process
    finally:
        stop(process)


# -- the profile's raw costs ------------------------------------------------------------------------


def _median_seconds(samples: list[float]) -> float:
    return statistics.median(samples)


def _crypto_costs() -> tuple[float, float]:
    """The median seconds of one request signature and of one approval verification, raw."""
    key = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment="alpha")
    data = canonical({"request": "x" * 400})
    signature = sshsig_sign(data, key, REQUEST_NAMESPACE)
    signs, verifies = [], []
    for _ in range(PRIMITIVE_SAMPLES):
        begun = time.perf_counter()
        sshsig_sign(data, key, REQUEST_NAMESPACE)
        signs.append(time.perf_counter() - begun)
        begun = time.perf_counter()
        sshsig_verify(data, signature, key.public_key, REQUEST_NAMESPACE)
        verifies.append(time.perf_counter() - begun)
    return _median_seconds(signs), _median_seconds(verifies)


async def _io_costs(http_port: int, store: tuple[str]) -> tuple[float, float, float]:
    """The median seconds of one raw HTTP hop, one EVALSHA write and one GET, one at a time."""
    http_request = _floor_call(b"x" * 700)
    http = await _FloorHTTP.open(http_port)
    redis_connection = await RespConnection.open(*store)
    key = b"bench:floor:{profile}:decision"
    sha = await redis_connection.call(pack(b"SCRIPT", b"LOAD", _FLOOR_SCRIPT))
    write, read = pack(b"EVALSHA", sha, b"1", key, b"x" * 400), pack(b"GET", key)
    costs: list[list[float]] = [[], [], []]
    try:
        for _ in range(PRIMITIVE_SAMPLES):
            for index, call in enumerate(
                (
                    _hop(http, http_request),
                    redis_connection.call(write),
                    redis_connection.call(read),
                )
            ):
                begun = time.perf_counter()
                await call
                costs[index].append(time.perf_counter() - begun)
    finally:
        http.close()
        redis_connection.close()
    hop, written, got = (_median_seconds(samples) for samples in costs)
    return hop, written, got
