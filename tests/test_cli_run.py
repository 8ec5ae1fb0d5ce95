"""``teaagent run --config node.toml "TASK"``: one agent run, shown as it goes, its exit code by status."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from teaagent.audit import verify_log
from teaagent.cli._main import run
from teaagent.llm import PRICE_FILE_FORMAT, PRICE_UNIT

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"


@pytest.fixture
def node(tmp_path: Path, ssh_key_factory: Callable[..., Any]) -> Path:
    key = ssh_key_factory("alpha")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("remember the milk\n")
    config = tmp_path / "alpha.toml"
    config.write_text(
        f"""agent_id = "alpha"
private_key = "{key.private_path}"
redis_url = "embedded"
relay_url = "http://127.0.0.1:9"
workspace = "workspace"

[agent]
permission_mode = "workspace-write"
provider = "scripted"
"""
    )
    return config


def teaagent_run(node: Path, *args: str) -> int:
    return run(["run", "--config", str(node), *args])


def test_a_completed_run_shows_its_steps_then_the_answer_and_exits_0(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = teaagent_run(node, "What do the notes say?", "--script", str(SCRIPTS / "read_notes.json"))

    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = captured.out
    assert "with scripted/scripted; at most 25 turns, 25 tool calls, 500 cents" in out
    assert "model (turn 1): I will read the notes." in out
    assert '→ fs.read {"path": "notes.txt"}' in out
    assert '← fs.read {"content": "remember the milk\\n", "size": 18, "truncated": false}' in out
    assert "cost so far 0.0000 cents (100 tokens in, 20 out)" in out
    assert out.rstrip().endswith(
        "The notes say: remember the milk.\n\n"
        "completed after 2 turns and 1 tool call; cost 0.0000 cents (250 tokens in, 30 out)"
    )
    assert captured.err == ""


def test_a_run_leaves_a_verified_audit_log_and_a_run_log(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        teaagent_run(node, "What do the notes say?", "--script", str(SCRIPTS / "read_notes.json"), "--json")
        == 0
    )

    result = json.loads(capsys.readouterr().out)
    audit = node.parent / ".teaagent-alpha" / "audit" / "alpha.jsonl"
    assert result["metadata"]["audit_log"] == str(audit)
    report = verify_log(audit)
    assert report.ok
    assert result["metadata"]["last_audit_hash"] == report.last_event_hash
    runs = list((node.parent / "workspace" / ".teaagent" / "runs").glob("*.jsonl"))
    assert [path.stem for path in runs] == [result["run_id"]]
    assert json.loads(runs[0].read_text().splitlines()[0])["label"] == "cli"


def test_json_prints_the_result_alone_on_stdout(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        teaagent_run(node, "What do the notes say?", "--script", str(SCRIPTS / "read_notes.json"), "--json")
        == 0
    )

    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["status"] == "completed"
    assert result["final_answer"] == {
        "content": "The notes say: remember the milk.",
        "metadata": {"stop_reason": "end_turn", "iteration": 2},
    }
    assert (result["iterations"], result["tool_calls"], result["input_tokens"]) == (2, 1, 250)
    assert "→ fs.read" in captured.err  # the progress went to stderr


def test_without_a_script_the_bundled_demo_plays(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert teaagent_run(node, "What is in the workspace?") == 0

    out = capsys.readouterr().out
    assert "→ fs.list" in out
    assert "This answer was played by the offline scripted provider" in out


def test_a_denied_call_exits_3(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = teaagent_run(node, "Clean up.", "--script", str(SCRIPTS / "delete_build.json"))

    captured = capsys.readouterr()
    assert code == 3
    assert "✗ fs.delete is destructive and the permission mode is workspace-write." in captured.out
    assert captured.err == (
        "teaagent: the run ended approval_denied: "
        "fs.delete is destructive and the permission mode is workspace-write.\n"
    )
    assert (node.parent / "workspace" / "notes.txt").exists()


def test_the_iteration_limit_exits_1(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = teaagent_run(
        node, "List.", "--script", str(SCRIPTS / "list_forever.json"), "--max-iterations", "2"
    )

    assert code == 1
    assert capsys.readouterr().err == (
        "teaagent: the run ended limit_exceeded: The run stopped at its limit of 2 iterations.\n"
    )


def test_a_cost_cap_of_zero_exits_1_before_any_model_call(
    node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps(
            {
                "format": PRICE_FILE_FORMAT,
                "unit": PRICE_UNIT,
                "providers": {"scripted": {"default": {"input": 0.01, "output": 0.01}}},
            }
        )
    )
    monkeypatch.setenv("TEAAGENT_PRICES_FILE", str(prices))

    code = teaagent_run(
        node, "List.", "--script", str(SCRIPTS / "read_notes.json"), "--max-cost-cents", "0", "--json"
    )

    captured = capsys.readouterr()
    assert code == 1
    result = json.loads(captured.out)
    assert (result["status"], result["iterations"]) == ("cost_exceeded", 0)
    assert "model turn" not in captured.err


def test_a_question_nobody_can_answer_is_declined(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert teaagent_run(node, "Paint it.", "--script", str(SCRIPTS / "ask_colour.json")) == 0

    out = capsys.readouterr().out
    assert "? Which colour?" in out
    assert "(declined)" in out


def test_a_session_carries_the_conversation_between_runs(
    node: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    second = tmp_path / "second.json"
    second.write_text(json.dumps([{"content": "You said: I am Ada.", "expect": ["I am Ada.", "Hello."]}]))
    first = tmp_path / "first.json"
    first.write_text(json.dumps([{"content": "Hello."}]))

    assert teaagent_run(node, "I am Ada.", "--script", str(first), "--session", "s1") == 0
    assert teaagent_run(node, "Who am I?", "--script", str(second), "--session", "s1") == 0

    saved = json.loads((node.parent / "workspace" / ".teaagent" / "sessions" / "s1.json").read_text())
    assert [message["content"] for message in saved["messages"]] == [
        "I am Ada.",
        "Hello.",
        "Who am I?",
        "You said: I am Ada.",
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--provider", "nope"], "teaagent: Unknown LLM provider 'nope'; choose one of: "),
        (
            ["--provider", "openai", "--script", "x.json"],
            "teaagent: --script plays a script with the scripted provider; the provider here is openai.",
        ),
        (["--max-iterations", "0"], "teaagent: max_iterations must be >= 1, not 0."),
        (
            ["--script", "missing.json"],
            "teaagent: The script missing.json cannot be read: No such file or directory.",
        ),
        (["--session", "a/b"], "teaagent: session id 'a/b' must be 1 to 64 letters"),
    ],
)
def test_bad_usage_exits_2_with_one_sentence(
    node: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert teaagent_run(node, "Task.", *args) == 2

    captured = capsys.readouterr()
    assert captured.err.startswith(message)
    assert captured.err.count("\n") == 1


def test_a_provider_without_its_key_exits_2(
    node: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    assert teaagent_run(node, "Task.", "--provider", "openai") == 2
    assert capsys.readouterr().err == "teaagent: Set OPENAI_API_KEY to use the openai provider.\n"


@pytest.mark.slow
def test_teaagent_run_as_a_process(node: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "teaagent",
            "run",
            "--config",
            str(node),
            "What do the notes say?",
            "--script",
            str(SCRIPTS / "read_notes.json"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["final_answer"]["content"] == "The notes say: remember the milk."


def test_a_high_risk_call_shows_the_quorum_it_waits_for_then_the_denial(
    node: Path, tmp_path: Path, ssh_key_factory: Callable[..., Any], capsys: pytest.CaptureFixture[str]
) -> None:
    text = node.read_text().replace('"workspace-write"', '"danger-full-access"')
    text += '\n[quorum]\nenabled = true\nrequired_approvals = 2\nhigh_risk_patterns = ["shell.*"]\n'
    text += "timeout_seconds = 5\n"
    for number, peer in enumerate(("beta", "delta", "gamma")):
        text += f'\n[peers.{peer}]\npublic_key = "{ssh_key_factory(peer).public_line}"\n'
        text += f'relay_url = "http://127.0.0.1:{9100 + number}"\n'
    node.write_text(text)
    script = tmp_path / "shell.json"
    script.write_text(
        json.dumps([{"tool_calls": [{"tool_name": "shell.run", "arguments": {"command": "touch made"}}]}])
    )

    code = teaagent_run(node, "Touch a file.", "--script", str(script))

    out = capsys.readouterr().out
    assert code == 3
    assert "shell.run waits for 2 approvals from 3 peers (beta, delta, gamma), up to 5s…" in out
    assert "✗ shell.run needs 2 approvals from 3 peers but no quorum could be obtained: the relay at " in out
    assert not (node.parent / "workspace" / "made").exists()
