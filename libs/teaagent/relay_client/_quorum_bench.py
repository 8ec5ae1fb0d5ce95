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
with a constant (no framework), over kept-alive connections with a minimal HTTP/1.1 client;
Redis round trips are RESP written and read by hand over kept-alive connections. The same
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

import hiredis
import httpx
import redis
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

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
from teaagent.trust import MultiSigQuorumConfig, QuorumRule, RuleTerm

__all__ = ["CONCURRENCIES", "bench_quorum"]

CONCURRENCIES: Final = (1, 16, 64)
WARMUP_FRACTION: Final = 0.2  # of each run, not timed: connections open, caches fill
MIN_TIMED: Final = 5  # quorums timed per run at least, however short the budget
READY_TIMEOUT: Final = 90.0  # seconds for a service to answer /health: five start at once on a loaded host
RUN_DEADLINE: Final = 120.0  # seconds past its budget that one run may take before the bench gives up
PEERS: Final = ("beta", "gamma")
NODES: Final = ("alpha", *PEERS)
SIGNATURES: Final = 3  # the request, two approvals
VERIFICATIONS: Final = 12  # see the module docstring
FLOOR_VERIFICATIONS: Final = 7
FLOOR_CLIENT_HOPS: Final = 2  # the origin's own: its submission and its outcome
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


def _write_nodes(
    folder: Path, redis_url: str, keys: Mapping[str, SSHPrivateKey], raw: Mapping[str, Any]
) -> dict[str, _Node]:
    ports = {name: (_free_port(), _free_port()) for name in NODES}
    nodes: dict[str, _Node] = {}
    for name in NODES:
        home = folder / name
        home.mkdir()
        _write_key(home, name, raw[name])
        token = f"bench-{secrets.token_hex(16)}"
        port, approver_port = ports[name]
        others = PEERS if name == "alpha" else ("alpha",)
        peers = "".join(
            f'\n[peers.{peer}]\npublic_key = "{keys[peer].public_key.to_line()}"\n'
            f'relay_url = "http://127.0.0.1:{ports[peer][0]}"\n'
            for peer in others
        )
        required = len(PEERS) if name == "alpha" else 1
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

    branch_hops: tuple[int, int]
    branch_writes: tuple[int, int]
    branch_reads: tuple[int, int]


def _split(total: float) -> tuple[int, int]:
    whole = max(0, round(total))
    return (whole + 1) // 2, whole // 2


def _plan(per_quorum: _Counters) -> _Plan:
    return _Plan(
        branch_hops=_split(per_quorum.hops - FLOOR_CLIENT_HOPS),
        branch_writes=_split(per_quorum.writes),
        branch_reads=_split(per_quorum.reads),
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


async def _hop(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> None:
    reader, writer = connection
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"the floor's server answered {head[:40]!r}")


@dataclass(frozen=True)
class _FloorJob:
    http_port: int
    redis_url: str
    callers: int
    seconds: float
    plan: _Plan


async def _floor_load(job: _FloorJob) -> tuple[list[tuple[float, float]], float, float]:
    """Run one process's floor callers: set up, say ``ready`` on stdout, start on a line on stdin."""
    keys = {
        name: SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment=name) for name in NODES
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
            required_approvals=2,
            peer_agent_ids=list(PEERS),
            peer_public_keys={peer: public[peer].to_line() for peer in PEERS},
            peer_relay_urls={peer: "http://127.0.0.1:1" for peer in PEERS},
            high_risk_patterns=["shell.*"],
            timeout_seconds=600,
        ),
    )
    request_bytes = request_statement(request)
    request_signature = sshsig_sign(request_bytes, keys["alpha"], REQUEST_NAMESPACE)
    statements = {
        peer: statement_bytes(approval_statement(request, peer, int(time.time()))) for peer in PEERS
    }
    approvals = {peer: sshsig_sign(statements[peer], keys[peer], APPROVAL_NAMESPACE) for peer in PEERS}
    body = canonical({"request": request, "signature": request_signature})
    http_request = (
        b"POST /v1/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    value = canonical({"statement": approval_statement(request, "beta", 0), "signature": approvals["beta"]})
    loader = await _redis_connect(job.redis_url)
    sha = await _resp_call(loader, _resp(b"SCRIPT", b"LOAD", _FLOOR_SCRIPT))
    loader.writer.close()
    plan = job.plan

    async def connections(count: int, port: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        return list(await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(count))))

    spans: list[tuple[float, float]] = []
    opened = 0

    async def caller(index: int) -> None:
        origin_http, *branch_http = await connections(3, job.http_port)
        branch_redis = [await _redis_connect(job.redis_url) for _ in PEERS]
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
                await asyncio.gather(branch(0, "beta"), branch(1, "gamma"))
                await _hop(origin_http, http_request)
                sshsig_verify(request_bytes, request_signature, public["alpha"], REQUEST_NAMESPACE)
                for peer in PEERS:
                    sshsig_verify(statements[peer], approvals[peer], public[peer], APPROVAL_NAMESPACE)
                spans.append((begun, time.perf_counter()))
        finally:
            for _reader, writer in (origin_http, *branch_http):
                writer.close()
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


