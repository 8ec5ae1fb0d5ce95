"""``teaagent bench quorum``: end-to-end quorums on a local cluster against their floor.

The modules, by concept: ``_cluster`` (the nodes, of each size), ``_asking`` (the real asking
path, as alpha's gate asks), ``_counting`` (what one quorum did: hops, round trips, CPU),
``_floor`` (the same raw work with nothing around it), ``_figures`` (the runs, and the figures).
"""

from __future__ import annotations

from teaagent_bench.quorum._cluster import SIZES
from teaagent_bench.quorum._figures import CONCURRENCIES, bench_quorum, bench_quorum_sizes
from teaagent_bench.quorum._floor import bare_http_server, floor_main, serve_floor

__all__ = [
    "CONCURRENCIES",
    "SIZES",
    "bare_http_server",
    "bench_quorum",
    "bench_quorum_sizes",
    "floor_main",
    "serve_floor",
]
