"""A cluster of teaagent nodes on this machine, started and stopped in one place: :class:`LocalCluster`.

For the demo, the benchmarks and the tests. Each node gets its configuration file, its key and its
token in one folder; its relay and its approver run as real processes (``teaagent relay serve``,
``teaagent approver serve``: the library never imports a service), on an embedded Redis or a given
one, each node under its own key prefix.

Typical use::

    rules = {"beta": APPROVE_SHELL, "gamma": APPROVE_SHELL}
    with LocalCluster(folder, ("alpha", "beta", "gamma"), rules=rules) as cluster:
        alpha = cluster.nodes["alpha"]  # its url, token, config_path, signer()...
"""

from __future__ import annotations

from teaagent.testing._cluster import (
    ClusterNode,
    LocalCluster,
    approver_rule,
    free_port,
    star,
    wait_healthy,
)

__all__ = ["ClusterNode", "LocalCluster", "approver_rule", "free_port", "star", "wait_healthy"]
