"""``teaagent agent serve``: on [agent] port, loopback unless configured; a broken node is one sentence."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from agent_support import AgentProcess, write_node

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
