"""The real asking path: alpha's callers through the library's relay client, as its gate asks."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import redis

from teaagent.quorum import (
    build_request,
    canonical,
    sign_request,
    verify_certificate,
)
from teaagent.relay_client._client import MAX_WAIT_SECONDS, AsyncRelayClient
from teaagent.signing import SSHPrivateKey
from teaagent.testing import ClusterNode, LocalCluster
from teaagent.trust import MultiSigQuorumConfig
from teaagent_bench._processes import process_cpu_seconds
from teaagent_bench.quorum._cluster import POLICY_TOOL
from teaagent_bench.quorum._counting import _Counters, _counters

WARMUP_FRACTION: Final = 0.2  # of each run, not timed: connections open, caches fill
MIN_TIMED: Final = 5  # quorums timed per run at least, however short the budget
RUN_DEADLINE: Final = 120.0  # seconds past its budget that one run may take before the bench gives up
IDLE_SECONDS: Final = 2.0  # the cluster left idle once, its services' own CPU measured


@dataclass(frozen=True)
class _Run:
    latencies: list[float]  # seconds, of the timed quorums
    throughput: float  # per second, over the timed window
    quorums: int  # all that completed, warm-up included
    cpu_seconds: float = 0.0  # the asking process's CPU over the whole run (the real path's only)


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
    alpha: ClusterNode,
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

    cpu = time.process_time()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    cpu = time.process_time() - cpu
    timed, throughput = _summarise(spans, started, time.perf_counter(), seconds)
    return _Run(timed, throughput, len(spans), cpu)


def _percentile(latencies: list[float], fraction: float) -> float:
    ordered = sorted(latencies)
    return ordered[max(0, min(len(ordered) - 1, round(len(ordered) * fraction) - 1))]


def _policy_run(
    seconds: float,
    nodes: Mapping[str, ClusterNode],
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
    return run, dataclasses.replace(delta, reads=max(0.0, delta.reads)).per(run.quorums)


def _real_path(
    cluster: LocalCluster,
    keys: Mapping[str, SSHPrivateKey],
    config: MultiSigQuorumConfig,
    client: redis.Redis,
    seconds: float,
    concurrencies: tuple[int, ...],
    *,
    policy: bool = False,
) -> tuple[dict[int, _Run], dict[int, _Counters], tuple[_Run, _Counters] | None]:
    """Start the cluster's services, run the real asking path at each concurrency, stop them; its runs
    and per-quorum counts.

    With ``policy``, the version 2 variant runs first (:func:`_policy_run`), on the idle cluster
    the plain run at concurrency 1 also finds; its run and counts are the third value.
    """
    counted: dict[int, _Counters] = {}
    runs: dict[int, _Run] = {}
    policy_result: tuple[_Run, _Counters] | None = None
    nodes = cluster.nodes
    cluster.start_services()
    try:
        processes = cluster.processes
        asyncio.run(_ask(1, min(seconds, 0.5), nodes["alpha"], keys["alpha"], config))  # warm every path
        if policy:
            policy_result = _policy_run(seconds, nodes, client, processes, keys["alpha"], config)
        # What the services spend with nothing to do (their polls and housekeeping), per second.
        idle = {label: process_cpu_seconds(process.pid) for label, process in processes.items()}
        time.sleep(IDLE_SECONDS)
        idle_per_s = (
            sum(process_cpu_seconds(process.pid) - idle[label] for label, process in processes.items())
            / IDLE_SECONDS
        )
        for concurrency in concurrencies:
            before = _counters(nodes, client, processes, before=True)
            runs[concurrency] = asyncio.run(_ask(concurrency, seconds, nodes["alpha"], keys["alpha"], config))
            delta = _counters(nodes, client, processes, before=False).minus(before)
            counted[concurrency] = delta.per(runs[concurrency].quorums, idle_per_s)
    finally:
        cluster.stop_services()
    return runs, counted, policy_result
