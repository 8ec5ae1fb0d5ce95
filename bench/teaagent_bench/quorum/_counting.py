"""What one quorum does, counted in the same run: HTTP hops, Redis round trips, CPU and context
switches of each service, the Redis server's CPU."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from teaagent._http import client_verify
from teaagent.testing import ClusterNode
from teaagent_bench._processes import process_context_switches, process_cpu_seconds

_SKIPPED_ROUTES: Final = frozenset({"/metrics", "/health"})
_LONG_POLLS: Final = frozenset({"/v1/requests/{request_id}/outcome", "/v1/inbox"})
_WRITE_TRIPS: Final = ("evalsha", "eval", "exec")  # the store's atomic writes: one round trip each


@dataclass(frozen=True)
class _Counters:
    hops: float
    server_seconds: dict[str, float]  # per node: time answering calls that are not long-polls
    writes: float
    reads: float
    cpu: dict[str, float]  # per process label: CPU seconds
    idle_cpu_per_s: float = 0.0  # all services' CPU seconds per second with no quorum running
    waits: dict[str, float] = field(default_factory=dict)  # per label: voluntary context switches
    preemptions: dict[str, float] = field(default_factory=dict)  # per label: involuntary ones
    redis_cpu: float = 0.0  # the Redis server's CPU seconds (its own INFO cpu)

    def minus(self, other: _Counters) -> _Counters:
        return _Counters(
            hops=self.hops - other.hops,
            server_seconds=_less(self.server_seconds, other.server_seconds),
            writes=self.writes - other.writes,
            reads=self.reads - other.reads,
            cpu=_less(self.cpu, other.cpu),
            waits=_less(self.waits, other.waits),
            preemptions=_less(self.preemptions, other.preemptions),
            redis_cpu=self.redis_cpu - other.redis_cpu,
        )

    def per(self, quorums: int, idle_cpu_per_s: float = 0.0) -> _Counters:
        """These counts (of a run's window) per quorum of the run's ``quorums``."""
        return _Counters(
            hops=self.hops / quorums,
            server_seconds=_each(self.server_seconds, quorums),
            writes=self.writes / quorums,
            reads=self.reads / quorums,  # below zero: not measurable (_trips)
            cpu=_each(self.cpu, quorums),
            idle_cpu_per_s=idle_cpu_per_s,
            waits=_each(self.waits, quorums),
            preemptions=_each(self.preemptions, quorums),
            redis_cpu=self.redis_cpu / quorums,
        )


def _less(counts: Mapping[str, float], earlier: Mapping[str, float]) -> dict[str, float]:
    return {key: value - earlier.get(key, 0.0) for key, value in counts.items()}


def _each(counts: Mapping[str, float], quorums: int) -> dict[str, float]:
    return {key: value / quorums for key, value in counts.items()}


def _redis_cpu_seconds(client: redis.Redis) -> float:
    """The CPU time (user and system) the Redis server reports for itself (``INFO cpu``)."""
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _relay_counters(url: str) -> tuple[float, float]:
    """The relay's HTTP calls answered (operations aside) and its seconds spent on those not long-polls."""
    hops = seconds = 0.0
    # The process's one SSL context: httpx would build one for each call (47 ms of CPU each on the
    # 2-core host of 2026-12-07, `httpx.create_ssl_context()` timed 20 times).
    answer = httpx.get(f"{url}/metrics", timeout=10, verify=client_verify())
    for family in text_string_to_metric_families(answer.text):
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
    nodes: Mapping[str, ClusterNode],
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
    redis_cpu = _redis_cpu_seconds(client)
    if not before:
        scraped = relays()
    switches = {label: process_context_switches(process.pid) for label, process in processes.items()}
    return _Counters(
        hops=sum(hops for hops, _seconds in scraped.values()),
        server_seconds={name: seconds for name, (_hops, seconds) in scraped.items()},
        writes=writes,
        reads=reads,
        cpu={label: process_cpu_seconds(process.pid) for label, process in processes.items()},
        waits={label: float(waited) for label, (waited, _preempted) in switches.items()},
        preemptions={label: float(preempted) for label, (_waited, preempted) in switches.items()},
        redis_cpu=redis_cpu,
    )


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
