"""``teaagent agent serve``: on [agent] port, loopback unless configured; a broken node is one sentence."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from agent_support import AgentProcess, write_node
from httpx_sse import connect_sse

from teaagent.cli._main import run


def test_a_missing_configuration_is_one_sentence_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["agent", "serve", "--config", str(tmp_path / "nope.toml")]) == 2
    assert (
        capsys.readouterr().err
        == f"teaagent: {tmp_path / 'nope.toml'}: the configuration file does not exist.\n"
    )


def test_a_workspace_that_is_not_a_folder_is_refused_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = write_node(tmp_path)
    node.workspace.rmdir()
    assert run(["agent", "serve", "--config", str(node.config_path)]) == 2
    assert "the workspace" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_listens_on_the_configured_port_of_the_loopback(tmp_path: Path) -> None:
    node = write_node(tmp_path)
    with AgentProcess(node, tmp_path):
        health = httpx.get(f"http://127.0.0.1:{node.port}/health", timeout=5)
        assert health.status_code == 200
        assert health.json()["workspace"] == str(node.workspace)
        # Loopback only: no other address of this host answers on the port.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.2:{node.port}/health", timeout=2)


@pytest.mark.slow
def test_sigterm_stops_the_runs_their_streams_end_with_the_result_and_the_service_exits_0(
    tmp_path: Path,
) -> None:
    node = write_node(tmp_path, turns=[{"content": "slow", "delay_seconds": 30}])
    process = AgentProcess(node, tmp_path).start()
    assert process.process is not None
    with (
        httpx.Client(base_url=node.url, headers=node.headers, timeout=20) as client,
        connect_sse(client, "POST", "/runs", json={"text": "go"}) as source,
    ):
        for event in source.iter_sse():
            if event.event == "model_request":
                started = time.monotonic()
                process.process.send_signal(signal.SIGTERM)
            if event.event == "result":
                result = json.loads(event.data)
    assert result["stop"] == "cancelled"
    assert process.process.wait(15) == 0
    assert time.monotonic() - started < 10


def test_a_port_in_use_is_one_sentence_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = write_node(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", node.port))
        holder.listen()
        assert run(["agent", "serve", "--config", str(node.config_path)]) == 2
    assert f"cannot listen on 127.0.0.1:{node.port}: the address is already in use" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "kill -9"])
def test_the_agent_service_restarted_serves_again_on_its_port(tmp_path: Path, how: str) -> None:
    """Nothing else is restarted with it: started again, it is ready on the same port (time printed)."""
    node = write_node(tmp_path)
    process = AgentProcess(node, tmp_path).start()
    assert process.process is not None
    if how == "kill -9":
        process.process.kill()
        process.process.wait(15)
    else:
        process.process.send_signal(getattr(signal, how))
        assert process.process.wait(15) == 0
    restarted = time.monotonic()
    with AgentProcess(node, tmp_path):
        ready = httpx.get(f"{node.url}/ready", timeout=5)
        healed = time.monotonic()
    print(f"\nagent service after {how}: ready {healed - restarted:.2f} s after its start")
    assert ready.status_code == 200, ready.text
