"""What ``teaagent demo`` tells as it goes: numbered steps, the approvers' decisions, alpha's lines."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from typing import IO, Any, Final

from rich.console import Console
from rich.markup import escape

from teaagent.config import NodeConfig
from teaagent.errors import TeaAgentError

PEERS: Final = ("beta", "gamma", "delta")
STEP_TIMEOUT_SECONDS: Final = 60  # any one step of the story; each takes a few seconds
APPROVER_AUDIT: Final = "approver-audit.jsonl"  # teaagent_approver.AUDIT_FILE_NAME (no service import)


class _Story:
    """The demo's output: numbered steps, each line stamped with the seconds since the start."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.lock = threading.RLock()
        self.number = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def step(self, title: str) -> None:
        with self.lock:
            self.number += 1
            text = f"{self.number}. {title}"
            if self.console.is_terminal and len(text) + 6 <= self.console.width:
                self.console.rule(f"[bold]{escape(text)}", align="left")
            else:  # piped, or wider than the terminal: a rule would cut the title to its width
                self.console.print(f"[bold]── {escape(text)}[/]")

    def say(self, text: str, *, markup: bool = True) -> None:
        with self.lock:
            body = text if markup else escape(text)
            self.console.print(f"[dim]{self.elapsed():5.1f}s[/] {body}")


class _Decisions:
    """Follows the approvers' audit logs and tells each decision: who, by what, with which key."""

    def __init__(self, story: _Story, nodes: dict[str, NodeConfig], keys: dict[str, str]) -> None:
        self.story = story
        self.paths = {node: nodes[node].data_dir / APPROVER_AUDIT for node in PEERS}
        self.offsets = dict.fromkeys(PEERS, 0)
        self.keys = keys  # fingerprint -> whose key it is
        self.seen: list[dict[str, Any]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="demo-decisions", daemon=True)

    def __enter__(self) -> _Decisions:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        self.scan()

    def _follow(self) -> None:
        while not self.stopped.wait(0.05):
            self.scan()

    def scan(self) -> None:
        """Tell every decision recorded since the last scan (whole lines only)."""
        with self.story.lock:
            for node, path in self.paths.items():
                try:
                    with path.open("rb") as handle:
                        handle.seek(self.offsets[node])
                        chunk = handle.read()
                except FileNotFoundError:
                    continue
                end = chunk.rfind(b"\n")
                if end < 0:
                    continue
                self.offsets[node] += end + 1
                for line in chunk[: end + 1].splitlines():
                    record = json.loads(line)
                    if record.get("event_type") == "approver.decision":
                        self._tell(node, record["payload"])

    def _tell(self, node: str, decision: dict[str, Any]) -> None:
        self.seen.append({"node": node, **decision})
        key = decision["key_fingerprint"]
        verb = "[green]approves[/]" if decision["decision"] == "approval" else "[red]denies[/]"
        reason = f": {escape(decision['reason'])}" if decision["reason"] else ""
        self.story.say(
            f"  [bold]{node}[/] ({escape(decision['by'])}) {verb} {decision['tool_name']}{reason}; "
            f"signed with {escape(self.keys.get(key, 'an unknown key'))} {key}"
        )


class _Agent:
    """Alpha's ``teaagent run``: its lines told as they come, with how long each approval took."""

    def __init__(self, story: _Story, decisions: _Decisions) -> None:
        self.story = story
        self.decisions = decisions
        self.asked_at: float | None = None
        self.waits: list[float] = []
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread: threading.Thread | None = None

    def follow(self, stream: IO[bytes]) -> None:
        self.thread = threading.Thread(target=self._read, args=(stream,), name="demo-agent", daemon=True)
        self.thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if not line.strip() or line.startswith("cost so far"):
                continue  # the scripted model is free: its running cost says nothing here
            if line.startswith("→ "):
                self.asked_at = time.monotonic()
            if line.startswith(("✓ ", "✗ ")) and self.asked_at is not None:
                # The approvers audit a decision before it leaves: tell theirs before the outcome.
                self.decisions.scan()
                took = time.monotonic() - self.asked_at
                self.waits.append(took)
                line += f"   ({took:.1f} s after alpha asked)"
            self.story.say(f"  [cyan]alpha[/] │ {escape(line)}")
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("")  # the end of the output: wakes any wait_for
            self.changed.notify_all()

    def wait_for(self, text: str, agent: subprocess.Popen[bytes]) -> str:
        """alpha's first line holding ``text``, once it is said (the run must still be going)."""
        deadline = time.monotonic() + STEP_TIMEOUT_SECONDS
        with self.changed:
            while True:
                found = next((line for line in self.lines if text in line), None)
                if found is not None:
                    return found
                if agent.poll() is not None and self.lines[-1:] == [""]:
                    raise TeaAgentError(
                        f"alpha's run ended (exit {agent.returncode}) before it said {text!r}."
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TeaAgentError(f"alpha did not say {text!r} within {STEP_TIMEOUT_SECONDS} s.")
                self.changed.wait(min(left, 1.0))

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(timeout=10)
