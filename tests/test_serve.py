"""Serving a node's services (``teaagent.cli._serve.serve_app``): bind first, stop cleanly.

A service started in a process of its own freezes its start-up heap and spaces out the cyclic
collector's young collections; a server on another thread of a process leaves its collector alone.

A port already in use ends the command at once with exit code 2 and one sentence, before any
service starts (no embedded Redis, no worker). SIGTERM and SIGINT stop a relay within seconds:
the long-polls in flight are answered (the state as it is, ``pending``), the process exits 0, and
its log holds no traceback and no uvicorn "graceful shutdown exceeded".
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import uvicorn
from fastapi import FastAPI
from relay_support import MakeCluster, RelayProcess, free_port, long_polls, wait_until

from teaagent._http import client_verify
from teaagent._tasks import cancel_and_wait
from teaagent.cli._serve import GC_OLDER_THRESHOLD, GC_YOUNG_THRESHOLD, _Server, serve_app

WAIT = 20.0  # seconds for what takes well under one on an idle host


@contextlib.contextmanager
def port_held(host: str = "127.0.0.1") -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind((host, 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_serve_app_on_a_port_in_use_exits_2_with_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    started: list[bool] = []
    app = FastAPI(on_startup=[lambda: started.append(True)])

    with port_held() as port, pytest.raises(typer.Exit) as exited:
        serve_app(app, host="127.0.0.1", port=port, what="the relay of alpha")

    assert exited.value.exit_code == 2
    assert capsys.readouterr().err == (
        f"teaagent: the relay of alpha cannot listen on 127.0.0.1:{port}: "
        "the address is already in use (another program, or another copy of this service, holds it).\n"
    )
    assert started == []  # refused before the application's start-up ran


@pytest.mark.parametrize("port", [0, 70_000, -1])
def test_serve_app_on_a_port_out_of_range_exits_2_and_listens_nowhere(
    port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    # getaddrinfo takes 70000 as 70000 % 65536 and 0 as any free port: the service would say one
    # port and listen on another.
    started: list[bool] = []
    with pytest.raises(typer.Exit) as exited:
        serve_app(
            FastAPI(on_startup=[lambda: started.append(True)]),
            host="127.0.0.1",
            port=port,
            what="the MCP server",
        )

    assert exited.value.exit_code == 2
    assert capsys.readouterr().err == (
        f"teaagent: the MCP server cannot listen on 127.0.0.1:{port}: a TCP port is between 1 and 65535.\n"
    )
    assert started == []


def test_serve_app_on_an_address_of_no_interface_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exited:
        serve_app(FastAPI(), host="192.0.2.1", port=free_port(), what="the approver of beta")

    assert exited.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.startswith("teaagent: the approver of beta cannot listen on 192.0.2.1:")
    assert "is not an address of this machine" in err
    assert err.count("\n") == 1


def test_serve_app_refuses_a_tls_key_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert = tmp_path / "relay.crt"
    key = tmp_path / "relay.key"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")

    with pytest.raises(typer.Exit) as exited:
        serve_app(
            FastAPI(),
            host="127.0.0.1",
            port=free_port(),
            what="the relay of alpha",
            tls_cert=cert,
            tls_key=key,
        )

    assert exited.value.exit_code == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"teaagent: the relay of alpha cannot load its TLS certificate {cert} and key {key}:"
    )
    assert err.count("\n") == 1


@pytest.mark.anyio
async def test_cancel_and_wait_cancels_again_a_task_that_swallowed_the_first_cancel() -> None:
    async def scenario() -> int:
        swallowed = 0

        async def worker() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    # What Python 3.11's wait_for does when the cancel meets its inner result.
                    if swallowed == 0:
                        swallowed += 1
                        continue
                    raise

        task = asyncio.get_running_loop().create_task(worker())
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task, retry_seconds=0.05), timeout=WAIT)
        assert task.cancelled()
        return swallowed

    assert await scenario() == 1


# -- the relay as a real process ---------------------------------------------------------------


def _serve_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "teaagent", "relay", "serve", "--config", str(config), *extra]


@pytest.mark.slow
def test_relay_serve_on_a_port_in_use_exits_2_at_once(tmp_path: Path) -> None:
    with port_held() as port:
        (tmp_path / "keys").mkdir()
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "alpha",
                "-f",
                str(tmp_path / "keys/alpha"),
            ],
            check=True,
        )
        config = tmp_path / "alpha.toml"
        # The embedded Redis: had the service started, its server's folder would exist.
        config.write_text(
            f'agent_id = "alpha"\nprivate_key = "keys/alpha"\nrelay_url = "http://127.0.0.1:{port}"\n'
        )
        began = time.monotonic()
        finished = subprocess.run(_serve_command(config), capture_output=True, text=True, timeout=WAIT)
        took = time.monotonic() - began

    assert finished.returncode == 2, finished.stderr
    assert finished.stderr.splitlines()[-1] == (
        f"teaagent: the relay of alpha cannot listen on 127.0.0.1:{port}: "
        "the address is already in use (another program, or another copy of this service, holds it)."
    )
    assert "Traceback" not in finished.stderr
    assert not (tmp_path / ".teaagent-alpha" / "redis").exists()
    assert took < WAIT


def _long_poll(url: str, headers: dict[str, str], results: dict[str, Any], name: str) -> None:
    try:
        response = httpx.get(url, headers=headers, timeout=WAIT * 3)
        results[name] = (response.status_code, response.json())
    except Exception as exc:  # recorded, so the test names what failed
        results[name] = exc


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_answers_the_long_polls_in_flight_and_exits_0(
    tmp_path: Path, stop: signal.Signals, make_cluster: MakeCluster
) -> None:
    nodes = make_cluster("alpha", "beta", required=1)
    alpha = nodes["alpha"]
    relay = RelayProcess(alpha, tmp_path)
    relay.start()
    assert relay.process is not None
    try:
        request = alpha.request()
        submitted = httpx.post(f"{alpha.url}/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        assert submitted.status_code == 201, submitted.text
        results: dict[str, Any] = {}
        polls = [
            threading.Thread(
                target=_long_poll,
                args=(
                    f"{alpha.url}/v1/requests/{request['request_id']}/outcome?wait=60",
                    alpha.headers,
                    results,
                    "outcome",
                ),
            ),
            threading.Thread(
                target=_long_poll, args=(f"{alpha.url}/v1/inbox?wait=60", alpha.headers, results, "inbox")
            ),
        ]
        for poll in polls:
            poll.start()
        # Both long-polls are in flight once the relay counts them (its metrics).
        deadline = time.monotonic() + WAIT
        while long_polls(alpha, "outcome") < 1 or long_polls(alpha, "inbox") < 1:
            assert time.monotonic() < deadline, f"the long-polls never started: {results}"
            time.sleep(0.02)

        stopped_at = time.monotonic()
        relay.process.send_signal(stop)
        code = relay.process.wait(timeout=WAIT)
        took = time.monotonic() - stopped_at
        for poll in polls:
            poll.join(timeout=WAIT)
    finally:
        relay.stop()

    log = relay.log_path.read_text()
    assert results["outcome"][0] == 200, results
    assert results["outcome"][1]["state"] == "pending"
    assert results["inbox"] == (200, [])
    assert code == 0, log
    assert took < 5.0, f"stopping took {took:.1f} s"
    assert "Traceback" not in log
    assert "graceful shutdown exceeded" not in log


# -- the collector of a serving process --------------------------------------------------------

_GC_SERVICE = """
import gc, sys
from fastapi import FastAPI
from teaagent.cli._serve import serve_app

