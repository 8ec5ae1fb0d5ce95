"""The ``[mcp.upstreams.NAME]`` tables of node.toml: the MCP servers ``teaagent mcp gateway`` fronts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SSHKey

from teaagent.config import load_config
from teaagent.config._model import McpSettings, McpUpstream
from teaagent.errors import ConfigError


@pytest.fixture
def write(tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]) -> Callable[[str], Path]:
    key = ssh_key_factory("alpha")

    def make(mcp: str) -> Path:
        path = tmp_path / "node.toml"
        path.write_text(
            f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\n'
            f'relay_url = "http://127.0.0.1:8701"\n{mcp}'
        )
        return path

    return make


def test_without_an_mcp_table_there_are_no_upstreams(write: Callable[[str], Path]) -> None:
    assert load_config(write("")).mcp == McpSettings()
    assert load_config(write("[mcp]\n")).mcp.upstreams == {}


def test_a_command_and_a_url_upstream_in_file_order(write: Callable[[str], Path]) -> None:
    node = load_config(
        write(
            "[mcp.upstreams.github]\n"
            'command = ["python", "-m", "github_mcp"]\n'
            'env = { GITHUB_TOKEN = "secret-token" }\n'
            "[mcp.upstreams.files_2]\n"
            'url = "http://127.0.0.1:9000/mcp/"\n'
        )
    )
    assert list(node.mcp.upstreams) == ["github", "files_2"]
    github = node.mcp.upstreams["github"]
    assert github == McpUpstream(
        name="github", command=("python", "-m", "github_mcp"), env={"GITHUB_TOKEN": "secret-token"}
    )
    assert "secret-token" not in repr(github)  # an API key in env stays out of logs
    assert node.mcp.upstreams["files_2"] == McpUpstream(name="files_2", url="http://127.0.0.1:9000/mcp")


@pytest.mark.parametrize(
    ("table", "sentence"),
    [
        (
            "[mcp.upstreams.gh]\n",
            r"mcp.upstreams.gh needs exactly one of command \(a stdio server\) and url",
        ),
        (
            '[mcp.upstreams.gh]\ncommand = ["x"]\nurl = "http://127.0.0.1:1/mcp"\n',
            "mcp.upstreams.gh needs exactly one of command",
        ),
        ("[mcp.upstreams.gh]\ncommand = []\n", "mcp.upstreams.gh.command must name a program to run"),
        ('[mcp.upstreams.gh]\ncommand = "python server.py"\n', "command must be an array of strings"),
        (
            '[mcp.upstreams.gh]\nurl = "ftp://example.com/mcp"\n',
            "mcp.upstreams.gh.url must be an http:// or https:// URL",
        ),
        (
            '[mcp.upstreams.gh]\nurl = "http://127.0.0.1:1/mcp"\nenv = { A = "b" }\n',
            "mcp.upstreams.gh.env only applies to a command, not to a url",
        ),
        (
            '[mcp.upstreams.gh]\ncommand = ["x"]\nenv = { A = 1 }\n',
            r"mcp.upstreams.gh.env.A must be a string",
        ),
        (
            '[mcp.upstreams."git.hub"]\ncommand = ["x"]\n',
            r"mcp.upstreams.git.hub is not a usable upstream name",
        ),
        ('[mcp.upstreams.gh]\ncommand = ["x"]\ncwd = "/tmp"\n', r"unknown key mcp.upstreams.gh.cwd"),
        ("[mcp]\nupstream = 1\n", r"unknown key mcp.upstream \(did you mean mcp.upstreams\?\)"),
    ],
)
def test_a_broken_upstream_is_one_sentence_naming_the_key(
    write: Callable[[str], Path], table: str, sentence: str
) -> None:
    with pytest.raises(ConfigError, match=sentence):
        load_config(write(table))


def test_a_gateway_without_upstreams_is_a_usage_error(
    write: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from teaagent.cli._main import run

    path = write("")
    assert run(["mcp", "gateway", "--config", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"teaagent: {path} has no [mcp.upstreams.NAME] table, so the gateway has nothing to serve.\n"
    )
