"""Version 2 counting, one counting not two: the relay's script, ``evaluate`` and ``Tally`` agree.

The version 1 parity test (``tests/test_quorum_parity.py``) with random policies: ``all_of`` or
``any_of``, one to three terms, each a random set of the configured peers (terms overlap, so one
signer counts toward several) with a random threshold. Each request is a ``"v": 2`` request
carrying the policy; the same random approvals, denials, turns, resends, bad signatures and
outsiders go one by one through the real relay path (``Relay.count`` and ``record_decision.lua`` on
the test's embedded Redis), through :func:`teaagent.quorum.evaluate` and through
:class:`teaagent.quorum.Tally` with the policy; at every step the states and signer sets must be
the same, and an approved request's certificate must verify.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from relay_support import Node
from test_quorum_parity import CONFIGURED, Scenario, drive, scenarios
from test_quorum_parity import fixture_origin as fixture_origin  # the fixtures "origin" and "relay"
from test_quorum_parity import fixture_relay as fixture_relay

from teaagent.trust import PolicyTerm, QuorumPolicy
from teaagent_relay._relay import Relay


@st.composite
def terms(draw: st.DrawFn) -> PolicyTerm:
    peers = tuple(sorted(draw(st.lists(st.sampled_from(CONFIGURED), min_size=1, max_size=4, unique=True))))
    return PolicyTerm(peers=peers, required=draw(st.integers(1, len(peers))))


policies = st.builds(
    QuorumPolicy,
    rule=st.sampled_from(("git.push*", "fs.delete", "*")),
    mode=st.sampled_from(("all_of", "any_of")),
    terms=st.lists(terms(), min_size=1, max_size=3).map(tuple),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios(policies))
def test_the_relay_script_evaluate_and_the_reference_count_a_policy_alike_at_every_step(
    relay: tuple[asyncio.Runner, Relay], origin: Node, scenario: Scenario
) -> None:
    assert scenario.policy is not None
    event(f"{scenario.policy.mode} of {len(scenario.policy.terms)} terms")
    runner, counting = relay
    runner.run(drive(counting, origin, scenario))