app = FastAPI()


@app.get("/gc")
def collector() -> dict[str, object]:
    return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}


serve_app(app, host="127.0.0.1", port=int(sys.argv[1]), what="the test service", log_level="warning")
"""


def _get_until_served(url: str, process: subprocess.Popen[bytes] | None = None) -> httpx.Response:
    def attempt() -> httpx.Response | None:
        assert process is None or process.poll() is None, "the service exited"
        with contextlib.suppress(httpx.TransportError):
            return httpx.get(url, timeout=WAIT, verify=client_verify())
        return None

    response = wait_until(attempt, timeout=WAIT)
    assert response is not None, f"{url} never answered"
    return response


def _serve_and_ask(service: str, path: str) -> tuple[Any, int]:
    """Run ``service`` (a script calling serve_app on the port it is given) in a process of its own;
    the JSON its ``path`` answers once it serves, and its exit code after SIGTERM."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", service, str(port)])
    try:
        state = _get_until_served(f"http://127.0.0.1:{port}{path}", process).json()
    finally:
        process.terminate()
        code = process.wait(timeout=WAIT)
    return state, code


def test_a_service_in_a_process_of_its_own_freezes_its_start_up_heap_and_spaces_out_collections() -> None:
    state, code = _serve_and_ask(_GC_SERVICE, "/gc")

    assert state["threshold"] == [GC_YOUNG_THRESHOLD, GC_OLDER_THRESHOLD, GC_OLDER_THRESHOLD]
    assert state["frozen"] > 10_000  # the modules, the application and its routes at the least
    assert code == 0


# -- the HTTP client a serving process loads before it serves ------------------------------------------

_CLIENT_SERVICE = """
import sys
from fastapi import FastAPI
from teaagent.cli._serve import serve_app

loaded_before = "aiohttp" in sys.modules
app = FastAPI()


@app.get("/modules")
def modules() -> dict[str, bool]:
    return {"before": loaded_before, "serving": "aiohttp" in sys.modules}


serve_app(app, host="127.0.0.1", port=int(sys.argv[1]), what="the test service", log_level="warning")
"""


def test_a_service_imports_its_http_client_before_it_serves_not_on_its_first_outgoing_call() -> None:
    # The app itself makes no outgoing call: only serve_app can have imported aiohttp by then.
    state, code = _serve_and_ask(_CLIENT_SERVICE, "/modules")

    assert state == {"before": False, "serving": True}
    assert code == 0


def test_a_server_on_another_thread_leaves_its_process_collector_alone() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    port = free_port()
    app = FastAPI()

    @app.get("/gc")
    def collector() -> dict[str, object]:
        return {"threshold": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = _Server(config, app, "the test service", f"http://127.0.0.1:{port}")
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        state = _get_until_served(f"http://127.0.0.1:{port}/gc").json()
    finally:
        server.should_exit = True
        thread.join(timeout=WAIT)

    assert server.started
    assert not thread.is_alive()
    assert state == {"threshold": list(threshold), "frozen": frozen}
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)
