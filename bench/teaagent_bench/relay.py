"""Benchmark of a relay counting signed decisions: ``teaagent bench relay`` (with the store's rate limiter).

``bench_decisions(seconds)`` starts an embedded Redis and one real relay process
(``teaagent relay serve``: one uvicorn worker; its delivery worker off, so that only intake is
measured), stores signed requests of its origin, and pre-signs three decisions for each (a denial
by ``delta``, approvals by ``beta`` and ``gamma``; 2 of 3 required, so all three count when they
arrive in that order). It then posts every decision at once, ``CONCURRENCY`` in flight, once
per HTTP client (``HTTP_CLIENTS``), on fresh requests each time; each client is one pool of
``CONCURRENCY`` kept-alive connections (as many as calls in flight, so that none is closed and
reopened; ``teaagent._http.http_pool``):

- ``decisions_per_s`` (and ``_aiohttp``): through aiohttp's client, the services' own;
- ``decisions_per_s_httpx``: through httpx, sized the same (``httpx.Limits``, HTTP/1.1);
- ``decisions_per_s_batched``: through aiohttp, as the peers' relays send them under load: each
  peer's decisions ``DELIVERY_BATCH`` at a time in one ``POST /v1/deliveries``, as many batches in
  flight as make ``CONCURRENCY`` decisions.

Beside each: ``client_cpu_us_per_call_<client>``, this process's CPU per call (the load
generator's cost, which shares the machine's cores with the relay), and
``relay_cpu_ms_per_decision_<client>``.

Each decision is verified by the relay (PROTOCOL.md's counting rules, one Ed25519 SSHSIG
verification) and counted in Redis (the atomic ``record_decision`` script) before it is answered;
only 2xx answers count, and every decision must be answered 2xx. ``relay_cpu_ms_per_decision`` is
the relay process's CPU time (user and system) per decision during the aiohttp run: its rate on a
core of its own is about ``1000 / relay_cpu_ms_per_decision``.

Its floor, measured in the same ``teaagent bench relay``: one SSHSIG verification of the same
approvals (``verify_ms_per_decision``, this process's CPU per verification, a few hundred of them
verified over and over for as long as the relay's own run took: ``verifications`` ran) plus the
client CPU of one raw EVALSHA round trip, no client library (``raw_evalsha_wire_client_cpu_us``);
``relay_ratio_to_floor`` is the relay's CPU per decision over their sum, each decision its own
call; ``relay_ratio_to_floor_batched`` the same of the batched run.

That floor leaves out the relay's HTTP serving: a relay is an HTTP service, and the floor does
no HTTP. ``http_floor_ms_per_call`` is what the serving costs by itself: the CPU per call of a
bare uvicorn app (uvicorn, httptools and uvloop as the relay runs them, one ASGI callable, no
framework: ``teaagent_bench.quorum.serve_floor``, the floor of ``bench quorum``'s hops) answering
the aiohttp run's decisions, posted by the same client at the same concurrency after the relay's
run, over and over for as long as that run took. ``relay_ratio_to_floor_with_http`` is the
relay's CPU per decision over the floor plus that: what is left above 1 is the framework
(Starlette and FastAPI, the middlewares, pydantic), the relay's own code and redis-py. It is a
figure beside the target's, not a target.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent._http import http_pool
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    APPROVAL_TYPE,
    approval_statement,
    build_request,
    sign_approval,
    sign_denial,
    sign_request,
    statement_bytes,
)
from teaagent.signing import SSHPrivateKey, sshsig_verify
from teaagent.store import EmbeddedRedis
from teaagent.testing import LocalCluster
from teaagent.trust import MultiSigQuorumConfig
from teaagent_bench._processes import free_port, process_cpu_seconds
from teaagent_bench.quorum import bare_http_server

__all__ = ["bench_decisions", "bench_relay"]

CONCURRENCY: Final = 64  # decisions in flight: many peers answering at once
DECISIONS_PER_SECOND_GUESS: Final = 1500  # sizes the work to the time budget; the figure is measured
READY_TIMEOUT: Final = 30.0  # seconds for the relay process to answer /health
PEERS: Final = ("beta", "delta", "gamma")

_Item = tuple[str, bytes]  # (path, JSON body)
_Poster = Callable[[str, list[_Item], dict[str, str]], Coroutine[Any, Any, tuple[int, list[float]]]]


# -- HTTP client variants (http-lib) --------------------------------------------------------------


HTTP_CLIENTS: Final = ("aiohttp", "httpx")  # the services' client first, then httpx sized the same
# Decisions per POST /v1/deliveries in the batched run: what one peer's relay sent the origin's in a
# batch at 64 callers in `bench quorum` (15 to 19 on average, on 2 cores).
DELIVERY_BATCH: Final = 16
HTTP_FLOOR_MIN_SECONDS: Final = 0.5  # the bare HTTP server's shortest measured run (``_bare_http_ms``)


async def _post(
    url: str,
    items: list[_Item],
    headers: dict[str, str],
    client: str = "aiohttp",
    *,
    in_flight: int = CONCURRENCY,
    accepted: Callable[[int, bytes], int] | None = None,
) -> tuple[int, list[float]]:
    """POST every item through one client of ``client``'s kind, ``in_flight`` calls at once; how
    many were accepted (``accepted`` of each answer: 1 for a 2xx when None), and each call's latency.

    One pool of ``in_flight`` kept-alive connections (``teaagent._http.http_pool``): as many
    connections as calls in flight, so that no client closes and reopens one.
    """
    pool = http_pool(url, headers=headers, connections=in_flight, timeout=60.0, client=client)
    pending = list(reversed(items))
    ok = 0
    latencies: list[float] = []

    async def worker() -> None:
        nonlocal ok
        while pending:
            path, body = pending.pop()
            started = time.perf_counter()
            status, answer = await pool.post(path, body)
            latencies.append(time.perf_counter() - started)
            ok += accepted(status, answer) if accepted is not None else 200 <= status < 300

    try:
        await asyncio.gather(*(worker() for _ in range(in_flight)))
    finally:
        await pool.aclose()
    return ok, latencies


def _accepted_in_batch(status: int, answer: bytes) -> int:
    """How many deliveries of a ``POST /v1/deliveries`` were answered 2xx."""
    if status != 200:
        return 0
    return sum(200 <= result["status"] < 300 for result in json.loads(answer)["results"])


async def _post_batched(url: str, items: list[_Item], headers: dict[str, str]) -> tuple[int, list[float]]:
    """POST every item in batches of ``DELIVERY_BATCH`` (``POST /v1/deliveries``), each batch one
    signer's decisions (one peer's relay sends its own); ``CONCURRENCY`` decisions in flight.

    Every item of ``items`` is one of three signers' decisions in turn (``_work``'s order).
    """
    own = [items[signer::3] for signer in range(3)]
    batches = [
        (
            "/v1/deliveries",
            json.dumps(
                {"deliveries": [{"path": path, "body": json.loads(body)} for path, body in chunk]}
            ).encode(),
        )
        for start in range(0, max(map(len, own)), DELIVERY_BATCH)
        for chunk in (decisions[start : start + DELIVERY_BATCH] for decisions in own)
        if chunk
    ]
    return await _post(
        url, batches, headers, in_flight=max(1, CONCURRENCY // DELIVERY_BATCH), accepted=_accepted_in_batch
    )


def _posting(client: str) -> _Poster:
    if client == "batched":
        return _post_batched

    async def post(url: str, items: list[_Item], headers: dict[str, str]) -> tuple[int, list[float]]:
        return await _post(url, items, headers, client)

    return post


def signed_requests(
    keys: dict[str, SSHPrivateKey], peers: list[str], required: int, run_id: str, indexes: range
) -> list[tuple[dict[str, Any], bytes]]:
    """alpha's requests to run ``make target-N`` (N in ``indexes``), each with its signed body as sent."""
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=required,
        peer_agent_ids=peers,
        peer_public_keys={peer: keys[peer].public_key.to_line() for peer in peers},
        peer_relay_urls={peer: "http://127.0.0.1:1" for peer in peers},
        high_risk_patterns=["shell.*"],
        timeout_seconds=600,
    )
    signed = []
    for index in indexes:
        request = build_request(
            origin="alpha",
            run_id=run_id,
            call_id=f"call-{index}",
            tool_name="shell.run",
            arguments={"command": f"make target-{index}"},
            reason="benchmark",
            config=config,
        )
        body = {"request": request, "signature": sign_request(request, keys["alpha"])}
        signed.append((request, json.dumps(body).encode()))
    return signed


