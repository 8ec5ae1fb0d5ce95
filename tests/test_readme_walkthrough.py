"""README.md's "From `make demo` to your own cluster", followed as written: the README cannot drift.

The shell blocks of "Three nodes in three terminals" and "Approving with your own SSH key" are
read from the README and run by bash, line by line, as a newcomer would paste them: ``HOME`` is a
temporary folder (so ``~/tea`` and ``~/.ssh/id_ed25519`` are the test's), and ``teaagent`` is the
one on PATH beside this Python (what ``. .venv/bin/activate`` gives). Only what a reader supplies is
supplied: ``ID`` becomes the id ``teaagent approvals list`` shows, an operator key exists in
``~/.ssh`` (and is loaded into an ``ssh-agent``), and a call waits for each decision (the README's
own ``tools call``, started again when a block decides without one). Services (``... serve``) run
in the background until the test ends; when the README says to restart them, the test does.

What is asserted is what the README states: every command exits 0, an approved call runs (exit 0,
its output), a denied one exits 3 and does not run; the ID is in the listing. Progress wording is
not asserted: it may change without the README being wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the README end to end, on a loaded host

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SECTIONS = ("Three nodes in three terminals", "Approving with your own SSH key")
DEADLINE = 90.0  # seconds for a service to start, a request to arrive, a decided call to end
COMMAND_TIMEOUT = 60.0


def section(title: str) -> str:
    text = README.read_text()
    assert f"\n### {title}\n" in text, f"README.md has no section {title!r}"
    body = text.split(f"\n### {title}\n", 1)[1]
    return re.split(r"\n##+ ", body, maxsplit=1)[0]


def blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)


def commands(block: str) -> list[str]:
    """The block's commands: continued lines joined, a ``for ... done`` loop kept whole."""
    found: list[str] = []
    current = ""
    depth = 0
    for line in block.splitlines():
        if not line.strip():
            continue
        current = f"{current}\n{line}" if current else line
        words = line.split()
        depth += words[0] in ("for", "while", "if") if words else 0
        depth -= words[0] in ("done", "fi") if words else 0
        if depth == 0 and not line.rstrip().endswith("\\"):
            found.append(current)
            current = ""
    assert not current, f"an unfinished command in README.md: {current!r}"
    return found


