"""A real Redis Cluster for the tests: three masters and one replica, ``valkey-server`` processes.

``redis_cluster`` (session) starts, on free loopback ports, three ``valkey-server`` processes with
``cluster-enabled yes``, gives them the 16384 slots in three ranges (``CLUSTER ADDSLOTSRANGE``),
joins them (``CLUSTER MEET``) and waits until every node says ``cluster_state:ok``; a fourth
process joins as a replica of the first master, so that a test can fail it over
(``RedisCluster.fail_over``). ``cluster_prefix`` is a fresh key prefix whose keys are deleted from
every master after the test. Nothing persists: the cluster lives for the session only.

Bring both into a test module, or conftest.py, with
``from redis_cluster_fixture import fixture_cluster_prefix, fixture_redis_cluster  # noqa: F401``.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis.cluster
from port_support import free_port
from redis_fixture import new_prefix

from teaagent.store import find_server_binary

SLOTS = 16384
MASTERS = 3
START_TIMEOUT = (
    20.0  # seconds for the cluster to say ok; about 2 here (a new master waits 2 s to be writable)
)
PORT_ATTEMPTS = 5  # another process may take a free port we picked before the server binds it
# Well above a loaded host's stalls: no node may be declared failed unless a test stops it.
NODE_TIMEOUT_MS = 15000


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true; the servers have no event to wait on."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test cluster did not {what} in {timeout}s")
        time.sleep(0.02)


@dataclass
class ClusterNode:
    """One ``valkey-server`` of the test cluster."""

    port: int
    bus_port: int
    folder: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        """A plain client of this node alone (no redirections followed)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def info(self, section: str) -> dict[str, object]:
        with contextlib.closing(self.client()) as client:
            return dict(client.info(section))

    def cluster_info(self) -> dict[str, str]:
        with contextlib.closing(self.client()) as client:
            return {str(k): str(v) for k, v in client.execute_command("CLUSTER INFO").items()}

    def node_id(self) -> str:
        with contextlib.closing(self.client()) as client:
            reply = client.execute_command("CLUSTER MYID")
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def is_master(self) -> bool:
        return self.info("replication").get("role") == "master"


