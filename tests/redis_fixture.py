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
import uuid
from collections.abc import Iterator

import pytest
import redis

from teaagent.store import EmbeddedRedis

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


@pytest.fixture(name="redis_prefix")
def fixture_redis_prefix(redis_server: str) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted after the test."""
    prefix = f"test:{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_server)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