def _work(count: int, keys: dict[str, SSHPrivateKey], tag: str) -> tuple[list[_Item], list[_Item]]:
    """``count`` signed requests to submit, and their three signed decisions each."""
    submissions: list[_Item] = []
    decisions: list[_Item] = []
    for request, body in signed_requests(keys, list(PEERS), 2, f"bench-{tag}", range(count)):
        submissions.append(("/v1/requests", body))
        path = f"/v1/requests/{request['request_id']}/decisions"
        decisions.append(
            (path, json.dumps(sign_denial(request, "delta", keys["delta"], "benchmark")).encode())
        )
        for peer in ("beta", "gamma"):
            compact = sign_approval(request, peer, keys[peer])
            statement = approval_statement(request, peer, int(compact.timestamp))
            decisions.append(
                (path, json.dumps({"statement": statement, "signature": compact.signature}).encode())
            )
    return submissions, decisions


def _verify_ms(
    decisions: list[_Item], keys: dict[str, SSHPrivateKey], seconds: float, samples: int = 300
) -> tuple[float, int]:
    """CPU milliseconds of one SSHSIG verification of the bench's approvals, raw, and how many ran.

    Up to ``samples`` approvals are verified over and over for ``seconds`` of wall time (once at
    least): the relay's own CPU per decision is an average over its whole run, and a host whose
    speed changes from one moment to the next (a shared core) would put a burst of a few
    milliseconds in a fast or a slow moment, never in their mix.
    """
    work = []
    for _path, body in decisions:
        document = json.loads(body)
        statement = document["statement"]
        if statement.get("type") == APPROVAL_TYPE:
            key = keys[statement["signer"]].public_key
            work.append((statement_bytes(statement), document["signature"], key))
            if len(work) == samples:
                break
    done = 0
    started, until = time.process_time(), time.perf_counter() + seconds
    while work and (done == 0 or time.perf_counter() < until):
        for data, signature, key in work:
            sshsig_verify(data, signature, key, APPROVAL_NAMESPACE)
        done += len(work)
    return (time.process_time() - started) / max(1, done) * 1000, done


