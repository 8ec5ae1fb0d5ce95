"""``teaagent relay|approver|agent serve`` log no line per HTTP call unless ``--access-log`` is given:
a waiting caller's long-polls would otherwise fill the log."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from relay_support import free_port, wait_until, write_cluster

pytestmark = pytest.mark.slow

CALLS = 3


def _serve_and_call(tmp_path: Path, redis_url: str, redis_prefix: str, kind: str, flags: list[str]) -> str:
    """Run one service's serve command, call its /health CALLS times, stop it; return its output."""
    tmp_path.mkdir()
    nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=redis_url, prefix=redis_prefix)
    alpha = nodes["alpha"]
    port = free_port()
    (tmp_path / "workspace-alpha").mkdir(exist_ok=True)
    with alpha.config_path.open("a") as config:
        config.write('\n[agent]\nprovider = "scripted"\n')
    env = alpha.env()
    log_path = tmp_path / f"{kind}-{int(time.time() * 1000)}.log"
    command = [sys.executable, "-m", "teaagent", kind, "serve", "--config", str(alpha.config_path)]
    command += ["--port", str(port), "--log-level", "info", *flags]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return process.poll() is not None

        assert wait_until(answers, timeout=30), log_path.read_text()
        assert process.poll() is None, log_path.read_text()
        for _ in range(CALLS - 1):
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=20)
    return log_path.read_text()


@pytest.mark.parametrize("kind", ["relay", "approver", "agent"])
def test_serve_logs_calls_only_with_access_log(
    tmp_path: Path, redis_url: str, redis_prefix: str, kind: str
) -> None:
    quiet = _serve_and_call(tmp_path / "quiet", redis_url, redis_prefix, kind, [])
    assert '"GET /health HTTP/1.1" 200' not in quiet
    assert "Application startup complete" in quiet  # the log itself is on
    loud = _serve_and_call(tmp_path / "loud", redis_url, redis_prefix, kind, ["--access-log"])
    assert loud.count('"GET /health HTTP/1.1" 200') == CALLS
