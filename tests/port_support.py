"""The tests' one port picker: loopback ports no test process of this machine hands out twice.

``free_port`` gives a port below the kernel's ephemeral range, from a slice of this xdist
worker's own, reserved for as long as the test process lives: a held ``flock`` on its block of
``BLOCK`` ports, so that a worker handing out thousands of ports holds a few dozen descriptors
(one per port passed 1,024 in a long run, and ``select`` fails past that);
``refusing_port`` holds one that refuses every connection (a peer that is down).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

_HANDED_OUT: set[int] = set()
_LOWEST_PORT = 10_000
BLOCK = 50  # ports reserved together, on one lock file: blocks start at _LOWEST_PORT + k * BLOCK


def _port_slice() -> range | None:
    """This test process's own ports: below the kernel's ephemeral range, one slice per xdist worker.

    A port from ``bind(0)`` is an ephemeral one: between its test closing the probe and a
    service binding it, an outgoing connection of any process (or another worker's probe) may
    take it, and the service then fails to start, or another worker's service answers there.
    Below the ephemeral range no outgoing connection is ever given a port, and the slices keep
    the workers apart.
    """
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % workers
    size = (low - _LOWEST_PORT) // workers
    if size < 500:
        return None
    start = _LOWEST_PORT + worker * size
    return range(start, start + size)


_RESERVED: dict[int, int] = {}  # block's first port -> its open lock file, held until the process exits
_RESERVATIONS = Path(tempfile.gettempdir()) / f"teaagent-test-ports-{os.getuid()}"


def _block(port: int) -> int:
    """The first port of ``port``'s block (blocks of ``BLOCK``, from ``_LOWEST_PORT``)."""
    return port - (port - _LOWEST_PORT) % BLOCK


def _reserve(port: int) -> bool:
    """Reserve ``port``'s block among this machine's test processes until this one exits (a held ``flock``).

    True when this process holds the block (it may hand out every port of it), False when another does.
    """
    start = _block(port)
    if start in _RESERVED:
        return True
    try:
        _RESERVATIONS.mkdir(mode=0o700, exist_ok=True)
        handle = os.open(_RESERVATIONS / f"block-{start}", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True  # no place to reserve in: the bind probe alone decides
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(handle)
        return False
    _RESERVED[start] = handle
    return True


def free_port() -> int:
    """A loopback port nothing listens on, never handed out twice in this process (see _port_slice)."""
    ports = _port_slice()
    if ports is not None:
        # Each test process starts at a place of its own in its slice and reserves the block of
        # every port it hands out for its whole life (_reserve): test runs of other checkouts on
        # this machine use the same slices, and a port one probed free may be listened on by
        # another a moment later, answering in place of this run's service.
        first = os.getpid() * 7919 % len(ports)
        first = max(0, first - (ports[first] - _LOWEST_PORT) % BLOCK)  # a block's start: its ports in a row
        for port in (*ports[first:], *ports[:first]):
            if port in _HANDED_OUT:
                continue
            _HANDED_OUT.add(port)
            if not _reserve(port):
                continue  # another test process of this machine handed it out
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue  # something of this machine's own holds it
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port that refuses every connection for as long as the context lasts.

    For a peer that is down. A :func:`free_port` is free only when it is handed out: any other
    process of the machine (another test run, another engineer's service) may listen on it a moment
    later and answer in the down peer's place. A socket bound to the port and never listening
    holds it instead: nobody else can bind it, and the kernel refuses every connection to it.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        while True:
            port = free_port()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken since free_port looked: another one
            break
        yield port
