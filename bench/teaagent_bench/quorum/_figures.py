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
2. two branches at once, one per peer, each: two request verifications (the peer's relay's and
   its approver's), one approval signature, one approval verification (the origin's;
   ``sshsig_verify``/``sshsig_sign``), half of the real path's other
   HTTP hops, and half of its Redis round trips: writes as ``EVALSHA`` of a one-line ``SET ... EX``
   script, reads as ``GET``, on the same embedded Redis;
3. the origin makes one HTTP hop and verifies the certificate's three signatures.

So 3 signatures and 9 verifications (the protocol's minimum, ``_Size.floor_verifications``: each
peer's relay and its approver check the origin's signature for themselves, as docs/protocol.md
requires of both, the origin checks each approval once, the agent checks the certificate), against
the real path's 3 and 12 (alpha's relay also checks its agent's request, each peer's relay its
approver's approval). HTTP hops go to a bare uvicorn server running a raw ASGI app that answers
every call with a constant (no framework), over kept-alive connections, each call framed and its
answer parsed by h11 (the HTTP/1.1 library under httpx; no HTTP written by hand); Redis round trips
over kept-alive connections, each command packed and its reply parsed by hiredis. The same
numbers of hops and round trips per quorum as the real path's at that concurrency (rounded).
The floor's callers run in ``min(N, cores)`` processes, so that it may use the machine as the
cluster does. ``floor_ratio = p50_ms_c1 / floor_p50_ms_c1`` (target <= 3) and
``floor_throughput_ratio_c64 = floor_throughput_c64 / throughput_c64`` (target <= 3).

**The library floor**, in the same run at 1 and 64 callers: the floor's work and plan again, its
hops and round trips through the services' own libraries, configured as the services configure
them and with nothing of the project's around them: aiohttp's client (one session per floor
process, its connector sized to the hops in flight) to a FastAPI app whose one Starlette route
answers as the bare app does, and redis-py's asyncio client (hiredis parsing, a blocking pool).
``library_floor_p50_ms_c1``, ``library_floor_throughput_c64``, and the two ratios split at it:
``floor_ratio = libraries_over_floor_c1 * library_floor_ratio`` and ``floor_throughput_ratio_c64
= libraries_over_floor_c64 * library_floor_throughput_ratio_c64``. The first factor is what the
libraries cost by themselves; the second what the real path costs beyond them (its services'
own work around each hop and call, its extra verifications, its processes).

