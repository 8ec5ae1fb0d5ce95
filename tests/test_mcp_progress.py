"""How the MCP server paces a high-risk call's progress notifications (``GatedToolServer.report_wait``).

The gate reports from the call's worker thread; the notifications go out on the server's loop. A
change within ``PROGRESS_EVERY_SECONDS`` of the last notification is held and sent when that time
is up, the latest of a burst only, and never after the call's result. The session here records
what it is asked to send; the whole path, client included, is in test_mcp_gateway.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_mcp_serve import node as node  # the node.toml of a node without quorum

from teaagent.config import load_config
from teaagent.mcp_server import _gated
from teaagent.relay_client import WaitProgress
from teaagent.runner._node import node_registry

WINDOW = 3.0  # PROGRESS_EVERY_SECONDS here: two reports in a row fall well inside it on a loaded host
DEADLINE = 30.0
PEERS = ("beta", "gamma", "delta")


@pytest.fixture
def server(node: Path) -> Iterator[_gated.GatedToolServer]:
    config = load_config(node)
    built = _gated.GatedToolServer(config, node_registry(config), name="test", run_prefix="test")
    yield built
    built.close()


class Session:
    """What the call's session is asked to send, in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str]] = []

    async def report_progress(self, progress: float, total: float, message: str) -> None:
        self.sent.append((progress, message))


def progress(why: str, *signers: str) -> WaitProgress:
    now = time.time()
    return WaitProgress(
        request_id="0" * 32,
        tool_name="shell.run",
        why=why,  # type: ignore[arg-type]
        state="pending",
        required=3,
        peers=PEERS,
        signers=signers,
        received=PEERS,
        expires_at=int(now) + 600,
        asked_at=now,
    )


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


@pytest.mark.slow  # two windows of WINDOW seconds
def test_a_burst_of_changes_is_one_notification_of_the_latest_and_none_comes_after_the_result(
    server: _gated.GatedToolServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_gated, "PROGRESS_EVERY_SECONDS", WINDOW)

    async def scenario() -> dict[str, Any]:
        session = Session()
        call = _gated._Call(
            ctx=SimpleNamespace(session=session),  # type: ignore[arg-type]
            tool_name="shell.run",
            on_wait=server.report_wait,
            loop=asyncio.get_running_loop(),
        )

        def report(*reports: WaitProgress) -> bool:
            for one in reports:
                server.report_wait(call, one)  # the gate's worker thread
            return call.held is not None

        # Sent at once; two changes right after it are held, the second in place of the first.
        held = await asyncio.to_thread(
            report, progress("sent"), progress("changed", "beta"), progress("changed", "beta", "gamma")
        )
        await until(lambda: len(session.sent) == 2)
        await until(lambda: not server._held_sends)
        burst = list(session.sent)
        # A change right after that one is held; the call's result is returned before it is due.
        held_again = await asyncio.to_thread(report, progress("changed", *PEERS))
        with call.lock:
            call.ended = True  # as the call's own finally says it
        await until(lambda: not server._held_sends)
        return {"held": (held, held_again), "burst": burst, "sent": session.sent}

    seen = asyncio.run(scenario())

    assert seen["held"] == (True, True)
    [(first, sent), (second, changed)] = seen["burst"]
    assert "0 approvals of the 3 needed" in sent
    assert "2 approvals of the 3 needed (beta, gamma)" in changed  # the latest, not beta's alone
    assert first < second
    assert seen["sent"] == seen["burst"]  # nothing after the result
