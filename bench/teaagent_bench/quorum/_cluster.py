"""The bench's cluster: alpha and its peers on a LocalCluster, of each size, with its version 2 rule."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from teaagent.testing import LocalCluster, approver_rule, star
from teaagent.trust import MultiSigQuorumConfig, QuorumRule, RuleTerm

READY_TIMEOUT: Final = 90.0  # seconds for a service to answer /health: five start at once on a loaded host
PEER_NAMES: Final = ("beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota")
SIZES: Final = (3, 5, 9)  # nodes in the cluster of ``--peers``: 2 of 3, 3 of 5, 5 of 9
PEERS: Final = PEER_NAMES[:2]  # the default cluster: 2 of 3
NODES: Final = ("alpha", *PEERS)
# The version 2 variant (``policy_*``): a tool under a rule of two groups, all of them.
POLICY_TOOL: Final = "git.push"
POLICY_GROUPS: Final = {"ops": ("beta",), "security": ("gamma",)}
_POLICY_TOML: Final = """
[quorum.groups]
ops = ["beta"]
security = ["gamma"]

[[quorum.rules]]
pattern = "git.push*"
all_of = [{ group = "ops", required = 1 }, { group = "security", required = 1 }]
"""
_APPROVE: Final = approver_rule("shell.*", "approve") + approver_rule("git.push*", "approve")  # every peer's


@dataclass(frozen=True)
class _Size:
    """A cluster of ``nodes`` nodes: alpha and its peers, a majority of the nodes' approvals needed."""

    nodes: int

    @property
    def peers(self) -> tuple[str, ...]:
        return PEER_NAMES[: self.nodes - 1]

    @property
    def names(self) -> tuple[str, ...]:
        return ("alpha", *self.peers)

    @property
    def required(self) -> int:
        return self.nodes // 2 + 1

    @property
    def signatures(self) -> int:
        return 1 + len(self.peers)  # the request, every peer's approval

    @property
    def verifications(self) -> int:
        # The request by alpha's relay and in the certificate, by each peer's relay and approver;
        # each approval by its peer's relay and by alpha's relay; the certificate's approvals.
        return 2 + 4 * len(self.peers) + self.required

    @property
    def floor_verifications(self) -> int:
        # The protocol's minimum: each peer's relay and its approver check the request for
        # themselves (docs/protocol.md, "What a peer's relay refuses" and "What an approving node
        # decides on"), alpha's relay checks each approval once, alpha's agent the certificate.
        return 3 * len(self.peers) + 1 + self.required


DEFAULT_SIZE: Final = _Size(3)


def local_cluster(
    folder: Path, redis_url: str, raw: Mapping[str, Ed25519PrivateKey], size: _Size = DEFAULT_SIZE
) -> LocalCluster:
    """Alpha asks its peers (a majority of the nodes); each peer's approver approves ``shell.*`` and
    ``git.push*`` by rule; every store under ``bench:<node>``. ``TEAAGENT_BENCH_PROFILE`` (a folder)
    runs every service under ``cProfile``, its profile kept there as ``<label>.prof``."""
    profile = os.environ.get("TEAAGENT_BENCH_PROFILE")

    def interpreter(label: str) -> list[str]:
        if not profile:
            return [sys.executable]
        Path(profile).mkdir(parents=True, exist_ok=True)
        return [sys.executable, "-m", "cProfile", "-o", str(Path(profile) / f"{label}.prof")]

    return LocalCluster(
        folder,
        size.names,
        redis_url=redis_url,
        prefix="bench",
        required=size.required,
        peers_of=star("alpha", size.names),
        rules=dict.fromkeys(size.peers, _APPROVE),
        quorum_rules={"alpha": _POLICY_TOML},
        high_risk=("shell.*", "git.push*"),
        timeout_seconds=600,
        keys=raw,
        approvers=size.peers,
        env={"TEAAGENT_RELAY_INBOX_RATE_LIMIT": "100000"},
        ready_timeout=READY_TIMEOUT,
        interpreter=interpreter,
    )


def _policy_config(config: MultiSigQuorumConfig) -> MultiSigQuorumConfig:
    """Alpha's configuration with its version 2 rule (as its node.toml has it)."""
    rule = QuorumRule(pattern="git.push*", mode="all_of", terms=(RuleTerm("ops", 1), RuleTerm("security", 1)))
    return dataclasses.replace(
        config,
        high_risk_patterns=[*config.high_risk_patterns, "git.push*"],
        groups={name: tuple(members) for name, members in POLICY_GROUPS.items()},
        rules=(rule,),
    )
