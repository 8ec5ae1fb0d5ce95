"""Version 2 between nodes: who may lower the bar (nobody), and a peer that knows only version 1.

PROTOCOL.md "Version 2": "Who decides what the policy is" and "Mixed clusters".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from relay_support import MakeCluster, Node, error, in_process
from test_relay_inbox import nothing_stored

import teaagent_relay._inbox
from teaagent.config import load_config
from teaagent.quorum import PROTOCOL_VERSION, build_request, request_problem
from teaagent.trust import MultiSigQuorumConfig, QuorumRule

RULES = """
[quorum.groups]
ops = ["beta", "gamma"]
security = ["delta"]

[[quorum.rules]]
pattern = "git.push*"
all_of = [{ group = "ops", required = 2 }, { group = "security", required = 1 }]
"""


@pytest.fixture(name="nodes")
def fixture_nodes(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks for git.push under its rule; beta, gamma, delta are its peers."""
    return make_cluster(
        "alpha",
        "beta",
        "gamma",
        "delta",
        quorum_rules={"alpha": RULES},
        high_risk=("shell.*", "fs.delete", "git.push*"),
    )


def push(config: MultiSigQuorumConfig) -> dict[str, Any]:
    return build_request(
        origin="alpha",
        run_id="run-1",
        call_id="call-1",
        tool_name="git.push",
        arguments={"branch": "release"},
        reason="ship it",
        config=config,
    )


def lowered(config: MultiSigQuorumConfig) -> MultiSigQuorumConfig:
    """alpha's configuration with its push rule relaxed to any one peer."""
    return MultiSigQuorumConfig(
        enabled=True,
        required_approvals=config.required_approvals,
        peer_agent_ids=config.peer_agent_ids,
        peer_public_keys=config.peer_public_keys,
        peer_relay_urls=config.peer_relay_urls,
        high_risk_patterns=config.high_risk_patterns,
        rules=(QuorumRule(pattern="git.push*", required=1),),
    )


def test_the_origins_gate_signs_no_request_whose_policy_is_not_its_own(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    config = load_config(alpha.config_path).quorum
    gate = alpha.gate(
        config=config,
    )
    try:
        request = push(lowered(config))
        with pytest.raises(
            ValueError,
            match=r"^the request cannot be sent: Request [0-9a-f]{32} for git\.push "
            r"carries rule 'git\.push\*' \(all of: 1 of beta, delta, gamma\), but this node's "
            r"configuration gives rule 'git\.push\*' \(all of: 2 of beta, gamma; 1 of delta\): "
            r"a request cannot change the bar\.$",
        ):
            gate.obtain(request)
        # A version 1 request for the tool the rule covers is the same lowering.
        plain = MultiSigQuorumConfig(**{**_fields(config), "rules": ()})
        with pytest.raises(ValueError, match=r"carries no rule \(version 1\)"):
            gate.obtain(push(plain))
    finally:
        gate.close()


def _fields(config: MultiSigQuorumConfig) -> dict[str, Any]:
    return {
        "enabled": True,
        "required_approvals": config.required_approvals,
        "peer_agent_ids": config.peer_agent_ids,
        "peer_public_keys": config.peer_public_keys,
        "peer_relay_urls": config.peer_relay_urls,
        "high_risk_patterns": config.high_risk_patterns,
    }


def version_1_only(request: object) -> str | None:
    """What a node that implements only version 1 checks first: the version (PROTOCOL.md, Mixed clusters)."""
    if isinstance(request, Mapping) and request.get("v") != PROTOCOL_VERSION:
        return f"the request has version {request.get('v')!r}, but only version {PROTOCOL_VERSION} is known"
    return request_problem(request)


@pytest.mark.anyio
async def test_a_version_1_peer_refuses_a_version_2_request_in_one_sentence(
    nodes: dict[str, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = push(load_config(alpha.config_path).quorum)
    assert request["v"] == 2
    monkeypatch.setattr(teaagent_relay._inbox, "request_problem", version_1_only)
    async with in_process(beta, deliver=False) as client:
        refused = await client.post("/v1/inbox", json=alpha.signed(request))
        # It never counts it as version 1: nothing is stored or queued for its approver.
        stored = await nothing_stored(client, "alpha", request["request_id"])
        # A version 1 request still goes through this peer.
        plain = await client.post("/v1/inbox", json=alpha.signed(alpha.request()))
    assert error(refused) == (422, "invalid", "The request has version 2, but only version 1 is known.")
    assert stored
    assert plain.status_code == 201


@pytest.mark.anyio
async def test_a_version_2_peer_takes_a_version_2_request(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    request = push(load_config(alpha.config_path).quorum)
    async with in_process(beta, deliver=False) as client:
        taken = await client.post("/v1/inbox", json=alpha.signed(request))
        shown = await client.get(f"/v1/inbox/{request['request_id']}", headers=beta.headers)
    assert taken.status_code == 201
    assert shown.json()["request"]["policy"] == request["policy"]
