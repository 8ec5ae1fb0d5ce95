"""End-to-end quorum benchmark, 2 of 3 with rule approvers: ``teaagent bench quorum``.

The cluster, all on this machine: one embedded Redis (the node's shipped setting, ``appendfsync
always``) carrying three nodes under their own key prefixes; node ``alpha``'s relay, and ``beta``'s
and ``gamma``'s relays and approvers, each a real process (``teaagent relay serve``, ``teaagent
approver serve``); the approvers' one rule approves ``shell.*``. Alpha's request names both
peers and needs both approvals: 2 of the cluster's 3 nodes besides the origin's own say-so.

Alpha's side runs in this process, through the real asking path, as ``RelayQuorumGate`` does it,
on the library's :class:`~teaagent.relay_client.AsyncRelayClient` (kept-alive calls; one client per caller,
as each gate holds its own): build the request (not timed), then, timed, sign it
(``sign_request``), ``POST /v1/requests``, long-poll ``GET /v1/requests/{id}/outcome`` until
decided, check that the certificate's request is the one signed and verify the certificate with
``verify_certificate`` and alpha's own configuration, as the policy does. ``CONCURRENCIES``
callers at once (1, 16, 64), each for ``seconds``; the first ``WARMUP_FRACTION`` of each run is
not timed. ``p50_ms_c1``/``p99_ms_c1`` are the latencies of one caller; ``throughput_cN`` the
approved, verified certificates per second with N callers.

What one quorum costs in the real path, counted in the same run: its HTTP hops (every relay's
``teaagent_relay_http_requests`` counter, /metrics and /health aside: the agent's submission and
long-poll, two deliveries to the peers, each approver's inbox listings and its decision, two
decisions back), its Redis round trips (a script, a pipeline or a transaction is one: the
round trips are the shared server's read events, ``INFO stats`` ``total_reads_processed``,
``redis_round_trips_cN``; the writes are the ``EVALSHA`` and ``EXEC`` calls of ``INFO
commandstats``; the reads are the round trips less the writes, left out with the reason
(``redis_reads_cN_omitted``) when several writes shared round trips so that they cannot be told
apart: see ``_trips``), and its cryptography by the code: 3 signatures
(the request, two approvals) and 12 verifications (the request by alpha's relay, by each peer's
relay and approver, and in the certificate; each approval by its peer's relay, by alpha's relay
and in the certificate).

**The floor**, measured in the same run for each concurrency, is that work done raw, with
nothing around it, in the protocol's shape (the origin, then both peers at once, then the origin):

1. the origin signs a request (``sshsig_sign`` over its canonical bytes) and makes one HTTP hop;
2. two branches at once, one per peer, each: one request verification, one approval signature,
   one approval verification (``sshsig_verify``/``sshsig_sign``), half of the real path's other
   HTTP hops, and half of its Redis round trips: writes as ``EVALSHA`` of a one-line ``SET ... EX``
   script, reads as ``GET``, on the same embedded Redis;
3. the origin makes one HTTP hop and verifies the certificate's three signatures.

So 3 signatures and 7 verifications (the protocol's minimum: each peer checks the origin once,
the origin checks each approval once, the agent checks the certificate), against the real path's
3 and 12. HTTP hops go to a bare uvicorn server running a raw ASGI app that answers every call
with a constant (no framework), over kept-alive connections, each call framed and its answer
parsed by h11 (the HTTP/1.1 library under httpx; no HTTP written by hand); Redis round
trips over kept-alive connections, each command packed and its reply parsed by hiredis. The same
numbers of hops and round trips per quorum as the real path's at that concurrency (rounded).
The floor's callers run in ``min(N, cores)`` processes, so that it may use the machine as the
cluster does. ``floor_ratio = p50_ms_c1 / floor_p50_ms_c1`` (target <= 3) and
``floor_throughput_ratio_c64 = floor_throughput_c64 / throughput_c64`` (target <= 3).

``cluster_cpu_ms_per_quorum_cN``: the CPU time (user and system) of the five services per quorum
at N callers; ``profile_cpu_ms_<node>_<service>`` splits it at one caller (it includes each
service's idle loops, which weigh more the fewer quorums a second there are).

``profile_*``: one quorum at concurrency 1, where its time goes: the raw cost of its signatures
(``profile_sign_ms``), its 12 verifications (``profile_verify_ms``), its Redis round trips
(``profile_redis_ms``) and its HTTP hops (``profile_http_ms``), each measured alone in this run
and summed as if done one after the other; and each relay's own time answering its calls
(``profile_server_ms_<node>``, from its latency histogram; long-polls excluded, they wait). Set
``TEAAGENT_BENCH_PROFILE`` to a directory to run every service under ``cProfile`` and keep its
profile there (``<node>-<service>.prof``).

``policy_*``: the same cluster, in the same run, asked for ``git.push`` under a version 2 rule with
two groups, ``all_of`` one of ops (beta) and one of security (gamma): the request carries its
policy, the relay's Lua and the certificate's check count by terms. One caller; its floor is
measured as the plain quorum's is, from its own counts of hops and round trips, and
``policy_floor_ratio = policy_p50_ms_c1 / policy_floor_p50_ms_c1`` (target <= 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import h11
import hiredis
import httpx
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from teaagent._http import BENCH_CLIENT_ENV
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    REQUEST_NAMESPACE,
    approval_statement,
    build_request,
    canonical,
    request_statement,
    sign_request,
    statement_bytes,
    verify_certificate,
)
from teaagent.relay_client._bench import _free_port, _process_cpu_seconds
from teaagent.relay_client._client import MAX_WAIT_SECONDS, AsyncRelayClient
from teaagent.signing import SSHPrivateKey, sshsig_sign, sshsig_verify
from teaagent.store import EmbeddedRedis
from teaagent.store._connection import BATCHES_ENV
from teaagent.trust import MultiSigQuorumConfig, QuorumRule, RuleTerm

__all__ = ["CONCURRENCIES", "SIZES", "bench_quorum", "bench_quorum_sizes"]

CONCURRENCIES: Final = (1, 16, 64)
WARMUP_FRACTION: Final = 0.2  # of each run, not timed: connections open, caches fill
MIN_TIMED: Final = 5  # quorums timed per run at least, however short the budget
READY_TIMEOUT: Final = 90.0  # seconds for a service to answer /health: five start at once on a loaded host
RUN_DEADLINE: Final = 120.0  # seconds past its budget that one run may take before the bench gives up
PEER_NAMES: Final = ("beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota")
SIZES: Final = (3, 5, 9)  # nodes in the cluster of ``--peers``: 2 of 3, 3 of 5, 5 of 9
PEERS: Final = PEER_NAMES[:2]  # the default cluster: 2 of 3
NODES: Final = ("alpha", *PEERS)
FLOOR_CLIENT_HOPS: Final = 2  # the origin's own: its submission and its outcome
HTTP_VARIANTS: Final = ("httpx",)  # run again through each, beside the services' aiohttp
# Run again with each setting in the services' environment: (figures' prefix, variable, value).
VARIANTS: Final = (
    *((f"http_{name}", BENCH_CLIENT_ENV, name) for name in HTTP_VARIANTS),
    # Each Redis call sent on its own, as before the store batched a moment's calls (issue 29).
    ("redis_unbatched", BATCHES_ENV, "0"),
)
IDLE_SECONDS: Final = 2.0  # the cluster left idle once, its services' own CPU measured
PRIMITIVE_SAMPLES: Final = 200  # each raw cost of the profile is the median of this many
_SKIPPED_ROUTES: Final = frozenset({"/metrics", "/health"})
_LONG_POLLS: Final = frozenset({"/v1/requests/{request_id}/outcome", "/v1/inbox"})
_WRITE_TRIPS: Final = ("evalsha", "eval", "exec")  # the store's atomic writes: one round trip each
_FLOOR_SCRIPT: Final = b"return redis.call('SET', KEYS[1], ARGV[1], 'EX', 600)"
_FLOOR_BODY: Final = b'{"state":"pending","request_id":"00000000000000000000000000000000"}'
# The version 2 variant (``policy_*``): a tool under a rule of two groups, all of them.
POLICY_TOOL: Final = "git.push"
POLICY_GROUPS: Final = {"ops": ("beta",), "security": ("gamma",)}
_POLICY_TOML: Final = """
[quorum.groups]
ops = ["beta"]
security = ["gamma"]

