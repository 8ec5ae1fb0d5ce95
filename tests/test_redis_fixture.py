"""The suite's Redis fixture: the embedded default, a configured URL, or a testcontainers container."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from redis_fixture import DEFAULT_TEST_REDIS_IMAGE, docker_redis

TESTS = Path(__file__).parent

PROBE = """
import redis
from redis_fixture import fixture_redis_prefix, fixture_redis_server, fixture_redis_url  # noqa: F401


def test_probe(redis_url: str, redis_prefix: str) -> None:
    assert redis.Redis.from_url(redis_url).ping()
"""


def run_probe(tmp_path: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    """Run a one-test pytest session that asks for the fixture, with ``environment`` added."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {key: value for key, value in os.environ.items() if not key.startswith("TEAAGENT_TEST_REDIS")}
    env.update(environment, PYTHONPATH=str(TESTS))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_probe.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def docker_reachable() -> bool:
    try:
        import docker

        return bool(docker.from_env(timeout=3).ping())
    except Exception:  # no SDK, no socket, no daemon: all mean no Docker here
        return False


@pytest.mark.slow
def test_the_embedded_server_is_the_default(tmp_path: Path) -> None:
    result = run_probe(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


@pytest.mark.slow
def test_a_configured_url_is_used_as_it_is(tmp_path: Path, redis_server: str) -> None:
    result = run_probe(tmp_path, TEAAGENT_TEST_REDIS_URL=redis_server, TEAAGENT_TEST_REDIS="nonsense")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_docker_without_an_engine_stops_the_session_with_one_sentence(tmp_path: Path) -> None:
    result = run_probe(
        tmp_path, TEAAGENT_TEST_REDIS="docker", DOCKER_HOST=f"unix://{tmp_path}/no-docker-here.sock"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "TEAAGENT_TEST_REDIS=docker, but no Docker engine answered" in result.stdout
    assert "passed" not in result.stdout


@pytest.mark.slow
def test_an_unknown_mode_stops_the_session_with_one_sentence(tmp_path: Path) -> None:
    result = run_probe(tmp_path, TEAAGENT_TEST_REDIS="podman")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "TEAAGENT_TEST_REDIS must be 'embedded' or 'docker', not 'podman'." in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(not docker_reachable(), reason="no Docker engine on this machine")
def test_a_container_serves_with_append_only_on() -> None:
    with docker_redis(DEFAULT_TEST_REDIS_IMAGE) as url:
        client = redis.Redis.from_url(url)
        assert client.ping()
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
