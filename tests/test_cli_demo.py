"""``teaagent demo`` as a user runs it: the story's facts, its evidence, and nothing left running.

Each test runs the real command (``python -m teaagent demo``) in a process group of its own, as a
terminal runs a foreground job, so a Ctrl-C is the terminal's: SIGINT to the whole group. Every
process the demo starts inherits a marker in its environment; after the demo exits, no process on
the machine may still carry it (relays, approvers, the agent, the embedded Redis, any command).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from interrupt_support import children_born

from teaagent.audit import verify_log
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.quorum import verify_certificate
from teaagent.signing import fingerprint

MARK = "TEAAGENT_DEMO_TEST_MARK"
DEADLINE = 240.0  # seconds for a whole demo on a loaded machine; it takes 20-60 s
SERVICES = 8  # four relays and four approvers


def marked(mark: str) -> list[int]:
    """The processes alive now whose environment carries ``MARK=mark`` (zombies have none)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environment = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if needle in environment.split(b"\0"):
            found.append(int(entry.name))
    return found


def described(pids: list[int]) -> list[str]:
    """Each process as ``pid: command line`` (``pid: gone`` once it exited): what an assertion that
    none is left names when one is."""
    lines = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            command = "gone"
        lines.append(f"{pid}: {command.strip()}")
    return lines