[[quorum.rules]]
pattern = "git.push*"
all_of = [{ group = "ops", required = 1 }, { group = "security", required = 1 }]
"""


# -- the cluster -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Size:
    """A cluster of ``nodes`` nodes: alpha and its peers, a majority of the nodes' approvals needed."""

    nodes: int

    @property
    def peers(self) -> tuple[str, ...]:
        return PEER_NAMES[: self.nodes - 1]

    @property
    def names(self) -> tuple[str, ...]:
        return ("alpha", *self.peers)

    @property
    def required(self) -> int:
        return self.nodes // 2 + 1

    @property
    def signatures(self) -> int:
        return 1 + len(self.peers)  # the request, every peer's approval

    @property
    def verifications(self) -> int:
        # The request by alpha's relay and in the certificate, by each peer's relay and approver;
        # each approval by its peer's relay and by alpha's relay; the certificate's approvals.
        return 2 + 4 * len(self.peers) + self.required


DEFAULT_SIZE: Final = _Size(3)


@dataclass(frozen=True)
class _Node:
    name: str
    config: Path
    port: int
    approver_port: int
    token: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def approver_url(self) -> str:
        return f"http://127.0.0.1:{self.approver_port}"


def _write_key(folder: Path, name: str, key: Ed25519PrivateKey) -> None:
    path = folder / "keys" / name
    path.parent.mkdir(parents=True)
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: each socket held until all are bound (one closed at once may
    be handed out again)."""
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)
        ]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def _write_nodes(
    folder: Path,
    redis_url: str,
    keys: Mapping[str, SSHPrivateKey],
    raw: Mapping[str, Any],
    size: _Size = DEFAULT_SIZE,
) -> dict[str, _Node]:
    free = iter(_free_ports(2 * len(size.names)))
    ports = {name: (next(free), next(free)) for name in size.names}
    nodes: dict[str, _Node] = {}
    for name in size.names:
        home = folder / name
        home.mkdir()
        _write_key(home, name, raw[name])
        token = f"bench-{secrets.token_hex(16)}"
        port, approver_port = ports[name]
        others = size.peers if name == "alpha" else ("alpha",)
        peers = "".join(
            f'\n[peers.{peer}]\npublic_key = "{keys[peer].public_key.to_line()}"\n'
            f'relay_url = "http://127.0.0.1:{ports[peer][0]}"\n'
            for peer in others
        )
        required = size.required if name == "alpha" else 1
        approver = (
            ""
            if name == "alpha"
            else f'\n[approver]\nport = {approver_port}\n\n[[approver.rules]]\ntool = "shell.*"\n'
            'decision = "approve"\n\n[[approver.rules]]\ntool = "git.push*"\ndecision = "approve"\n'
        )
        policy = _POLICY_TOML if name == "alpha" else ""
        (home / "node.toml").write_text(
            f'agent_id = "{name}"\nprivate_key = "keys/{name}"\nredis_url = "{redis_url}"\n'
            f'relay_url = "http://127.0.0.1:{port}"\ntoken = "{token}"\n'
            'workspace = "workspace"\ndata_dir = "data"\n\n'
            f"[quorum]\nenabled = true\nrequired_approvals = {required}\n"
            'high_risk_patterns = ["shell.*", "git.push*"]\n'
            f"timeout_seconds = 600\n{policy}{peers}{approver}"
        )
        nodes[name] = _Node(name, home / "node.toml", port, approver_port, token)
    return nodes


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_ready(process: subprocess.Popen[bytes], url: str, log: Path, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited at start: {log.read_text(errors='replace')[-1000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(
        f"{what} did not answer within {READY_TIMEOUT:g} s: {log.read_text(errors='replace')[-1000:]}"
    )


@contextlib.contextmanager
def _cluster(folder: Path, nodes: Mapping[str, _Node]) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Start every relay, then the approvers; stop them all at the end."""
    profile = os.environ.get("TEAAGENT_BENCH_PROFILE")
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for service in ("relay", "approver"):
            for node in nodes.values():
                if service == "approver" and node.name == "alpha":
                    continue
                label = f"{node.name}-{service}"
                env = {
                    **os.environ,
                    "TEAAGENT_RELAY_REDIS_PREFIX": f"bench:{node.name}",
                    "TEAAGENT_APPROVER_REDIS_PREFIX": f"bench:{node.name}",
                    "TEAAGENT_RELAY_INBOX_RATE_LIMIT": "100000",
                }
                env.pop("TEAAGENT_CONFIG", None)
                runner = [sys.executable]
                if profile:
                    Path(profile).mkdir(parents=True, exist_ok=True)
                    runner += ["-m", "cProfile", "-o", str(Path(profile) / f"{label}.prof")]
                log = folder / f"{label}.log"
                with log.open("wb") as out:
                    processes[label] = subprocess.Popen(
                        [*runner, "-m", "teaagent", service, "serve", "--config", str(node.config),
                         "--no-access-log", "--log-level", "warning"],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )  # fmt: skip
            for node in nodes.values():
                if service == "approver" and node.name == "alpha":
                    continue
                label = f"{node.name}-{service}"
                url = node.url if service == "relay" else node.approver_url
                _wait_ready(processes[label], url, folder / f"{label}.log", f"{node.name}'s {service}")
        yield processes
    finally:
        for process in reversed(processes.values()):
            _stop(process)


