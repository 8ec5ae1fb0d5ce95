"""The tests' star cluster: one origin whose high-risk calls its leaves approve, on LocalCluster.

``teaagent.testing.LocalCluster`` writes the nodes' files (configurations, keys, operators'
files, approver rules) and runs their approvers as ``teaagent approver serve`` processes; here the
relays are served in this process (``relay_support.served``: real sockets, a fast start), every
node's keys are ``relay_support``'s (so ``signer(name)`` signs for it) and its store lives under a
fresh key prefix of the test Redis, deleted at the end. The ``star_cluster`` fixture of conftest.py
starts one for a module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from port_support import free_port
from redis_fixture import fresh_prefix
from relay_support import SERVICE_TIMING, Node, private_key, served

from teaagent.testing import ClusterNode, LocalCluster, star


def node_of(node: ClusterNode, *, timeout_seconds: int, prefix: str) -> Node:
    """The tests' :class:`Node` for a node of a :class:`LocalCluster` (its documents, env, settings)."""
    return Node(
        name=node.name,
        folder=node.folder,
        port=node.port,
        token=node.token,
        peers=node.peers,
        required=node.required,
        timeout_seconds=timeout_seconds,
        prefix=prefix,
        approver_port=node.approver_port,
        nested=True,
    )


@contextlib.contextmanager
def running_star(
    folder: Path,
    redis_url: str,
    *,
    origin: str = "alpha",
    leaves: Sequence[str] = ("beta", "gamma"),
    approvers: Iterable[str] = (),
    relays: Iterable[str] | None = None,
    prepare: Callable[[dict[str, Node]], None] | None = None,
    timeout_seconds: int = 120,
    operators: dict[str, list[str]] | None = None,
    **options: Any,
) -> Iterator[dict[str, Node]]:
    """``origin`` asks every leaf, each leaf knows the origin only; yield the nodes, their services up.

    ``relays`` (default: every node) are served in this process, ``approvers`` run as processes;
    ``prepare`` may change the files once written, before anything starts. ``options`` are
    LocalCluster's (``required``, ``rules``, ``extra_toml``, ``ports``...).
    """
    names = [origin, *leaves]
    team = [operator for members in (operators or {}).values() for operator in members]
    with fresh_prefix(redis_url) as prefix:
        cluster = LocalCluster(
            folder,
            names,
            redis_url=redis_url,
            prefix=prefix,
            peers_of=star(origin, names),
            keys={name: private_key(name) for name in (*names, *team)},
            operators=operators,
            approvers=tuple(approvers),
            env=SERVICE_TIMING,
            port_factory=free_port,
            timeout_seconds=timeout_seconds,
            **options,
        )
        nodes = {
            name: node_of(node, timeout_seconds=timeout_seconds, prefix=prefix)
            for name, node in cluster.write().items()
        }
        if prepare is not None:
            prepare(nodes)
        with served(*(nodes[name] for name in (names if relays is None else relays))):
            try:  # the approvers stop first: a relay's shutdown waits for their long-polls
                for name in cluster.approvers:
                    cluster.start_service(name, "approver", wait=False)
                for name in cluster.approvers:
                    cluster.wait_ready(name, "approver")
                yield nodes
            finally:
                cluster.stop()
