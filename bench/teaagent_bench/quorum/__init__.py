"""``teaagent bench quorum``: end-to-end quorums on a local cluster against their floor."""

from __future__ import annotations

from teaagent_bench.quorum._figures import (
    CONCURRENCIES,
    SIZES,
    bench_quorum,
    bench_quorum_sizes,
    floor_main,
    serve_floor,
)

__all__ = ["CONCURRENCIES", "SIZES", "bench_quorum", "bench_quorum_sizes", "floor_main", "serve_floor"]