# -- counting what one quorum does ------------------------------------------------------------------


@dataclass(frozen=True)
class _Counters:
    hops: float
    server_seconds: dict[str, float]  # per node: time answering calls that are not long-polls
    writes: float
    reads: float
    cpu: dict[str, float]  # per process label: CPU seconds
    idle_cpu_per_s: float = 0.0  # all services' CPU seconds per second with no quorum running

    def minus(self, other: _Counters) -> _Counters:
        return _Counters(
            hops=self.hops - other.hops,
            server_seconds={k: v - other.server_seconds.get(k, 0.0) for k, v in self.server_seconds.items()},
            writes=self.writes - other.writes,
            reads=self.reads - other.reads,
            cpu={k: v - other.cpu.get(k, 0.0) for k, v in self.cpu.items()},
        )


def _relay_counters(url: str) -> tuple[float, float]:
    """The relay's HTTP calls answered (operations aside) and its seconds spent on those not long-polls."""
    hops = seconds = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            route = sample.labels.get("route", "")
            if route in _SKIPPED_ROUTES:
                continue
            if sample.name == "teaagent_relay_http_requests_total":
                hops += sample.value
            elif (
                sample.name == "teaagent_relay_http_request_duration_seconds_sum" and route not in _LONG_POLLS
            ):
                seconds += sample.value
    return hops, seconds


def _redis_counters(client: redis.Redis) -> tuple[float, float]:
    """Round trips the server has answered, as writes (scripts, transactions) and the rest, so far.

    Writes are counted by their calls; the rest are the server's read events
    (``total_reads_processed``: a script's inner commands, a pipeline's and a transaction's are
    in one) less the writes. Over a window that difference is below zero when several writes
    shared a round trip; ``bench_quorum`` then leaves the figure out (``_trips``).
    """
    trips = float(client.info("stats")["total_reads_processed"])
    calls: dict[str, Any] = client.info("commandstats")
    writes = float(sum(calls.get(f"cmdstat_{name}", {}).get("calls", 0) for name in _WRITE_TRIPS))
    return writes, trips - writes


def _counters(
    nodes: Mapping[str, _Node],
    client: redis.Redis,
    processes: Mapping[str, subprocess.Popen[bytes]],
    *,
    before: bool,
) -> _Counters:
    # The relays' /metrics reads Redis too: read them outside the window of the Redis counts.
    def relays() -> dict[str, tuple[float, float]]:
        return {name: _relay_counters(node.url) for name, node in nodes.items()}

    scraped = relays() if before else {}
    writes, reads = _redis_counters(client)
    if not before:
        scraped = relays()
    return _Counters(
        hops=sum(hops for hops, _seconds in scraped.values()),
        server_seconds={name: seconds for name, (_hops, seconds) in scraped.items()},
        writes=writes,
        reads=reads,
        cpu={label: _process_cpu_seconds(process.pid) for label, process in processes.items()},
    )


# -- the real asking path ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    latencies: list[float]  # seconds, of the timed quorums
    throughput: float  # per second, over the timed window
    quorums: int  # all that completed, warm-up included