def _bare_http_ms(items: list[_Item], seconds: float) -> float:
    """CPU milliseconds per call of the bare HTTP server answering ``items``, as ``_post`` sends them.

    One pass over ``items`` warms the server up and says how long a pass takes; the measured run
    then posts them over and over for at least ``seconds`` (the relay's own run, and never less
    than ``HTTP_FLOOR_MIN_SECONDS``), so that the server's CPU, read from ``/proc`` in clock ticks,
    is many ticks and an average over as long as what it is the floor of.

    Raises:
        TeaAgentError: The server did not start.
        RuntimeError: It did not answer every call 200.
    """
    seconds = max(seconds, HTTP_FLOOR_MIN_SECONDS)
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-http-floor-") as folder,
        bare_http_server(Path(folder)) as (port, process),
    ):
        url = f"http://127.0.0.1:{port}"

        def post(work: list[_Item]) -> None:
            answered, _ = asyncio.run(_post(url, work, {}))
            if answered != len(work):
                raise RuntimeError(f"the bare HTTP server answered {answered} of {len(work)} calls 200")

        started = time.perf_counter()
        post(items)
        passes = max(1, math.ceil(seconds / max(time.perf_counter() - started, 1e-3)))
        work = items * passes
        cpu = process_cpu_seconds(process.pid)
        post(work)
        return (process_cpu_seconds(process.pid) - cpu) / len(work) * 1000


