"""Fixtures shared by the whole suite."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from cluster_support import running_star
from hypothesis import HealthCheck, settings

# The Redis fixtures (redis_server, redis_url, redis_prefix) for every test module, and the Redis
# Cluster's (redis_cluster, cluster_prefix), started only for the tests that ask for it.
from redis_cluster_fixture import fixture_cluster_prefix, fixture_redis_cluster  # noqa: F401
from redis_fixture import fixture_redis_prefix, fixture_redis_server, fixture_redis_url  # noqa: F401
from relay_support import MakeCluster, Node, write_cluster

from teaagent.store import Store, open_store

# Hypothesis's defaults judge time: an example slower than 200 ms fails its test (and the fast replay
# then calls the test flaky), and slow generation fails a health check. Under `make test`'s three
# workers on two cores a pause of that size is load, not a fault, so no property test here depends
# on it; a test's own @settings still overrides what it names.
settings.register_profile("teaagent", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("teaagent")

# Started in the background by a shell without job control (`make test &`, nohup), the suite would
# inherit SIGINT ignored, and with it every process it starts: the Ctrl-C tests would then wait in
# vain. Python's own handler here puts the default back for the children too (exec resets a handler).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """``@pytest.mark.anyio`` tests (anyio's pytest plugin) run on asyncio, each in a loop of its own."""
    return "asyncio"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace root of its own for one test."""
    root = tmp_path / "workspace"
    root.mkdir()
    return root


@dataclass(frozen=True)
class SSHKey:
    """A key pair written by the real ``ssh-keygen``."""

    name: str
    key_type: str
    private_path: Path
    public_line: str  # the .pub file's line, "ssh-ed25519 AAAA... comment"

    @property
    def public_path(self) -> Path:
        return self.private_path.with_name(self.private_path.name + ".pub")


@pytest.fixture(scope="session")
def ssh_key_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., SSHKey]:
    """Make (and cache for the session) SSH key pairs with OpenSSH's own ``ssh-keygen``.

    ``ssh_key_factory("beta")`` gives an ed25519 key; ``key_type`` takes ``ecdsa``, ``rsa``;
    ``bits`` sets the size (ECDSA 256/384/521, RSA >= 1024); ``passphrase`` protects the file.
    """
    if shutil.which("ssh-keygen") is None:  # pragma: no cover - the README lists it as a prerequisite
        pytest.fail("ssh-keygen is not on PATH; install OpenSSH's client tools")
    folder = tmp_path_factory.mktemp("sshkeys")
    cache: dict[tuple[str, str, int | None, str], SSHKey] = {}

    def make(name: str, key_type: str = "ed25519", bits: int | None = None, passphrase: str = "") -> SSHKey:
        cache_key = (name, key_type, bits, passphrase)
        if cache_key not in cache:
            path = folder / f"{name}-{key_type}-{bits or 'default'}-{len(passphrase)}"
            command = ["ssh-keygen", "-q", "-t", key_type, "-N", passphrase, "-C", name, "-f", str(path)]
            if bits is not None:
                command[4:4] = ["-b", str(bits)]
            subprocess.run(command, check=True, capture_output=True)
            public_line = Path(str(path) + ".pub").read_text().strip()
            cache[cache_key] = SSHKey(name, key_type, path, public_line)
        return cache[cache_key]

    return make


T = TypeVar("T")


@pytest.fixture
def in_store(redis_url: str, redis_prefix: str) -> Callable[[Callable[[Store], Awaitable[T]]], T]:
    """Run ``scenario(store)`` in a fresh event loop with a store under the test's own prefix."""

    def run(scenario: Callable[[Store], Awaitable[T]]) -> T:
        async def main() -> T:
            async with open_store(redis_url, prefix=redis_prefix) as store:
                return await scenario(store)

        return asyncio.run(main())

    return run


@pytest.fixture(name="make_cluster")
def fixture_make_cluster(tmp_path: Path, redis_url: str, redis_prefix: str) -> MakeCluster:
    """``relay_support.write_cluster`` in this test's folder, on its Redis prefix:
    ``make_cluster("alpha", "beta", required=1)`` writes the nodes' files and returns the nodes."""

    def make(*names: str, **options: Any) -> dict[str, Node]:
        return write_cluster(tmp_path, names, redis_url=redis_url, prefix=redis_prefix, **options)

    return make


@pytest.fixture(scope="module", name="star_cluster")
def fixture_star_cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: str
) -> Iterator[Callable[..., dict[str, Node]]]:
    """Start star clusters (``cluster_support.running_star``) on the session's Redis for one module.

    ``star_cluster("name", leaves=..., approvers=..., rules=...)`` writes one in a folder of its
    own and returns its nodes, services up; everything stops at the module's end.
    """
    with contextlib.ExitStack() as stack:

        def start(name: str = "star", **options: Any) -> dict[str, Node]:
            return stack.enter_context(running_star(tmp_path_factory.mktemp(name), redis_server, **options))

        yield start
