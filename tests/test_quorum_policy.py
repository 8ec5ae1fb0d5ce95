"""Version 2 in the library: the request's ``policy``, counting by terms, and no lowering of the bar.

PROTOCOL.md "Version 2: per-tool policies and groups of peers". The signatures are real Ed25519
SSHSIGs (``relay_support``'s session keys).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from relay_support import approval, public_line, signer

from teaagent.errors import QuorumError
from teaagent.quorum import (
    build_certificate,
    build_request,
    evaluate,
    policy_mismatch,
    request_problem,
    sign_denial,
    sign_request,
    verify_certificate,
)
from teaagent.trust import MultiSigQuorumConfig, QuorumRule, RuleTerm

PEERS = ("beta", "gamma", "delta", "epsilon", "zeta")
GROUPS = {"ops": ("beta", "gamma", "delta"), "security": ("epsilon", "zeta")}
PUSH = QuorumRule(
    pattern="git.push*",
    mode="all_of",
    terms=(RuleTerm("ops", 2), RuleTerm("security", 1)),
    timeout_seconds=600,
)
DEPLOY = QuorumRule(pattern="deploy.*", mode="any_of", terms=(RuleTerm("ops", 2), RuleTerm("security", 1)))
DELETE = QuorumRule(pattern="fs.delete", required=1)
NOW = 1_764_570_000


def config(*rules: QuorumRule) -> MultiSigQuorumConfig:
    return MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=list(PEERS),
        peer_public_keys={peer: public_line(peer) for peer in PEERS},
        peer_relay_urls={peer: "http://127.0.0.1:1" for peer in PEERS},
        high_risk_patterns=["git.push*", "deploy.*", "fs.delete", "shell.*"],
        groups=GROUPS,
        rules=rules or (PUSH, DEPLOY, DELETE),
    )


def request(tool_name: str, quorum: MultiSigQuorumConfig | None = None) -> dict[str, Any]:
    return build_request(
        origin="alpha",
        run_id="run-1",
        call_id="call-1",
        tool_name=tool_name,
        arguments={"branch": "release"},
        reason="",
        config=quorum or config(),
        now=NOW,
        request_id="0" * 32,
    )


def count(doc: dict[str, Any], approvers: tuple[str, ...] = (), deniers: tuple[str, ...] = ()) -> Any:
    return evaluate(
        doc,
        [approval(doc, a, NOW + 1) for a in approvers],
        [sign_denial(doc, d, signer(d), "no", NOW + 1) for d in deniers],
        config(),
        now=NOW + 2,
    )


def test_a_call_under_a_rule_is_a_version_2_request_with_its_policy() -> None:
    doc = request("git.push")
    assert doc["v"] == 2
    assert doc["policy"] == {
        "rule": "git.push*",
        "all_of": [
            {"peers": ["beta", "delta", "gamma"], "required": 2},
            {"peers": ["epsilon", "zeta"], "required": 1},
        ],
    }
    assert doc["peers"] == ["beta", "delta", "epsilon", "gamma", "zeta"]
    assert doc["required_approvals"] == 2  # the largest term's, for readers
    assert doc["expires_at"] == NOW + 600  # the rule's timeout
    assert request_problem(doc) is None


def test_a_call_that_no_rule_matches_stays_version_1_byte_for_byte() -> None:
    doc = request("shell.run")
    assert doc["v"] == 1
    assert "policy" not in doc
    assert (
        doc
        == request("shell.run", config())
        == request(
            "shell.run",
            MultiSigQuorumConfig(
                enabled=True,
                required_approvals=2,
                peer_agent_ids=list(PEERS),
                peer_public_keys={peer: public_line(peer) for peer in PEERS},
                peer_relay_urls={peer: "http://127.0.0.1:1" for peer in PEERS},
                high_risk_patterns=["shell.*"],
            ),
        )
    )


def test_all_of_needs_every_term_and_says_what_is_still_missing() -> None:
    doc = request("git.push")
    waiting = count(doc, ("beta", "gamma"))
    assert waiting.state == "pending"
    assert waiting.describe() == (
        "waiting (rule git.push*, all of: ops: met by beta, gamma; needs 1 more of security: epsilon or zeta)"
    )
    # Three operators are still not a security reviewer.
    assert count(doc, ("beta", "gamma", "delta")).state == "pending"
    approved = count(doc, ("beta", "gamma", "zeta"))
    assert approved.state == "approved"
    assert approved.to_dict()["policy"]["terms"][1]["approved_by"] == ["zeta"]


def test_all_of_is_denied_as_soon_as_one_term_can_no_longer_be_met() -> None:
    doc = request("git.push")
    assert count(doc, ("beta", "gamma"), ("epsilon",)).state == "pending"
    denied = count(doc, ("beta", "gamma"), ("epsilon", "zeta"))
    assert denied.state == "denied"
    assert "security: can no longer be met (denied by epsilon, zeta)" in denied.describe()
    # Two operators of three denied: ops cannot reach 2, whatever security says.
    assert count(doc, ("epsilon",), ("beta", "gamma")).state == "denied"


def test_any_of_needs_one_term_and_is_denied_when_none_can_be_met() -> None:
    doc = request("deploy.prod")
    assert doc["policy"]["any_of"][1] == {"peers": ["epsilon", "zeta"], "required": 1}
    assert count(doc, ("epsilon",)).state == "approved"
    assert count(doc, ("beta", "delta")).state == "approved"
    assert count(doc, ("beta",), ("epsilon",)).state == "pending"
    assert count(doc, ("beta",), ("gamma", "delta", "epsilon")).state == "pending"  # zeta may still approve
    assert count(doc, ("beta",), ("gamma", "delta", "epsilon", "zeta")).state == "denied"


def test_required_n_is_n_of_all_peers() -> None:
    doc = request("fs.delete")
    assert doc["policy"] == {"rule": "fs.delete", "all_of": [{"peers": sorted(PEERS), "required": 1}]}
    assert count(doc, ("delta",)).state == "approved"
    assert count(doc, (), PEERS[:4]).state == "pending"
    assert count(doc, (), PEERS).state == "denied"


def test_a_certificate_proves_its_policy_and_only_its_policy() -> None:
    doc = request("git.push")
    signature = sign_request(doc, signer("alpha"))
    good = build_certificate(
        doc, signature, [approval(doc, a, NOW + 1) for a in ("beta", "delta", "epsilon")]
    )
    outcome = verify_certificate(good, config(), origin_public_key=public_line("alpha"), now=NOW + 5)
    assert outcome.signers == ("beta", "delta", "epsilon")
    short = build_certificate(doc, signature, [approval(doc, a, NOW + 1) for a in ("beta", "gamma", "delta")])
    with pytest.raises(QuorumError, match=re.escape("needs 1 more of security: epsilon or zeta")):
        verify_certificate(short, config(), origin_public_key=public_line("alpha"), now=NOW + 5)


def test_a_request_whose_policy_is_not_this_nodes_is_named_as_such() -> None:
    doc = request("git.push")
    assert policy_mismatch(doc, config()) is None
    lowered = request("git.push", config(QuorumRule(pattern="git.push*", required=1)))
    assert policy_mismatch(lowered, config()) == (
        f"Request {lowered['request_id']} for git.push carries rule 'git.push*' (all of: 1 of beta, delta, "
        "epsilon, gamma, zeta), but this node's configuration gives rule 'git.push*' (all of: 2 of beta, "
        "delta, gamma; 1 of epsilon, zeta): a request cannot change the bar."
    )
    # A version 1 request for a tool a rule covers, and a version 2 one for a tool none covers.
    v1 = request("git.push", config(DELETE))
    assert v1["v"] == 1
    assert "carries no rule (version 1)" in (policy_mismatch(v1, config()) or "")
    assert "configuration gives no rule (version 1)" in (policy_mismatch(doc, config(DELETE)) or "")


def test_the_asking_sides_wait_shows_the_terms() -> None:
    from teaagent.relay_client import WaitProgress, describe_wait, wait_news

    policy = config().policy_for("git.push")
    assert policy is not None
    named = policy.named(GROUPS)
    before = WaitProgress(
        request_id="0" * 32,
        tool_name="git.push",
        why="changed",
        state="pending",
        required=2,
        peers=PEERS,
        signers=("beta",),
        received=PEERS,
        expires_at=NOW + 600,
        asked_at=NOW,
        policy=named,
    )
    after = WaitProgress(**{**before.__dict__, "signers": ("beta", "gamma")})
    assert describe_wait(after, NOW + 60, command=False) == (
        "request 00000000 for git.push: rule git.push*, all of: ops: met by beta, gamma; needs 1 more of "
        "security: epsilon or zeta; received by beta, gamma, delta, epsilon, zeta; 9m 00s left (expires at "
        "2025-12-01 06:30:00Z)."
    )
    assert wait_news(before, after, NOW + 2)[-1] == (
        "✓ gamma approved (2.0 s after asking): rule git.push*, all of: ops: met by beta, gamma; "
        "needs 1 more of security: epsilon or zeta."
    )
    assert after.to_dict(NOW)["policy"]["terms"][1]["missing"] == 1


def test_approvals_show_names_the_rule_its_terms_and_the_term_this_node_counts_toward() -> None:
    from teaagent.approver_client import ApprovalItem
    from teaagent.cli._inbox import show_lines

    doc = request("git.push")
    item = ApprovalItem.from_json(
        {
            **{name: doc[name] for name in ("request_id", "origin", "tool_name", "arguments", "reason")},
            **{name: doc[name] for name in ("payload_digest", "run_id", "call_id", "required_approvals")},
            **{name: doc[name] for name in ("peers", "created_at", "expires_at")},
            "seconds_left": 60,
            "state": "pending",
            "decision": None,
            "rule": None,
            "request": doc,
            "signature": sign_request(doc, signer("alpha")),
        }
    )
    lines = show_lines(item, "epsilon", NOW + 1)
    start = next(i for i, line in enumerate(lines) if line.startswith("quorum"))
    assert lines[start : start + 4] == [
        "quorum       rule git.push*: all of 2 terms, counted by alpha",
        "  term 1     2 of beta, delta, gamma",
        "  term 2     1 of epsilon, zeta",
        "counts for   epsilon's decision counts toward term 2",
    ]
    assert "counts for   beta's decision counts toward term 1" in show_lines(item, "beta", NOW + 1)