def _summarise(
    spans: list[tuple[float, float]], started: float, ended: float, seconds: float
) -> tuple[list[float], float]:
    warm = started + seconds * WARMUP_FRACTION
    timed = sorted(end - start for start, end in spans if start >= warm)
    done = sum(1 for _start, end in spans if end > warm)
    return timed, done / max(ended - warm, 1e-9)


async def _ask(
    concurrency: int,
    seconds: float,
    alpha: _Node,
    signer: SSHPrivateKey,
    config: MultiSigQuorumConfig,
    tool_name: str = "shell.run",
) -> _Run:
    origin_key = signer.public_key.to_line()
    spans: list[tuple[float, float]] = []
    counter = iter(range(1 << 62))
    started = time.perf_counter()
    stop_at = started + seconds
    warm = started + seconds * WARMUP_FRACTION
    deadline = stop_at + RUN_DEADLINE

    def more() -> bool:
        now = time.perf_counter()
        if now > deadline:
            raise RuntimeError(f"the cluster timed only {len(spans)} quorums in {seconds + RUN_DEADLINE:g} s")
        return now < stop_at or sum(1 for start, _end in spans if start >= warm) < MIN_TIMED

    async def caller() -> None:
        async with AsyncRelayClient(alpha.url, token=alpha.token, timeout=MAX_WAIT_SECONDS) as client:
            while more():
                index = next(counter)
                request = build_request(
                    origin="alpha",
                    run_id="bench-quorum",
                    call_id=f"call-{index}",
                    tool_name=tool_name,
                    arguments={"command": f"make target-{index}"},
                    reason="benchmark",
                    config=config,
                )
                begun = time.perf_counter()
                status = await client.submit_request(request, sign_request(request, signer))
                while not status.decided:
                    status = await client.wait_outcome(request["request_id"], MAX_WAIT_SECONDS)
                certificate = status.certificate
                if status.state != "approved" or certificate is None:
                    raise RuntimeError(f"request {request['request_id']} was {status.describe()}")
                # The policy's checks: the request it signed for this call, then the signatures.
                if canonical(certificate.get("request")) != canonical(request):
                    raise RuntimeError(f"the certificate of {request['request_id']} is for another request")
                verify_certificate(certificate, config, origin_public_key=origin_key, now=time.time())
                spans.append((begun, time.perf_counter()))

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    timed, throughput = _summarise(spans, started, time.perf_counter(), seconds)
    return _Run(timed, throughput, len(spans))


# -- the floor --------------------------------------------------------------------------------------


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


def serve_floor(port: int) -> None:
    """Serve the floor's bare HTTP app on ``127.0.0.1:port`` until SIGTERM (one uvicorn worker)."""
    import uvicorn

    uvicorn.run(
        _floor_app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )


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


def _resp(*parts: bytes) -> bytes:
    """A command as RESP, packed by hiredis."""
    packed: bytes = hiredis.pack_command(parts)  # type: ignore[arg-type]  # its stub takes 1-tuples
    return packed