``cluster_cpu_ms_per_quorum_cN``: the CPU time (user and system) of the five services per quorum
at N callers; ``profile_cpu_ms_<node>_<service>`` splits it at one caller (it includes each
service's idle loops, which weigh more the fewer quorums a second there are). By role at each
concurrency: ``origin_relay_cpu_ms_per_quorum_cN``, ``peer_relay_...`` and ``peer_approver_...``
(the mean of a peer's), the Redis server's own ``redis_cpu_ms_per_quorum_cN`` (its ``INFO cpu``;
not in the cluster's), and the services' context switches per quorum
(``context_switches_per_quorum_cN``, of them ``preemptions_per_quorum_cN``, from
``/proc/<pid>/task/*/status``): each is a thread leaving the CPU, to wait or preempted.

``profile_*``: one quorum at concurrency 1, where its time goes: the raw cost of its signatures
(``profile_sign_ms``), its 12 verifications (``profile_verify_ms``), its Redis round trips
(``profile_redis_ms``) and its HTTP hops (``profile_http_ms``), each measured alone in this run
and summed as if done one after the other; and each relay's own time answering its calls
(``profile_server_ms_<node>``, from its latency histogram; long-polls excluded, they wait). Set
``TEAAGENT_BENCH_PROFILE`` to a directory to run every service under ``cProfile`` and keep its
profile there (``<node>-<service>.prof``).

``asking_cpu_ms_per_quorum_cN``: the CPU of this process per quorum at N callers, alpha's agent
side (its gates' relay clients, signing each request, checking each certificate), which the
cluster's figure leaves out. ``http_httpx_*``, ``redis_unbatched_*``, ``deliveries_unbatched_*``
and ``deliveries_unbatched_http_httpx_*``: the real path again under another setting
(``_variants``). ``aiohttp_over_httpx_*``: from those runs, aiohttp's gains over httpx at 64 callers
in cluster CPU per quorum and in throughput, deliveries batched and each its own call; the best,
``aiohttp_over_httpx_best``, is judged against 1.5 (issue 29: a library other than the asked-for
httpx only from 1.5 times end to end).

``policy_*``: the same cluster, in the same run, asked for ``git.push`` under a version 2 rule with
two groups, ``all_of`` one of ops (beta) and one of security (gamma): the request carries its
policy, the relay's Lua and the certificate's check count by terms. One caller; its floor is
measured as the plain quorum's is, from its own counts of hops and round trips, and
``policy_floor_ratio = policy_p50_ms_c1 / policy_floor_p50_ms_c1`` (target <= 3).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import redis
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent._http import BENCH_CLIENT_ENV
from teaagent.signing import SSHPrivateKey
from teaagent.store import EmbeddedRedis
from teaagent.store._connection import BATCHES_ENV
from teaagent.testing import LocalCluster
from teaagent.trust import MultiSigQuorumConfig
from teaagent_bench.quorum._asking import _percentile, _real_path, _Run
from teaagent_bench.quorum._cluster import DEFAULT_SIZE, SIZES, _policy_config, _Size, local_cluster
from teaagent_bench.quorum._counting import _Counters, _trips
from teaagent_bench.quorum._floor import _crypto_costs, _floor, _io_costs, _plan, bare_http_server

__all__ = ["CONCURRENCIES", "SIZES", "bench_quorum", "bench_quorum_sizes"]

CONCURRENCIES: Final = (1, 16, 64)
LIBRARY_FLOOR_CONCURRENCIES: Final = (1, 64)  # those of the ratios
_UNBATCHED_DELIVERIES: Final = ("TEAAGENT_RELAY_DELIVERY_BATCHES", "0")
# Run again with each setting in the services' environment: (figures' prefix, its variables' values).
VARIANTS: Final[tuple[tuple[str, tuple[tuple[str, str], ...]], ...]] = (
    # httpx, the HTTP client the project's users asked for, beside the services' aiohttp (issue 29).
    ("http_httpx", ((BENCH_CLIENT_ENV, "httpx"),)),
    # Each Redis call sent on its own, as before the store batched a moment's calls (issue 29).
    ("redis_unbatched", ((BATCHES_ENV, "0"),)),
    # Each delivery between relays its own call, as before they sent a moment's in one (issue 29),
    # and as a relay still sends them to a peer whose relay takes no batch (an older one).
    ("deliveries_unbatched", (_UNBATCHED_DELIVERIES,)),
    # The same through httpx: where one pool has many calls in flight (up to 128 deliveries).
    ("deliveries_unbatched_http_httpx", (_UNBATCHED_DELIVERIES, (BENCH_CLIENT_ENV, "httpx"))),
)
# aiohttp's gains over httpx that judge the choice of client: (figure, its variant's prefix, its
# httpx variant's prefix). Each is how many times less CPU per quorum, or how many times the
# quorums a second, at 64 callers.
CLIENT_GAINS: Final = (
    ("c64", "", "http_httpx_"),
    ("c64_deliveries_unbatched", "deliveries_unbatched_", "deliveries_unbatched_http_httpx_"),
)


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
        ``floor_ratio`` and ``floor_throughput_ratio_c64``, the library floor's and the ratios'
        split at it (``library_floor_*``, ``libraries_over_floor_c1``, ``libraries_over_floor_c64``;
        see the module docstring), the version 2 variant's ``policy_*``
        (``policy_p50_ms_c1``, ``policy_floor_p50_ms_c1``, ``policy_floor_ratio``...), what one quorum did
        (``http_hops_c1``, ``redis_round_trips_c1``, ``redis_writes_c1``, ``redis_reads_c1`` or
        ``redis_reads_c1_omitted``, the same at c16 and c64), the CPU
        milliseconds per quorum of all services at c64 (``cluster_cpu_ms_per_quorum_c64``), and
        the ``profile_*`` breakdown.

    Raises:
        ValueError: ``seconds`` is not positive, ``nodes`` not one of ``SIZES``, or a
            concurrency other than 1 and 64 is missing.
        TeaAgentError: A service did not start (``teaagent.testing``).
        RuntimeError: A quorum was not approved or its certificate did not verify, or a run did not
            finish in time.
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
        cluster = local_cluster(folder, server.url, raw, size)
        members = cluster.write()
        config = MultiSigQuorumConfig(
            enabled=True,
            required_approvals=size.required,
            peer_agent_ids=list(size.peers),
            peer_public_keys={peer: keys[peer].public_key.to_line() for peer in size.peers},
            peer_relay_urls={peer: members[peer].url for peer in size.peers},
            high_risk_patterns=["shell.*"],
            timeout_seconds=600,
        )
        config = _policy_config(config)  # shell.run matches no rule: version 1, 2 of 3, as before
        client = redis.Redis.from_url(server.url)
        store = (server.url,)
        # The version 2 variant (a two-group all_of rule) on the default cluster, in the same run.
        with_policy = variants and nodes == DEFAULT_SIZE.nodes
        runs, counted, policy_result = _real_path(
            cluster, keys, config, client, seconds, concurrencies, policy=with_policy
        )
        writes, reads, omitted = _trips(counted)
        with bare_http_server(folder) as (http_port, _server):
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
        with bare_http_server(folder, libraries=True) as (library_port, _server):
            library_floors = {
                c: _floor(c, seconds, library_port, store, plans[c], size, libraries=True)
                for c in LIBRARY_FLOOR_CONCURRENCIES
            }
        if variants:
            figures.update(_variants(cluster, keys, config, client, seconds))
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
        figures[f"asking_cpu_ms_per_quorum_{suffix}"] = _asking_cpu_ms(run)
        figures |= {f"{name}_{suffix}": value for name, value in _split_by_role(per, size).items()}
        # The same less what the services spent idle meanwhile (their polls, per second of the run).
        figures[f"cluster_busy_cpu_ms_per_quorum_{suffix}"] = (
            sum(per.cpu.values()) - per.idle_cpu_per_s / max(run.throughput, 1e-9)
        ) * 1000
    figures["cluster_idle_cpu_ms_per_s"] = counted[concurrencies[0]].idle_cpu_per_s * 1000
    figures["floor_ratio"] = figures["p50_ms_c1"] / figures["floor_p50_ms_c1"]
    figures["floor_throughput_ratio_c64"] = figures["floor_throughput_c64"] / figures["throughput_c64"]
    figures |= _library_floor_figures(figures, library_floors)
    for label, _settings in VARIANTS if variants else ():
        name, prefix = f"{label}_p50_ms_c1", f"{label}_"
        figures[f"{prefix}floor_ratio"] = figures[name] / figures["floor_p50_ms_c1"]
        figures[f"{prefix}floor_throughput_ratio_c64"] = (
            figures["floor_throughput_c64"] / figures[f"{prefix}throughput_c64"]
        )
    if variants:
        figures |= _client_gains(figures)
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


def _library_floor_figures(figures: Mapping[str, Any], floors: Mapping[int, _Run]) -> dict[str, float]:
    """The library floor's figures, and how the real path's ratios to the floor split at it.

    ``floor_ratio`` is ``libraries_over_floor_c1 * library_floor_ratio``, and
    ``floor_throughput_ratio_c64`` is ``libraries_over_floor_c64 *
    library_floor_throughput_ratio_c64``: what the libraries cost by themselves, times what the
    services cost around them.
    """
    one, many = floors[1], floors[64]
    library: dict[str, float] = {
        "library_floor_p50_ms_c1": statistics.median(one.latencies) * 1000,
        "library_floor_p99_ms_c1": _percentile(one.latencies, 0.99) * 1000,
        "library_floor_throughput_c64": many.throughput,
    }
    library["library_floor_ratio"] = figures["p50_ms_c1"] / library["library_floor_p50_ms_c1"]
    library["library_floor_throughput_ratio_c64"] = (
        library["library_floor_throughput_c64"] / figures["throughput_c64"]
    )
    library["libraries_over_floor_c1"] = library["library_floor_p50_ms_c1"] / figures["floor_p50_ms_c1"]
    library["libraries_over_floor_c64"] = (
        figures["floor_throughput_c64"] / library["library_floor_throughput_c64"]
    )
    return library


def _asking_cpu_ms(run: _Run) -> float:
    """The asking process's CPU per quorum, in milliseconds: alpha's agent side (its gates' relay
    clients, the signing of each request and the check of each certificate), not in the cluster's."""
    return run.cpu_seconds / max(run.quorums, 1) * 1000


def _client_gains(figures: Mapping[str, Any]) -> dict[str, float]:
    """aiohttp's end-to-end gains over httpx at 64 callers (``CLIENT_GAINS``), and the best of them.

    ``aiohttp_over_httpx_cpu_<case>``: httpx's cluster CPU per quorum over aiohttp's;
    ``aiohttp_over_httpx_throughput_<case>``: aiohttp's quorums a second over httpx's. The services
    use aiohttp only while one of them is at least 1.5 (issue 29's rule for a library other than the
    asked-for one): ``aiohttp_over_httpx_best`` is the largest.
    """
    gains: dict[str, float] = {}
    cpu = "cluster_cpu_ms_per_quorum_c64"
    for case, ours, theirs in CLIENT_GAINS:
        gains[f"aiohttp_over_httpx_cpu_{case}"] = figures[f"{theirs}{cpu}"] / figures[f"{ours}{cpu}"]
        gains[f"aiohttp_over_httpx_throughput_{case}"] = (
            figures[f"{ours}throughput_c64"] / figures[f"{theirs}throughput_c64"]
        )
    gains["aiohttp_over_httpx_best"] = max(gains.values())
    return gains


def _split_by_role(per: _Counters, size: _Size) -> dict[str, float]:
    """Where one quorum's CPU went, by role, and how often the services left the CPU for it.

    ``origin_relay_cpu_ms_per_quorum``, a peer's relay (``peer_relay_``) and approver
    (``peer_approver_``, each the mean over the peers), the Redis server's own
    (``redis_cpu_ms_per_quorum``, from its ``INFO cpu``: not in ``cluster_cpu``); the services'
    context switches (``context_switches_per_quorum``: every time one of their threads left the
    CPU, waiting or preempted) and of them the preemptions (``preemptions_per_quorum``: the
    scheduler took the CPU from a thread that could still run, as it does more often the more
    processes share the cores).
    """
    peers = size.peers
    return {
        "origin_relay_cpu_ms_per_quorum": per.cpu["alpha-relay"] * 1000,
        "peer_relay_cpu_ms_per_quorum": sum(per.cpu[f"{peer}-relay"] for peer in peers) / len(peers) * 1000,
        "peer_approver_cpu_ms_per_quorum": (
            sum(per.cpu[f"{peer}-approver"] for peer in peers) / len(peers) * 1000
        ),
        "redis_cpu_ms_per_quorum": per.redis_cpu * 1000,
        "context_switches_per_quorum": sum(per.waits.values()) + sum(per.preemptions.values()),
        "preemptions_per_quorum": sum(per.preemptions.values()),
    }


# -- variants: other HTTP clients (http-lib), Redis calls unbatched (issue 29) ---------------------


def _variants(
    cluster: LocalCluster,
    keys: Mapping[str, SSHPrivateKey],
    config: MultiSigQuorumConfig,
    client: redis.Redis,
    seconds: float,
) -> dict[str, float]:
    """The real path again under each of ``VARIANTS``, at concurrency 1 and 64.

    Every service of the cluster and the asking callers here read the variables at start:
    ``TEAAGENT_BENCH_HTTP_CLIENT`` points ``teaagent._http.http_pool`` at another HTTP client
    (``httpx``: one client per server, ``httpx.Limits`` sized as aiohttp's connector, HTTP/1.1);
    ``TEAAGENT_REDIS_BATCHES=0`` sends each Redis call on its own (``redis_unbatched``, the store
    before it batched); ``TEAAGENT_RELAY_DELIVERY_BATCHES=0`` makes each delivery between relays its
    own call (``deliveries_unbatched``, the relays before they sent a moment's deliveries to a peer
    in one, and a relay's to a peer that takes no batch); both the last and httpx,
    ``deliveries_unbatched_http_httpx``. Each: ``<prefix>_p50_ms_c1``, ``<prefix>_throughput_c64``,
    ``<prefix>_cluster_cpu_ms_per_quorum_c64``, ``<prefix>_asking_cpu_ms_per_quorum_c64``,
    ``<prefix>_redis_round_trips_c64`` and ``<prefix>_http_hops_c64``, against
    the same floor as the default's (``<prefix>_floor_ratio``...).
    """
    figures: dict[str, float] = {}
    for prefix, settings in VARIANTS:
        before = {variable: os.environ.get(variable) for variable, _value in settings}
        os.environ.update(settings)
        try:
            runs, counted, _ = _real_path(cluster, keys, config, client, seconds, (1, 64))
        finally:
            for variable, value in before.items():
                if value is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = value
        figures[f"{prefix}_p50_ms_c1"] = statistics.median(runs[1].latencies) * 1000
        figures[f"{prefix}_throughput_c64"] = runs[64].throughput
        figures[f"{prefix}_cluster_cpu_ms_per_quorum_c64"] = sum(counted[64].cpu.values()) * 1000
        figures[f"{prefix}_asking_cpu_ms_per_quorum_c64"] = _asking_cpu_ms(runs[64])
        figures[f"{prefix}_redis_round_trips_c64"] = max(0.0, counted[64].writes + counted[64].reads)
        figures[f"{prefix}_http_hops_c64"] = counted[64].hops
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
    quorums a second a larger cluster completes on the same cores). Where it grows, for each size
    at 64 callers: the Redis round trips of one quorum (``n<N>_redis_round_trips_c64``: the fewer
    calls a moment brings, the fewer share one), the origin's relay, a peer's relay and approver,
    the Redis server (each ``n<N>_<role>_cpu_ms_per_quorum_c64``), the services' context switches
    and preemptions per quorum, and a peer's own CPU per quorum (relay and approver) against the
    smallest size's (``n<N>_peer_cpu_growth``: 1 when a peer's work for one quorum does not depend
    on how many peers there are).

    Raises:
        ValueError: ``seconds`` is not positive, or a size is not one of ``SIZES``.
    """
    figures: dict[str, float] = {}
    for nodes in sizes:
        measured = bench_quorum(seconds, nodes=nodes, concurrencies=(1, 64), variants=False)
        for key in (
            "floor_ratio",
            "floor_throughput_ratio_c64",
            "library_floor_ratio",
            "library_floor_throughput_ratio_c64",
            "libraries_over_floor_c1",
            "libraries_over_floor_c64",
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
            "redis_round_trips_c64",
            "origin_relay_cpu_ms_per_quorum_c64",
            "peer_relay_cpu_ms_per_quorum_c64",
            "peer_approver_cpu_ms_per_quorum_c64",
            "redis_cpu_ms_per_quorum_c64",
            "context_switches_per_quorum_c64",
            "preemptions_per_quorum_c64",
        ):
            figures[f"n{nodes}_{key}"] = measured[key]
    smallest = min(sizes)
    for nodes in sizes:  # a peer's own work for one quorum, against the smallest cluster's peer
        figures[f"n{nodes}_peer_cpu_growth"] = _peer_cpu(figures, nodes) / _peer_cpu(figures, smallest)
    for kind in ("", "busy_"):
        base = figures[f"n{smallest}_cluster_{kind}cpu_ms_per_quorum_c64"]
        for nodes in sizes:
            growth = figures[f"n{nodes}_cluster_{kind}cpu_ms_per_quorum_c64"] / base
            figures[f"n{nodes}_{kind}cpu_growth_over_peers"] = growth / ((nodes - 1) / (smallest - 1))
            figures[f"n{nodes}_{kind}cpu_growth_over_nodes"] = growth / (nodes / smallest)
    return figures


def _peer_cpu(figures: Mapping[str, float], nodes: int) -> float:
    """A peer's CPU milliseconds per quorum at 64 callers in the cluster of ``nodes``: relay and approver."""
    return (
        figures[f"n{nodes}_peer_relay_cpu_ms_per_quorum_c64"]
        + figures[f"n{nodes}_peer_approver_cpu_ms_per_quorum_c64"]
    )
