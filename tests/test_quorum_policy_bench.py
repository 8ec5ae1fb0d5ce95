"""``teaagent bench quorum``'s version 2 variant: a two-group ``all_of`` rule beside the plain 2 of 3.

Its figures in a whole run of the bench are checked with the others', in one run
(``tests/test_quorum_bench.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from teaagent.cli._bench import TARGETS
from teaagent.config import load_config
from teaagent.quorum import build_request, request_policy
from teaagent.signing import SSHPrivateKey
from teaagent.trust import MultiSigQuorumConfig
from teaagent_bench.quorum._asking import _Run
from teaagent_bench.quorum._cluster import POLICY_TOOL, _policy_config, local_cluster
from teaagent_bench.quorum._counting import _Counters
from teaagent_bench.quorum._figures import _policy_figures


def test_the_variant_asks_under_alphas_two_group_rule_and_the_plain_calls_stay_version_1(
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    raw = {name: Ed25519PrivateKey.generate() for name in ("alpha", "beta", "gamma")}
    keys = {name: SSHPrivateKey.from_cryptography(key, comment=name) for name, key in raw.items()}
    nodes = local_cluster(tmp_path, "redis://127.0.0.1:1", raw).write()
    alpha = load_config(nodes["alpha"].config_path)
    plain = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=["beta", "gamma"],
        peer_public_keys={peer: keys[peer].public_key.to_line() for peer in ("beta", "gamma")},
        peer_relay_urls={peer: nodes[peer].url for peer in ("beta", "gamma")},
        high_risk_patterns=["shell.*"],
        timeout_seconds=600,
    )
    config = _policy_config(plain)

    def ask(tool: str, quorum: MultiSigQuorumConfig) -> object:
        doc = build_request(
            origin="alpha", run_id="r", call_id="c", tool_name=tool, arguments={}, reason="", config=quorum
        )
        return request_policy(doc)

    # alpha's node.toml (its relay's) and the bench's own configuration give the same policy.
    policy = ask(POLICY_TOOL, config)
    assert policy == ask(POLICY_TOOL, alpha.quorum)
    assert policy is not None
    assert policy.summary() == "all of: 1 of beta; 1 of gamma"  # type: ignore[attr-defined]
    assert ask("shell.run", config) is None  # the plain 2 of 3 is still version 1


def test_the_variants_figures_are_its_latency_against_its_own_floor() -> None:
    per = _Counters(hops=10.0, server_seconds={}, writes=21.0, reads=31.0, cpu={})
    figures = _policy_figures(
        _Run([0.012, 0.014, 0.020], 70.0, 3), _Run([0.006, 0.007, 0.009], 140.0, 3), per
    )
    assert figures["policy_p50_ms_c1"] == pytest.approx(14.0)
    assert figures["policy_floor_p50_ms_c1"] == pytest.approx(7.0)
    assert figures["policy_floor_ratio"] == pytest.approx(2.0)
    assert figures["policy_http_hops_c1"] == 10.0
    assert ("policy_floor_ratio", "<=", 3.0) in TARGETS["quorum"]
