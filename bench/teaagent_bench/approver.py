"""Benchmark of one approver process deciding by rule: ``teaagent bench approver``.

``bench_approver(seconds)`` starts an embedded Redis, one real relay process (``teaagent relay
serve``, its delivery worker off) and one real approver process (``teaagent approver serve``) of
node ``beta``, whose one rule approves every ``shell.*`` request. It first posts ``count`` signed
requests of the peer ``alpha`` to the relay's inbox (``POST /v1/inbox``, before the approver
starts), then starts the approver and measures, from the first decision in its audit log to the
approver's ``forwards{result="ok"}`` counter reaching ``count``, the decisions it signed and the
relay accepted per second (``decisions_per_s``).

In the same run, ``teaagent_bench.relay.bench_decisions`` measures the relay's own ceiling
on peer decisions (``relay_decisions_per_s``); ``ratio_to_relay`` is the approver's rate against it
(target >= 0.5). ``approver_cpu_ms_per_decision`` and ``relay_cpu_ms_per_decision`` are each
process's CPU time (user and system) per decision during the approver's run;
``observer_cpu_share`` is the bench's own CPU time while it watches (a ``/metrics`` read every
``POLL_SECONDS`` on one kept client), as a share of one core: what the measurement takes from the
two measured processes on the same machine.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.signing import SSHPrivateKey
from teaagent.testing import LocalCluster, approver_rule
from teaagent_approver._audit import AUDIT_FILE_NAME
from teaagent_bench._processes import process_cpu_seconds
from teaagent_bench.relay import _post, bench_decisions, signed_requests

__all__ = ["bench_approver", "bench_inbox_scale"]

DECISIONS_PER_SECOND_GUESS: Final = 400  # sizes the work to the time budget; the figure is measured
MIN_REQUESTS: Final = 200  # enough that the clock starts well before the last decision
DEADLINE_SECONDS: Final = 120.0  # the approver must have decided everything by then
POLL_SECONDS: Final = 0.05  # how often the bench reads the approver's counters (each read is a /metrics)
_FORWARDS_OK = re.compile(r'^teaagent_approver_forwards_total\{result="ok"\} (\S+)$', re.MULTILINE)
_ASKED = re.compile(r'^teaagent_approver_skipped_total\{reason="ask"\} (\S+)$', re.MULTILINE)
_LOOKS = re.compile(r"^teaagent_approver_look_seconds_(count|sum) (\S+)$", re.MULTILINE)


def _beta(folder: Path, raw: dict[str, Ed25519PrivateKey], max_pending: int, rule_tool: str) -> LocalCluster:
    """Node beta (peer alpha, outside the cluster): its relay, delivery off; its approver, one rule
    approving ``rule_tool``, started by the bench when it measures."""
    return LocalCluster(
        folder,
        ("beta",),
        prefix="bench",
        required=1,
        peers_of={"beta": ["alpha"]},
        rules={"beta": approver_rule(rule_tool, "approve")},
        high_risk=("shell.*",),
        timeout_seconds=600,
        keys=raw,
        approvers=(),
        env={
            "TEAAGENT_RELAY_DELIVER": "0",
            "TEAAGENT_RELAY_INBOX_RATE_LIMIT": "100000",
            # One origin sends every request of the bench at once: above the per-origin cap.
            "TEAAGENT_RELAY_INBOX_MAX_PENDING": str(max(max_pending, 1)),
        },
    )


def _requests(count: int, keys: dict[str, SSHPrivateKey], start: int = 0) -> list[tuple[str, bytes]]:
    signed = signed_requests(keys, ["beta"], 1, "bench-approver", range(start, start + count))
    return [("/v1/inbox", body) for _request, body in signed]


def _forwarded(client: httpx.Client, url: str) -> int:
    match = _FORWARDS_OK.search(client.get(f"{url}/metrics").text)
    return int(float(match.group(1))) if match else 0


@dataclass(frozen=True)
class _Watched:
    """What the approver's ``/metrics`` says so far (it reads no Redis to say it)."""

    asked: int  # items its rounds left to an operator
    looks: int  # looks at the inbox that found something (``look_seconds`` histogram's count)
    look_seconds: float  # their time, by the approver's own clock (the histogram's sum)


