"""docker-compose.yml brought up for real, on a private Docker engine, all traffic on loopback.

Opt-in: `make test-compose` (TEAAGENT_TEST_COMPOSE=1) installs what it needs, and `.ci/run` runs it
after `make test`. The steps share one cluster and run in the order written:

1. every image is made here (no registry), the teaagent image built once; the ten services become
   healthy (readiness);
2. the README's flow: ``tools call`` waits in alpha's agent, beta's operator lists and approves it
   in beta's approver, the call completes;
3. no container holds another node's private key or token, anywhere in its filesystem;
4. ``docker-compose stop``: every service exits 0; ``up`` again: the init step changes nothing, the
   services are healthy again;
5. ``down -v --rmi all`` leaves no container, volume or image of the project.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from compose_harness import (
    Compose,
    PrivateDockerd,
    build_valkey_image,
    build_wheelhouse,
    compose_file,
    dockerfile_base_image,
    free_port_block,
    host_network_override,
    import_debian_base,
    private_engine,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(
        os.environ.get("TEAAGENT_TEST_COMPOSE") != "1",
        reason="the compose cluster runs with `make test-compose` (a private Docker engine; on in CI)",
    ),
]

NODES = ("alpha", "beta", "gamma")
KINDS = ("relay", "approver", "agent")
SERVICES = tuple(f"{kind}-{node}" for node in NODES for kind in KINDS)
IMAGE = "teaagent:local"


@dataclass
class Cluster:
    engine: PrivateDockerd
    compose: Compose
    figures: dict[str, float] = field(default_factory=dict)

    def exec(
        self, service: str, *argv: str, timeout: float = 120, root: bool = False
    ) -> tuple[int, str, str]:
        user = ["--user", "0"] if root else []
        done = self.compose.run("exec", "-T", *user, service, *argv, timeout=timeout)
        return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = time.monotonic()
    with private_engine() as engine:
        base_port = free_port_block(10)  # nine node ports, then Valkey's
        project = f"teaagent-compose-{os.getpid()}"
        compose = Compose(engine, host_network_override(base_port, base_port + 9), project)
        found = Cluster(engine, compose)
        try:
            import_debian_base(engine, dockerfile_base_image())
            build_valkey_image(engine, compose_file()["services"]["valkey"]["image"], dockerfile_base_image())
            build_wheelhouse()
            found.figures["images_s"] = time.monotonic() - started
            build_started = time.monotonic()
            compose("build")
            compose("up", "-d")
            found.figures["up_s"] = time.monotonic() - build_started
            found.figures["healthy_s"] = compose.wait_healthy(("valkey", *SERVICES))
            yield found
        finally:
            print(f"\ncompose figures: {json.dumps({k: round(v, 1) for k, v in found.figures.items()})}")
            compose.run("down", "-v", "--rmi", "all", "--timeout", "20", timeout=300)


def test_every_service_becomes_healthy_from_one_built_image(cluster: Cluster) -> None:
    containers = cluster.compose.containers()
    assert set(containers) == {"valkey", "init", *SERVICES}
    assert containers["init"]["State"]["ExitCode"] == 0
    images = {containers[name]["Image"] for name in ("init", *SERVICES)}
    assert len(images) == 1, "every teaagent service runs the one image the init service built"
    tagged = cluster.engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").split()
    assert tagged.count(IMAGE) == 1
    assert not [name for name in tagged if name.startswith(cluster.compose.project)], tagged
    # What the image holds: the installed environment, no source tree, build folder or egg-info.
    code, out, err = cluster.exec(
        "agent-alpha",
        "sh",
        "-c",
        "find / -xdev \\( -name '*.egg-info' -o \\( -name build -o -name libs -o -name src"
        " -o -name wheelhouse \\) ! -path '*/site-packages/*' ! -path '/usr/*' \\) -print",
        root=True,
    )
    assert code == 0, err
    assert out.split() == [], out
    # Memory of the running cluster, in the figures printed at the end.
    stats = cluster.engine.docker("stats", "--no-stream", "--format", "{{.MemUsage}}")
    cluster.figures["memory_mib"] = sum(_mib(line.split("/")[0].strip()) for line in stats.splitlines())
    assert cluster.figures["memory_mib"] > 0


def _mib(text: str) -> float:
    units = {"B": 1 / 2**20, "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "kB": 1e3 / 2**20, "MB": 1e6 / 2**20}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    raise ValueError(text)


def test_the_readmes_approval_flow_completes(cluster: Cluster) -> None:
    asking = cluster.compose.popen(
        "exec",
        "-T",
        "agent-alpha",
        "teaagent",
        "tools",
        "call",
        "--config",
        "/cluster/alpha/node.toml",
        "shell.run",
        '{"command": "echo hello from the compose cluster"}',
    )
    try:
        pending: list[dict[str, object]] = []
        until = time.monotonic() + 120
        while time.monotonic() < until and not pending:
            code, out, err = cluster.exec(
                "approver-beta",
                "teaagent",
                "approvals",
                "list",
                "--config",
                "/cluster/beta/node.toml",
                "--json",
            )
            assert code == 0, err
            pending = [item for item in json.loads(out) if item.get("tool_name") == "shell.run"]
            if not pending:
                assert asking.poll() is None, asking.communicate()
                time.sleep(1)
        assert len(pending) == 1, "the call reached beta's inbox"
        request_id = str(pending[0]["request_id"])
        code, out, err = cluster.exec(
            "approver-beta",
            "teaagent",
            "approvals",
            "approve",
            request_id[:8],
            "--config",
            "/cluster/beta/node.toml",
        )
        assert code == 0, (out, err)
        out, err = asking.communicate(timeout=120)
    finally:
        if asking.poll() is None:
            asking.kill()
            asking.communicate()
    assert asking.returncode == 0, (out, err)
    assert "hello from the compose cluster" in out


def _secrets(cluster: Cluster, node: str) -> list[str]:
    """A node's private key (its base64 body's first line) and token, read in its own approver."""
    script = f"sed -n 2p /cluster/{node}/keys/{node} && cat /cluster/{node}/data/token"
    code, out, err = cluster.exec("approver-" + node, "sh", "-c", script)
    assert code == 0, err
    key_line, token = out.split()[:2]
    assert len(key_line) > 40
    assert len(token) >= 32
    return [key_line, token]


def test_no_container_holds_another_nodes_private_key_or_token(cluster: Cluster) -> None:
    secrets = {node: _secrets(cluster, node) for node in NODES}
    for service in SERVICES:
        node = service.split("-", 1)[1]
        others = [secret for other in NODES if other != node for secret in secrets[other]]
        # Searched everywhere the container can read: its image, its volume, /tmp, its home.
        patterns = " ".join(f"-e {secret}" for secret in [*others, *secrets[node]])
        code, out, err = cluster.exec(
            service,
            "sh",
            "-c",
            f"grep -rlsF {patterns} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev; true",
            timeout=300,
        )
        assert code == 0, err
        found = "\n".join(out.splitlines())
        for other in NODES:
            if other != node:
                assert f"/cluster/{other}/" not in found, (service, found)
        # The check can see: this node's own key and token are found where they are.
        assert f"/cluster/{node}/keys/{node}" in found, (service, found)
        assert f"/cluster/{node}/data/token" in found, (service, found)
        # And by path: another node's folder is not there at all.
        for other in NODES:
            if other != node:
                code, _, _ = cluster.exec(service, "cat", f"/cluster/{other}/keys/{other}")
                assert code != 0
                code, _, _ = cluster.exec(service, "cat", f"/cluster/{other}/data/token")
                assert code != 0


def test_stop_exits_zero_and_up_again_changes_nothing(cluster: Cluster) -> None:
    before = {node: cluster.compose.volume_digests(node, IMAGE) for node in NODES}
    assert all(f"./keys/{node}" in before[node] and "./node.toml" in before[node] for node in NODES)
    stopping = time.monotonic()
    cluster.compose("stop", "--timeout", "30")
    cluster.figures["stop_s"] = time.monotonic() - stopping
    containers = cluster.compose.containers()
    codes = {name: item["State"]["ExitCode"] for name, item in containers.items()}
    running = [name for name, item in containers.items() if item["State"]["Running"]]
    assert running == []
    assert {name: code for name, code in codes.items() if code != 0} == {}
    cluster.compose("up", "-d")
    cluster.figures["healthy_again_s"] = cluster.compose.wait_healthy(("valkey", *SERVICES))
    assert cluster.compose.containers()["init"]["State"]["ExitCode"] == 0
    after = {node: cluster.compose.volume_digests(node, IMAGE) for node in NODES}
    assert after == before, "the init step run again changed a node's keys, token or configuration"


def test_down_removes_every_container_volume_and_image(cluster: Cluster) -> None:
    cluster.compose("down", "-v", "--rmi", "all", "--timeout", "20")
    assert cluster.compose.containers() == {}
    volumes = cluster.engine.docker("volume", "ls", "--format", "{{.Name}}").split()
    assert [name for name in volumes if name.startswith(cluster.compose.project)] == []
    images = cluster.engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}").split()
    assert IMAGE not in images
