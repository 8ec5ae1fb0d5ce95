"""``teaagent quorum verify`` on version 2 certificates: the rule and its terms, and no lowered bar.

PROTOCOL.md "Who decides what the policy is": a certificate of this node's own request whose
``policy`` is not the one this node's rules give the tool is refused, whatever it proves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from relay_support import shell_request
from test_quorum_cli import KEYS, LINES, PORTS, write
from test_quorum_cli import cluster as cluster  # the fixture: keys and alpha.toml ... delta.toml

from teaagent.cli._main import run
from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import build_certificate, sign_approval, sign_request
from teaagent.trust import QuorumRule, RuleTerm

RULES = """
[quorum.groups]
ops = ["beta", "gamma"]
security = ["delta"]

[[quorum.rules]]
pattern = "shell.*"
all_of = [{ group = "ops", required = 2 }, { group = "security", required = 1 }]
"""
PEERS = ("beta", "gamma", "delta")
GROUPS = {"ops": ("beta", "gamma"), "security": ("delta",)}
PUSH = QuorumRule(pattern="shell.*", mode="all_of", terms=(RuleTerm("ops", 2), RuleTerm("security", 1)))


def with_rules(folder: Path) -> Path:
    path = folder / "alpha.toml"
    path.write_text(
        path.read_text().replace(
            'high_risk_patterns = ["shell.*"]\n', 'high_risk_patterns = ["shell.*"]\n' + RULES
        )
    )
    return path


def certificate(rule: QuorumRule, *signers: str) -> dict[str, Any]:
    config = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=2,
        peer_agent_ids=list(PEERS),
        peer_public_keys={peer: LINES[peer] for peer in PEERS},
        peer_relay_urls={peer: f"http://127.0.0.1:{PORTS[peer]}" for peer in PEERS},
        high_risk_patterns=["shell.*"],
        groups=GROUPS,
        rules=(rule,),
    )
    request = shell_request(
        config,
        "git push origin release",
        run_id="run-7",
        call_id="call-3",
        reason="ship it",
        request_id="d" * 32,
        now=1_764_570_000,
    )
    approvals = [sign_approval(request, signer, KEYS[signer], signed_at=1_764_570_005) for signer in signers]
    return build_certificate(request, sign_request(request, KEYS["alpha"]), approvals)


def test_a_version_2_certificate_names_its_rule_and_terms(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = with_rules(cluster)
    cert = write(cluster, certificate(PUSH, "beta", "gamma", "delta"))
    assert run(["quorum", "verify", str(cert), "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "approved by beta, delta, gamma "
        "(rule shell.*, all of: ops: met by beta, gamma; security: met by delta)"
    )


def test_a_version_2_certificate_short_of_a_term_says_what_is_missing(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = with_rules(cluster)
    cert = write(cluster, certificate(PUSH, "beta", "gamma"))
    assert run(["quorum", "verify", str(cert), "--config", str(config)]) == 1
    assert capsys.readouterr().err == (
        "teaagent: The certificate does not meet its policy (rule shell.*, all of: ops: met by beta, gamma; "
        "needs 1 more of security: delta).\n"
    )


def test_a_certificate_with_a_lowered_policy_is_refused(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = with_rules(cluster)
    # Signed by alpha's own key, and it proves what it carries: one approval of any peer.
    cert = write(cluster, certificate(QuorumRule(pattern="shell.*", required=1), "beta"))
    assert run(["quorum", "verify", str(cert), "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"teaagent: Request {'d' * 32} for shell.run carries rule 'shell.*' "
        "(all of: 1 of beta, delta, gamma), but this node's configuration gives rule 'shell.*' "
        "(all of: 2 of beta, gamma; 1 of delta): a request cannot change the bar.\n"
    )
    # The same file verifies under a configuration without the rule: it is the rule that refuses it.
    assert run(["quorum", "verify", str(cert), "--config", str(cluster / "beta.toml")]) == 0