def _floor(concurrency: int, seconds: float, http_port: int, store: tuple[str], plan: _Plan) -> _Run:
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
            job = _FloorJob(http_port, *store, share, seconds, plan)
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
    body = b"x" * 700
    http_request = b"POST /v1/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    http = await asyncio.open_connection("127.0.0.1", http_port)
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
        http[1].close()
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


def bench_quorum(seconds: float = 3.0) -> dict[str, Any]:
    """``teaagent bench quorum``: end-to-end quorums against their floor (see the module docstring).

    Args:
        seconds: The time of each run: the real path and the floor, at each concurrency.

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
        ValueError: ``seconds`` is not positive.
        RuntimeError: A service did not start, a quorum was not approved or its certificate did
            not verify, or a run did not finish in time.
        StoreError: The embedded Redis did not start.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    raw = {name: Ed25519PrivateKey.generate() for name in NODES}
    keys = {name: SSHPrivateKey.from_cryptography(key, comment=name) for name, key in raw.items()}
    figures: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-quorum-") as temporary,
        EmbeddedRedis(Path(temporary) / "redis") as server,
    ):
        folder = Path(temporary)
        nodes = _write_nodes(folder, server.url, keys, raw)
        config = MultiSigQuorumConfig(
            enabled=True,
            required_approvals=len(PEERS),
            peer_agent_ids=list(PEERS),
            peer_public_keys={peer: keys[peer].public_key.to_line() for peer in PEERS},
            peer_relay_urls={peer: nodes[peer].url for peer in PEERS},
            high_risk_patterns=["shell.*"],
            timeout_seconds=600,
        )
        config = _policy_config(config)  # shell.run matches no rule: version 1, 2 of 3, as before
        client = redis.Redis.from_url(server.url)
        store = (server.url,)
        counted: dict[int, _Counters] = {}
        runs: dict[int, _Run] = {}
        with _cluster(folder, nodes) as processes:
            asyncio.run(_ask(1, min(seconds, 0.5), nodes["alpha"], keys["alpha"], config))  # warm every path
            # The version 2 variant first, on the idle cluster the plain c1 run also finds.
            policy_run, policy_counted = _policy_run(seconds, nodes, client, processes, keys["alpha"], config)
            for concurrency in CONCURRENCIES:
                before = _counters(nodes, client, processes, before=True)
                runs[concurrency] = asyncio.run(
                    _ask(concurrency, seconds, nodes["alpha"], keys["alpha"], config)
                )
                after = _counters(nodes, client, processes, before=False)
                delta = after.minus(before)
                quorums = runs[concurrency].quorums
                counted[concurrency] = _Counters(
                    hops=delta.hops / quorums,
                    server_seconds={k: v / quorums for k, v in delta.server_seconds.items()},
                    writes=delta.writes / quorums,
                    reads=delta.reads / quorums,  # below zero: not measurable (_trips)
                    cpu={k: v / quorums for k, v in delta.cpu.items()},
                )
        writes, reads, omitted = _trips(counted)
        with _floor_server(folder) as http_port:
            plans = {
                c: _plan(dataclasses.replace(counted[c], writes=writes[c], reads=reads[c]))
                for c in CONCURRENCIES
            }
            floors = {c: _floor(c, seconds, http_port, store, plans[c]) for c in CONCURRENCIES}
            policy_floor = _floor(1, seconds, http_port, store, _plan(policy_counted))
            hop, written, got = asyncio.run(_io_costs(http_port, store))
        client.close()
    sign, verify = _crypto_costs()
    for concurrency in CONCURRENCIES:
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
    figures["floor_ratio"] = figures["p50_ms_c1"] / figures["floor_p50_ms_c1"]
    figures["floor_throughput_ratio_c64"] = figures["floor_throughput_c64"] / figures["throughput_c64"]
    figures |= _policy_figures(policy_run, policy_floor, policy_counted)
    one = counted[1]
    figures["profile_sign_ms"] = SIGNATURES * sign * 1000
    figures["profile_verify_ms"] = VERIFICATIONS * verify * 1000
    figures["profile_redis_ms"] = (writes[1] * written + reads[1] * got) * 1000
    figures["profile_http_ms"] = one.hops * hop * 1000
    for name, spent in one.server_seconds.items():
        figures[f"profile_server_ms_{name}"] = spent * 1000
    for label, spent in one.cpu.items():
        figures[f"profile_cpu_ms_{label.replace('-', '_')}"] = spent * 1000
    return figures
