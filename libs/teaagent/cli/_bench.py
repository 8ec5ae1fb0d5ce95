"""``teaagent bench NAME [--json]``: the benchmarks behind the figures the issues name.

Each benchmark measures its subject and its baseline in the same run on the same machine, so the
ratios hold wherever they are run; absolute rates depend on the machine. The benchmarks are the
checkout's ``bench/`` folder (the package ``teaagent_bench``), not the library: this command is the
one place the library imports them, and :func:`find_benches` puts them on the path.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

import typer

import teaagent
from teaagent.errors import ConfigError

DEFAULT_SECONDS = 3.0  # per benchmark: long enough for stable medians, short enough for `make bench`
NOT_INSTALLED = (
    "teaagent bench runs from a checkout of teaagent: the benchmarks live in its bench/ folder, "
    "which this installation does not have."
)


def find_benches() -> None:
    """Make ``teaagent_bench`` importable: the ``bench/`` folder beside ``libs/`` of this checkout.

    Raises:
        ConfigError: This teaagent is not a checkout's (a wheel ships no benchmarks).
    """
    if importlib.util.find_spec("teaagent_bench") is not None:
        return
    folder = Path(teaagent.__file__).resolve().parents[2] / "bench"
    if not (folder / "teaagent_bench" / "__init__.py").is_file():
        raise ConfigError(NOT_INSTALLED)
    sys.path.insert(0, str(folder))


def _core(seconds: float) -> dict[str, float]:
    from teaagent_bench.runner import bench_core

    return bench_core(seconds)


def _signing(seconds: float) -> dict[str, float]:
    from teaagent_bench.counting import bench_evaluate
    from teaagent_bench.signing import bench_signing_primitives

    return {**bench_signing_primitives(seconds), **bench_evaluate(seconds / 2)}


def _runner(seconds: float) -> dict[str, float]:
    from teaagent_bench.runner import bench_runner

    return bench_runner(seconds)


def _relay(seconds: float) -> dict[str, float | str]:
    from teaagent_bench.relay import bench_relay

    # Numbers, and the reasons of figures left out (``*_omitted``); nothing else.
    return {
        key: value if isinstance(value, str) else float(value)
        for key, value in bench_relay(seconds).items()
        if (isinstance(value, int | float) and not isinstance(value, bool))
        or (isinstance(value, str) and key.endswith("_omitted"))
    }


def _agent(seconds: float) -> dict[str, float]:
    # The command line is the one place the library starts a service; the import stays here.
    from teaagent_bench.agent import bench_agent

    return bench_agent(seconds)


def _approver(seconds: float) -> dict[str, float]:
    from teaagent_bench.approver import bench_approver

    return bench_approver(seconds)


def _mcp(seconds: float) -> dict[str, float]:
    from teaagent_bench.mcp import bench_mcp

    return bench_mcp(seconds)


def _quorum(seconds: float) -> dict[str, float | str]:
    from teaagent_bench.quorum import bench_quorum

    return bench_quorum(seconds)


def _quorum_sizes(seconds: float, sizes: tuple[int, ...]) -> dict[str, float | str]:
    from teaagent_bench.approver import bench_inbox_scale
    from teaagent_bench.quorum import bench_quorum_sizes

    # Beside the clusters: one inbox of 10, then 10,000 pending requests, listed.
    return {**bench_quorum_sizes(seconds, sizes), **bench_inbox_scale()}


def _sizes(text: str) -> tuple[int, ...]:
    """``--peers 3,5,9``: the clusters' sizes, each one of those ``bench quorum`` knows."""
    from teaagent_bench.quorum import SIZES

    try:
        sizes = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        sizes = ()
    if not sizes or not set(sizes) <= set(SIZES):
        raise ConfigError(f"--peers takes cluster sizes among {','.join(map(str, SIZES))}, not {text!r}.")
    return sizes


# Figures are numbers; a figure that could not be measured is left out, and ``<name>_omitted``
# says why (a sentence).
BENCHMARKS: dict[str, Callable[[float], Mapping[str, float | str]]] = {
    "core": _core,
    "signing": _signing,
    "relay": _relay,
    "runner": _runner,
    "agent": _agent,
    "approver": _approver,
    "mcp": _mcp,
    "quorum": _quorum,
}

