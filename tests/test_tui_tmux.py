"""The real ``teaagent tui`` on a real terminal, as a person uses it: tmux types (send-keys) and reads
the screen (capture-pane).

One session of alpha's TUI: a task whose ``shell.run`` waits for 2 of beta and gamma, with the live
line showing beta's signature and the time left counting down until gamma's operator signs; a
second task whose wait is withdrawn with Ctrl-C; a request of beta's approved from ``/inbox``; and
``/quit``. The relays are served by this process, the approvers are real processes, the model is
the offline scripted provider (``TEAAGENT_LLM_SCRIPT``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_tui_quorum import Cluster, cluster, pending_for, shell  # noqa: F401  (the module's cluster fixture)

from teaagent.quorum import sign_request
from teaagent.relay_client import RelayClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]

WAIT = 30.0
EXIT_RECORDER = """
import signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
code = subprocess.call(sys.argv[2:], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
open(sys.argv[1] + ".tmp", "w").write(str(code))
__import__("os").replace(sys.argv[1] + ".tmp", sys.argv[1])
"""
LIVE_ONE_OF_TWO = (
    r"shell\.run: 1 approval of the 2 needed +\[✓ beta +… gamma\] +(\d+)m (\d\d)s left · Ctrl-C withdraws"
)
WIDTH, HEIGHT = 160, 50


class Tmux:
    """One tmux server of this test's own (its own socket), running one command in one pane."""

    def __init__(self, folder: Path) -> None:
        self.socket = f"teaagent-tui-{uuid.uuid4().hex[:8]}"
        self.session = "tui"
        self.folder = folder
        self.exit_file = folder / "tui-exit-code"

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start(self, command: list[str], env: dict[str, str]) -> None:
        # A small parent writes the TUI's exit code to a file: tmux 3.3 does not always record the
        # status of a dead pane. The parent ignores Ctrl-C; the TUI gets it, as from a terminal.
        argv = ["env", "-i", *(f"{name}={value}" for name, value in env.items())]
        argv += [sys.executable, "-c", EXIT_RECORDER, str(self.exit_file), *command]
        self.tmux(
            "set-option", "-g", "remain-on-exit", "on", ";",
            "new-session", "-d", "-s", self.session, "-x", str(WIDTH), "-y", str(HEIGHT), *argv,
        )  # fmt: skip

    def exit_status(self, timeout: float = WAIT) -> int:
        """The TUI's exit code, once it has exited."""
        deadline = time.monotonic() + timeout
        while not self.exit_file.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"the TUI has not exited:\n{self.history()}")
            time.sleep(0.1)
        return int(self.exit_file.read_text())

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", self.session, "-l", line)
        self.tmux("send-keys", "-t", self.session, "Enter")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-t", self.session)

    def history(self) -> str:
        """The whole scrollback and the screen."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", self.session)

    def wait_for(self, pattern: str, *, timeout: float = WAIT, whole: bool = False) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            text = self.history() if whole else self.screen()
            found = re.search(pattern, text, re.M)
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} never appeared on the screen:\n{self.history()}")
            time.sleep(0.1)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Tmux]:
    screen = Tmux(tmp_path)
    try:
        yield screen
    finally:
        (tmp_path / "screen.txt").write_text(_safe_history(screen))
        screen.kill()


def _safe_history(screen: Tmux) -> str:
    try:
        return screen.history()
    except (RuntimeError, subprocess.SubprocessError):
        return ""


def test_a_session_in_tmux_runs_a_task_shows_the_quorum_live_withdraws_approves_and_quits(
    cluster: Cluster,  # noqa: F811
    terminal: Tmux,
    tmp_path: Path,
) -> None:
    alpha, beta = cluster.alpha, cluster.nodes["beta"]
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [shell("echo cleaned"), {"content": "Cleaned.", "expect": ["cleaned"]}, shell("make deploy")]
        )
    )
    env = {
        "TEAAGENT_LLM_SCRIPT": str(script),
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "TERM": "xterm-256color",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    command = [
        sys.executable, "-m", "teaagent", "tui", "--config", str(alpha.config_path),
        "--permission", "danger-full-access", "--database", str(tmp_path / "db"),
    ]  # fmt: skip
    terminal.start(command, env)
    terminal.wait_for(r"Type a task, or /help for the commands\.")
    terminal.wait_for(r"^›")  # the prompt (capture-pane drops the blank after it)

    # 1. A task whose shell.run needs beta and gamma: beta's rule signs, gamma's operator is slower.
    terminal.type("clean up")
    live = terminal.wait_for(LIVE_ONE_OF_TWO)
    first_left = int(live.group(1)) * 60 + int(live.group(2))
    screen = terminal.screen()
    assert re.search(r"^Running echo cleaned\.$", screen, re.M), screen  # streamed word by word, one line
    assert re.search(r"^→ shell\.run \{\"command\": \"echo cleaned\"\}$", screen, re.M), screen
    assert re.search(
        r"^  ✓ beta approved \(key SHA256:\S+, \d+\.\d s after asking\): 1 approval of the 2 needed\.$",
        screen,
        re.M,
    ), screen
    # The time left counts down on the same line, redrawn in place.
    deadline = time.monotonic() + WAIT
    while True:
        later = terminal.wait_for(LIVE_ONE_OF_TWO)
        if int(later.group(1)) * 60 + int(later.group(2)) < first_left:
            break
        assert time.monotonic() < deadline, "the time left did not move"
        time.sleep(0.2)
    assert terminal.screen().count("left · Ctrl-C withdraws") == 1  # one line, redrawn, not one a second
    request_id = pending_for(cluster, "gamma", "shell.run", "echo cleaned")
    with cluster.approver("gamma") as client:
        client.approve(request_id)
    terminal.wait_for(
        r"^  ✓ gamma approved \(key SHA256:\S+, \d+\.\d s after asking\): 2 approvals of the 2 needed\.$"
    )
    terminal.wait_for(r"^✓ quorum reached for shell\.run: signed by beta, gamma; the certificate is verified")
    terminal.wait_for(r'^← shell\.run \{"exit_code": 0, "stderr": "", "stdout": "cleaned\\n"')
    terminal.wait_for(r"^Cleaned\.$")
    terminal.wait_for(r"^completed · 2 turns · 1 tool call · 0\.0000 cents · answered by scripted/scripted$")
    assert "left · Ctrl-C withdraws" not in terminal.screen()  # the live line went with the wait

    # 2. A task whose wait nobody answers: Ctrl-C withdraws it, the run ends with the refusal.
    terminal.type("deploy")
    terminal.wait_for(
        r"shell\.run: 0 approvals of the 2 needed +\[… beta +… gamma\] +\d+m \d\ds left · Ctrl-C withdraws"
    )
    terminal.keys("C-c")
    terminal.wait_for(r"^Withdrawing request [0-9a-f]{12}: shell\.run will not run, the peers drop it,")
    terminal.wait_for(
        r"^The run ended approval_denied: shell\.run was not run: the wait for its quorum was stopped\. "
        r"Withdrawn: request [0-9a-f]{32} of shell\.run; the peers drop it\.$"
    )
    terminal.type("/quorum")
    terminal.wait_for(r"^[0-9a-f]{12} +shell\.run +withdrawn +- +- +2 approvals from 2 peers ")
    terminal.wait_for(r"^[0-9a-f]{12} +shell\.run +approved +beta, gamma +- +2 approvals from 2 peers ")

    # 3. A request of beta's, approved from the inbox.
    request = beta.request(arguments={"command": "make release"}, call_id="tmux-1")
    with RelayClient(beta.url, token=beta.token) as relay:
        relay.submit_request(request, sign_request(request, beta.key))
    with cluster.approver("alpha") as client:
        deadline = time.monotonic() + WAIT
        while not any(item.request_id == request["request_id"] for item in client.list_requests("pending")):
            assert time.monotonic() < deadline, "beta's request never reached alpha's approver"
            time.sleep(0.05)
    terminal.type("/inbox")
    arguments = re.escape('{"command": "make release"}')
    terminal.wait_for(
        rf"^{request['request_id']} +beta +shell\.run +\d+m \d\ds +ask \(no rule\) +{arguments}$"
    )
    terminal.type(f"/approve {request['request_id'][:10]}")
    terminal.wait_for(rf"^alpha approved request {request['request_id']} of beta: signed with .*key SHA256:")
    with RelayClient(beta.url, token=beta.token) as relay:
        outcome = relay.wait_outcome(request["request_id"], 10)
    assert (outcome.state, outcome.signers) == ("approved", ("alpha",))

    # 4. Leave.
    terminal.type("/quit")
    terminal.wait_for(r"^Goodbye\.$")
    assert terminal.exit_status() == 0
    state = json.loads((tmp_path / "db" / ".teaagent" / "tui_state.json").read_text())
    assert state["permission_mode"] == "danger-full-access"
    assert "Traceback" not in terminal.history()
