"""``teaagent tools list|call --config node.toml``: the node's tools, and one call through the full gate."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from teaagent.audit import verify_log
from teaagent.cli._main import run
from teaagent.store import EmbeddedRedis


def write_node(
    folder: Path,
    ssh_key_factory: Callable[..., Any],
    *,
    mode: str = "workspace-write",
    quorum: bool = False,
    rate_limits: str = "",
) -> Path:
    """A node configuration of its own in ``folder``, with a workspace holding notes.txt."""
    key = ssh_key_factory("alpha")
    (folder / "workspace").mkdir(exist_ok=True)
    (folder / "workspace" / "notes.txt").write_text("remember the milk\n")
    text = f"""agent_id = "alpha"
private_key = "{key.private_path}"
redis_url = "embedded"
relay_url = "http://127.0.0.1:9"
workspace = "workspace"

[agent]
permission_mode = "{mode}"
provider = "scripted"
"""
    if rate_limits:
        text += f"\n[agent.rate_limits]\n{rate_limits}\n"
    if quorum:
        text += (
            '\n[quorum]\nenabled = true\nrequired_approvals = 2\nhigh_risk_patterns = ["shell.*"]\n'
            "timeout_seconds = 5\n"
        )
        for number, peer in enumerate(("beta", "delta", "gamma")):
            text += (
                f'\n[peers.{peer}]\npublic_key = "{ssh_key_factory(peer).public_line}"\n'
                f'relay_url = "http://127.0.0.1:{9100 + number}"\n'
            )
    path = folder / "alpha.toml"
    path.write_text(text)
    return path


@pytest.fixture
def node(tmp_path: Path, ssh_key_factory: Callable[..., Any]) -> Path:
    return write_node(tmp_path, ssh_key_factory)


def audit_records(folder: Path) -> list[dict[str, Any]]:
    path = folder / ".teaagent-alpha" / "audit" / "alpha.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- list ---------------------------------------------------------------------------------------------


def test_the_tools_are_listed_as_a_table(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["tools", "list", "--config", str(node)]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "tier", "read_only", "destructive", "high_risk"]
    assert [line.split() for line in lines[1:]] == [
        ["fs.read", "Low", "yes", "no", "no"],
        ["fs.write", "Medium", "no", "no", "no"],
        ["fs.list", "Low", "yes", "no", "no"],
        ["fs.search", "Low", "yes", "no", "no"],
        ["fs.delete", "High", "no", "yes", "no"],
        ["shell.run", "Critical", "no", "yes", "no"],
    ]


def test_the_high_risk_column_follows_the_quorum(
    tmp_path: Path, ssh_key_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_node(tmp_path, ssh_key_factory, quorum=True)

    assert run(["tools", "list", "--config", str(config), "--json"]) == 0

    rows = json.loads(capsys.readouterr().out)
    assert {row["name"]: row["high_risk"] for row in rows} == {
        "fs.read": False,
        "fs.write": False,
        "fs.list": False,
        "fs.search": False,
        "fs.delete": False,
        "shell.run": True,
    }
    assert set(rows[0]) == {"name", "tier", "read_only", "destructive", "high_risk", "description"}


def test_the_table_says_what_the_quorum_needs(
    tmp_path: Path, ssh_key_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_node(tmp_path, ssh_key_factory, quorum=True)

    assert run(["tools", "list", "--config", str(config)]) == 0

    out = capsys.readouterr().out
    assert out.endswith("\nhigh-risk calls need 2 approvals from 3 peers.\n")
    assert "shell.run  Critical  no         yes          yes" in out


# -- call ---------------------------------------------------------------------------------------------


def test_a_call_prints_the_result_as_json_and_nothing_else(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["tools", "call", "--config", str(node), "fs.read", '{"path": "notes.txt"}']) == 0

    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"content": "remember the milk\n", "size": 18, "truncated": False}
    assert captured.out.count("\n") == 1
    assert captured.err == ""


def test_a_call_is_on_the_nodes_audit_log(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(["tools", "call", "--config", str(node), "fs.write", '{"path": "a.txt", "content": "hi"}']) == 0
    )

    assert (node.parent / "workspace" / "a.txt").read_text() == "hi"
    records = audit_records(node.parent)
    assert [record["event_type"] for record in records] == ["tool_call", "tool_result"]
    assert records[0]["payload"]["tool_name"] == "fs.write"
    assert records[0]["run_id"].startswith("cli-")
    assert records[0]["payload"]["call_id"] == records[0]["run_id"] + "-1"
    assert verify_log(node.parent / ".teaagent-alpha" / "audit" / "alpha.jsonl").ok


def test_a_denied_call_exits_3_and_does_not_run(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["tools", "call", "--config", str(node), "fs.delete", '{"path": "notes.txt"}']) == 3

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "teaagent: fs.delete is destructive and the permission mode is workspace-write.\n"
    assert (node.parent / "workspace" / "notes.txt").exists()
    assert [record["event_type"] for record in audit_records(node.parent)] == ["approval_denied"]


def test_a_tool_that_fails_exits_1(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["tools", "call", "--config", str(node), "fs.read", '{"path": "missing.txt"}']) == 1

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "teaagent: fs.read: cannot read 'missing.txt': no such file or directory\n"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ('{"path": ', "The arguments are not valid JSON: Expecting value at column 10."),
        (
            '["notes.txt"]',
            'The arguments must be a JSON object such as \'{"path": "README.md"}\', not \'["notes.txt"]\'.',
        ),
        ('{"path": 3}', "fs.read: arguments are invalid"),
        ('{"path": "notes.txt", "extra": 1}', "fs.read: arguments are invalid"),
    ],
)
def test_bad_arguments_exit_2_with_one_sentence(
    node: Path, capsys: pytest.CaptureFixture[str], arguments: str, message: str
) -> None:
    assert run(["tools", "call", "--config", str(node), "fs.read", arguments]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"teaagent: {message}")
    assert captured.err.count("\n") == 1


def test_an_unknown_tool_exits_2(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["tools", "call", "--config", str(node), "fs.nope", "{}"]) == 2

    assert capsys.readouterr().err == "teaagent: no tool named 'fs.nope' is registered\n"


def test_a_missing_configuration_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["tools", "call", "--config", str(tmp_path / "none.toml"), "fs.read", "{}"]) == 2

    assert capsys.readouterr().err.startswith("teaagent: ")


def test_a_missing_workspace_exits_2(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (node.parent / "workspace" / "notes.txt").unlink()
    (node.parent / "workspace").rmdir()

    assert run(["tools", "list", "--config", str(node)]) == 2


def test_a_high_risk_call_without_a_quorum_fails_closed_with_exit_3(
    tmp_path: Path, ssh_key_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_node(tmp_path, ssh_key_factory, mode="danger-full-access", quorum=True)

    code = run(["tools", "call", "--config", str(config), "shell.run", '{"command": "touch made"}'])

    captured = capsys.readouterr()
    assert code == 3
    assert captured.out == ""
    assert "teaagent: shell.run needs 2 approvals from 3 peers but " in captured.err
    assert not (tmp_path / "workspace" / "made").exists()


def test_the_nodes_key_is_needed_only_by_a_high_risk_call(
    tmp_path: Path,
    ssh_key_factory: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = write_node(tmp_path, ssh_key_factory, mode="danger-full-access", quorum=True)
    locked = ssh_key_factory("alpha", passphrase="secret words")
    text = config.read_text().replace(str(ssh_key_factory("alpha").private_path), str(locked.private_path))
    config.write_text(text)
    monkeypatch.delenv("TEAAGENT_KEY_PASSPHRASE", raising=False)

    assert run(["tools", "call", "--config", str(config), "fs.read", '{"path": "notes.txt"}']) == 0
    capsys.readouterr()
    assert run(["tools", "call", "--config", str(config), "shell.run", '{"command": "touch made"}']) == 3
    assert (
        "shell.run needs 2 approvals from 3 peers but no quorum could be obtained: "
        in capsys.readouterr().err
    )
    assert not (tmp_path / "workspace" / "made").exists()


@pytest.mark.parametrize(
    ("tool", "arguments", "target", "sentence"),
    [
        (
            "fs.read",
            '{"path": "notes.txt"}',
            "cert.json",
            "fs.read needs no quorum on this node, so there is no certificate to save.",
        ),
        (
            "shell.run",
            '{"command": "touch made"}',
            "missing/cert.json",
            "the folder {folder}/missing does not exist.",
        ),
        (
            "shell.run",
            '{"command": "touch made"}',
            "workspace",
            "{folder}/workspace is a folder, not a file.",
        ),
    ],
)
def test_a_certificate_out_that_cannot_be_saved_exits_2_before_anything_is_asked(
    tmp_path: Path,
    ssh_key_factory: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
    tool: str,
    arguments: str,
    target: str,
    sentence: str,
) -> None:
    config = write_node(tmp_path, ssh_key_factory, mode="danger-full-access", quorum=True)

    code = run(
        [
            "tools",
            "call",
            "--config",
            str(config),
            tool,
            arguments,
            "--certificate-out",
            str(tmp_path / target),
        ]
    )

    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err == f"teaagent: --certificate-out: {sentence.format(folder=tmp_path)}\n"
    assert not (tmp_path / "workspace" / "made").exists()
    assert not (tmp_path / "cert.json").exists()


# -- rate limits shared through the node's Redis -------------------------------------------------------


def call_in_a_process(node: Path, tool: str, arguments: str) -> subprocess.CompletedProcess[str]:
    """``teaagent tools call`` as a process of its own: an agent process of the node."""
    return subprocess.run(
        [sys.executable, "-m", "teaagent", "tools", "call", "--config", str(node), tool, arguments],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_separate_processes_of_one_node_share_its_rate_limit_windows(
    tmp_path: Path, ssh_key_factory: Callable[..., Any]
) -> None:
    node = write_node(
        tmp_path, ssh_key_factory, rate_limits='"fs.read" = { max_calls = 2, window_seconds = 3600 }'
    )
    # The node's embedded Redis runs with its relay; this test process plays the relay's part.
    with EmbeddedRedis(tmp_path / ".teaagent-alpha") as server:
        calls = [call_in_a_process(node, "fs.read", '{"path": "notes.txt"}') for _ in range(3)]
        alive = server.pid is not None and redis.Redis.from_url(server.url).ping()

    assert [call.returncode for call in calls] == [0, 0, 1], [call.stderr for call in calls]
    assert calls[2].stderr.startswith(
        "teaagent: fs.read: rate limit of 2 calls per 3600 s reached; retry in "
    )
    assert alive  # the agents used the relay's server and left it running


@pytest.mark.slow
def test_without_the_relays_redis_a_limited_call_is_refused_and_no_server_is_started(
    tmp_path: Path, ssh_key_factory: Callable[..., Any]
) -> None:
    node = write_node(tmp_path, ssh_key_factory, rate_limits='"fs.read" = { max_calls = 2 }')
    limited = call_in_a_process(node, "fs.read", '{"path": "notes.txt"}')
    unlimited = call_in_a_process(node, "fs.list", "{}")

    assert limited.returncode == 1
    assert limited.stderr == (
        "teaagent: alpha's rate limits are counted in its embedded Redis, which runs with its relay: "
        f"start it (teaagent relay serve --config {node})\n"
    )
    assert unlimited.returncode == 0, unlimited.stderr
    assert not (tmp_path / ".teaagent-alpha" / "redis").exists()


def test_a_rate_limit_on_a_tool_the_node_lacks_exits_2(
    tmp_path: Path, ssh_key_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    node = write_node(tmp_path, ssh_key_factory, rate_limits='"fs.nope" = { max_calls = 1 }')
    assert run(["tools", "call", "--config", str(node), "fs.read", '{"path": "notes.txt"}']) == 2
    assert capsys.readouterr().err == (
        f"teaagent: {node}: agent.rate_limits names tools that are not workspace tools: fs.nope.\n"
    )


def test_listing_tools_does_not_start_redis_for_the_limits(
    tmp_path: Path, ssh_key_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    node = write_node(tmp_path, ssh_key_factory, rate_limits='"shell.run" = { max_calls = 1 }')
    assert run(["tools", "list", "--config", str(node)]) == 0
    assert "shell.run" in capsys.readouterr().out
    assert not (tmp_path / ".teaagent-alpha" / "redis").exists()
