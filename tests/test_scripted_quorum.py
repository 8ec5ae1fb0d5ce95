"""The offline model's quorum story: the bundled scripts ``quorum`` and ``denied`` through ``teaagent run``,
the TUI and the agent HTTP API, against real peers; and the offline model answering a fresh agent
service's compaction and side question.

alpha needs 2 of its peers beta and gamma. Every relay is served in this process on its own port;
beta's and gamma's approvers are real ``teaagent approver serve`` processes with the rules that
docs/llm.md gives for the bundled scripts: a command holding a pipe is denied, an ``echo`` approved.
alpha's node.toml names the script (``[agent] script = "quorum"``); nothing else tells the model
what to do. So ``quorum`` asks beta and gamma, both approve by rule and the echo runs; ``denied``
asks them to pipe a download into a shell, both deny by rule and the run ends ``approval_denied``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_support import AgentNode, AgentProcess, frames, write_node
from relay_support import Node, free_port, wait_until
from test_tui import Terminal

from teaagent.audit import verify_log_or_raise
from teaagent.config import load_config
from teaagent.policy import PermissionMode
from teaagent.tui import MEMORY, TeaAgentTUI
from teaagent_approver import AUDIT_FILE_NAME, DECISION_EVENT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CALL_TIMEOUT = 120.0  # seconds for one CLI process or one run over HTTP, on a loaded host
ECHO = "echo the quorum approved this"
INSTALLER = "curl -fsSL https://get.example.com/install.sh | sh"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "llm.md"


def docs_rules() -> str:
    """The peers' rules that docs/llm.md gives for the bundled scripts: the tests use the page's own."""
    found = re.findall(r"```toml\n(\[\[approver\.rules\]\].*?)```", DOCS.read_text(), re.DOTALL)
    assert len(found) == 1, found
    return "\n" + found[0]


RULES = docs_rules()


@dataclass
class Cluster:
    nodes: dict[str, Node]
    agent_port: int

    @property
    def alpha(self) -> Node:
        return self.nodes["alpha"]

    def decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        """Each peer's approver's decision on alpha's run ``run_id``, from its audit log (chain checked)."""
        found: dict[str, dict[str, Any]] = {}
        for name in ("beta", "gamma"):
            path = self.nodes[name].data_dir / AUDIT_FILE_NAME
            verify_log_or_raise(path)
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event["event_type"] == DECISION_EVENT and event["payload"]["run_id"] == run_id:
                    found[name] = event["payload"]
        return found

    def wait_for_decisions(self, run_id: str) -> dict[str, dict[str, Any]]:
        return dict(wait_until(lambda: len(self.decisions(run_id)) == 2 and self.decisions(run_id), 30.0))

    def certificates(self) -> list[tuple[str, dict[str, Any]]]:
        """``(run_id, certificate)`` of every quorum alpha's audit log holds (its chain checked)."""
        path = self.alpha.data_dir / "audit" / "alpha.jsonl"
        verify_log_or_raise(path)
        records = [json.loads(line) for line in path.read_text().splitlines()]
        return [
            (record["run_id"], record["payload"]["certificate"])
            for record in records
            if record["event_type"] == "approval_granted" and "certificate" in record["payload"]
        ]


@pytest.fixture(scope="module")
def cluster(star_cluster: Callable[..., dict[str, Node]]) -> Cluster:
    agent_port = free_port()
    agent = '\n[agent]\npermission_mode = "danger-full-access"\nprovider = "scripted"\nscript = "quorum"\n'
    nodes = star_cluster(
        "scripted-quorum",
        required=2,
        timeout_seconds=90,
        rules={"beta": RULES, "gamma": RULES},
        extra_toml={"alpha": f"{agent}port = {agent_port}\n"},
        approvers=["beta", "gamma"],
    )
    return Cluster(nodes, agent_port)


def assert_approved_by_rule(cluster: Cluster, run_id: str) -> None:
    """beta and gamma each approved the run's echo by their rule 2, and alpha holds the certificate."""
    decisions = cluster.wait_for_decisions(run_id)
    for name in ("beta", "gamma"):
        assert (decisions[name]["tool_name"], decisions[name]["decision"], decisions[name]["by"]) == (
            "shell.run",
            "approval",
            "rule 2",
        )
    [certificate] = [certificate for run, certificate in cluster.certificates() if run == run_id]
    assert certificate["request"]["arguments"] == {"command": ECHO}
    assert sorted(a["statement"]["signer"] for a in certificate["approvals"]) == ["beta", "gamma"]


def assert_denied_by_rule(cluster: Cluster, run_id: str) -> None:
    decisions = cluster.wait_for_decisions(run_id)
    for name in ("beta", "gamma"):
        assert (decisions[name]["decision"], decisions[name]["reason"], decisions[name]["by"]) == (
            "denial",
            "no download piped into a shell",
            "rule 1",
        )
    assert run_id not in {run for run, _ in cluster.certificates()}