def bench_decisions(seconds: float = 3.0) -> dict[str, Any]:
    """Measure one relay process accepting and counting signed decisions (see the module docstring).

    Returns:
        ``decisions_per_s``, ``decisions_per_s_httpx``, ``decisions_per_s_batched``,
        ``relay_cpu_ms_per_decision`` (and ``_<run>`` of each run), ``decision_latency_ms_median``/``_p99``
        (first run), ``decisions`` (per run), ``concurrency``, and ``http_floor_ms_per_call`` (the
        bare HTTP server's CPU per call of the aiohttp run's decisions).

    Raises:
        ValueError: ``seconds`` is not positive.
        TeaAgentError: The relay did not start (``teaagent.testing``).
        RuntimeError: The relay refused requests or decisions it should have accepted.
        StoreError: The embedded Redis did not start.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    raw = {name: Ed25519PrivateKey.generate() for name in ("alpha", *PEERS)}
    keys = {name: SSHPrivateKey.from_cryptography(key, comment=name) for name, key in raw.items()}
    count = max(50, round(seconds * DECISIONS_PER_SECOND_GUESS / 3 / 2))
    # aiohttp first: the services' client, whose run gives the relay's own figures.
    runs: list[tuple[str, _Poster, list[_Item], list[_Item]]] = [
        (name, _posting(name), *_work(count, keys, name)) for name in (*HTTP_CLIENTS, "batched")
    ]
    figures: dict[str, Any] = {"decisions": 3 * count, "concurrency": CONCURRENCY}
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-relay-") as temporary,
        LocalCluster(
            Path(temporary),
            ("alpha",),
            prefix="bench",
            peers_of={"alpha": PEERS},
            high_risk=("shell.*",),
            timeout_seconds=600,
            keys=raw,
            approvers=(),
            env={"TEAAGENT_RELAY_DELIVER": "0"},  # intake alone
            ready_timeout=READY_TIMEOUT,
        ) as cluster,
    ):
        url, auth = cluster.nodes["alpha"].url, cluster.nodes["alpha"].headers
        process = cluster.processes["alpha-relay"]
        for name, post, submissions, decisions in runs:
            stored, _ = asyncio.run(_post(url, submissions, auth))
            if stored != len(submissions):
                raise RuntimeError(f"the relay stored {stored} of {len(submissions)} requests")
            cpu = process_cpu_seconds(process.pid)
            own = time.process_time()
            started = time.perf_counter()
            accepted, latencies = asyncio.run(post(url, decisions, {}))
            elapsed = time.perf_counter() - started
            client_cpu = time.process_time() - own
            if accepted != len(decisions):
                raise RuntimeError(
                    f"the relay accepted {accepted} of {len(decisions)} valid decisions ({name})"
                )
            figures[f"decisions_per_s_{name}"] = accepted / elapsed
            figures[f"client_cpu_us_per_call_{name}"] = client_cpu / accepted * 1e6
            figures[f"relay_cpu_ms_per_decision_{name}"] = (
                (process_cpu_seconds(process.pid) - cpu) / accepted * 1000
            )
            if name == "aiohttp":
                figures["verify_ms_per_decision"], figures["verifications"] = _verify_ms(
                    decisions, keys, elapsed
                )
                figures["decisions_per_s"] = accepted / elapsed
                # Read before the verifications above, not after them (the idle relay's ticks).
                figures["relay_cpu_ms_per_decision"] = figures["relay_cpu_ms_per_decision_aiohttp"]
                # The bare HTTP server answers these calls, for as long as this run took.
                http_floor_work = decisions, elapsed
                latencies.sort()
                figures["decision_latency_ms_median"] = statistics.median(latencies) * 1000
                figures["decision_latency_ms_p99"] = latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000
    figures["http_floor_ms_per_call"] = _bare_http_ms(*http_floor_work)
    return figures


def bench_relay(seconds: float = 3.0) -> dict[str, Any]:
    """``teaagent bench relay``: the store's rate-limit figures and the relay's decision rates.

    The rate limiter runs against a fresh embedded Redis (``seconds / 2`` per contender, see
    ``teaagent_bench.store``) started with ``appendfsync everysec``: its targets compare the
    scripts' own cost with a bare EVALSHA and with ``limits``, and under ``always`` (what the node's
    embedded server runs, so that an acknowledged decision survives a host crash) every write
    would add one fsync that the read-only floor never pays. ``ratelimit_fsync_always_per_s`` is
    the same check on the shipped setting, for the record. On the same server, ``async_*`` is the
    store's asyncio client at 32 callers against RESP written by hand (``bench_async_client``). The
    decisions take about ``seconds``, on the shipped setting.

    Raises:
        ValueError: ``seconds`` is not positive.
        TeaAgentError: The relay did not start.
        RuntimeError: The relay refused valid decisions.
        StoreError: The embedded Redis did not start.
    """
    from teaagent_bench.store import bench_async_client, bench_ratelimit

    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-ratelimit-") as folder,
        EmbeddedRedis(Path(folder) / "everysec", appendfsync="everysec") as server,
    ):
        figures = bench_ratelimit(server.url, seconds / 2)
        figures.update(bench_async_client(server.url, seconds / 2))
        figures.update(bench_relay_redis(server, seconds / 2))
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-ratelimit-") as folder,
        EmbeddedRedis(Path(folder) / "always") as server,
    ):
        shipped = bench_ratelimit(server.url, seconds / 4)
    figures["ratelimit_fsync_always_per_s"] = shipped["ratelimit_per_s"]
    figures["ratio_to_raw_evalsha_fsync_always"] = shipped["ratio_to_raw_evalsha"]
    figures.update(bench_decisions(seconds))
    floor = figures["verify_ms_per_decision"] + figures["raw_evalsha_wire_client_cpu_us"] / 1000
    figures["relay_floor_ms_per_decision"] = floor
    figures["relay_ratio_to_floor"] = figures["relay_cpu_ms_per_decision"] / floor
    figures["relay_ratio_to_floor_batched"] = figures["relay_cpu_ms_per_decision_batched"] / floor
    with_http = floor + figures["http_floor_ms_per_call"]
    figures["relay_floor_with_http_ms_per_decision"] = with_http
    figures["relay_ratio_to_floor_with_http"] = figures["relay_cpu_ms_per_decision"] / with_http
    return figures


# -- issue 29, the Redis side: the store's Redis client, library against library --------------------


def tcp_url(server: EmbeddedRedis) -> str:
    """Open a loopback TCP port on the embedded ``server`` (it has only its socket) and return its URL."""
    import redis

    port = free_port()
    client = redis.Redis.from_url(server.url)
    try:
        client.config_set("bind", "127.0.0.1")
        client.config_set("port", port)
    finally:
        client.close()
    password = urlsplit(server.url).password or ""
    return f"redis://:{password}@127.0.0.1:{port}/0"


def bench_relay_redis(server: EmbeddedRedis, seconds: float) -> dict[str, Any]:
    """The ``lib_*`` figures on ``server``: redis-py, coredis and valkey-glide against the wire's floor
    (``teaagent_bench.store_libraries``; glide over the server's TCP port, beside redis-py there).

    The store's own client of before (``lean``) and the relay's decisions on it were measured end to
    end at commit 18dc4de (``TEAAGENT_STORE_CLIENT``); docs/architecture.md has the figures.
    """
    from teaagent_bench.store_libraries import bench_redis_libraries

    return bench_redis_libraries(server.url, tcp_url(server), seconds, ("redispy", "coredis", "glide"))