def _watched(client: httpx.Client, url: str) -> _Watched:
    text = client.get(f"{url}/metrics").text
    asked = _ASKED.search(text)
    looks = {name: float(value) for name, value in _LOOKS.findall(text)}
    return _Watched(
        asked=int(float(asked.group(1))) if asked else 0,
        looks=int(looks.get("count", 0.0)),
        look_seconds=looks.get("sum", 0.0),
    )


def _audited(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def bench_approver_only(count: int) -> dict[str, float]:
    """One approver process deciding ``count`` preloaded inbox items by rule (no relay ceiling).

    Returns:
        ``decisions_per_s``, ``approver_cpu_ms_per_decision``, ``relay_cpu_ms_per_decision``,
        ``decisions`` (those timed: all but the first) and ``observer_cpu_share``, the bench's own
        CPU time while it watches, as a share of one core (the machine the approver loses to it).

    Raises:
        ValueError: ``count`` is below 2.
        TeaAgentError: The relay did not start (``teaagent.testing``).
        RuntimeError: The approver exited, the relay refused a request, or the approver did not
            sign and hand over every request within ``DEADLINE_SECONDS``.
        StoreError: The embedded Redis did not start.
    """
    if count < 2:
        raise ValueError(f"count must be at least 2, not {count}")
    raw = {name: Ed25519PrivateKey.generate() for name in ("alpha", "beta")}
    keys = {name: SSHPrivateKey.from_cryptography(key, comment=name) for name, key in raw.items()}
    items = _requests(count, keys)
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-approver-") as temporary,
        _beta(Path(temporary), raw, count, "shell.*") as cluster,
        # One polling client, made before the clock starts: a new httpx client per poll costs
        # about 20 ms of CPU (its TLS context), which the approver and its relay would lose.
        httpx.Client(timeout=5) as poller,
    ):
        beta = cluster.nodes["beta"]
        url, approver_url = beta.url, beta.approver_url
        relay = cluster.processes["beta-relay"]
        stored, _ = asyncio.run(_post(url, items, {}))
        if stored != count:
            raise RuntimeError(f"the relay stored {stored} of {count} requests")
        approver = cluster.start_service("beta", "approver", wait=False)
        audit = beta.data_dir / AUDIT_FILE_NAME
        deadline = time.monotonic() + DEADLINE_SECONDS
        while _audited(audit) == 0:
            if approver.poll() is not None or time.monotonic() > deadline:
                log = (cluster.folder / "logs" / "beta-approver.log").read_text(errors="replace")[-1000:]
                raise RuntimeError(f"the approver decided nothing: {log}")
            time.sleep(0.002)
        # Timed from the first decision: the approver's start-up is not its rate.
        started, first = time.perf_counter(), _audited(audit)
        cpu_approver, cpu_relay = process_cpu_seconds(approver.pid), process_cpu_seconds(relay.pid)
        cpu_bench = time.process_time()
        while (forwarded := _forwarded(poller, approver_url)) < count:
            if approver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the approver handed {forwarded} of {count} decisions to the relay")
            time.sleep(POLL_SECONDS)
        elapsed = time.perf_counter() - started
        cpu_bench = time.process_time() - cpu_bench
        timed = count - first
        if timed <= 0:
            raise RuntimeError(f"the approver decided all {count} requests before the clock started")
        return {
            "decisions": float(timed),
            "decisions_per_s": timed / elapsed,
            "approver_cpu_ms_per_decision": (process_cpu_seconds(approver.pid) - cpu_approver) / timed * 1000,
            "relay_cpu_ms_per_decision": (process_cpu_seconds(relay.pid) - cpu_relay) / timed * 1000,
            "observer_cpu_share": cpu_bench / elapsed,
        }


