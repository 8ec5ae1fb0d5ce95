"""One counting, not two: the relay's script, ``evaluate`` and the reference ``Tally`` agree at every step.

Random sequences of decisions on one request (3 to 5 peers, 1 to all of them required) go, one by
one, through the real relay path (``Relay.count``: the relay's checks of rules 1 to 4, then
``record_decision.lua`` on the test's Redis), through :func:`teaagent.quorum.evaluate` over every
decision submitted so far, and through :class:`teaagent.quorum.Tally`. The decisions are real
Ed25519 SSHSIG signatures: valid approvals and denials (some dated at rule 4's lower bound,
``created_at - 60``), repeats and exact resends, both kinds from one signer (a signer turning its
earlier decision round), ones signed after the expiry, ones signed before the request existed
(``created_at - 61`` and earlier), ones with another peer's key, and ones from signers who may
not sign (the origin, a configured peer the request does not name, a stranger); time passes in
half seconds, up to, around and past the expiry. The Ed25519 keys are made once per session
(``relay_support.private_key``).

``Relay.count`` is called in-process on the relay its app builds (lifespan run, no HTTP), with the
step's clock; ``test_relay.py`` covers the same path over HTTP.

At every step the stored state and signer sets must be the reference's; while it is pending,
``evaluate`` must say the same, and the step that decides must be decided the same way by
``evaluate`` (``expired`` examines nothing, so there only the state). After that the stored outcome
never changes, whatever comes (``evaluate``, a pure function, may then say otherwise).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from relay_support import MakeCluster, Node, public_line, signer

from teaagent.quorum import (
    MAX_CLOCK_SKEW_SECONDS,
    POLICY_VERSION,
    Tally,
    approval_statement,
    evaluate,
    is_expired,
    sign_approval,
    sign_denial,
    sign_request,
    verify_certificate,
)
from teaagent.trust import QuorumPolicy
from teaagent_relay import create_app
from teaagent_relay._errors import ApiError
from teaagent_relay._relay import Relay

ORIGIN = "alpha"
CONFIGURED = ("beta", "delta", "epsilon", "gamma", "zeta")  # the origin's peers; a request names 3 to 5
STRANGER = "mallory"  # has a key, is nobody's peer
TIMEOUT = 120  # seconds from created_at to expires_at
REASONS = ("", "not on Fridays")

Kind = Literal["approval", "denial"]
Flavour = Literal["valid", "late", "early", "wrong_key"]


@dataclass(frozen=True)
class Decide:
    kind: Kind
    who: str
    flavour: Flavour
    skew: int  # signed_at = now + skew, kept within rule 4's bounds: created_at - 60 to expires_at
    reason: str


@dataclass(frozen=True)
class Resend:
    index: int  # an earlier submission, sent again byte for byte (modulo len)


@dataclass(frozen=True)
class Turn:
    index: int  # the signer of an earlier valid submission (modulo len) validly signs the other kind now


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class Step:
    advance: float  # seconds the clock moves first
    action: Decide | Resend | Turn | Tick
    near_expiry: float | None = None  # then, if set, the clock moves on to expires_at + this, if ahead


@dataclass(frozen=True)
class Scenario:
    peers: tuple[str, ...]
    required: int
    steps: tuple[Step, ...]
    policy: QuorumPolicy | None = (
        None  # version 2 (tests/test_quorum_policy_parity.py): peers and required follow it
    )


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of the strategies, each as often as its weight (``one_of`` draws each branch alike)."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(
        lambda strategy: strategy
    )


@st.composite
def scenarios(draw: st.DrawFn, policies: st.SearchStrategy[QuorumPolicy] | None = None) -> Scenario:
    policy = None if policies is None else draw(policies)
    if policy is not None:
        peers, required = policy.peers, policy.required
    else:
        peers = tuple(
            sorted(draw(st.lists(st.sampled_from(CONFIGURED), min_size=3, max_size=5, unique=True)))
        )
        # Two or more more often: with one, the first approval decides before anyone changes its mind.
        required = draw(weighted((1, st.integers(1, len(peers))), (2, st.integers(2, len(peers)))))
    outsiders = [ORIGIN, STRANGER, *(peer for peer in CONFIGURED if peer not in peers)]
    # Mostly the request's peers, so that signers repeat and change their minds.
    who = weighted((4, st.sampled_from(peers)), (1, st.sampled_from(outsiders)))
    flavour = st.sampled_from(("valid", "valid", "valid", "valid", "late", "early", "wrong_key"))
    decide = st.builds(
        Decide,
        kind=st.sampled_from(("approval", "denial")),
        who=who,
        flavour=flavour,
        skew=st.integers(-90, 60),
        reason=st.sampled_from(REASONS),
    )
    earlier = st.integers(0, 20)
    action = weighted(
        (4, decide), (2, st.builds(Turn, earlier)), (1, st.builds(Resend, earlier)), (1, st.just(Tick()))
    )
    # Mostly small steps, in half seconds; now and then a long one, so that some sequences expire.
    advance = weighted((12, st.integers(0, 8).map(lambda half: half / 2)), (1, st.integers(20, 90)))
    # The seconds around the expiry, where whole and fractional seconds must agree.
    near_expiry = weighted((20, st.none()), (1, st.sampled_from((-0.5, 0.0, 0.5, 1.0))))
    steps = draw(st.lists(st.builds(Step, advance, action, near_expiry), min_size=2, max_size=16))
    return Scenario(peers=peers, required=required, steps=tuple(steps), policy=policy)


def document(request: dict[str, Any], decide: Decide, now: float) -> dict[str, Any]:
    """The signed ``{"statement", "signature"}`` the action describes, at ``now``."""
    expires_at = request["expires_at"]
    earliest = request["created_at"] - MAX_CLOCK_SKEW_SECONDS  # rule 4's lower bound
    if decide.flavour == "late":
        signed_at = expires_at + 1 + decide.skew % 30
    elif decide.flavour == "early":
        signed_at = earliest - 1 - decide.skew % 30
    else:
        signed_at = max(min(int(now) + decide.skew, expires_at), earliest)
    # wrong_key: the statement names who, the signature is another peer's.
    key = signer(
        ("gamma" if decide.who == "beta" else "beta") if decide.flavour == "wrong_key" else decide.who
    )
    if decide.kind == "denial":
        return sign_denial(request, decide.who, key, decide.reason, signed_at)
    compact = sign_approval(request, decide.who, key, signed_at)
    return {"statement": approval_statement(request, decide.who, signed_at), "signature": compact.signature}


@pytest.fixture(name="origin")
def fixture_origin(make_cluster: MakeCluster) -> Node:
    nodes = make_cluster(ORIGIN, *CONFIGURED, required=1, peers_of={ORIGIN: CONFIGURED})
    return nodes[ORIGIN]


@pytest.fixture(name="relay")
def fixture_relay(origin: Node) -> Iterator[tuple[asyncio.Runner, Relay]]:
    """The origin's relay as its app builds it, on the test's Redis, in one event loop for all examples."""
    app = create_app(origin.settings(deliver=False))
    with asyncio.Runner() as runner:
        stack = AsyncExitStack()

        async def start() -> Relay:
            await stack.enter_async_context(app.router.lifespan_context(app))
            relay: Relay = app.state.relay
            return relay

        try:
            yield runner, runner.run(start())
        finally:
            runner.run(stack.aclose())


async def drive(relay: Relay, origin: Node, scenario: Scenario) -> None:
    """Run one scenario through the three, comparing after every step."""
    config = origin.quorum()
    created_at = int(time.time())
    request = origin.request(now=created_at)
    request["peers"] = list(scenario.peers)
    request["required_approvals"] = scenario.required
    if scenario.policy is not None:
        request["v"] = POLICY_VERSION
        request["policy"] = scenario.policy.document()
    request_id, expires_at = request["request_id"], request["expires_at"]
    created, _status = await relay.submit(request, sign_request(request, origin.key))
    assert created
    tally = Tally(
        peers=len(scenario.peers), required=scenario.required, expires_at=expires_at, policy=scenario.policy
    )
    submitted: list[tuple[Kind, dict[str, Any], bool]] = []  # (kind, document, verified)
    approvals: list[dict[str, Any]] = []
    denials: list[dict[str, Any]] = []
    now: float = created_at
    for number, step in enumerate(scenario.steps):
        now += step.advance
        if step.near_expiry is not None:
            now = max(now, expires_at + step.near_expiry)
        where = f"step {number} ({step}) at created_at + {now - created_at}"
        before = tally
        action = step.action
        if isinstance(action, Resend | Turn) and not submitted:
            continue
        if isinstance(action, Turn):
            valid = [entry for entry in submitted if entry[2]] or submitted
            earlier, body = valid[action.index % len(valid)][:2]
            other: Kind = "approval" if earlier == "denial" else "denial"
            action = Decide(other, body["statement"]["signer"], "valid", 0, REASONS[1])
        if isinstance(action, Tick):
            receipt: dict[str, Any] | None = None
        else:
            if isinstance(action, Resend):
                kind, body, verified = submitted[action.index % len(submitted)]
            else:
                kind, body = action.kind, document(request, action, now)
                # What rules 1 to 4 say, known here independently of the relay's checks.
                verified = action.who in scenario.peers and action.flavour == "valid"
                submitted.append((kind, body, verified))
            (denials if kind == "denial" else approvals).append(body)
            refusal: str | None = None
            try:
                receipt = await relay.count(request_id, dict(body["statement"]), body["signature"], now=now)
            except ApiError as exc:
                receipt, refusal = None, exc.message
            assert refusal is None or not verified, f"{where}: a valid decision was refused: {refusal}"
            if verified:
                tally = tally.step(kind, body["statement"]["signer"], now=now)
                assert receipt is not None
                assert receipt["state"] == tally.state, where
                moved = (tally.approvers, tally.deniers) != (before.approvers, before.deniers)
                assert receipt["counted"] is moved, where
                if not before.decided and not is_expired(now, expires_at):
                    who = body["statement"]["signer"]
                    if kind == "denial" and who in before.approvers:
                        event("a denial took its signer's approval away")
                    if kind == "approval" and who in before.deniers:
                        event("an approval after its signer's denial was not counted")
            elif receipt is not None:
                # Unverified yet answered: only past the expiry, where nothing is verified or counted.
                assert is_expired(now, expires_at), where
                assert (receipt["state"], receipt["counted"]) == (tally.step(None, now=now).state, False), (
                    where
                )
        # What the relay's readers see at ``now``: they settle the expiry first (whole seconds,
        # rounded up as the relay rounds them, so ``at > expires_at`` holds exactly when ``now > ...``).
        tally = tally.step(None, now=now)
        settled = await relay.store.requests.settle_expiry(request_id, now=math.ceil(now))
        stored = await relay.store.requests.get(request_id)
        assert stored is not None
        assert settled.state == stored.state == tally.state, where
        assert set(stored.approvals) == tally.approvers, where
        assert set(stored.denials) == tally.deniers, where
        # The counters beside the decisions hash follow it (an approval taken away is one fewer).
        assert (settled.approvals, settled.denials) == (len(tally.approvers), len(tally.deniers)), where
        outcome = evaluate(request, approvals, denials, config, now=now)
        if not tally.decided or not before.decided:
            # Pending, or decided at this very step: evaluate agrees with the stored count.
            assert outcome.state == tally.state, where
            if tally.state != "expired":
                assert set(outcome.signers) == tally.approvers, where
                assert set(outcome.denied_by) == tally.deniers, where
        if tally.state == "approved" and not before.decided:
            status = await relay.status(request_id)
            certificate = verify_certificate(
                status["certificate"], config, origin_public_key=public_line(ORIGIN), now=now
            )
            assert set(certificate.signers) == tally.approvers, where
            carried = {item["statement"]["signer"] for item in status["certificate"]["approvals"]}
            assert not carried & set(stored.denials), f"{where}: a signer that denied is in the certificate"
    event(f"ended {tally.state}")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_the_relay_script_evaluate_and_the_reference_count_alike_at_every_step(
    relay: tuple[asyncio.Runner, Relay], origin: Node, scenario: Scenario
) -> None:
    runner, counting = relay
    runner.run(drive(counting, origin, scenario))


# The reference alone, on PROTOCOL.md's own cases -----------------------------------------------

E = 1_764_570_120  # expires_at; decisions at E - 1 unless a case says otherwise


def fold(steps: list[tuple[str | None, str]], *, peers: int = 3, required: int = 2, at: int = E - 1) -> Tally:
    tally = Tally(peers=peers, required=required, expires_at=E)
    for kind, who in steps:
        tally = tally.step(kind, who, now=at)  # type: ignore[arg-type]
    return tally


def seen(tally: Tally) -> tuple[str, list[str], list[str]]:
    return tally.state, sorted(tally.approvers), sorted(tally.deniers)


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        # Rule 5: a repeat counts once; the threshold approves.
        ([("approval", "beta"), ("approval", "beta")], ("pending", ["beta"], [])),
        ([("approval", "beta"), ("approval", "gamma")], ("approved", ["beta", "gamma"], [])),
        # Rule 6: a denial after the signer's approval takes it away; an approval after a denial is ignored.
        ([("approval", "beta"), ("denial", "beta")], ("pending", [], ["beta"])),
        ([("denial", "beta"), ("approval", "beta"), ("approval", "gamma")], ("pending", ["gamma"], ["beta"])),
        # 2 of 3: one denial can be spared, the second decides, even one that takes an approval away.
        ([("approval", "beta"), ("denial", "gamma"), ("denial", "beta")], ("denied", [], ["beta", "gamma"])),
        # Once decided, nothing changes: not a later denial, nor one that would take an approval away.
        (
            [("approval", "beta"), ("approval", "gamma"), ("denial", "beta")],
            ("approved", ["beta", "gamma"], []),
        ),
        ([("denial", "beta"), ("denial", "gamma"), ("approval", "delta")], ("denied", [], ["beta", "gamma"])),
        # Settling expiry alone before it is due changes nothing.
        ([(None, ""), ("approval", "beta")], ("pending", ["beta"], [])),
    ],
)
def test_the_reference_applies_the_counting_rules(
    steps: list[tuple[str | None, str]], expected: tuple[str, list[str], list[str]]
) -> None:
    assert seen(fold(steps)) == expected


def test_the_reference_denies_as_soon_as_the_quorum_cannot_be_reached() -> None:
    # 3 of 3: the first denial decides, even after two approvals (one of them its signer's).
    assert seen(fold([("approval", "beta"), ("approval", "gamma"), ("denial", "beta")], required=3)) == (
        "denied",
        ["gamma"],
        ["beta"],
    )
    # 1 of 3: only three denials deny.
    assert fold([("denial", "beta"), ("denial", "gamma")], required=1).state == "pending"
    assert fold([("denial", "beta"), ("denial", "gamma"), ("denial", "delta")], required=1).state == "denied"


def test_the_reference_expires_after_expires_at_first_and_counts_nothing_then() -> None:
    assert fold([("approval", "beta")], at=E).approvers == {"beta"}  # at expires_at it still counts
    late = fold([("approval", "beta")]).step("approval", "gamma", now=E + 0.5)
    assert seen(late) == ("expired", ["beta"], [])
    # Decided before the expiry: the outcome stays.
    approved = fold([("approval", "beta"), ("approval", "gamma")])
    assert approved.step(None, now=E + 100) is approved


@pytest.mark.parametrize(("peers", "required"), [(3, 0), (3, 4)])
def test_a_tally_needs_a_threshold_its_peers_can_meet(peers: int, required: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^required must be between 1 and peers \({peers}\), not {required}$"
    ):
        Tally(peers=peers, required=required, expires_at=E)


def test_the_reference_refuses_an_unknown_kind() -> None:
    with pytest.raises(
        ValueError, match=r"^decision kind must be 'approval', 'denial' or None, not 'maybe'$"
    ):
        fold([("maybe", "beta")])
