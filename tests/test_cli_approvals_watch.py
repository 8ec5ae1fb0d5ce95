"""``teaagent approvals watch``: new requests as lines or a live table, decided by what the operator types.

The watch is a real process (on a pipe, and on a real terminal) against ``approvals_support``'s
beta, whose approver and relay are killed and started again under it.
"""

from __future__ import annotations

import contextlib
import os
import pty
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from approvals_support import DEADLINE, STOP_SECONDS, Approver, Cluster, readable, sharing
from approvals_support import fixture_approver as fixture_approver  # the module's fixture
from approvals_support import fixture_approver_processes as fixture_approver_processes  # the module's fixture
from approvals_support import fixture_cluster as fixture_cluster  # the module's fixture
from relay_support import signer

from teaagent.quorum import sign_withdrawal
from teaagent.relay_client import RelayClient

# -- watch -------------------------------------------------------------------------------------


class Lines:
    """A subprocess's stdout, read by a thread, waited on line by line with a deadline."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = DEADLINE) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no such line; seen: {self.seen}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if predicate(line):
                return line


@contextlib.contextmanager
def watching(cluster: Cluster, *extra: str) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "teaagent", "approvals", "watch", "--config", cluster.config, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        yield process, Lines(process.stdout)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=DEADLINE)


@pytest.mark.slow
def test_watch_prints_new_requests_decides_them_and_outlives_restarts(
    cluster: Cluster, approver: Approver
) -> None:
    with watching(cluster) as (process, lines):
        assert process.stdin is not None
        lines.wait_for(lambda line: line.startswith("watching the requests waiting for beta"))
        first = approver.deliver(cluster.request(call_id="c1"))
        lines.wait_for(
            lambda line: line.startswith(f"new request {first['request_id']} from alpha: shell.run")
        )
        lines.wait_for(
            lambda line: line.startswith("  expires in 1m 5") or line.startswith("  expires in 2m 00s")
        )

        process.stdin.write(f"a {first['request_id'][:10]}\n")
        process.stdin.flush()
        decided = lines.wait_for(
            lambda line: line.startswith(f"beta approved request {first['request_id']} of alpha")
        )
        # The node key signed it: the line says so, not "operator".
        assert decided.startswith(
            f"beta approved request {first['request_id']} of alpha, signed with the node key SHA256:"
        ), decided

        approver.kill()  # kill -9: the watch waits for it, says so once, and goes on when it is back
        lines.wait_for(
            lambda line: (
                line.startswith("No approver answers at") and line.endswith("retrying until it answers.")
            )
        )
        approver.start()
        lines.wait_for(lambda line: line.endswith("answers again."))
        approver.relay.stop()  # the approver answers, but cannot list the relay's inbox
        down = lines.wait_for(lambda line: line.endswith("retrying until it answers."))
        assert down.startswith(
            f"The approver at {cluster.beta.approver_url} refused the listing of requests (5"
        )
        approver.relay.start()
        lines.wait_for(lambda line: line.endswith("answers again."))
        second = approver.deliver(
            cluster.request(call_id="c2", tool_name="fs.delete", arguments={"path": "x"})
        )
        lines.wait_for(
            lambda line: line.startswith(f"new request {second['request_id']} from alpha: fs.delete")
        )

        process.stdin.write(f"d {second['request_id']} too risky\n")
        process.stdin.flush()
        lines.wait_for(lambda line: line.startswith(f"beta denied request {second['request_id']} of alpha"))
        lines.wait_for(
            lambda line: line.startswith(
                f"request {second['request_id']} of alpha: beta denied with the node key"
            )
        )

        process.stdin.write("q\n")
        process.stdin.flush()
        assert process.wait(timeout=DEADLINE) == 0


@pytest.mark.slow
def test_watch_never_signs_a_request_sent_under_the_prefix_of_one_withdrawn_after_it_was_shown(
    cluster: Cluster, approver: Approver
) -> None:
    # Issue 25: the origin withdraws what the operator read and sends another request whose id
    # starts the same; the operator's `a PREFIX` names the one they read, not the newcomer.
    prefix = secrets.token_hex(4)
    with watching(cluster) as (process, lines):
        assert process.stdin is not None
        lines.wait_for(lambda line: line.startswith("watching the requests waiting for beta"))
        shown = approver.deliver(
            cluster.request(
                tool_name="fs.delete", arguments={"path": "build/old.log"}, request_id=sharing(prefix, "0")
            )
        )
        lines.wait_for(
            lambda line: line.startswith(f"new request {shown['request_id']} from alpha: fs.delete")
        )
        withdrawal = sign_withdrawal(shown, signer("alpha"))
        with RelayClient(cluster.beta.url) as relay:
            relay.deliver_withdrawal(shown["request_id"], withdrawal["statement"], withdrawal["signature"])
        lines.wait_for(
            lambda line: line == f"request {shown['request_id']} of alpha was withdrawn by its origin."
        )
        swapped = approver.deliver(
            cluster.request(
                arguments={"command": "rm -rf /"}, request_id=sharing(prefix, "f"), call_id="swap"
            )
        )
        lines.wait_for(
            lambda line: line.startswith(f"new request {swapped['request_id']} from alpha: shell.run")
        )

        process.stdin.write(f"a {prefix}\n")
        process.stdin.flush()
        answer = lines.wait_for(lambda line: line.startswith((prefix, "beta ")))
        process.stdin.write(f"a {shown['request_id'][:9]}\n")  # what the operator read: withdrawn
        process.stdin.flush()
        withdrawn = lines.wait_for(lambda line: line.startswith(("The approver at", "beta ")))
        process.stdin.write("q\n")
        process.stdin.flush()
        assert process.wait(timeout=DEADLINE) == 0

    assert answer == (
        f"{prefix} starts the ids of 2 requests shown by this watch ({shown['request_id']} of alpha, "
        f"{swapped['request_id']} of alpha), so it names none of them; type more of the id."
    )
    assert withdrawn.endswith(
        f"(409 withdrawn): Request {shown['request_id']} was withdrawn by its origin alpha; this node signs "
        "nothing for it."
    )
    assert approver.decision(swapped["request_id"]) is None
    assert approver.decision(shown["request_id"]) is None


ANSI = re.compile(rb"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][A-Za-z0-9]|\r")


@pytest.mark.slow
def test_watch_on_a_terminal_shows_a_live_table_and_takes_keystrokes(
    cluster: Cluster, approver: Approver
) -> None:
    request = approver.deliver(cluster.request())
    argv = [sys.executable, "-m", "teaagent", "approvals", "watch", "--config", cluster.config]
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execve(sys.executable, argv, env)  # noqa: S606 - the CLI itself, argv fixed above
    seen = b""
    try:
        deadline = time.monotonic() + DEADLINE

        def wait_for(text: str) -> None:
            nonlocal seen
            while text.encode() not in ANSI.sub(b"", seen):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{text!r} not on the terminal: {ANSI.sub(b'', seen)[-3000:]!r}")
                if readable(terminal, min(left, 0.5)):
                    seen += os.read(terminal, 65536)

        wait_for(request["request_id"])  # the table's row
        wait_for("> ")
        os.write(terminal, f"a {request['request_id'][:8]}".encode())
        wait_for(f"> a {request['request_id'][:8]}")  # what is typed is shown (echo is the table's)
        os.write(terminal, b"\r")
        wait_for(f"beta approved request {request['request_id']} of alpha")
        os.write(terminal, b"q\r")
        # Keep reading the terminal until the watch exits: a pty nobody reads fills up, and the
        # watch's last redraws then block it in a write (seen on a loaded machine).
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline + STOP_SECONDS:
                raise AssertionError(f"the watch did not exit after q: {ANSI.sub(b'', seen)[-1000:]!r}")
            if readable(terminal, 0.2):
                with contextlib.suppress(OSError):  # EIO once the child closed its side
                    seen += os.read(terminal, 65536)
    finally:
        with contextlib.suppress(OSError):
            os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0