def bench_approver(seconds: float = 3.0) -> dict[str, float]:
    """``teaagent bench approver``: the approver's rule decisions against the relay's own ceiling.

    Returns:
        ``decisions_per_s`` and the CPU figures of ``bench_approver_only``, ``relay_decisions_per_s``
        (``decisions_per_s`` of ``bench_decisions``) and ``ratio_to_relay``. What one approver round
        and a listing cost at 10 and 10,000 pending is ``bench_inbox_scale``'s, run by
        ``teaagent bench quorum --peers``.

    Raises:
        ValueError: ``seconds`` is not positive.
        TeaAgentError: A service did not start.
        RuntimeError: A process refused valid work.
        StoreError: The embedded Redis did not start.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    figures = bench_approver_only(max(MIN_REQUESTS, round(seconds * DECISIONS_PER_SECOND_GUESS)))
    ceiling = float(bench_decisions(seconds / 2)["decisions_per_s"])
    figures["relay_decisions_per_s"] = ceiling
    figures["ratio_to_relay"] = figures["decisions_per_s"] / ceiling
    return figures


# -- an inbox of many pending requests (http-lib) ---------------------------------------------------

INBOX_SIZES: Final = (10, 10_000)
INBOX_SAMPLES: Final = 20  # calls timed per figure; the median is reported


def _median_call(
    client: httpx.Client, url: str, headers: dict[str, str], redis_client: Any
) -> tuple[float, float]:
    """The median milliseconds of ``GET url`` over INBOX_SAMPLES calls, and the Redis commands per call."""
    times = []
    before = redis_client.info("stats")["total_commands_processed"]
    for _ in range(INBOX_SAMPLES):
        begun = time.perf_counter()
        response = client.get(url, headers=headers)
        times.append(time.perf_counter() - begun)
        response.raise_for_status()
    # Less the INFO call itself.
    commands = redis_client.info("stats")["total_commands_processed"] - before - 1
    return statistics.median(times) * 1000, commands / INBOX_SAMPLES


def _asked_past(client: httpx.Client, url: str, count: int, what: str, *, looks: int = -1) -> _Watched:
    """Wait until the approver has left more than ``count`` items to an operator and timed more than
    ``looks`` looks (its counter moves inside a look, the histogram at the look's end); what it says then."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        seen = _watched(client, url)
        if seen.asked > count and seen.looks > looks:
            return seen
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not within {DEADLINE_SECONDS:g} s")
        time.sleep(POLL_SECONDS)


@dataclass(frozen=True)
class _RoundCosts:
    look_ms: float  # median, by the approver's own clock
    intake_ms: float  # median of the relay's POST /v1/inbox, by the bench's clock
    commands: float  # mean Redis commands per request: intake, look and the wait for news


def _round_costs(
    client: httpx.Client, url: str, approver_url: str, items: list[tuple[str, bytes]], redis_client: Any
) -> _RoundCosts:
    """One request at a time posted to the relay until the approver's round has looked at it.

    Per request: the time of the approver's look that found it (its ``look_seconds`` histogram,
    the sum's growth over the count's), the time of the relay's ``POST`` that took it in, and the
    Redis commands meanwhile (the relay's intake, the approver's look and its wait for news), less
    the two INFO calls that count them. The bench's own polls of ``/metrics`` every
    ``POLL_SECONDS`` decide only when it reads, not what it reads.
    """
    looks, intakes = [], []
    commands = 0
    for path, body in items:
        before_seen = _watched(client, approver_url)
        before = redis_client.info("stats")["total_commands_processed"]
        begun = time.perf_counter()
        client.post(
            f"{url}{path}", content=body, headers={"Content-Type": "application/json"}
        ).raise_for_status()
        intakes.append(time.perf_counter() - begun)
        seen = _asked_past(
            client, approver_url, before_seen.asked, "the approver's round", looks=before_seen.looks
        )
        commands += redis_client.info("stats")["total_commands_processed"] - before - 1
        looks.append((seen.look_seconds - before_seen.look_seconds) / (seen.looks - before_seen.looks))
    return _RoundCosts(
        look_ms=statistics.median(looks) * 1000,
        intake_ms=statistics.median(intakes) * 1000,
        commands=commands / len(items),
    )


def bench_inbox_scale(sizes: tuple[int, ...] = INBOX_SIZES) -> dict[str, float]:
    """What a listing costs with ``sizes`` pending requests in one inbox (10 and 10,000).

    Node beta's relay (its delivery worker off) and approver (whose one rule matches none of the
    requests, so that they stay pending and the approver idles) on an embedded Redis; alpha's
    signed requests are posted to beta's inbox up to each size. At each size, over
    ``INBOX_SAMPLES`` calls: ``approvals_list_ms_<size>`` (the approver's ``GET /v1/requests?limit=10``,
    what ``teaagent approvals list --limit 10`` calls), ``inbox_page_ms_<size>`` (the relay's
    ``GET /v1/inbox?limit=10``), each with its Redis commands per call
    (``..._redis_commands_<size>``). Then, the approver having read the whole inbox, one more
    request at a time is posted to the relay until the approver's round has looked at it, over
    ``INBOX_SAMPLES`` requests: ``approver_round_ms_<size>``, the median time of the look that
    found it by the approver's own clock (its ``look_seconds`` histogram: the bench's polls of
    ``/metrics`` decide when it reads, not what it reads); ``relay_intake_ms_<size>``, the median
    time of the relay's ``POST`` that took it in; ``approver_round_redis_commands_<size>``, the mean
    Redis commands per request of both and of the approver's wait for news. And the ratios of the
    largest size to the smallest (``inbox_scale_ratio_*``: 1 when the cost does not grow with the
    inbox).

    Raises:
        TeaAgentError: A service did not start.
        RuntimeError: The relay refused a request.
        StoreError: The embedded Redis did not start.
    """
    import redis

    raw = {name: Ed25519PrivateKey.generate() for name in ("alpha", "beta")}
    keys = {name: SSHPrivateKey.from_cryptography(key, comment=name) for name, key in raw.items()}
    figures: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="teaagent-bench-inbox-") as temporary,
        _beta(Path(temporary), raw, max(sizes) + INBOX_SAMPLES * len(sizes), "none.*") as cluster,
        httpx.Client(timeout=60) as client,
    ):
        beta = cluster.nodes["beta"]
        url, approver_url, auth = beta.url, beta.approver_url, beta.headers
        store = redis.Redis.from_url(cluster.redis_url)
        try:
            held = 0
            for size in sorted(sizes):
                items = _requests(size - held, keys, start=held)
                stored, _ = asyncio.run(_post(url, items, {}))
                if stored != len(items):
                    raise RuntimeError(f"the relay stored {stored} of {len(items)} requests")
                held = size
                # The approver runs only while measured: each request posted would wake a round.
                cluster.start_service("beta", "approver")
                try:
                    _asked_past(client, approver_url, size - 1, "the approver reading its inbox")
                    for name, call in (
                        ("approvals_list", f"{approver_url}/v1/requests?limit=10"),
                        ("inbox_page", f"{url}/v1/inbox?limit=10"),
                    ):
                        ms, commands = _median_call(client, call, auth, store)
                        figures[f"{name}_ms_{size}"] = ms
                        figures[f"{name}_redis_commands_{size}"] = commands
                    extra = _requests(INBOX_SAMPLES, keys, start=max(sizes) + INBOX_SAMPLES * size)
                    costs = _round_costs(client, url, approver_url, extra, store)
                    figures[f"approver_round_ms_{size}"] = costs.look_ms
                    figures[f"relay_intake_ms_{size}"] = costs.intake_ms
                    figures[f"approver_round_redis_commands_{size}"] = costs.commands
                finally:
                    cluster.stop_service("beta-approver")
        finally:
            store.close()
    low, high = min(sizes), max(sizes)
    for name in ("approvals_list", "inbox_page", "approver_round"):
        figures[f"inbox_scale_ratio_{name}"] = figures[f"{name}_ms_{high}"] / figures[f"{name}_ms_{low}"]
    return figures