def port_block(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports, below the ephemeral range.

    Drawn at random from a range the other tests' ``free_port`` (relay_support) reaches last, so
    that this walk-through's nine services meet no other test's.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        start = random.randrange(max(20_000, low - 8_000), low - count)
        if all(port_free(port) for port in range(start, start + count)):
            return start
    pytest.fail(f"no {count} consecutive free ports below {low}")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


@dataclass
class Background:
    """A command started in its own session, its output collected as it comes."""

    command: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def children(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    # the fields after the command's name, in parentheses: state, then ppid
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[1]) == self.process.pid:
                        found.append(int(entry.name))
        return found

    def stop_services(self) -> int:
        """SIGTERM to the services bash started, as Ctrl-C in their terminal: bash ends with them.

        Returns:
            bash's exit code: its foreground service's. The background one must be gone too.
        """
        children = self.children()
        for pid in children:
            os.kill(pid, signal.SIGTERM)
        code = self.process.wait(timeout=DEADLINE)
        deadline = time.monotonic() + DEADLINE
        for pid in children:
            while gone(pid) is False:
                assert time.monotonic() < deadline, f"process {pid} of {self.command!r} did not stop"
                time.sleep(0.05)
        return code

    def group(self) -> list[int]:
        """The live processes of the command's session (bash, what it started, what they started)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and not gone(int(entry.name)):
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[3]) == self.process.pid:  # its session id
                        found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """SIGTERM to the whole session, then SIGKILL to what is left of it a while later."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self.group():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)


class Reader:
    """Runs the README's commands as bash would, and keeps what a reader sees."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.work = home / "work"
        self.work.mkdir(parents=True)
        self.env = {
            **os.environ,
            "HOME": str(home),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.env.pop("TEAAGENT_CONFIG", None)
        self.services: list[Background] = []
        self.pending: Background | None = None
        self.pending_id: str | None = None
        self.first_call: str | None = None
        self.denied = False
        self.others: list[Background] = []

    def start(self, command: str) -> Background:
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        started = Background(command, process)
        threading.Thread(target=started.read, daemon=True).start()
        return started

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )

    def ok(self, command: str) -> str:
        done = self.run(command)
        assert done.returncode == 0, f"$ {command}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    # -- the kinds of command -----------------------------------------------------------------

    def serve(self, command: str) -> None:
        """``relay serve ... & approver serve ...``: in the background, until both say they serve."""
        service = self.start(command)
        self.services.append(service)
        expected = command.count(" serve ")
        deadline = time.monotonic() + DEADLINE
        while service.output.count(" serving on ") < expected:
            assert service.process.poll() is None, f"$ {command}\n{service.output}"
            assert time.monotonic() < deadline, f"$ {command}\n{service.output}"
            time.sleep(0.1)

    def restart_services(self) -> None:
        commands = [service.command for service in self.services]
        for service in self.services:
            assert service.stop_services() == 0, f"$ {service.command}\n{service.output}"
        self.services = []
        for command in commands:
            self.serve(command)

    def call(self, command: str) -> None:
        """A ``tools call`` that waits: in the background, until a decision ends it."""
        assert self.pending is None, "the README asks for a second call before the first was decided"
        self.first_call = self.first_call or command
        self.pending = self.start(command)
        self.pending_id = None

    def waiting_id(self, config: str) -> str:
        """The id of the request the pending call waits on, once it reached the deciding node."""
        assert self.pending is not None
        if self.pending_id is not None:
            return self.pending_id
        deadline = time.monotonic() + DEADLINE
        while True:
            assert self.pending.process.poll() is None, f"$ {self.pending.command}\n{self.pending.output}"
            listed = json.loads(self.ok(f"teaagent approvals list --json --config {config}"))
            waiting = [item for item in listed if item["origin"] == "alpha" and item["state"] == "pending"]
            if waiting:
                assert len(waiting) == 1, waiting
                self.pending_id = str(waiting[0]["request_id"])
                return self.pending_id
            assert time.monotonic() < deadline, f"no request reached {config}: {self.pending.output}"
            time.sleep(0.2)

    def decide(self, command: str) -> None:
        """A command that names ``ID``: the id of the waiting request (a call is made if none waits)."""
        if self.pending is None:
            assert self.first_call is not None, f"no call waits for {command!r}"
            self.call(self.first_call)
        config = re.search(r"--config (\S+)", command)
        assert config is not None, command
        request_id = self.waiting_id(config.group(1))
        output = self.ok(re.sub(r"\bID\b", request_id, command))
        words = command.split()
        if words[:2] != ["teaagent", "approvals"] or words[2] not in ("approve", "deny", "submit"):
            return  # `statement`: the decision comes later, with `submit`
        assert request_id[:8] in output, output  # what it decided is named
        self.denied = words[2] == "deny"
        if not self.denied:  # an approval is enough (1 of 2); denials end the call once all deny
            self.ended(command)

    def ended(self, command: str) -> None:
        """The pending call ends after ``command``: exit 3 and not run if denied, else exit 0."""
        assert self.pending is not None
        call = self.pending
        try:
            code = call.process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            pytest.fail(f"$ {call.command}\nstill waits {DEADLINE} s after\n$ {command}\n{call.output}")
        if self.denied:
            assert code == 3, f"$ {call.command}\nexit {code}\n{call.output}"
            ran = re.search(r'"command": "touch (\S+)"', call.command)
            if ran:
                assert not (self.home / "tea" / "alpha" / "workspace" / ran.group(1)).exists()
        else:
            assert code == 0, f"$ {call.command}\nexit {code}\n{call.output}"
            echoed = re.search(r'"command": "echo ([^"]+)"', call.command)
            if echoed:
                assert echoed.group(1) in call.output
        self.pending = None
        self.pending_id = None
        self.denied = False

    def listing(self, command: str) -> None:
        """``approvals list``: the waiting request's ID is in what it prints."""
        config = re.search(r"--config (\S+)", command)
        assert config is not None, command
        if self.pending is not None:
            request_id = self.waiting_id(config.group(1))
            assert request_id[:8] in self.ok(command)
        else:
            self.ok(command)

    def follow(self, command: str) -> None:
        words = command.split()
        if " serve " in command:
            self.serve(command)
        elif words[:3] == ["teaagent", "tools", "call"]:
            self.call(command)
        elif re.search(r"\bID\b", command):
            self.decide(command)
        elif words[:3] == ["teaagent", "approvals", "list"]:
            self.listing(command)
        else:
            self.ok(command)

    def stop(self) -> None:
        for started in [*self.services, *([self.pending] if self.pending else []), *self.others]:
            started.stop()


def test_the_readme_tells_how_to_reach_teaagent_after_make_demo() -> None:
    text = README.read_text()
    after_demo = text.split("make demo", 1)[1].split("\n## ", 1)[0]
    assert ". .venv/bin/activate" in after_demo
    assert ".venv/bin/teaagent" in after_demo


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="rw-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_readme_from_make_demo_to_your_own_cluster_runs_as_written(short_tmp: Path) -> None:
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("the README's ssh-agent step needs OpenSSH's ssh-agent and ssh-add")
    # A home as short as a newcomer's: each node's Redis socket lies under it (~/tea/alpha/data/redis/
    # redis.sock), and a socket's path must fit in 107 bytes, which pytest's tmp_path under xdist
    # does not leave.
    tmp_path = short_tmp
    home = tmp_path / "home"
    reader = Reader(home)
    # The nodes' ports: nine consecutive ones of this test process's own (8700-8708 may be another
    # program's); `teaagent init` reads $TEAAGENT_BASE_PORT as the README says.
    reader.env["TEAAGENT_BASE_PORT"] = str(port_block(9))
    # What the reader has already: an SSH key of their own, in an ssh-agent.
    (home / ".ssh").mkdir(mode=0o700)
    reader.ok("ssh-keygen -q -t ed25519 -N '' -C me@laptop -f ~/.ssh/id_ed25519")
    agent = reader.start(f"exec ssh-agent -D -a {tmp_path / 'agent.sock'}")
    reader.others.append(agent)
    reader.env["SSH_AUTH_SOCK"] = str(tmp_path / "agent.sock")
    deadline = time.monotonic() + DEADLINE
    # The socket's file exists a moment before the agent listens: wait until `ssh-add -l` reaches it
    # (it exits 2 only when no agent answers).
    while subprocess.run(["ssh-add", "-l"], env=reader.env, capture_output=True, check=False).returncode == 2:
        assert agent.process.poll() is None, agent.output
        assert time.monotonic() < deadline, agent.output
        time.sleep(0.05)
    reader.ok("ssh-add -q ~/.ssh/id_ed25519")

    followed: list[str] = []
    try:
        for title in SECTIONS:
            text = section(title)
            for block in blocks(text):
                for command in commands(block):
                    reader.follow(command)
                    followed.append(command)
                if reader.pending is not None and reader.denied:  # the block's denials end its call
                    reader.ended(followed[-1])
                # Where the README says to restart the services, the test does. Today it says that
                # `peers add` and `operators add` have the running services reload: nothing is
                # restarted, and the own-key approvals that follow prove the reload.
                after = text.split(block, 1)[1].removeprefix("```").split("```", 1)[0]
                if re.search(r"\brestart\b", after, flags=re.IGNORECASE):
                    reader.restart_services()
        assert reader.pending is None, "a call was left waiting"
        # Each service stops cleanly, exit 0 ("Ctrl-C or SIGTERM stops each service cleanly, exit 0").
        for service in reader.services:
            assert service.stop_services() == 0, f"$ {service.command}\n{service.output}"
            assert "Traceback" not in service.output, service.output
    finally:
        reader.stop()

    # The walk-through did what the README promises: three nodes, an approval, a denial, an
    # operator's own key (from a file, from ssh-agent, and with ssh-keygen alone).
    joined = "\n".join(followed)
    assert "teaagent init --cluster alpha,beta,gamma ~/tea" in joined
    for needed in (
        "approvals approve ID --config",
        "approvals deny ID",
        "--key ~/.ssh/id_ed25519",
        "--agent",
    ):
        assert needed in joined, needed
    assert "ssh-keygen -Y sign -n teaagent-approval" in joined
    assert "approvals submit ID" in joined
    audit = home / "tea" / "beta" / "data" / "approver-audit.jsonl"
    assert audit.exists(), sorted(str(p) for p in (home / "tea" / "beta" / "data").iterdir())
