"""``teaagent bench quorum``: 2-of-3 quorums end to end against their floor, in the same run."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from redis_fixture import delete_prefix

from teaagent.cli._bench import TARGETS
from teaagent.cli._main import run
from teaagent_bench._processes import process_context_switches
from teaagent_bench.quorum import CONCURRENCIES
from teaagent_bench.quorum._counting import _Counters, _trips
from teaagent_bench.quorum._floor import FLOOR_CLIENT_HOPS

ISSUE_KEYS = {"p50_ms_c1", "p99_ms_c1", "throughput_c16", "throughput_c64", "floor_p50_ms_c1", "floor_ratio"}


@pytest.mark.slow
@pytest.mark.timeout(600)  # the whole bench, its variants and floors: minutes on a loaded host
def test_bench_quorum_reports_the_real_path_its_floor_and_their_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["bench", "quorum", "--json", "--seconds", "0.2"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) >= ISSUE_KEYS
    assert {key for key, _op, _target in TARGETS["quorum"]} <= set(figures)
    for concurrency in CONCURRENCIES:
        suffix = f"c{concurrency}"
        assert 0 < figures[f"p50_ms_{suffix}"] <= figures[f"p99_ms_{suffix}"]
        assert 0 < figures[f"floor_p50_ms_{suffix}"] <= figures[f"floor_p99_ms_{suffix}"]
        assert figures[f"throughput_{suffix}"] > 0
        assert figures[f"floor_throughput_{suffix}"] > 0
        # Every quorum went through the cluster: the agent's submission and long-poll; alone, a
        # delivery to each peer and each decision back, each its own call, and each approver's
        # listing and decision too. With callers in parallel, approvers list and send many
        # decisions per call, and relays send a peer the deliveries of one moment in one call.
        per_request = FLOOR_CLIENT_HOPS + 4 + 2 if suffix == "c1" else FLOOR_CLIENT_HOPS
        assert figures[f"http_hops_{suffix}"] >= per_request
        assert figures[f"redis_writes_{suffix}"] >= 1
        assert figures[f"redis_round_trips_{suffix}"] > 0
        # A read count is measured (and above zero: every quorum reads), or left out with why.
        if f"redis_reads_{suffix}" in figures:
            assert figures[f"redis_reads_{suffix}"] > 0
        else:
            assert figures[f"redis_reads_{suffix}_omitted"].startswith("not measurable: ")
        assert figures[f"cluster_cpu_ms_per_quorum_{suffix}"] >= 0
        # By role: every service and the Redis server worked, and the services left the CPU.
        for role in ("origin_relay", "peer_relay", "peer_approver", "redis"):
            assert figures[f"{role}_cpu_ms_per_quorum_{suffix}"] > 0, role
        assert figures[f"context_switches_per_quorum_{suffix}"] >= 1  # every hop wakes a service
        assert (
            0
            <= figures[f"preemptions_per_quorum_{suffix}"]
            <= figures[f"context_switches_per_quorum_{suffix}"]
        )
    # One caller has one quorum in flight: its rate is about one over its latency (a short run
    # counts a quorum begun before the window, hence the slack).
    assert figures["throughput_c1"] * figures["p50_ms_c1"] / 1000 <= 3
    assert figures["floor_ratio"] == pytest.approx(figures["p50_ms_c1"] / figures["floor_p50_ms_c1"])
    assert figures["floor_throughput_ratio_c64"] == pytest.approx(
        figures["floor_throughput_c64"] / figures["throughput_c64"]
    )
    # The library floor, same work through the services' libraries: the ratios split at it.
    assert 0 < figures["library_floor_p50_ms_c1"] <= figures["library_floor_p99_ms_c1"]
    assert figures["library_floor_throughput_c64"] > 0
    assert figures["floor_ratio"] == pytest.approx(
        figures["libraries_over_floor_c1"] * figures["library_floor_ratio"]
    )
    assert figures["floor_throughput_ratio_c64"] == pytest.approx(
        figures["libraries_over_floor_c64"] * figures["library_floor_throughput_ratio_c64"]
    )
    assert figures["library_floor_throughput_ratio_c64"] == pytest.approx(
        figures["library_floor_throughput_c64"] / figures["throughput_c64"]
    )
    for part in ("sign", "verify", "redis", "http"):
        assert figures[f"profile_{part}_ms"] > 0
    assert {f"profile_server_ms_{node}" for node in ("alpha", "beta", "gamma")} <= set(figures)
    # The other HTTP client, in the same run, against the same floor.
    for key in ("p50_ms_c1", "throughput_c64", "cluster_cpu_ms_per_quorum_c64", "floor_ratio"):
        assert figures[f"http_httpx_{key}"] > 0, key
    # Each delivery between relays its own call, in the same run: the submission and long-poll, a
    # delivery to each peer and each decision back, whatever the callers in parallel.
    for key in ("p50_ms_c1", "throughput_c64", "cluster_cpu_ms_per_quorum_c64", "floor_ratio"):
        assert figures[f"deliveries_unbatched_{key}"] > 0, key
    assert figures["deliveries_unbatched_http_hops_c64"] >= FLOOR_CLIENT_HOPS + 4
    # And so through httpx, where a relay's pool to a peer has many calls in flight.
    for key in ("p50_ms_c1", "throughput_c64", "cluster_cpu_ms_per_quorum_c64", "floor_ratio"):
        assert figures[f"deliveries_unbatched_http_httpx_{key}"] > 0, key
    assert figures["deliveries_unbatched_http_httpx_http_hops_c64"] >= FLOOR_CLIENT_HOPS + 4
    # The asking side's CPU (alpha's agent, this process), beside the cluster's, in each run.
    for prefix in (
        "",
        "http_httpx_",
        "redis_unbatched_",
        "deliveries_unbatched_",
        "deliveries_unbatched_http_httpx_",
    ):
        assert figures[f"{prefix}asking_cpu_ms_per_quorum_c64"] > 0, prefix
    # aiohttp's gains over httpx that judge the services' client, from the same run's figures.
    cpu, throughput = "cluster_cpu_ms_per_quorum_c64", "throughput_c64"
    gains = {
        "cpu_c64": figures[f"http_httpx_{cpu}"] / figures[cpu],
        "throughput_c64": figures[throughput] / figures[f"http_httpx_{throughput}"],
        "cpu_c64_deliveries_unbatched": (
            figures[f"deliveries_unbatched_http_httpx_{cpu}"] / figures[f"deliveries_unbatched_{cpu}"]
        ),
        "throughput_c64_deliveries_unbatched": (
            figures[f"deliveries_unbatched_{throughput}"]
            / figures[f"deliveries_unbatched_http_httpx_{throughput}"]
        ),
    }
    for case, gain in gains.items():
        assert figures[f"aiohttp_over_httpx_{case}"] == pytest.approx(gain), case
    assert figures["aiohttp_over_httpx_best"] == pytest.approx(max(gains.values()))
    assert figures["cluster_idle_cpu_ms_per_s"] >= 0
    # The version 2 variant (two groups, all_of), in the same run, against its own floor. Each of its
    # quorums went through the cluster as the plain ones do: the agent's submission and long-poll, a
    # delivery to each peer, each approver's listing and decision.
    assert 0 < figures["policy_p50_ms_c1"] <= figures["policy_p99_ms_c1"]
    assert figures["policy_floor_ratio"] == pytest.approx(
        figures["policy_p50_ms_c1"] / figures["policy_floor_p50_ms_c1"]
    )
    assert figures["policy_http_hops_c1"] >= 8
    assert figures["policy_redis_writes_c1"] >= 1


@pytest.mark.slow  # two clusters of processes, 3 and 5 nodes, each against its floor
@pytest.mark.timeout(600)
def test_bench_quorum_peers_runs_each_cluster_size_against_its_own_floor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from teaagent_bench.quorum import bench_quorum_sizes
    from teaagent_bench.quorum._cluster import _Size

    assert [(_Size(n).required, len(_Size(n).peers)) for n in (3, 5, 9)] == [
        (2, 2),
        (3, 4),
        (5, 8),
    ]
    figures = bench_quorum_sizes(0.2, (3, 5))
    for nodes in (3, 5):
        assert figures[f"n{nodes}_floor_ratio"] > 0
        assert figures[f"n{nodes}_floor_throughput_ratio_c64"] > 0
        assert figures[f"n{nodes}_floor_throughput_ratio_c64"] == pytest.approx(
            figures[f"n{nodes}_libraries_over_floor_c64"]
            * figures[f"n{nodes}_library_floor_throughput_ratio_c64"]
        )
        assert figures[f"n{nodes}_cluster_cpu_ms_per_quorum_c64"] > 0
    assert figures["n3_cpu_growth_over_peers"] == 1.0
    assert figures["n3_peer_cpu_growth"] == 1.0
    assert figures["n5_peer_cpu_growth"] == pytest.approx(
        (figures["n5_peer_relay_cpu_ms_per_quorum_c64"] + figures["n5_peer_approver_cpu_ms_per_quorum_c64"])
        / (figures["n3_peer_relay_cpu_ms_per_quorum_c64"] + figures["n3_peer_approver_cpu_ms_per_quorum_c64"])
    )
    for nodes in (3, 5):
        assert figures[f"n{nodes}_redis_round_trips_c64"] > 0
        assert figures[f"n{nodes}_redis_cpu_ms_per_quorum_c64"] > 0
        assert (
            figures[f"n{nodes}_context_switches_per_quorum_c64"]
            >= figures[f"n{nodes}_preemptions_per_quorum_c64"]
        )
    # Twice the peers: about twice the hops and the writes of each quorum.
    assert figures["n5_http_hops_c64"] > figures["n3_http_hops_c64"]
    assert figures["n5_redis_writes_c64"] > figures["n3_redis_writes_c64"]
    assert run(["bench", "quorum", "--peers", "4"]) == 2  # no such size: a usage error
    assert "cluster sizes among 3,5,9" in capsys.readouterr().err


def _per_quorum(reads: float) -> _Counters:
    return _Counters(hops=10.0, server_seconds={}, writes=20.0, reads=reads, cpu={})


def test_a_read_count_that_cannot_be_measured_is_left_out_with_the_reason_never_zero() -> None:
    # Fewer read events than writes: several writes shared round trips, reads cannot be told apart.
    writes, reads, omitted = _trips({1: _per_quorum(30.0), 16: _per_quorum(-7.3), 64: _per_quorum(-25.0)})
    assert set(omitted) == {16, 64}
    assert omitted[16] == (
        "not measurable: the server took in 7.30 fewer read events than writes per quorum "
        "(several writes per round trip); the floor makes the 12.70 round trips counted, all as writes"
    )
    # The floor never makes more round trips than the server counted.
    assert writes == {1: 20.0, 16: pytest.approx(12.7), 64: 0.0}
    assert reads == {1: 30.0, 16: 0.0, 64: 0.0}


def test_the_table_prints_a_figure_left_out_with_its_reason_and_judges_the_rest() -> None:
    from teaagent.cli._bench import report

    reason = "not measurable: several writes per round trip"
    lines, missed = report("quorum", {"floor_ratio": 2.0, "redis_reads_c64_omitted": reason})
    assert any(line.startswith("redis_reads_c64_omitted") and line.endswith(reason) for line in lines)
    assert not any(line.startswith("redis_reads_c64 ") for line in lines)  # no 0.0 in its place
    assert "floor_ratio" not in missed


def _counts(times: float) -> _Counters:
    """Every count of a window, each ``times`` a base (powers of two: the arithmetic is exact)."""
    return _Counters(
        hops=2.0 * times,
        server_seconds={"alpha": 0.25 * times},
        writes=4.0 * times,
        reads=1.0 * times,
        cpu={"alpha-relay": 0.125 * times},
        waits={"alpha-relay": 4.0 * times},
        preemptions={"alpha-relay": 2.0 * times},
        redis_cpu=0.0625 * times,
    )


def test_counts_of_a_window_per_quorum_cover_every_count() -> None:
    per = _counts(33).minus(_counts(1)).per(32, idle_cpu_per_s=0.25)  # 32 quorums in the window
    assert per == dataclasses.replace(_counts(1), idle_cpu_per_s=0.25)


_SLEEPER = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
for _ in range(5):
    time.sleep(0.001)  # each sleep leaves the CPU: a voluntary switch
print("slept", flush=True)
sys.stdin.readline()
"""


