"""A peer's Redis dying right after its approver's decision was acknowledged (200) loses nothing.

Two relays as real processes, each on its own embedded Redis (``redis_url = "embedded"``), as in
production where every node has its own: killing the peer's Redis leaves the origin's alone. The
origin's relay is stopped before the peer decides, so the decision is still queued on the peer
when its Redis dies, and it reaches the origin only if the peer's Redis kept it.

- ``kill -9`` of the peer's Redis process: the kernel keeps what the server wrote, whatever its
  fsync policy; the relay starts its Redis again by itself (before, it answered 503 until someone
  restarted the relay).
- A crash of the peer's host (the relay and its Redis killed, and whatever was not fsynced lost,
  as a power cut loses it): emulated with ``tests/native/lose_unsynced_writes.c`` preloaded into
  the peer's processes. It holds the append-only file's writes in the server's memory until they
  are fsynced, so SIGKILL drops them. With ``appendfsync everysec`` the decision was lost.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from relay_support import (
    Node,
    RelayProcess,
    approve_next,
    kill_process,
    undelivered,
    wait_until,
    write_cluster,
)

from teaagent.relay_client import RelayClient
from teaagent.store import EmbeddedRedis

pytestmark = pytest.mark.slow

WAIT = 20.0  # seconds for something that takes well under one on an idle host
NATIVE = Path(__file__).parent / "native"


@pytest.fixture(scope="session", name="lose_unsynced_writes")
def fixture_lose_unsynced_writes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The power-cut library, built with this machine's C compiler."""
    if sys.platform != "linux":
        pytest.skip("the host crash is emulated with LD_PRELOAD, which this test builds for Linux only")
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("a host crash is emulated by a small C library, and no C compiler is on PATH")
    library = tmp_path_factory.mktemp("native") / "lose_unsynced_writes.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(NATIVE / "lose_unsynced_writes.c"),
         "-ldl", "-lpthread"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return library


def embedded_cluster(tmp_path: Path) -> dict[str, Node]:
    """alpha (the origin) and beta (its one peer, 1 approval required), each on its own embedded Redis."""
    return write_cluster(tmp_path, ["alpha", "beta"], redis_url="embedded", prefix="crash", required=1)


def redis_of(node: Node) -> tuple[int, str]:
    """The pid and URL of the embedded Redis the node's relay runs (its ``server.json``)."""
    state = json.loads((node.folder / f"data-{node.name}" / "redis" / "server.json").read_text())
    return int(state["pid"]), str(state["url"])


def answers(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def decide_with_the_origin_away(alpha: Node, beta: Node, alpha_relay: RelayProcess) -> str:
    """alpha asks, its relay stops, beta's approver approves (200): the decision waits on beta."""
    request = alpha.request()
    with RelayClient(alpha.url, token=alpha.token) as client:
        client.submit_request(request, alpha.signed(request)["signature"])
    alpha_relay.stop()  # beta cannot deliver the decision before its Redis dies
    approve_next(beta, wait=WAIT)
    return str(request["request_id"])


def test_a_peers_redis_killed_right_after_the_decision_is_started_again_and_the_decision_arrives(
    tmp_path: Path,
) -> None:
    nodes = embedded_cluster(tmp_path)
    alpha, beta = nodes["alpha"], nodes["beta"]
    processes = [RelayProcess(alpha, tmp_path).start(), RelayProcess(beta, tmp_path).start()]
    try:
        request_id = decide_with_the_origin_away(alpha, beta, processes[0])
        pid, url = redis_of(beta)
        kill_process(pid)  # kill -9 of beta's Redis; beta's relay keeps running

        # Beta's relay starts its Redis again, on the same URL, with the queued decision in it.
        assert wait_until(lambda: redis_of(beta)[0] != pid and answers(url), timeout=WAIT)
        assert redis_of(beta)[1] == url
        assert undelivered(url, beta) == 1
        processes.append(RelayProcess(alpha, tmp_path).start())
        with RelayClient(alpha.url, token=alpha.token) as client:
            outcome = client.wait_outcome(request_id, WAIT)
        delivered = wait_until(lambda: undelivered(url, beta) == 0, timeout=WAIT)
    finally:
        for process in processes:
            process.stop()

    assert (outcome.state, outcome.signers) == ("approved", ("beta",))
    assert delivered


def test_a_peers_host_crash_right_after_the_decision_loses_neither_the_request_nor_the_decision(
    tmp_path: Path, lose_unsynced_writes: Path
) -> None:
    nodes = embedded_cluster(tmp_path)
    alpha, beta = nodes["alpha"], nodes["beta"]
    beta.extra_env["LD_PRELOAD"] = str(lose_unsynced_writes)  # beta's relay and its Redis
    beta_relay = RelayProcess(beta, tmp_path).start()
    processes = [RelayProcess(alpha, tmp_path).start(), beta_relay]
    try:
        request_id = decide_with_the_origin_away(alpha, beta, processes[0])
        pid, _url = redis_of(beta)
        beta_relay.kill()  # the host goes down: the relay first, so nothing starts its Redis again
        kill_process(pid)  # and its Redis, with whatever it had not fsynced

        processes.append(RelayProcess(beta, tmp_path).start())  # its Redis replays the append-only file
        processes.append(RelayProcess(alpha, tmp_path).start())
        with RelayClient(beta.url, token=beta.token) as client:
            kept = [(item.request_id, item.state) for item in client.list_inbox("all")]
        with RelayClient(alpha.url, token=alpha.token) as client:
            outcome = client.wait_outcome(request_id, WAIT)
    finally:
        for process in processes:
            process.stop()

    assert kept == [(request_id, "approved")]  # the request, and beta's decision on it
    assert (outcome.state, outcome.signers) == ("approved", ("beta",))


def test_an_embedded_redis_killed_while_started_comes_back_on_its_url_with_its_data(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        pid, url = server.pid, server.url
        assert pid is not None
        client = redis.Redis.from_url(url)
        client.set("ta:alpha:probe", "kept", ex=3600)
        kill_process(pid)
        assert wait_until(lambda: server.pid not in (None, pid) and answers(url), timeout=WAIT)
        assert (server.url, client.get("ta:alpha:probe")) == (url, b"kept")
        client.close()
    assert wait_until(lambda: not answers(url), timeout=WAIT)  # stopped for good, not started again
