"""Redis for the test suite: one real server per session, and a key prefix of its own per test.

``redis_server`` (session) is the URL of an embedded Valkey started in a temporary folder, or of
the server named by ``TEAAGENT_TEST_REDIS_URL`` when that is set (CI with a Redis service).
``redis_url`` is the same URL for one test; ``redis_prefix`` is a fresh key prefix whose keys are
deleted when the test ends, so tests never see each other's keys, even running in parallel.
The functions carry a ``fixture_`` prefix and register under the plain names (``name=``), so a
test's ``redis_url`` parameter does not shadow an import (ruff F811). Bring all three into a test
module (or conftest.py) with
``from redis_fixture import fixture_redis_prefix, fixture_redis_server, fixture_redis_url  # noqa: F401``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from teaagent.store import EmbeddedRedis

TEST_REDIS_URL_VARIABLE = "TEAAGENT_TEST_REDIS_URL"


@pytest.fixture(scope="session", name="redis_server")
def fixture_redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of the session's Redis: ``TEAAGENT_TEST_REDIS_URL``, else an embedded server."""
    configured = os.environ.get(TEST_REDIS_URL_VARIABLE)
    if configured:
        yield configured
        return
    # A Docker-provided Redis (testcontainers) would slot in here; the embedded server needs nothing.
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