# What each benchmark promises (key, comparison, target), printed beside the figures.
TARGETS: dict[str, list[tuple[str, str, float]]] = {
    "core": [
        ("gate_overhead_us_median", "<=", 50.0),
        ("audit_appends_per_s", ">=", 20_000.0),
        # The whole gate of a read-only call against a plain append of its audit record (same run).
        ("gate_floor_ratio", "<=", 2.5),
        ("api_floor_ratio", "<=", 2.5),
    ],
    "signing": [("sshsig_verify_ratio", ">=", 0.85), ("evaluate_2of3_over_two_raw", "<=", 2.5)],
    "relay": [
        ("decisions_per_s", ">=", 1000.0),
        ("ratio_to_raw_evalsha", ">=", 0.8),
        ("ratio_to_limits", ">=", 2.0),
        # The relay's CPU per decision against one raw verification and one raw EVALSHA (issue 29).
        ("relay_ratio_to_floor", "<=", 2.5),
    ],
    "runner": [("iteration_overhead_ms_median", "<=", 1.0)],
    # The agent service's stream against a bare uvicorn SSE endpoint streaming the same frames.
    "agent": [("first_event_floor_ratio", "<=", 3.0), ("events_floor_ratio", ">=", 0.5)],
    # Rule decisions signed and handed over by one approver against the relay's peer-decision
    # ceiling (`decisions_per_s` of `bench relay`), measured in the same run.
    "approver": [("ratio_to_relay", ">=", 0.5)],
    # A low-risk call through teaagent mcp gateway against the same upstream called directly, by
    # the same client in the same run: one more stdio hop is the floor (about 2x).
    "mcp": [("p50_ratio", "<=", 2.5)],
    # 2 of 3, rule approvers, every node on this machine, against the same signatures,
    # verifications, Redis round trips and HTTP hops done raw in the same run. The ratios judge;
    # the absolute figures are a guide for a 2-core machine.
    "quorum": [
        ("floor_ratio", "<=", 3.0),
        ("floor_throughput_ratio_c64", "<=", 3.0),
        ("p50_ms_c1", "<=", 15.0),
        ("throughput_c64", ">=", 200.0),
        # The same cluster, same run, under a version 2 rule of two groups (all_of), one caller.
        ("policy_floor_ratio", "<=", 3.0),
        # The services' HTTP client, aiohttp, against httpx (the one asked for), end to end at 64
        # callers: the rule for another library than the asked-for one (issue 29).
        ("aiohttp_over_httpx_best", ">=", 1.5),
    ],
    # bench quorum --peers 3,5,9: each size against its own floor, and the CPU per approved call
    # growing at most linearly in the number of peers.
    "quorum_peers": [
        *(
            (f"n{n}_{key}", "<=", 3.0)
            for n in (3, 5, 9)
            for key in ("floor_ratio", "floor_throughput_ratio_c64")
        ),
        *((f"n{n}_cpu_growth_over_peers", "<=", 1.0) for n in (5, 9)),
        # 10,000 pending requests in one inbox against 10: the same page costs the same.
        *((f"inbox_scale_ratio_{name}", "<=", 1.5) for name in ("approvals_list", "inbox_page")),
        ("inbox_scale_ratio_approver_round", "<=", 1.5),
    ],
}


# What each judged figure means, and its floor (what it is measured against in the same run).
MEANINGS: dict[str, str] = {
    "gate_overhead_us_median": "the policy gate's own time per read-only call (median)",
    "audit_appends_per_s": "audit records appended per second, HMAC chain included",
    "gate_floor_ratio": "a read-only call through the whole gate against a bare audit append (the floor)",
    "api_floor_ratio": "the public API's call path against the same bare audit append (the floor)",
    "sshsig_verify_ratio": "teaagent's SSHSIG verification rate against the raw Ed25519 verify (the floor)",
    "evaluate_2of3_over_two_raw": "counting a 2-of-3 certificate against two raw verifications (the floor)",
    "decisions_per_s": "peers' decisions a relay verifies and counts per second",
    "ratio_to_raw_evalsha": "rate-limit checks a second (the store's synchronous limiter) against bare "
    "EVALSHA round trips through the same client (the floor)",
    "ratio_to_limits": "the same checks a second against the limits library's moving window (same Redis)",
    "relay_ratio_to_floor": "the relay's CPU per decision, each its own call, against one raw SSHSIG "
    "verification plus one raw EVALSHA's client CPU (the floor; it does no HTTP)",
    "iteration_overhead_ms_median": "the runner's own time per agent loop iteration (median)",
    "first_event_floor_ratio": "time to a run's first SSE event against a bare uvicorn SSE endpoint (floor)",
    "events_floor_ratio": "SSE events per second against the bare endpoint's (the floor)",
    "ratio_to_relay": "rule decisions one approver signs and hands over per second, against the relay's "
    "own ceiling on decisions (the floor)",
    "p50_ratio": "a low-risk call through the MCP gateway against the same upstream called directly (p50)",
    "floor_ratio": "a 2-of-3 quorum's p50 at concurrency 1 against the same crypto, Redis round trips and "
    "HTTP hops done raw (the floor)",
    "floor_throughput_ratio_c64": "the floor's throughput at concurrency 64 against the quorum's",
    "p50_ms_c1": "a 2-of-3 quorum end to end at concurrency 1 (median)",
    "throughput_c64": "approved 2-of-3 quorums per second with 64 callers",
    "policy_floor_ratio": "a quorum under a two-group all_of rule, p50 at concurrency 1, against its own "
    "floor (the same raw work with its own hops and round trips)",
    "aiohttp_over_httpx_best": "the largest of aiohttp's gains over httpx at 64 callers, in cluster CPU "
    "per quorum and in throughput, deliveries batched and each its own call (httpx is the floor)",
    **{
        f"n{n}_floor_ratio": f"a quorum of {n} nodes' p50 at concurrency 1 against its own floor"
        for n in (3, 5, 9)
    },
    **{
        f"n{n}_floor_throughput_ratio_c64": f"the floor's throughput at 64 against a {n}-node quorum's"
        for n in (3, 5, 9)
    },
    **{
        f"n{n}_cpu_growth_over_peers": f"the cluster CPU per approved call at {n} nodes against 3 nodes', "
        "over the growth in peers (1: linear)"
        for n in (5, 9)
    },
    "inbox_scale_ratio_approvals_list": "approvals list --limit 10 with 10,000 pending against 10 pending",
    "inbox_scale_ratio_inbox_page": "the relay's inbox page of 10 with 10,000 pending against 10 pending",
    "inbox_scale_ratio_approver_round": "one approver round (a new request read and looked at) with "
    "10,000 pending against 10 pending",
}


