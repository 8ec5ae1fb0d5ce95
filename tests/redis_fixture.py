"""Redis for the test suite: one real server per session, and a key prefix of its own per test.

``redis_server`` (session) is the URL of, in this order:

- the server named by ``TEAAGENT_TEST_REDIS_URL`` when that is set (CI with a Redis service);
- a container started by testcontainers when ``TEAAGENT_TEST_REDIS=docker`` (image
  ``TEAAGENT_TEST_REDIS_IMAGE``, default ``valkey/valkey:8``, append-only on); without a reachable
  Docker engine the session stops at once with one sentence, rather than failing every test;
- an embedded Valkey started in a temporary folder (``TEAAGENT_TEST_REDIS=embedded``, the default).

``redis_url`` is the same URL for one test; ``redis_prefix`` is a fresh key prefix whose keys are
deleted when the test ends, so tests never see each other's keys, even running in parallel.
The functions carry a ``fixture_`` prefix and register under the plain names (``name=``), so a
test's ``redis_url`` parameter does not shadow an import (ruff F811). Bring all three into a test
module (or conftest.py) with
``from redis_fixture import fixture_redis_prefix, fixture_redis_server, fixture_redis_url  # noqa: F401``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from port_support import free_port

from teaagent.store import EmbeddedRedis, find_server_binary

TEST_REDIS_URL_VARIABLE = "TEAAGENT_TEST_REDIS_URL"
TEST_REDIS_VARIABLE = "TEAAGENT_TEST_REDIS"  # embedded (default) or docker
TEST_REDIS_IMAGE_VARIABLE = "TEAAGENT_TEST_REDIS_IMAGE"
DEFAULT_TEST_REDIS_IMAGE = "valkey/valkey:8"
REDIS_PORT = 6379


class DockerUnavailableError(RuntimeError):
    """testcontainers was asked for, and there is no Docker engine to start a container with."""


@contextlib.contextmanager
def docker_redis(image: str) -> Iterator[str]:
    """Run ``image`` (a Redis or Valkey image) with append-only on; yield its URL; remove it after.

    Raises:
        DockerUnavailableError: testcontainers is not installed, or no Docker engine answers.
    """
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:
        try:
            from testcontainers.redis import RedisContainer  # before testcontainers 4.14
        except ImportError as exc:
            raise DockerUnavailableError(f"testcontainers is not installed ({exc})") from exc
    import docker.errors

    # The official images run their server with the arguments given when the first starts with "-".
    try:  # the container's Docker client is made here, so a missing engine shows here or at start
        container = RedisContainer(image, port=REDIS_PORT).with_command("--appendonly yes")
        container.start()
    except docker.errors.DockerException as exc:
        raise DockerUnavailableError(f"no Docker engine answered ({exc})") from exc
    try:
        host = container.get_container_host_ip()
        yield f"redis://{host}:{container.get_exposed_port(REDIS_PORT)}/0"
    finally:
        container.stop()


@pytest.fixture(scope="session", name="redis_server")
def fixture_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of the session's Redis (see the module: a configured URL, a container, or embedded)."""
    configured = os.environ.get(TEST_REDIS_URL_VARIABLE)
    if configured:
        yield configured
        return
    mode = os.environ.get(TEST_REDIS_VARIABLE, "embedded")
    if mode == "docker":
        image = os.environ.get(TEST_REDIS_IMAGE_VARIABLE, DEFAULT_TEST_REDIS_IMAGE)
        try:
            with docker_redis(image) as url:
                yield url
        except DockerUnavailableError as exc:
            pytest.exit(f"{TEST_REDIS_VARIABLE}=docker, but {exc}.", returncode=2)
        return
    if mode != "embedded":
        pytest.exit(f"{TEST_REDIS_VARIABLE} must be 'embedded' or 'docker', not {mode!r}.", returncode=2)
    with EmbeddedRedis(tmp_path_factory.mktemp("redis-session")) as server:
        yield server.url


@pytest.fixture(name="redis_url")
def fixture_redis_url(redis_server: str) -> str:
    """The session's Redis URL, for one test."""
    return redis_server


def new_prefix() -> str:
    """A key prefix no other test uses (``test:<12 hex digits>``)."""
    return f"test:{uuid.uuid4().hex[:12]}"


def delete_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (``<prefix>:*``) from the Redis at ``redis_url``."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@contextlib.contextmanager
def fresh_prefix(redis_url: str) -> Iterator[str]:
    """A :func:`new_prefix` whose keys are deleted from ``redis_url`` when the context ends."""
    prefix = new_prefix()
    try:
        yield prefix
    finally:
        delete_prefix(redis_url, prefix)


@pytest.fixture(name="redis_prefix")
def fixture_redis_prefix(redis_server: str) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted after the test."""
    with fresh_prefix(redis_server) as prefix:
        yield prefix


class RestartableRedis:
    """A Redis server of one test on a loopback port of its own: stopped and started again at will.

    ``append_only`` gives it an append-only file fsynced before every reply, so that it comes back
    with what it acknowledged; without, it comes back empty.
    """

    START_TIMEOUT = 20.0

    def __init__(self, folder: Path, *, append_only: bool = False) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        persistence = "appendonly yes\nappendfsync always\n" if append_only else "appendonly no\n"
        (folder / "valkey.conf").write_text(
            f'bind 127.0.0.1\nport {self.port}\ndir "{folder}"\n{persistence}save ""\ndaemonize no\n'
        )

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(find_server_binary()), str(self.folder / "valkey.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            deadline = time.monotonic() + self.START_TIMEOUT
            while not self._pings(client):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the test's Redis on port {self.port} did not start")
                time.sleep(0.02)
        finally:
            client.close()

    @staticmethod
    def _pings(client: redis.Redis) -> bool:
        with contextlib.suppress(redis.RedisError):
            return bool(client.ping())
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=self.START_TIMEOUT)