@dataclass
class _RedisConnection:
    """A kept connection of the floor: commands written as they are, replies read by hiredis."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    replies: hiredis.Reader = dataclasses.field(default_factory=hiredis.Reader)


async def _resp_call(connection: _RedisConnection, command: bytes) -> bytes:
    connection.writer.write(command)
    while (reply := connection.replies.gets()) is False:
        data = await connection.reader.read(65536)
        if not data:
            raise RuntimeError("Redis closed a floor connection")
        connection.replies.feed(data)
    if isinstance(reply, Exception):
        raise RuntimeError(f"Redis refused a floor command: {reply}")
    return reply if isinstance(reply, bytes) else str(reply).encode()


async def _redis_connect(url: str) -> _RedisConnection:
    parts = urlsplit(url)
    if parts.scheme == "unix":  # the embedded server listens on its socket only
        connection = await asyncio.open_unix_connection(parts.path)
    else:
        connection = await asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 6379)
    kept = _RedisConnection(*connection)
    if parts.password:
        await _resp_call(kept, _resp(b"AUTH", parts.password.encode()))
    return kept


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


async def _floor_load(job: _FloorJob) -> tuple[list[tuple[float, float]], float, float]:
    """Run one process's floor callers: set up, say ``ready`` on stdout, start on a line on stdin."""
    size = _Size(job.nodes)
    peers = size.peers
    keys = {
        name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment=name)
        for name in size.names
    }
    public = {name: key.public_key for name, key in keys.items()}
    request = build_request(
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
            peer_public_keys={peer: public[peer].to_line() for peer in peers},
            peer_relay_urls={peer: "http://127.0.0.1:1" for peer in peers},
            high_risk_patterns=["shell.*"],
            timeout_seconds=600,
        ),
    )
    request_bytes = request_statement(request)
    request_signature = sshsig_sign(request_bytes, keys["alpha"], REQUEST_NAMESPACE)
    statements = {
        peer: statement_bytes(approval_statement(request, peer, int(time.time()))) for peer in peers
    }
    approvals = {peer: sshsig_sign(statements[peer], keys[peer], APPROVAL_NAMESPACE) for peer in peers}
    body = canonical({"request": request, "signature": request_signature})
    http_request = _floor_call(body)
    value = canonical({"statement": approval_statement(request, "beta", 0), "signature": approvals["beta"]})
    loader = await _redis_connect(job.redis_url)
    sha = await _resp_call(loader, _resp(b"SCRIPT", b"LOAD", _FLOOR_SCRIPT))
    loader.writer.close()
    plan = job.plan

    async def connections(count: int, port: int) -> list[_FloorHTTP]:
        return list(await asyncio.gather(*(_FloorHTTP.open(port) for _ in range(count))))

    spans: list[tuple[float, float]] = []
    opened = 0

    async def caller(index: int) -> None:
        origin_http, *branch_http = await connections(1 + len(peers), job.http_port)
        branch_redis = [await _redis_connect(job.redis_url) for _ in peers]
        key = f"bench:floor:{{{os.getpid()}-{index}}}:decision".encode()
        write, read = _resp(b"EVALSHA", sha, b"1", key, value), _resp(b"GET", key)
        await _resp_call(branch_redis[0], write)  # the key exists before the first GET
        nonlocal opened
        opened += 1
        await started.wait()

        async def branch(side: int, peer: str) -> None:
            sshsig_verify(request_bytes, request_signature, public["alpha"], REQUEST_NAMESPACE)
            sshsig_sign(statements[peer], keys[peer], APPROVAL_NAMESPACE)
            for _ in range(plan.branch_hops[side]):
                await _hop(branch_http[side], http_request)
            for _ in range(plan.branch_writes[side]):
                await _resp_call(branch_redis[side], write)
            for _ in range(plan.branch_reads[side]):
                await _resp_call(branch_redis[side], read)
            sshsig_verify(statements[peer], approvals[peer], public[peer], APPROVAL_NAMESPACE)

        try:
            while (
                time.perf_counter() < stop_at or sum(1 for start, _end in spans if start >= warm) < MIN_TIMED
            ):
                begun = time.perf_counter()
                sshsig_sign(request_bytes, keys["alpha"], REQUEST_NAMESPACE)
                await _hop(origin_http, http_request)
                await asyncio.gather(*(branch(side, peer) for side, peer in enumerate(peers)))
                await _hop(origin_http, http_request)
                sshsig_verify(request_bytes, request_signature, public["alpha"], REQUEST_NAMESPACE)
                for peer in peers[: size.required]:  # the certificate's approvals
                    sshsig_verify(statements[peer], approvals[peer], public[peer], APPROVAL_NAMESPACE)
                spans.append((begun, time.perf_counter()))
        finally:
            for http in (origin_http, *branch_http):
                http.close()
            for kept in branch_redis:
                kept.writer.close()

    started = asyncio.Event()
    stop_at = warm = 0.0
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
) -> _Run:
    count = 1 if concurrency == 1 else max(1, min(concurrency, os.cpu_count() or 1))
    shares = [concurrency // count + (index < concurrency % count) for index in range(count)]
    command = [
        sys.executable,
        "-c",
        "from teaagent.relay_client._quorum_bench import floor_main; floor_main()",
    ]
    workers = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in shares
    ]
    try:
        for worker, share in zip(workers, shares, strict=True):
            job = _FloorJob(http_port, *store, share, seconds, plan, size.nodes)
            _send(worker, json.dumps(dataclasses.asdict(job)))
        for worker in workers:
            _expect(worker, "ready")
        for worker in workers:
            _send(worker, "go")
        outcomes = [json.loads(_expect(worker, None)) for worker in workers]
    finally:
        for worker in workers:
            _stop(worker)
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
def _floor_server(folder: Path) -> Iterator[int]:
    port = _free_port()
    log = folder / "floor-http.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from teaagent.relay_client._quorum_bench import serve_floor; serve_floor({port})",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(process, f"http://127.0.0.1:{port}", log, "the floor's HTTP server")
        yield port
    finally:
        _stop(process)


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
    redis_connection = await _redis_connect(*store)
    key = b"bench:floor:{profile}:decision"
    sha = await _resp_call(redis_connection, _resp(b"SCRIPT", b"LOAD", _FLOOR_SCRIPT))
    write, read = _resp(b"EVALSHA", sha, b"1", key, b"x" * 400), _resp(b"GET", key)
    costs: list[list[float]] = [[], [], []]
    try:
        for _ in range(PRIMITIVE_SAMPLES):
            for index, call in enumerate(
                (
                    _hop(http, http_request),
                    _resp_call(redis_connection, write),
                    _resp_call(redis_connection, read),
                )
            ):
                begun = time.perf_counter()
                await call
                costs[index].append(time.perf_counter() - begun)
    finally:
        http.close()
        redis_connection.writer.close()
    hop, written, got = (_median_seconds(samples) for samples in costs)
    return hop, written, got


# -- the benchmark ----------------------------------------------------------------------------------


def _trips(counted: Mapping[int, _Counters]) -> tuple[dict[int, float], dict[int, float], dict[int, str]]:
    """The floor's writes and reads per quorum at each concurrency, and why a read count is left out.

    The server counts read events: a client's command, pipeline or transaction is one when it
    has a connection to itself (redis-py's pool), so the read events are the round trips, writes
    and reads together. The writes are counted as commands (``_redis_counters``), and several of
    them may share a round trip (a pipeline of scripts): then the round trips less the writes
    fall below zero, the reads cannot be told apart, and ``redis_reads_cN`` is left out with the
    reason, never reported as zero. The floor makes as many round trips as the server counted,
    never more: its writes are the writes, or all the round trips when there were fewer, and its
    reads are the rest.
    """
    writes: dict[int, float] = {}
    reads: dict[int, float] = {}
    omitted: dict[int, str] = {}
    for concurrency, per in counted.items():
        trips = per.writes + per.reads
        if per.reads < 0:
            omitted[concurrency] = (
                f"not measurable: the server took in {-per.reads:.2f} fewer read events than writes per "
                f"quorum (several writes per round trip); the floor makes the {max(trips, 0.0):.2f} "
                "round trips counted, all as writes"
            )
        writes[concurrency] = max(0.0, min(per.writes, trips))
        reads[concurrency] = max(0.0, per.reads)
    return writes, reads, omitted


