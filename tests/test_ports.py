"""The tests' own port picker: no port twice, none that an outgoing connection could be given."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from port_support import BLOCK, _reserve, free_port, refusing_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]

    assert len(set(ports)) == len(ports)
    assert all(port < low for port in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_something_holds_is_skipped() -> None:
    nxt = free_port() + 1
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", nxt))
        holder.listen()
        assert free_port() != nxt


def test_a_refusing_port_refuses_connections_and_nobody_else_can_listen_on_it_meanwhile() -> None:
    with refusing_port() as port:
        for _ in range(3):  # every time, not once
            with socket.socket() as client, pytest.raises(ConnectionRefusedError):
                client.connect(("127.0.0.1", port))
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do
            with pytest.raises(OSError, match="Address already in use") as taken:
                other.bind(("127.0.0.1", port))
            assert taken.value.errno == errno.EADDRINUSE
    with socket.socket() as after:
        after.bind(("127.0.0.1", port))  # let go once the test is over


def test_a_port_another_test_process_handed_out_is_never_handed_out_here_while_it_lives() -> None:
    code = (
        "import port_support, sys; print(*[port_support.free_port() for _ in range(20)]); "
        "sys.stdout.flush(); sys.stdin.read()"
    )
    child = subprocess.Popen(  # another checkout's test run, on this machine at the same time
        [sys.executable, "-c", code],
        cwd=Path(__file__).parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        theirs = [int(port) for port in child.stdout.readline().split()]
        assert len(theirs) == 20
        assert not any(_reserve(port) for port in theirs)  # reserved by the child while it lives
        assert not set(theirs) & {free_port() for _ in range(50)}
    finally:
        child.communicate("", timeout=30)
    assert _reserve(theirs[0])  # let go when it exits


def test_a_test_process_handing_out_a_thousand_ports_holds_a_few_dozen_descriptors() -> None:
    # One lock per port reached 1,024 descriptors in a long run, and select() fails past that.
    code = (
        "import os, port_support; before = len(os.listdir('/proc/self/fd')); "
        "ports = [port_support.free_port() for _ in range(1000)]; "
        "print(len(set(ports)), len(os.listdir('/proc/self/fd')) - before)"
    )
    answer = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=60
    )
    distinct, held = (int(word) for word in answer.stdout.split())

    assert distinct == 1000
    assert held <= 1000 // BLOCK + 2  # one per block of ports, and a spare where a block was taken