class RedisCluster:
    """Three masters and one replica of the first, started in ``folder`` (see the module).

    ``replicas=0`` starts the masters alone; ``persistent`` gives each an append-only file fsynced
    before every reply, so that a master killed (``kill``) and started again (``restart``) on its
    port comes back with what it acknowledged. Such a cluster is a test's own, not the session's.
    """

    def __init__(self, folder: Path, *, replicas: int = 1, persistent: bool = False) -> None:
        self.folder = folder
        self.nodes: list[ClusterNode] = []
        self.replicas = replicas
        self.persistent = persistent

    @property
    def url(self) -> str:
        """The URL a node's configuration names: one master now; the client finds the others."""
        return self.masters()[0].url

    def start(self) -> RedisCluster:
        binary = find_server_binary()
        for index in range(MASTERS + self.replicas):
            self.nodes.append(self._spawn(binary, self.folder / f"node-{index}"))
        masters = self.nodes[:MASTERS]
        bounds = [SLOTS * index // MASTERS for index in range(MASTERS + 1)]
        for node, low, high in zip(masters, bounds, bounds[1:], strict=False):
            with contextlib.closing(node.client()) as client:
                client.execute_command("CLUSTER ADDSLOTSRANGE", low, high - 1)
        with contextlib.closing(masters[0].client()) as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", node.port, node.bus_port)
        _wait(
            lambda: all(len(self._known(node)) == len(self.nodes) for node in self.nodes),
            START_TIMEOUT,
            "meet",
        )
        if self.replicas:
            master_id = masters[0].node_id()
            with contextlib.closing(self.nodes[MASTERS].client()) as client:
                client.execute_command("CLUSTER REPLICATE", master_id)
        _wait(self._ready, START_TIMEOUT, "say cluster_state:ok")
        return self

    def kill(self, node: ClusterNode) -> None:
        """``kill -9`` one node: no shutdown, nothing flushed but what its fsyncs wrote."""
        node.process.kill()
        node.process.wait(timeout=10)

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again on its port, with its nodes.conf and data; wait until all say ok."""
        node.process = self._run(find_server_binary(), node.folder / "valkey.conf")
        _wait(lambda: self._answers(node), START_TIMEOUT, "restart a node")
        _wait(self._ready, START_TIMEOUT, "say cluster_state:ok after a restart")

    @staticmethod
    def _run(binary: Path, config: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [str(binary), str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    @staticmethod
    def _answers(node: ClusterNode) -> bool:
        with contextlib.suppress(redis.exceptions.RedisError), contextlib.closing(node.client()) as client:
            return bool(client.ping())
        return False

    def stop(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes:
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()

    def _spawn(self, binary: Path, folder: Path) -> ClusterNode:
        folder.mkdir(parents=True, exist_ok=True)
        for _attempt in range(PORT_ATTEMPTS):
            port, bus_port = free_port(), free_port()
            config = folder / "valkey.conf"
            persistence = "appendonly yes\nappendfsync always\n" if self.persistent else "appendonly no\n"
            config.write_text(
                f"port {port}\n"
                f"cluster-port {bus_port}\n"
                "bind 127.0.0.1\n"
                "cluster-enabled yes\n"
                f"cluster-config-file {folder / 'nodes.conf'}\n"
                f"cluster-node-timeout {NODE_TIMEOUT_MS}\n"
                'save ""\n'
                f"{persistence}"
                "repl-diskless-sync yes\n"
                "repl-diskless-sync-delay 0\n"  # a replica syncs at once, not 5 s later
                f'dir "{folder}"\n'
                f'logfile "{folder / "valkey.log"}"\n'
            )
            (folder / "nodes.conf").unlink(missing_ok=True)
            process = self._run(binary, config)
            node = ClusterNode(port, bus_port, folder, process)
            deadline = time.monotonic() + START_TIMEOUT
            while process.poll() is None and time.monotonic() < deadline:
                with (
                    contextlib.suppress(redis.exceptions.RedisError),
                    contextlib.closing(node.client()) as client,
                ):
                    if client.ping():
                        return node
                time.sleep(0.01)
            if process.poll() is None:
                process.kill()
                process.wait()
                raise RuntimeError(f"valkey-server in {folder} did not answer in {START_TIMEOUT}s")
        raise RuntimeError(f"valkey-server in {folder} found no free port in {PORT_ATTEMPTS} attempts")

    @staticmethod
    def _known(node: ClusterNode) -> list[str]:
        with contextlib.closing(node.client()) as client:
            reply = client.execute_command("CLUSTER NODES")
        text = reply.decode() if isinstance(reply, bytes) else reply
        if isinstance(text, dict):  # redis-py parses CLUSTER NODES into {address: fields}
            return list(text)
        return [line for line in str(text).splitlines() if line.strip()]

    def _ready(self) -> bool:
        if not all(node.cluster_info().get("cluster_state") == "ok" for node in self.nodes):
            return False
        if not self.replicas:
            return True
        replica = self.nodes[MASTERS]
        return replica.info("replication").get("master_link_status") == "up"

    # -- what the tests ask ----------------------------------------------------------------

    def masters(self) -> list[ClusterNode]:
        """The nodes that are masters now (a failover swaps one pair)."""
        return [node for node in self.nodes if node.is_master()]

    def client(self) -> redis.cluster.RedisCluster:
        """A cluster client of the tests' own (close it)."""
        return redis.cluster.RedisCluster.from_url(self.url)

    def keys(self, match: str) -> dict[int, list[bytes]]:
        """Every key matching ``match`` on each master, by the master's port (SCAN on each)."""
        found: dict[int, list[bytes]] = {}
        for node in self.masters():
            with contextlib.closing(node.client()) as client:
                found[node.port] = list(client.scan_iter(match=match, count=1000))
        return found

    def error_counts(self, name: str) -> int:
        """How often the masters and the replica answered error ``name`` (``INFO errorstats``)."""
        total = 0
        for node in self.nodes:
            stats = node.info("errorstats").get(f"errorstat_{name}")
            if isinstance(stats, dict):
                total += int(stats.get("count", 0))
        return total

    def fail_over(self, replica: ClusterNode) -> None:
        """Promote ``replica`` (``CLUSTER FAILOVER``: its master hands over) and wait until every node agrees.

        Raises:
            RuntimeError: the nodes did not agree in ``START_TIMEOUT`` seconds.
        """
        with contextlib.closing(replica.client()) as client:
            client.execute_command("CLUSTER FAILOVER")
        replica_id = replica.node_id()

        def agreed() -> bool:
            for node in self.nodes:
                with contextlib.closing(node.client()) as client:
                    nodes = client.execute_command("CLUSTER NODES")
                for fields in nodes.values() if isinstance(nodes, dict) else ():
                    if fields.get("node_id") == replica_id and "master" not in fields.get("flags", ""):
                        return False
            return all(node.cluster_info().get("cluster_state") == "ok" for node in self.nodes)

        _wait(agreed, START_TIMEOUT, "agree on the failover")

    def replica_of_a_master(self) -> tuple[ClusterNode, ClusterNode]:
        """Return ``(master, replica)``: the pair a failover can swap."""
        masters = self.masters()
        replica = next(node for node in self.nodes if node not in masters)
        master_address = replica.info("replication")["master_port"]
        master = next(node for node in masters if node.port == int(str(master_address)))
        return master, replica


@pytest.fixture(scope="session", name="redis_cluster")
def fixture_redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """The session's Redis Cluster (three masters, one replica)."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(name="cluster_prefix")
def fixture_cluster_prefix(redis_cluster: RedisCluster) -> Iterator[str]:
    """A key prefix no other test uses; its keys are deleted from every master after the test."""
    prefix = new_prefix()
    yield prefix
    for node in redis_cluster.masters():
        with contextlib.closing(node.client()) as client:
            keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            pipe = client.pipeline(transaction=False)
            for key in keys:  # one key per DEL: keys of two slots in one command are CROSSSLOT
                pipe.delete(key)
            pipe.execute()