def unit(key: str) -> str:
    """The unit a figure is printed with, read from the words of its name (``x`` for a ratio)."""
    words = key.split("_")
    if "ratio" in words or "over" in words:
        return "x"
    if key.endswith("per_s") or "throughput" in words:
        return "per s"
    if "cpu" in words and "ms" in words:
        return "ms CPU"
    for word, name in (("ms", "ms"), ("us", "µs")):
        if word in words:
            return name
    return "s" if words[-1] == "s" else ""


def report(name: str, figures: Mapping[str, float | str]) -> tuple[list[str], list[str]]:
    """The lines ``teaagent bench NAME`` prints, and the keys whose target is not met.

    Every figure with its unit; each judged one with its target, met or NOT MET, and what it means
    (its floor); a last line that counts the targets met, so a miss cannot scroll by unseen.
    """
    targets = {key: (op, target) for key, op, target in TARGETS.get(name, [])}
    lines: list[str] = []
    missed: list[str] = []
    for key in sorted(figures):
        value = figures[key]
        if isinstance(value, str):  # a figure left out, and why (``*_omitted``)
            lines.append(f"{key:32} {value}")
            continue
        line = f"{key:32} {value:14,.3f} {unit(key):6}"
        if key in targets:
            op, target = targets[key]
            met = value <= target if op == "<=" else value >= target
            if not met:
                missed.append(key)
            line += f"  target {op} {target:,g}: {'met' if met else 'NOT MET'}"
            if key in MEANINGS:
                line += f" ({MEANINGS[key]})"
        lines.append(line.rstrip())
    absent = [key for key in targets if key not in figures]
    missed.extend(absent)
    judged = len(targets)
    if judged:
        verdict = f"{judged - len(missed)} of {judged} targets met"
        if missed:
            verdict += f"; NOT MET: {', '.join(missed)}"
        lines.append(verdict)
    return lines, missed


def bench(
    name: Annotated[
        str, typer.Argument(help="core | signing | relay | runner | agent | approver | mcp | quorum")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else.")] = False,
    seconds: Annotated[
        float, typer.Option(help="Time budget of the benchmark, in seconds.")
    ] = DEFAULT_SECONDS,
    peers: Annotated[
        str | None,
        typer.Option(help="bench quorum only: the clusters' sizes, as 3,5,9 (2 of 3, 3 of 5, 5 of 9)."),
    ] = None,
) -> None:
    """Run one benchmark and print its figures (`make bench` runs them all)."""
    find_benches()
    if name not in BENCHMARKS:
        raise ConfigError(
            f"there is no benchmark named {name!r}; choose one of {', '.join(sorted(BENCHMARKS))}."
        )
    if not (math.isfinite(seconds) and seconds > 0):  # nan passes "<= 0"; inf never ends
        raise ConfigError(f"--seconds must be a positive number of seconds, not {seconds}.")
    if peers is not None and name != "quorum":
        raise ConfigError("--peers is for bench quorum only.")
    figures: Mapping[str, float | str]
    if peers is not None:
        figures, judged = _quorum_sizes(seconds, _sizes(peers)), "quorum_peers"
    else:
        figures, judged = BENCHMARKS[name](seconds), name
    if as_json:
        typer.echo(json.dumps(figures, sort_keys=True))
        return
    lines, _missed = report(judged, figures)
    for line in lines:
        typer.echo(line)
