"""Serving one of the node's services in the foreground, for every ``teaagent ... serve`` command.

:func:`serve_app` binds the listening socket before anything starts, so a port already in use
ends the command at once with exit code 2 and one sentence (uvicorn alone would first run the
application's start-up, an embedded Redis and workers included, then fail to bind, then wait on
that start-up's shutdown with SIGTERM and SIGINT only noted, never acted on).

A stop signal (SIGTERM, or SIGINT: Ctrl-C) stops the service cleanly: the application hears it
first, through ``app.state.stopping`` (an :class:`asyncio.Event` it may set up; ``serve_app`` sets
it), so its long-polls answer at once with the state as it is; then uvicorn stops accepting,
waits up to :data:`STOP_GRACE_SECONDS` for the requests in flight, and runs the application's
shutdown. The command then exits 0.

SIGHUP makes a relay or an approver read its trust again (its peers, its operators, their
``allowed_signers`` files; :mod:`teaagent._reload`), as sshd and nginx read their files again: a
file that does not load leaves the old trust in use, with one line in the log.

Before the application starts, the HTTP client library of its outgoing calls is imported
(:func:`teaagent._http.load_client`, whose module says why).

Once a service has started in a process of its own (``serve_app`` on the main thread, as every
``serve`` command runs it), its heap is settled for serving. What start-up built (modules, the
application, its clients) is collected once and frozen out of the cyclic collector's reach
(:func:`gc.freeze`). The youngest generation is then collected once :data:`GC_YOUNG_THRESHOLD`
more containers have been allocated than freed (700 by default), and each older one after
:data:`GC_OLDER_THRESHOLD` collections of the one below (10 by default). A service's calls make
many short-lived containers that reference counting frees anyway. At the defaults, the origin
relay of ``teaagent bench quorum``'s cluster (start-up, then 4 s of 64 quorums at once) collected
607 times and spent 0.28 s of its 3.3 s of CPU on it, walking objects that were still in use. A
server run on another thread (the tests' in-process servers) leaves its process's collector alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Final

import typer
import uvicorn

from teaagent._http import load_client
from teaagent.cli._exit import EXIT_FAILED, bad_usage, fail
from teaagent.store import EMBEDDED_URL, open_node_store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from teaagent.config import NodeConfig

__all__ = ["GC_OLDER_THRESHOLD", "GC_YOUNG_THRESHOLD", "STOP_GRACE_SECONDS", "serve_app", "wait_for_store"]

STOP_GRACE_SECONDS: Final = 5  # for the requests in flight after a stop signal; long-polls end in ~1 s
_STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
# Once a service has started (see the module docstring): containers allocated less freed that
# trigger a young collection, and collections of a generation that trigger one of the next.
GC_YOUNG_THRESHOLD: Final = 50_000
GC_OLDER_THRESHOLD: Final = 20

logger = logging.getLogger("uvicorn.error")


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(host: str, port: int, what: str) -> socket.socket:
    """Bind (not yet listen on) ``host:port`` the way uvicorn would, or end the command.

    Raises:
        typer.Exit: Exit code 2 with one sentence: the name does not resolve, the address is in
            use, not this machine's, or needs privileges.
    """
    where = _where(host, port)
    if not 1 <= port <= 65535:  # getaddrinfo would take 70000 as 70000 % 65536, and 0 as any port
        bad_usage(f"{what} cannot listen on {where}: a TCP port is between 1 and 65535.")
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        bad_usage(f"{what} cannot listen on {where}: {host} does not resolve ({exc.strerror}).")
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no owner
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "the address is already in use (another program, or another copy of this service, holds it)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            why = f"{host} is not an address of this machine"
        elif exc.errno == errno.EACCES:
            why = "permission denied (ports below 1024 need privileges)"
        else:
            why = (exc.strerror or str(exc)).rstrip(".")
        bad_usage(f"{what} cannot listen on {where}: {why}.")
    sock.set_inheritable(True)
    return sock


def _settle_heap() -> None:
    """Collect and freeze what start-up built, and space out the young collections (module docstring)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, GC_OLDER_THRESHOLD, GC_OLDER_THRESHOLD)


