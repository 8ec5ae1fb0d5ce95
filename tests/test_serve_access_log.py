"""``teaagent relay|approver|agent serve`` log no line per HTTP call unless ``--access-log`` is given:
a waiting caller's long-polls would otherwise fill the log."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from relay_support import ServiceProcess, free_port, write_cluster

from teaagent._http import client_verify

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
    service = ServiceProcess(
        kind,
        alpha.config_path,
        tmp_path,
        port=port,
        env=alpha.env(),
        label=kind,
        args=["--port", str(port), "--log-level", "info", *flags],
    )
    service.ready_timeout = 30.0  # an agent service starts in seconds on a loaded host
    with service:  # waiting for it to answer is the first call
        for _ in range(CALLS - 1):
            assert httpx.get(f"{service.url}/health", timeout=5, verify=client_verify()).status_code == 200
    return service.log_path.read_text()


@pytest.mark.parametrize("kind", ["relay", "approver", "agent"])
def test_serve_logs_calls_only_with_access_log(
    tmp_path: Path, redis_url: str, redis_prefix: str, kind: str
) -> None:
    quiet = _serve_and_call(tmp_path / "quiet", redis_url, redis_prefix, kind, [])
    assert '"GET /health HTTP/1.1" 200' not in quiet
    assert "Application startup complete" in quiet  # the log itself is on
    loud = _serve_and_call(tmp_path / "loud", redis_url, redis_prefix, kind, ["--access-log"])
    assert loud.count('"GET /health HTTP/1.1" 200') == CALLS
