"""``mcp serve --http`` and ``mcp gateway --http`` say where they listen, as ``relay serve`` does.

Their default log level is ``warning`` (on stdio, stdout is the protocol and stderr stays quiet),
yet the start-up line is written whatever the level: a user who started an HTTP server sees its URL.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SSHKey
from relay_support import free_port

pytestmark = pytest.mark.slow

DEADLINE = 30.0


@pytest.fixture
def config(tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]) -> Path:
    key = ssh_key_factory("alpha")
    (tmp_path / "workspace").mkdir()
    path = tmp_path / "node.toml"
    path.write_text(
        f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\nredis_url = "redis://127.0.0.1:1/0"\n'
        'relay_url = "http://127.0.0.1:1"\ntoken = "mcp-startup-token-0123456789abcdef"\n'
        '[mcp.upstreams.up]\nurl = "http://127.0.0.1:1/mcp"\n'
    )
    return path


@pytest.mark.parametrize(("command", "what"), [("serve", "MCP server"), ("gateway", "MCP gateway")])
def test_the_http_server_names_its_url_at_start_up(config: Path, command: str, what: str) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "teaagent", "mcp", command, "--config", str(config), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stderr = process.stderr
    threading.Thread(target=lambda: [lines.put(line) for line in stderr], daemon=True).start()
    expected = (
        f"teaagent: the {what} of alpha serving on http://127.0.0.1:{port}/mcp (Ctrl-C or SIGTERM stops it)\n"
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + DEADLINE
        while expected not in seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, seen
            try:
                seen.append(lines.get(timeout=remaining))
            except queue.Empty:
                pytest.fail(f"no start-up line within {DEADLINE} s: {seen}")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=DEADLINE)
    assert code == 0