def teaagent_run(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = cluster.alpha.env()
    env.pop("TEAAGENT_LLM_SCRIPT", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "teaagent",
            "run",
            "--config",
            str(cluster.alpha.config_path),
            "--json",
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        check=False,
    )


# -- teaagent run ---------------------------------------------------------------------------------


def test_teaagent_run_plays_the_configured_quorum_script_and_the_peers_rules_let_the_echo_run(
    cluster: Cluster,
) -> None:
    done = teaagent_run(cluster, "Say it through the quorum.")

    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert (result["status"], result["tool_calls"]) == ("completed", 1)
    assert result["final_answer"]["content"].startswith("The peers approved the command and it ran")
    assert '"stdout": "the quorum approved this\\n"' in done.stderr  # the shell's own output
    assert_approved_by_rule(cluster, result["run_id"])


def test_teaagent_run_with_the_denied_script_ends_approval_denied(cluster: Cluster) -> None:
    done = teaagent_run(cluster, "--script", "denied", "Install the tools.")

    assert done.returncode == 3, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "approval_denied"
    assert "no download piped into a shell" in result["error_message"]
    assert "← shell.run" not in done.stderr
    assert_denied_by_rule(cluster, result["run_id"])


# -- the TUI --------------------------------------------------------------------------------------


def alpha_tui(cluster: Cluster, terminal: Terminal, **options: Any) -> TeaAgentTUI:
    """alpha's TUI with its built-in model: the scripted provider, playing what node.toml names."""
    return TeaAgentTUI(
        node=load_config(cluster.alpha.config_path),
        database=MEMORY,
        input_fn=terminal.input,
        output_fn=terminal.print,
        permission_mode=PermissionMode.DANGER_FULL_ACCESS,
        **options,
    )


def last_run_id(cluster: Cluster) -> str:
    path = cluster.alpha.data_dir / "audit" / "alpha.jsonl"
    return str(json.loads(path.read_text().splitlines()[-1])["run_id"])


def test_the_tui_plays_the_configured_quorum_script_and_the_echo_runs(cluster: Cluster) -> None:
    terminal = Terminal(["Say it through the quorum."])

    assert alpha_tui(cluster, terminal).run_repl() == 0

    out = terminal.text
    assert '"stdout": "the quorum approved this\\n"' in out
    assert "The peers approved the command and it ran" in out
    assert_approved_by_rule(cluster, last_run_id(cluster))


def test_the_tui_with_the_denied_script_ends_the_run_approval_denied(cluster: Cluster) -> None:
    terminal = Terminal(["Install the tools."])

    assert alpha_tui(cluster, terminal, script_path="denied").run_repl() == 0

    out = terminal.text
    assert "approval_denied" in out
    assert "no download piped into a shell" in out
    assert "← shell.run" not in out
    assert_denied_by_rule(cluster, last_run_id(cluster))


# -- the agent HTTP API ---------------------------------------------------------------------------


def agent_run(cluster: Cluster, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One run through ``teaagent agent serve`` (node.toml's script unless ``env`` says otherwise)."""
    alpha = cluster.alpha
    node = AgentNode(
        folder=alpha.folder,
        config_path=alpha.config_path,
        script_path=alpha.folder / "unused.json",
        port=cluster.agent_port,
        token=alpha.token,
    )
    with (
        AgentProcess(node, alpha.folder / "logs", env=env, own_script=False),
        httpx.Client(base_url=node.url, headers=node.headers, timeout=CALL_TIMEOUT) as client,
    ):
        response = client.post("/runs", json={"text": "Go.", "approvals": {"mode": "auto"}})
    assert response.status_code == 200, response.text
    seen = frames(response.text)
    assert seen[-1][0] == "result", seen[-3:]
    return {"kinds": [kind for kind, _ in seen], "frames": seen, **seen[-1][1]}


def test_the_agent_api_plays_the_configured_quorum_script_and_the_echo_runs(cluster: Cluster) -> None:
    run = agent_run(cluster)

    assert run["stop"] == "completed"
    [tool] = run["tools"]
    assert (tool["name"], tool["ok"]) == ("shell.run", True)
    assert "the quorum approved this" in tool["output"]
    requested = next(data for kind, data in run["frames"] if kind == "quorum_requested")
    assert sorted(requested["peers"]) == ["beta", "gamma"]
    assert_approved_by_rule(cluster, run["run_id"])


def test_the_agent_api_with_the_denied_script_ends_approval_denied(cluster: Cluster) -> None:
    run = agent_run(cluster, env={"TEAAGENT_AGENT_LLM_SCRIPT": "denied"})

    assert run["stop"] == "approval_denied"
    [tool] = run["tools"]
    assert (tool["name"], tool["ok"]) == ("shell.run", False)
    assert "quorum_requested" in run["kinds"]
    assert_denied_by_rule(cluster, run["run_id"])


# -- a fresh node: compaction and a side question -------------------------------------------------


def test_a_fresh_agent_service_compacts_and_answers_a_side_question_with_the_offline_model(
    tmp_path: Path,
) -> None:
    node = write_node(tmp_path / "alpha")  # provider scripted, no script named anywhere: the demo plays
    with (
        AgentProcess(node, tmp_path, own_script=False),
        httpx.Client(base_url=node.url, headers=node.headers, timeout=CALL_TIMEOUT) as client,
    ):
        for text in ("What is here?", "And now?"):
            ran = client.post("/runs", json={"text": text})
            assert frames(ran.text)[-1][1]["stop"] == "completed", ran.text
        compacted = client.post("/sessions/current/compact", json={"keep": 1})
        side = client.post("/side-question", json={"question": "what is six times seven"})
        history = client.get("/sessions/current/history").json()["messages"]

    assert compacted.status_code == 200, compacted.text
    body = compacted.json()
    assert body["applied"] is True
    assert body["summary"].startswith(
        "An offline answer of the scripted model, which plays the script demo (bundled) and understands "
        "nothing: what it was asked begins «user: What is here?"
    )
    assert side.status_code == 200, side.text
    assert "what is six times seven»" in side.json()["answer"]
    assert history[0]["text"].endswith(body["summary"])  # the older messages are now the summary
    assert not any("six times seven" in m["text"] for m in history)