def _percentile(latencies: list[float], fraction: float) -> float:
    ordered = sorted(latencies)
    return ordered[max(0, min(len(ordered) - 1, round(len(ordered) * fraction) - 1))]


def _policy_config(config: MultiSigQuorumConfig) -> MultiSigQuorumConfig:
    """Alpha's configuration with its version 2 rule (as its node.toml has it)."""
    rule = QuorumRule(pattern="git.push*", mode="all_of", terms=(RuleTerm("ops", 1), RuleTerm("security", 1)))
    return dataclasses.replace(
        config,
        high_risk_patterns=[*config.high_risk_patterns, "git.push*"],
        groups={name: tuple(members) for name, members in POLICY_GROUPS.items()},
        rules=(rule,),
    )


def _policy_run(
    seconds: float,
    nodes: Mapping[str, _Node],
    client: redis.Redis,
    processes: Mapping[str, subprocess.Popen[bytes]],
    signer: SSHPrivateKey,
    config: MultiSigQuorumConfig,
) -> tuple[_Run, _Counters]:
    """The version 2 variant on the running cluster: one caller asking for ``git.push``, counted."""
    asyncio.run(_ask(1, min(seconds, 0.5), nodes["alpha"], signer, config, POLICY_TOOL))  # warm it
    before = _counters(nodes, client, processes, before=True)
    run = asyncio.run(_ask(1, seconds, nodes["alpha"], signer, config, POLICY_TOOL))
    delta = _counters(nodes, client, processes, before=False).minus(before)
    per = _Counters(
        hops=delta.hops / run.quorums,
        server_seconds={k: v / run.quorums for k, v in delta.server_seconds.items()},
        writes=delta.writes / run.quorums,
        reads=max(0.0, delta.reads) / run.quorums,
        cpu={k: v / run.quorums for k, v in delta.cpu.items()},
    )
    return run, per


def _policy_figures(run: _Run, floor: _Run, per: _Counters) -> dict[str, float]:
    """The variant's ``policy_*`` figures: its latency, its floor's, their ratio, what it did."""
    p50 = statistics.median(run.latencies) * 1000
    floor_p50 = statistics.median(floor.latencies) * 1000
    return {
        "policy_p50_ms_c1": p50,
        "policy_p99_ms_c1": _percentile(run.latencies, 0.99) * 1000,
        "policy_throughput_c1": run.throughput,
        "policy_floor_p50_ms_c1": floor_p50,
        "policy_floor_ratio": p50 / floor_p50,
        "policy_http_hops_c1": per.hops,
        "policy_redis_writes_c1": per.writes,
        "policy_redis_reads_c1": per.reads,
    }


def _real_path(
    folder: Path,
    nodes: Mapping[str, _Node],
    keys: Mapping[str, SSHPrivateKey],
    config: MultiSigQuorumConfig,
    client: redis.Redis,
    seconds: float,
    concurrencies: tuple[int, ...],
    *,
    policy: bool = False,
) -> tuple[dict[int, _Run], dict[int, _Counters], tuple[_Run, _Counters] | None]:
    """Start the cluster, run the real asking path at each concurrency; its runs and per-quorum counts.

    With ``policy``, the version 2 variant runs first (:func:`_policy_run`), on the idle cluster
    the plain run at concurrency 1 also finds; its run and counts are the third value.
    """
    counted: dict[int, _Counters] = {}
    runs: dict[int, _Run] = {}
    policy_result: tuple[_Run, _Counters] | None = None
    with _cluster(folder, nodes) as processes:
        asyncio.run(_ask(1, min(seconds, 0.5), nodes["alpha"], keys["alpha"], config))  # warm every path
        if policy:
            policy_result = _policy_run(seconds, nodes, client, processes, keys["alpha"], config)
        # What the services spend with nothing to do (their polls and housekeeping), per second.
        idle = {label: _process_cpu_seconds(process.pid) for label, process in processes.items()}
        time.sleep(IDLE_SECONDS)
        idle_per_s = (
            sum(_process_cpu_seconds(process.pid) - idle[label] for label, process in processes.items())
            / IDLE_SECONDS
        )
        for concurrency in concurrencies:
            before = _counters(nodes, client, processes, before=True)
            runs[concurrency] = asyncio.run(_ask(concurrency, seconds, nodes["alpha"], keys["alpha"], config))
            after = _counters(nodes, client, processes, before=False)
            delta = after.minus(before)
            quorums = runs[concurrency].quorums
            counted[concurrency] = _Counters(
                hops=delta.hops / quorums,
                server_seconds={k: v / quorums for k, v in delta.server_seconds.items()},
                writes=delta.writes / quorums,
                reads=delta.reads / quorums,  # below zero: not measurable (_trips)
                cpu={k: v / quorums for k, v in delta.cpu.items()},
                idle_cpu_per_s=idle_per_s,
            )
    return runs, counted, policy_result