class Demo:
    """``teaagent demo --dir FOLDER [ARGS]`` in its own process group, its output read as it comes."""

    def __init__(self, folder: Path, *args: str) -> None:
        self.folder = folder
        self.mark = secrets.token_hex(8)
        environment = {**os.environ, MARK: self.mark, "COLUMNS": "200"}
        environment.pop("TEAAGENT_CONFIG", None)
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "teaagent", "demo", "--dir", str(folder), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment,
            start_new_session=True,
            # As in a terminal, whatever ran this test: a shell's background job ignores SIGINT.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.changed = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.errors), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, stream: object, into: list[str]) -> None:
        for raw in stream:  # type: ignore[attr-defined]
            with self.changed:
                into.append(raw.decode("utf-8", errors="replace").rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    @property
    def out(self) -> str:
        with self.changed:
            return "\n".join(self.lines)

    @property
    def err(self) -> str:
        with self.changed:
            return "\n".join(self.errors)

    def wait_for(self, text: str, timeout: float = DEADLINE) -> None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(text in line for line in self.lines):
                if self.process.poll() is not None and not self.readers[0].is_alive():
                    raise AssertionError(f"the demo exited before {text!r}:\n{self.out}\n{self.err}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {text!r} in the demo's output within {timeout} s:\n{self.out}")
                self.changed.wait(min(left, 1.0))

    def ctrl_c(self) -> None:
        """What a terminal does on Ctrl-C: SIGINT to every process of the foreground group."""
        os.killpg(self.process.pid, signal.SIGINT)

    def finish(self, timeout: float = DEADLINE) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(
                f"the demo did not end within {timeout} s:\n{self.out}\n{self.err}"
            ) from None
        for reader in self.readers:
            reader.join(timeout=10)
        self.seconds = time.monotonic() - self.started
        return code


def approver_decisions(folder: Path, node: str) -> list[tuple[str, str, str, str]]:
    lines = (folder / node / "data" / "approver-audit.jsonl").read_text().splitlines()
    payloads = [json.loads(line)["payload"] for line in lines]
    return [(p["tool_name"], p["decision"], p["by"], p["key_fingerprint"]) for p in payloads]


@pytest.mark.slow
def test_the_demo_tells_the_five_outcomes_and_its_evidence_verifies(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    demo = Demo(folder)
    code = demo.finish()
    out = demo.out

    assert code == 0, f"{out}\n{demo.err}"
    assert described(marked(demo.mark)) == []
    key = {name: fingerprint((folder / "keys" / f"{name}.pub").read_text()) for name in ("beta", "gamma")}
    operator = fingerprint((folder / "keys" / "delta-operator.pub").read_text())
    # The story as it happened: who decided, by which rule or by whom, with which key.
    assert f"beta (rule 2) approves fs.delete; signed with beta's node key {key['beta']}" in out
    assert f"gamma (rule 2) approves fs.delete; signed with gamma's node key {key['gamma']}" in out
    assert f"beta (rule 3) approves shell.run; signed with beta's node key {key['beta']}" in out
    assert "gamma (rule 3 says ask): left to gamma's operators" in out
    assert "delta (no rule matches): request" in out
    assert (
        "a forged approval claiming to be delta (signed with mallory's key) is refused by alpha's relay"
        in out
    )
    assert "$ teaagent approvals statement " in out
    assert "$ ssh-keygen -Y sign -n teaagent-approval -f keys/delta-operator " in out
    assert "$ teaagent approvals submit " in out
    assert f"delta (operator) approves shell.run; signed with delta's operator's own key {operator}" in out
    assert "beta (rule 1) denies shell.run: beta signs one plain command at a time" in out
    assert "gamma (rule 1) denies shell.run: gamma's hosts download nothing from the internet" in out
    # The all_of rule: ops (beta, gamma) met by their rules, and the write still waits for security
    # (delta's operator), shown pending by delta's own inbox before delta approves; then it runs.
    assert f"beta (rule 4) approves fs.write; signed with beta's node key {key['beta']}" in out
    assert f"gamma (rule 4) approves fs.write; signed with gamma's node key {key['gamma']}" in out
    pending = out.index("rule fs.write, all of: ops: met by beta, gamma; needs 1 more of security: delta.")
    still = out.index("the term ops is met (beta, gamma) and release/VERSION is still not written")
    shown = out.index("    quorum       rule fs.write: all of 2 terms, counted by alpha")
    approved = out.index(
        f"delta (operator) approves fs.write; signed with delta's operator's own key {operator}"
    )
    written = out.index('← fs.write {"bytes_written": 6, "path": "release/VERSION"}')
    assert pending < still < shown < approved < written
    assert "counts for   delta's decision counts toward term 2" in out
    assert "fs.write waits for rule 'fs.write' (all of: 2 of beta, gamma; 1 of delta), up to 2m 00s" in out
    assert "$ teaagent approvals approve " in out
    assert "rule fs.write, all of: ops: met by beta, gamma; security: met by delta" in out[approved:]
    # How long each step took: every line stamped, each quorum's wait measured.
    assert len(re.findall(r"\(\d+\.\d s after alpha asked\)", out)) == 4
    assert re.search(r"1\. fs\.list \. +ran at once: low risk, no peer was asked", out)
    assert re.search(r"2\. fs\.delete build/app\.log +approved by beta \(rule 2\), gamma \(rule 2\) in ", out)
    assert re.search(
        r"3\. shell\.run tar czf release\.tar\.gz src +approved by beta \(rule 3\), delta \(operator\)", out
    )
    assert re.search(
        r"4\. fs\.write release/VERSION +approved by beta \(rule 4\), delta \(operator\), gamma \(rule 4\)",
        out,
    )
    assert re.search(r"5\. shell\.run curl .*\| sh +denied by beta \(rule 1\), gamma \(rule 1\) in ", out)
    assert "the story is told in " in out

    # What the calls did: the deletion and the archive ran, the installer did not.
    workspace = folder / "alpha" / "workspace"
    assert not (workspace / "build" / "app.log").exists()
    with tarfile.open(workspace / "release.tar.gz") as archive:
        assert archive.getnames() == ["src", "src/main.py"]
    records = [
        json.loads(line) for line in (folder / "alpha/data/audit/alpha.jsonl").read_text().splitlines()
    ]
    asked = [r["payload"]["tool_name"] for r in records if r["event_type"] == "approval_request"]
    assert asked == ["fs.delete", "shell.run", "fs.write", "shell.run"]  # fs.list never asked anyone
    ran = [r["payload"]["tool_name"] for r in records if r["event_type"] == "tool_result"]
    assert ran == ["fs.list", "fs.delete", "shell.run", "fs.write"]
    assert (workspace / "release" / "VERSION").read_text() == "1.0.0\n"
    assert [r["payload"]["status"] for r in records if r["event_type"] == "run_end"] == ["approval_denied"]

    # The certificates verify here too, with the signers the story named.
    alpha = load_config(folder / "alpha.toml")
    certificates = sorted((folder / "certificates").iterdir())
    assert [path.name for path in certificates] == ["1-fs.delete.json", "2-shell.run.json", "3-fs.write.json"]
    outcomes = [
        verify_certificate(
            json.loads(path.read_text()), alpha.quorum, origin_public_key=alpha.own_public_key().to_line()
        )
        for path in certificates
    ]
    assert [outcome.signers for outcome in outcomes] == [
        ("beta", "gamma"),
        ("beta", "delta"),
        ("beta", "delta", "gamma"),
    ]
    assert [outcome.policy is None for outcome in outcomes] == [True, True, False]
    # quorum verify, offline, names the write's rule and how each term was met
    verified = out.index("$ teaagent quorum verify certificates/3-fs.write.json --config alpha.toml")
    assert (
        "approved by beta, delta, gamma "
        "(rule fs.write, all of: ops: met by beta, gamma; security: met by delta)" in out[verified:]
    )
    # statement, ssh-keygen, submit, show and approve, each timed; then the checks, run together
    # and timed once: three certificates and four audit logs, the tampered copy
    assert len(re.findall(r"^ *\d+\.\ds +exit 0, \d+\.\d s$", out, re.M)) == 5
    assert "these 8 checks ran together, each a process of its own, in " in out
    assert len(re.findall(r"^ *\d+\.\ds +exit 0$", out, re.M)) == 3 + 4
    assert len(re.findall(r"^ *\d+\.\ds +exit 1$", out, re.M)) == 1
    # Every audit log verifies (hash chain and HMAC); the tampered copy does not.
    logs = [folder / "alpha/data/audit/alpha.jsonl"] + [
        folder / node / "data" / "approver-audit.jsonl" for node in ("beta", "gamma", "delta")
    ]
    for log in logs:
        report = verify_log(log)
        assert report.ok, report.message
        assert report.hmac_checked
    assert not verify_log(folder / "alpha/data/audit/tampered.jsonl").ok
    assert re.search(r"tampered\.jsonl: line \d+: event_hash does not match the record", out)
    # Each peer's approver audited exactly its own decisions, with the key that signed each.
    assert approver_decisions(folder, "beta") == [
        ("fs.delete", "approval", "rule 2", key["beta"]),
        ("shell.run", "approval", "rule 3", key["beta"]),
        ("fs.write", "approval", "rule 4", key["beta"]),
        ("shell.run", "denial", "rule 1", key["beta"]),
    ]
    assert approver_decisions(folder, "gamma") == [
        ("fs.delete", "approval", "rule 2", key["gamma"]),
        ("fs.write", "approval", "rule 4", key["gamma"]),
        ("shell.run", "denial", "rule 1", key["gamma"]),
    ]
    assert approver_decisions(folder, "delta") == [
        ("shell.run", "approval", "operator", operator),
        ("fs.write", "approval", "operator", operator),
    ]
    print(f"teaagent demo: {demo.seconds:.1f} s wall")


@pytest.mark.slow
def test_ctrl_c_in_the_middle_of_the_demo_stops_every_process_it_started(tmp_path: Path) -> None:
    demo = Demo(tmp_path / "demo")
    try:
        # The moment with the most running: eight services, Redis, and the agent waiting for delta.
        demo.wait_for("waits in delta's inbox")
        alive = marked(demo.mark)
        assert len(alive) >= SERVICES + 2, alive
        demo.ctrl_c()
        code = demo.finish()
    finally:
        if demo.process.poll() is None:
            os.killpg(demo.process.pid, signal.SIGKILL)

    assert described(marked(demo.mark)) == []
    assert code == 130, f"{demo.out}\n{demo.err}"
    assert "Interrupted: stopping every process the demo started." in demo.out, demo.out[-2000:]
    assert "Traceback" not in demo.err


def test_a_ctrl_c_as_a_command_starts_leaves_it_listed_and_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupt comes between the fork and the listing: the command, in a session of its own,
    hears no Ctrl-C, so the demo must know it to stop it (a run under load left one running)."""
    from teaagent.cli import _demo

    children_born(monkeypatch, ctrl_c=True)
    processes = _demo._Processes(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        processes.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path)
    monkeypatch.undo()
    assert [name for name, _process in processes.running] == ["sleeper"]
    ((_name, process),) = processes.running
    processes.stop_all()
    assert process.poll() is not None


@pytest.mark.slow
def test_keep_leaves_the_cluster_running_until_ctrl_c(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    demo = Demo(folder, "--keep")
    try:
        demo.wait_for("The cluster runs until Ctrl-C.")
        assert "teaagent approvals list --config delta.toml" in demo.out
        assert "teaagent tools call --config alpha.toml shell.run" in demo.out
        # The cluster answers the commands it suggests: delta never decided two of alpha's requests.
        listing = subprocess.run(
            [sys.executable, "-m", "teaagent", "approvals", "list", "--json", "--config", "delta.toml"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listing.returncode == 0, listing.stderr
        assert sorted(item["tool_name"] for item in json.loads(listing.stdout)) == ["fs.delete", "shell.run"]
        assert len(marked(demo.mark)) >= SERVICES + 1  # and the embedded Redis
        assert demo.process.poll() is None
        demo.ctrl_c()
        code = demo.finish()
    finally:
        if demo.process.poll() is None:
            os.killpg(demo.process.pid, signal.SIGKILL)

    assert code == 0, f"{demo.out}\n{demo.err}"
    assert "Stopping every process the demo started." in demo.out
    assert described(marked(demo.mark)) == []


def test_the_demo_refuses_a_folder_that_is_not_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "something").write_text("x")

    assert run(["demo", "--dir", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"teaagent: the demo folder {tmp_path} is not empty; give an empty or new one.\n"
    )


def test_the_summary_names_approvers_from_the_certificate_in_name_order_whatever_order_they_arrived(
    tmp_path: Path,
) -> None:
    """The calls' lines do not depend on which peer's decision the demo saw first (issue 26)."""
    import io

    from rich.console import Console

    from teaagent.cli import _demo

    def record(event_type: str, call: int, **payload: object) -> str:
        body = {"call_id": f"call_{call}_1", "request_id": f"r{call}", **payload}
        return json.dumps({"event_type": event_type, "payload": body})

    certificate = {"approvals": [{"statement": {"signer": "gamma"}}, {"statement": {"signer": "beta"}}]}
    audit = tmp_path / "alpha.jsonl"
    audit.write_text(
        "\n".join(
            [
                record("approval_request", 2),
                record("approval_granted", 2, certificate=certificate),
                record("approval_request", 5),
                record("approval_denied", 5),
            ]
        )
    )
    # As they arrived on a loaded host: gamma before beta, and delta's late approval after the quorum.
    seen = [
        {"node": "gamma", "by": "rule 2", "request_id": "r2", "decision": "approval"},
        {"node": "delta", "by": "operator", "request_id": "r2", "decision": "approval"},
        {"node": "beta", "by": "rule 2", "request_id": "r2", "decision": "approval"},
        {"node": "gamma", "by": "rule 1", "request_id": "r5", "decision": "denial"},
        {"node": "beta", "by": "rule 1", "request_id": "r5", "decision": "denial"},
    ]
    out = io.StringIO()
    _demo._summary(_demo._Story(Console(file=out, width=200)), audit, seen, [1.0, 2.0])

    text = out.getvalue()
    assert re.search(
        r"2\. fs\.delete build/app\.log +approved by beta \(rule 2\), gamma \(rule 2\) in 1\.0 s", text
    )
    assert re.search(r"5\. shell\.run .* +denied by beta \(rule 1\), gamma \(rule 1\) in 2\.0 s", text)


def test_piped_the_step_titles_are_whole() -> None:
    """Piped (``teaagent demo | less``), a rule at the pipe's 80 columns would cut a title to ``…``."""
    import io

    from rich.console import Console

    from teaagent.cli import _demo

    out = io.StringIO()
    story = _demo._Story(Console(file=out, width=80, highlight=False, soft_wrap=True))
    title = "Four nodes, their SSH keys (ssh-keygen), one embedded Redis; alpha needs 2 of 3 [peers]"
    story.step(title)
    story.step("short")

    assert out.getvalue() == f"── 1. {title}\n── 2. short\n"


def test_the_checks_run_together_say_so_once_not_one_time_each(tmp_path: Path) -> None:
    """The checks run at once: one line says so and how long they took together; each tells its exit."""
    import io

    from rich.console import Console

    from teaagent.cli import _demo

    (tmp_path / "logs").mkdir()
    processes = _demo._Processes(tmp_path / "logs")
    out = io.StringIO()
    checks = [(["--version"], 0), (["audit", "verify", "missing.jsonl"], 2)]
    try:
        story = _demo._Story(Console(file=out, width=200))
        _demo._verify_all(_demo._Scene(tmp_path, {}, {}, story, processes), checks)
    finally:
        processes.stop_all()

    lines = [re.sub(r"^ *\d+\.\ds ", "", line) for line in out.getvalue().splitlines()]
    assert re.fullmatch(
        r"  these 2 checks ran together, each a process of its own, in \d+\.\d s for them all; "
        r"their outputs follow in order",
        lines[0],
    )
    assert lines[1] == "$ teaagent --version"
    assert re.fullmatch(r"    teaagent \S+", lines[2])
    assert lines[3] == "    exit 0"
    assert lines[4] == "$ teaagent audit verify missing.jsonl"
    assert lines[-2] == "    exit 2"
    assert not any(re.search(r"exit \d, ", line) for line in lines)