def test_a_process_context_switches_count_its_waits() -> None:
    # A process of one thread: in this one a thread of an earlier test that ends between the two
    # reads takes its counts out of the sum, and the sum goes down.
    child = subprocess.Popen(
        [sys.executable, "-c", _SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        waited, preempted = process_context_switches(child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "slept"
        waited_after, preempted_after = process_context_switches(child.pid)
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=60)
    assert waited_after - waited >= 5
    assert preempted_after >= preempted


@pytest.mark.parametrize("libraries", [False, True], ids=["raw", "libraries"])
@pytest.mark.parametrize("nodes", [3, 5])
def test_each_floor_quorum_makes_the_protocols_minimum_of_verifications(
    nodes: int, libraries: bool, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The floor's own load, in this process, against its HTTP server and the test's Redis: each
    # quorum it times signed and verified what the protocol requires at the least. Each peer's
    # relay and its approver verify the request for themselves (docs/protocol.md, "What an
    # approving node decides on"), the origin each approval, its agent the certificate. And it
    # made its plan's HTTP hops and Redis calls, through h11 and hiredis for the raw floor, through
    # aiohttp's client and redis-py for the library floor.
    import aiohttp
    import redis.asyncio

    from teaagent_bench._resp import RespConnection
    from teaagent_bench.quorum import _floor
    from teaagent_bench.quorum._cluster import _Size

    size = _Size(nodes)
    assert size.floor_verifications == {3: 9, 5: 16}[nodes]
    made = {"sign": 0, "verify": 0}
    calls = {"http": 0, "redis": 0}

    def counted(name: str, call: Callable[..., object], into: dict[str, int] = made) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            into[name] += 1
            return call(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(_floor, "sshsig_sign", counted("sign", _floor.sshsig_sign))
    monkeypatch.setattr(_floor, "sshsig_verify", counted("verify", _floor.sshsig_verify))

    def commands(call: Callable[..., object]) -> Callable[..., object]:
        # Only the plan's EVALSHA writes and GET reads (not a login, not the script's load).
        def wrapper(self: object, command: str | bytes, *args: object, **kwargs: object) -> object:
            named = command.encode() if isinstance(command, str) else command
            if named in (b"EVALSHA", b"GET") or named.startswith(
                (b"*5\r\n$7\r\nEVALSHA", b"*2\r\n$3\r\nGET")
            ):
                calls["redis"] += 1
            return call(self, command, *args, **kwargs)

        return wrapper

    if libraries:
        monkeypatch.setattr(aiohttp.ClientSession, "post", counted("http", aiohttp.ClientSession.post, calls))
        monkeypatch.setattr(
            redis.asyncio.Redis, "execute_command", commands(redis.asyncio.Redis.execute_command)
        )
    else:
        monkeypatch.setattr(_floor, "_hop", counted("http", _floor._hop, calls))
        monkeypatch.setattr(RespConnection, "call", commands(RespConnection.call))
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n"))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    one_each = (1,) * len(size.peers)
    plan = _floor._Plan(branch_hops=one_each, branch_writes=one_each, branch_reads=one_each)
    try:
        with _floor.bare_http_server(tmp_path, libraries) as (port, _server):
            job = _floor._FloorJob(port, redis_url, 1, 0.3, plan, nodes, libraries)
            spans, _begin, _end = asyncio.run(_floor._floor_load(job))
    finally:
        # The one caller's key (the bench's floor writes in a Redis of its own, thrown away after).
        delete_prefix(redis_url, f"bench:floor:{{{os.getpid()}-0}}")
    quorums = len(spans)
    assert quorums >= 1
    made["sign"] -= size.signatures  # the load's documents, signed once before it starts
    assert made == {"sign": quorums * size.signatures, "verify": quorums * size.floor_verifications}
    # The origin's two hops and one per branch; a write and a read per branch, and the one write
    # that makes the key before the caller's first read.
    assert calls == {"http": quorums * (2 + len(size.peers)), "redis": 1 + quorums * 2 * len(size.peers)}