def bench_quorum(
    seconds: float = 3.0,
    *,
    nodes: int = DEFAULT_SIZE.nodes,
    concurrencies: tuple[int, ...] = CONCURRENCIES,
    variants: bool = True,
) -> dict[str, Any]:
    """``teaagent bench quorum``: end-to-end quorums against their floor (see the module docstring).

    Args:
        seconds: The time of each run: the real path and the floor, at each concurrency.
        nodes: The cluster's size: alpha and ``nodes - 1`` peers, a majority of the nodes'
            approvals needed (2 of 3, 3 of 5, 5 of 9).
        concurrencies: The numbers of callers at once, 1 and 64 among them.
        variants: Whether to run the cluster again under each of ``VARIANTS`` (another HTTP
            client, ``http_<client>_*``; Redis calls unbatched, ``redis_unbatched_*``; see
            ``_variants``).

    Returns:
        ``p50_ms_c1``, ``p99_ms_c1``, ``throughput_c1``, ``throughput_c16``, ``throughput_c64``,
        ``p50_ms_c16``, ``p50_ms_c64``, ``p99_ms_c64``, the floor's ``floor_p50_ms_c1``,
        ``floor_p99_ms_c1``, ``floor_throughput_c16``, ``floor_throughput_c64``, the ratios
        ``floor_ratio`` and ``floor_throughput_ratio_c64``, the version 2 variant's ``policy_*``
        (``policy_p50_ms_c1``, ``policy_floor_p50_ms_c1``, ``policy_floor_ratio``...), what one quorum did
        (``http_hops_c1``, ``redis_round_trips_c1``, ``redis_writes_c1``, ``redis_reads_c1`` or
        ``redis_reads_c1_omitted``, the same at c16 and c64), the CPU
        milliseconds per quorum of all services at c64 (``cluster_cpu_ms_per_quorum_c64``), and
        the ``profile_*`` breakdown.

    Raises:
        ValueError: ``seconds`` is not positive, ``nodes`` not one of ``SIZES``, or a
            concurrency other than 1 and 64 is missing.
        RuntimeError: A service did not start, a quorum was not approved or its certificate did
            not verify, or a run did not finish in time.
        StoreError: The embedded Redis did not start.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    if nodes not in SIZES:
        raise ValueError(f"a cluster of {nodes} nodes is not one of {', '.join(map(str, SIZES))}")
    if not {1, 64} <= set(concurrencies):
        raise ValueError("the concurrencies must include 1 and 64")
    size = _Size(nodes)
    raw = {name: Ed25519PrivateKey.generate() for name in size.names}
    keys = {name: SSHPrivateKey.from_cryptography(key, comment=name) for name, key in raw.items()}
    figures: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-quorum-") as temporary,
        EmbeddedRedis(Path(temporary) / "redis") as server,
    ):
        folder = Path(temporary)
        cluster = _write_nodes(folder, server.url, keys, raw, size)
        config = MultiSigQuorumConfig(
            enabled=True,
            required_approvals=size.required,
            peer_agent_ids=list(size.peers),
            peer_public_keys={peer: keys[peer].public_key.to_line() for peer in size.peers},
            peer_relay_urls={peer: cluster[peer].url for peer in size.peers},
            high_risk_patterns=["shell.*"],
            timeout_seconds=600,
        )
        config = _policy_config(config)  # shell.run matches no rule: version 1, 2 of 3, as before
        client = redis.Redis.from_url(server.url)
        store = (server.url,)
        # The version 2 variant (a two-group all_of rule) on the default cluster, in the same run.
        with_policy = variants and nodes == DEFAULT_SIZE.nodes
        runs, counted, policy_result = _real_path(
            folder, cluster, keys, config, client, seconds, concurrencies, policy=with_policy
        )
        writes, reads, omitted = _trips(counted)
        with _floor_server(folder) as http_port:
            plans = {
                c: _plan(dataclasses.replace(counted[c], writes=writes[c], reads=reads[c]), size)
                for c in concurrencies
            }
            floors = {c: _floor(c, seconds, http_port, store, plans[c], size) for c in concurrencies}
            policy_floor = (
                None
                if policy_result is None
                else _floor(1, seconds, http_port, store, _plan(policy_result[1], size), size)
            )
            hop, written, got = asyncio.run(_io_costs(http_port, store))
        if variants:
            figures.update(_variants(folder, cluster, keys, config, client, seconds))
        client.close()
    sign, verify = _crypto_costs()
    for concurrency in concurrencies:
        run, floor, per = runs[concurrency], floors[concurrency], counted[concurrency]
        suffix = f"c{concurrency}"
        figures[f"p50_ms_{suffix}"] = statistics.median(run.latencies) * 1000
        figures[f"p99_ms_{suffix}"] = _percentile(run.latencies, 0.99) * 1000
        figures[f"throughput_{suffix}"] = run.throughput
        figures[f"floor_p50_ms_{suffix}"] = statistics.median(floor.latencies) * 1000
        figures[f"floor_p99_ms_{suffix}"] = _percentile(floor.latencies, 0.99) * 1000
        figures[f"floor_throughput_{suffix}"] = floor.throughput
        figures[f"http_hops_{suffix}"] = per.hops
        figures[f"redis_writes_{suffix}"] = per.writes
        figures[f"redis_round_trips_{suffix}"] = max(0.0, per.writes + per.reads)
        if concurrency in omitted:
            figures[f"redis_reads_{suffix}_omitted"] = omitted[concurrency]
        else:
            figures[f"redis_reads_{suffix}"] = per.reads
        figures[f"cluster_cpu_ms_per_quorum_{suffix}"] = sum(per.cpu.values()) * 1000
        # The same less what the services spent idle meanwhile (their polls, per second of the run).
        figures[f"cluster_busy_cpu_ms_per_quorum_{suffix}"] = (
            sum(per.cpu.values()) - per.idle_cpu_per_s / max(run.throughput, 1e-9)
        ) * 1000
    figures["cluster_idle_cpu_ms_per_s"] = counted[concurrencies[0]].idle_cpu_per_s * 1000
    figures["floor_ratio"] = figures["p50_ms_c1"] / figures["floor_p50_ms_c1"]
    figures["floor_throughput_ratio_c64"] = figures["floor_throughput_c64"] / figures["throughput_c64"]
    for label, _variable, _value in VARIANTS if variants else ():
        name, prefix = f"{label}_p50_ms_c1", f"{label}_"
        figures[f"{prefix}floor_ratio"] = figures[name] / figures["floor_p50_ms_c1"]
        figures[f"{prefix}floor_throughput_ratio_c64"] = (
            figures["floor_throughput_c64"] / figures[f"{prefix}throughput_c64"]
        )
    if policy_result is not None and policy_floor is not None:
        figures |= _policy_figures(policy_result[0], policy_floor, policy_result[1])
    one = counted[1]
    figures["profile_sign_ms"] = size.signatures * sign * 1000
    figures["profile_verify_ms"] = size.verifications * verify * 1000
    figures["profile_redis_ms"] = (writes[1] * written + reads[1] * got) * 1000
    figures["profile_http_ms"] = one.hops * hop * 1000
    figures["profile_http_hop_ms"] = hop * 1000
    for name, spent in one.server_seconds.items():
        figures[f"profile_server_ms_{name}"] = spent * 1000
    for label, spent in one.cpu.items():
        figures[f"profile_cpu_ms_{label.replace('-', '_')}"] = spent * 1000
    return figures


# -- variants: other HTTP clients (http-lib), Redis calls unbatched (issue 29) ---------------------


def _variants(
    folder: Path,
    nodes: Mapping[str, _Node],
    keys: Mapping[str, SSHPrivateKey],
    config: MultiSigQuorumConfig,
    client: redis.Redis,
    seconds: float,
) -> dict[str, float]:
    """The real path again under each of ``VARIANTS``, at concurrency 1 and 64.

    Every service of the cluster and the asking callers here read the variable at start:
    ``TEAAGENT_BENCH_HTTP_CLIENT`` points ``teaagent._http.http_pool`` at another HTTP client
    (``httpx``: one client per server, ``httpx.Limits`` sized as aiohttp's connector, HTTP/1.1);
    ``TEAAGENT_REDIS_BATCHES=0`` sends each Redis call on its own (``redis_unbatched``, the store
    before it batched). Each: ``<prefix>_p50_ms_c1``, ``<prefix>_throughput_c64``,
    ``<prefix>_cluster_cpu_ms_per_quorum_c64`` and ``<prefix>_redis_round_trips_c64``, against
    the same floor as the default's (``<prefix>_floor_ratio``...).
    """
    figures: dict[str, float] = {}
    for prefix, variable, value in VARIANTS:
        before = os.environ.get(variable)
        os.environ[variable] = value
        try:
            runs, counted, _ = _real_path(folder, nodes, keys, config, client, seconds, (1, 64))
        finally:
            if before is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = before
        figures[f"{prefix}_p50_ms_c1"] = statistics.median(runs[1].latencies) * 1000
        figures[f"{prefix}_throughput_c64"] = runs[64].throughput
        figures[f"{prefix}_cluster_cpu_ms_per_quorum_c64"] = sum(counted[64].cpu.values()) * 1000
        figures[f"{prefix}_redis_round_trips_c64"] = max(0.0, counted[64].writes + counted[64].reads)
    return figures


# -- growth with the cluster's size (http-lib) ------------------------------------------------------


def bench_quorum_sizes(seconds: float = 3.0, sizes: tuple[int, ...] = SIZES) -> dict[str, float]:
    """``teaagent bench quorum --peers 3,5,9``: the same quorum on clusters of each size.

    For each size N (2 of 3, 3 of 5, 5 of 9; every node on this machine), at concurrency 1 and 64,
    against its own floor: ``n<N>_floor_ratio``, ``n<N>_floor_throughput_ratio_c64``,
    ``n<N>_cluster_cpu_ms_per_quorum_c64``, ``n<N>_p50_ms_c1``, ``n<N>_throughput_c64``. Beside
    them, how the cluster's CPU per approved call grows against the smallest size's, over the
    growth in peers (``n<N>_cpu_growth_over_peers``: at most 1 is at most linear in the number of
    peers) and over the growth in nodes (``n<N>_cpu_growth_over_nodes``); the same of the CPU
    less what the services spend idle (``busy_``: each service's polls and housekeeping, measured
    with the cluster idle, ``n<N>_cluster_idle_cpu_ms_per_s``, cost more per quorum the fewer
    quorums a second a larger cluster completes on the same cores).

    Raises:
        ValueError: ``seconds`` is not positive, or a size is not one of ``SIZES``.
    """
    figures: dict[str, float] = {}
    for nodes in sizes:
        measured = bench_quorum(seconds, nodes=nodes, concurrencies=(1, 64), variants=False)
        for key in (
            "floor_ratio",
            "floor_throughput_ratio_c64",
            "cluster_cpu_ms_per_quorum_c64",
            "cluster_cpu_ms_per_quorum_c1",
            "cluster_busy_cpu_ms_per_quorum_c64",
            "cluster_idle_cpu_ms_per_s",
            "p50_ms_c1",
            "floor_p50_ms_c1",
            "throughput_c64",
            "floor_throughput_c64",
            "http_hops_c64",
            "redis_writes_c64",
        ):
            figures[f"n{nodes}_{key}"] = measured[key]
    smallest = min(sizes)
    for kind in ("", "busy_"):
        base = figures[f"n{smallest}_cluster_{kind}cpu_ms_per_quorum_c64"]
        for nodes in sizes:
            growth = figures[f"n{nodes}_cluster_{kind}cpu_ms_per_quorum_c64"] / base
            figures[f"n{nodes}_{kind}cpu_growth_over_peers"] = growth / ((nodes - 1) / (smallest - 1))
            figures[f"n{nodes}_{kind}cpu_growth_over_nodes"] = growth / (nodes / smallest)
    return figures