class _Server(uvicorn.Server):
    """uvicorn's server, told to warn the application of a stop and not to die by the signal after."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, what: str, url: str) -> None:
        super().__init__(config)
        self._app = app
        self._what = what
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # uvicorn names no address when it is handed the socket
            if threading.current_thread() is threading.main_thread():
                _settle_heap()
            line = f"{self._what} serving on {self._url} (Ctrl-C or SIGTERM stops it)"
            if logger.isEnabledFor(logging.INFO):
                logger.info("%s", line)
            else:  # a quieter --log-level still says where the service listens
                sys.stderr.write(f"teaagent: {line}\n")
                sys.stderr.flush()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stopping = getattr(self._app.state, "stopping", None)
        if isinstance(stopping, asyncio.Event):
            stopping.set()  # before uvicorn waits for the requests in flight: long-polls answer now
        await super().shutdown(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn's own version raises the caught signal again once served, so a clean stop would
        # end the process by SIGTERM (status -15) rather than exit 0; this one only restores.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
        reload = _reload_on_hangup(self._app, self._what)
        try:
            yield
        finally:
            if reload is not None:
                reload.remove_signal_handler(signal.SIGHUP)
            for sig, handler in original.items():
                signal.signal(sig, handler)


def wait_for_store(node: NodeConfig, what: str, *, starts_embedded: bool) -> None:
    """Before serving, wait until the node's Redis answers, however long; SIGTERM or Ctrl-C ends the wait.

    A service started before its Redis (an approver before its relay, whose embedded server it
    uses) waits here rather than in its application's start-up, where uvicorn hears a stop signal
    but cannot act on it until the start-up ends: stopped while it waits, the command says so in
    one line and exits 0, as a stop of a running service does.

    Args:
        node: The node's configuration.
        what: The service, for the log and the sentence: ``"the approver of alpha"``.
        starts_embedded: The service starts the node's embedded server itself (the relay): nothing
            to wait for when ``redis_url = "embedded"``.

    Raises:
        typer.Exit: Exit code 0 when stopped before the Redis answered.
    """
    if starts_embedded and node.redis_url == EMBEDDED_URL:
        return

    async def wait() -> bool:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stopped = False

        def stop() -> None:
            nonlocal stopped
            stopped = True
            task.cancel()

        for sig in _STOP_SIGNALS:
            loop.add_signal_handler(sig, stop)
        try:
            async with open_node_store(node, start_embedded=False, service=what):
                pass
        except asyncio.CancelledError:
            if not stopped:
                raise
        finally:
            for sig in _STOP_SIGNALS:
                loop.remove_signal_handler(sig)
        return stopped

    if threading.current_thread() is threading.main_thread() and asyncio.run(wait()):
        sys.stderr.write(f"teaagent: {what} stopped before its Redis answered.\n")
        sys.stderr.flush()
        raise typer.Exit(0)


def _reload_on_hangup(app: FastAPI, what: str) -> asyncio.AbstractEventLoop | None:
    """Reload the application's trust on SIGHUP, as sshd and nginx reload their files; the loop, or None.

    Only for an application that has one (``app.state.trust``, a :class:`teaagent._reload.TrustReloader`);
    the others keep SIGHUP's default. Each reload logs its outcome; a failed one keeps the old trust.
    """
    reloader = getattr(app.state, "trust", None)
    if reloader is None:
        return None
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[object]] = set()

    def hangup() -> None:
        logger.info("%s: SIGHUP, reading its peers and operators again", what)
        task: asyncio.Task[object] = loop.create_task(reloader.reload("SIGHUP"), name="teaagent-reload")
        running.add(task)  # kept until done: the loop holds tasks weakly
        task.add_done_callback(running.discard)

    loop.add_signal_handler(signal.SIGHUP, hangup)
    return loop


def serve_app(
    app: FastAPI,
    *,
    host: str,
    port: int,
    what: str,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    log_level: str = "info",
    access_log: bool = False,
    path: str = "",
    wait_first: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` in the foreground, one worker, until SIGTERM or SIGINT.

    Build the application first (so a broken configuration fails before anything is bound), then
    call this. To have its long-polls answered when the service stops, give the application an
    ``asyncio.Event`` at ``app.state.stopping`` and end every wait when it is set.

    Args:
        app: The service's application (its lifespan runs once the socket is bound).
        host: The address to listen on: an IP address or a name of this machine.
        port: The TCP port.
        what: What is served, for the sentences: ``"the relay of alpha"``.
        tls_cert: A PEM certificate chain: serve HTTPS with it (``tls_key`` required too).
        tls_key: The PEM private key of ``tls_cert``.
        log_level: uvicorn's log level (critical, error, warning, info, debug, trace).
        access_log: Log one line per HTTP call (off by default).
        path: The path to name after the address in the start-up line (``"/mcp"``).
        wait_first: Called once the address is bound, before the application starts: what the
            service waits for before it can start (:func:`wait_for_store`).

    The start-up line (``<what> serving on <url>``) is written whatever ``log_level`` is.

    Raises:
        typer.Exit: Exit code 2 with one sentence when the address cannot be bound (in use, not an
            address of this machine, a name that does not resolve, a privileged port) or the TLS
            certificate and key cannot be loaded; exit code 1 when the application's start-up
            failed (the log above says why).
        ValueError: Only one of ``tls_cert`` and ``tls_key`` is given.
    """
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("tls_cert and tls_key go together: give both or neither")
    sock = _bind(host, port, what)
    try:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            workers=1,
            log_level=log_level,
            access_log=access_log,
            lifespan="on",
            timeout_graceful_shutdown=STOP_GRACE_SECONDS,
            ssl_certfile=None if tls_cert is None else str(tls_cert),
            ssl_keyfile=None if tls_key is None else str(tls_key),
        )
        try:
            config.load()  # the TLS context is made here: a bad file is a sentence, not a traceback
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
            bad_usage(
                f"{what} cannot load its TLS certificate {tls_cert} and key {tls_key}: "
                f"{str(reason).rstrip('.').lower().replace('_', ' ')}."
            )
        load_client()  # not on the service's first outgoing call, with every call in flight held
        if wait_first is not None:
            wait_first()  # uvicorn's Config has set the logging up: the wait logs as the service will
        scheme = "https" if tls_cert is not None else "http"
        server = _Server(config, app, what, f"{scheme}://{_where(host, port)}{path}")
        with contextlib.suppress(SystemExit):  # uvicorn's own exit when the start-up fails: reported below
            server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        raise typer.Exit(fail(f"{what} did not start; the log above says why.", EXIT_FAILED))
