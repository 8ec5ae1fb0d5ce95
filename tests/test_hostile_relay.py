"""A hostile relay in place of the origin's own: whatever it answers, only a true quorum runs the call.

PROTOCOL.md says relays hold no keys and are not trusted: the origin binds every certificate to the
request it signed for the call ("Using a certificate") and counts its approvals under its own
configuration ("Counting"). This module is the proof. alpha's own relay is replaced by
:class:`HostileRelay`, a small Starlette app on a loopback port that speaks the relay API to the
real :class:`~teaagent.relay_client.RelayQuorumGate` of a real node (node.toml, key, policy, tools,
audit log). It holds real signatures by the peers' real keys, so that each lie is the strongest a
relay could tell: genuine approvals, of something else.

For each attack the ``shell.run`` that would create a file in the workspace never runs, the run ends
``approval_denied`` (the CLI exits 3), and the audit log's ``approval_denied`` record says why; a
relay that never answers only delays the denial. The control: the same relay turned honest gets
the call run, so none of this passes for a trivial reason.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any, Literal

import pytest
from hostile_relay_support import (
    LEAD,
    MADE,
    NOT_GAMMAS_KEY,
    NOT_THIS_REQUEST,
    STRANGER,
    TOUCH,
    UNVERIFIED,
    Answer,
    Asked,
    Held,
    HostileRelay,
    Origin,
    Phase,
    Tactic,
    approval_by,
    approving,
    assert_refused,
    genuine,
    twin,
)
from hostile_relay_support import fixture_origin as fixture_origin  # the fixture
from hostile_relay_support import fixture_relay as fixture_relay  # the fixture
from hostile_relay_support import fixture_retiring_origin as fixture_retiring_origin  # the fixture
from hostile_relay_support import fixture_short_origin as fixture_short_origin  # the fixture
from lies import Lie, lies
from relay_support import approval, denial, signer
from words_support import AGO, moment_re

from teaagent.quorum import (
    MAX_CERTIFICATE_APPROVALS,
    approval_statement,
    build_certificate,
    payload_digest,
    sign_approval,
    sign_request,
    verify_certificate,
)

PEERS = ("beta", "delta", "gamma")

# -- the control: an honest relay gets the call run -------------------------------------------------------


def test_the_relay_turned_honest_gets_the_call_run(origin: Origin, relay: HostileRelay) -> None:
    result = origin.run(TOUCH)

    assert result.status == "completed", result.error_message
    assert (origin.workspace / MADE).exists()
    records = origin.records(result.run_id)
    kinds = [record["event_type"] for record in records]
    assert kinds[kinds.index("approval_request") :][:4] == [
        "approval_request",
        "approval_granted",
        "tool_call",
        "tool_result",
    ]
    (granted,) = [record for record in records if record["event_type"] == "approval_granted"]
    certificate = granted["payload"]["certificate"]
    assert certificate["request"] == relay.last().request
    assert [a["statement"]["signer"] for a in certificate["approvals"]] == ["beta", "gamma"]


# -- 0. every field of every answer, one lie at a time ------------------------------------------------


def test_every_field_of_every_answer_rewritten_runs_nothing_without_a_certificate_for_this_call(
    short_origin: Origin, relay: HostileRelay
) -> None:
    """The relay's two answers (the submission's, the outcome's), each field changed in turn.

    The lies come from the fields of a genuine answer (``tests/lies.py``), the certificate's own
    included. Whatever the lie, the run either runs the call on a certificate that verifies under
    alpha's configuration for exactly the request alpha signed for it, or ends ``approval_denied``
    saying why; it never crashes, and a lie inside the signed request never runs.
    """
    origin = short_origin
    first = origin.run(TOUCH)  # the control, honest; and a genuine answer to take the fields from
    assert first.status == "completed", first.error_message
    sample = relay.last()
    submitted = sample.status("pending")
    approved = sample.status("approved", certificate=genuine(sample), signers=("beta", "gamma"))
    cases = [("submit", lie) for lie in lies(submitted)] + [("outcome", lie) for lie in lies(approved)]
    ran = refused = 0
    for phase, lie in cases:
        (origin.workspace / MADE).unlink(missing_ok=True)

        def tactic(asked: Asked, now: Phase, phase: str = phase, lie: Lie = lie) -> Answer:
            honest = (
                asked.status("pending")
                if now == "submit"
                else asked.status("approved", certificate=genuine(asked), signers=("beta", "gamma"))
            )
            told = lie.told(honest) if now == phase and lie.fits(honest) else honest
            return told if now == "submit" or told.get("state") != "pending" else Held(told, 0.05)

        relay.tactic = tactic
        result = origin.run(TOUCH)

        name = f"{phase} {lie.name}"
        assert result.status in ("completed", "approval_denied"), (name, result.status, result.error_message)
        if result.status == "approval_denied":
            refused += 1
            assert not (origin.workspace / MADE).exists(), name
            assert result.error_message, name
            continue
        ran += 1
        assert (origin.workspace / MADE).exists(), name
        asked = relay.last()
        (granted,) = [r for r in origin.records(result.run_id) if r["event_type"] == "approval_granted"]
        certificate = granted["payload"]["certificate"]
        assert certificate["request"] == asked.request, name
        own_key = origin.node.own_public_key().to_line()
        verify_certificate(certificate, origin.node.quorum, origin_public_key=own_key)
        signed_part = lie.path[:2] in (("certificate", "request"), ("certificate", "request_signature"))
        assert not signed_part, name
    print(f"\n{len(cases)} lies about the gate's answers: {ran} ran, {refused} refused")
    assert refused > len(cases) // 4
    assert ran > 0


# -- 1. "approved" with nothing to show for it --------------------------------------------------------


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        pytest.param(
            lambda asked: asked.certificate(),
            UNVERIFIED + "0 approvals of the 2 needed (counted: nobody).",
            id="no-approvals",
        ),
        pytest.param(lambda asked: None, None, id="no-certificate"),
        pytest.param(lambda asked: "approved", "not-a-status", id="not-a-certificate"),
        pytest.param(
            lambda asked: {"request_signature": asked.signature, "approvals": []},
            LEAD + "the quorum certificate holds no request.",
            id="no-request",
        ),
    ],
)
def test_approved_without_signatures_never_runs(
    origin: Origin, relay: HostileRelay, forge: Callable[[Asked], object], reason: str | None
) -> None:
    relay.tactic = approving(forge)

    result = origin.run(TOUCH)

    if reason is None:
        reason = (
            LEAD + f"no quorum could be obtained: the relay approved request {relay.last().request_id} "
            "but sent no certificate."
        )
    elif reason == "not-a-status":
        # Refused as soon as it answers: a relay that sends nonsense is not waited out.
        reason = (
            LEAD + f"no quorum could be obtained: the relay at {relay.url} answered the outcome of request "
            f"{relay.last().request_id} with something that is not a request status: its certificate is "
            "not a JSON object."
        )
    assert_refused(origin, result, reason)


# -- 2. valid approvals, signed over another request ----------------------------------------------------


def harmless(asked: Asked) -> dict[str, Any]:
    """This very request (its id included), but for a harmless command: what the peers were shown."""
    arguments = {"command": "echo hi"}
    return dict(asked.request, arguments=arguments, payload_digest=payload_digest("shell.run", arguments))


@pytest.mark.parametrize(
    ("other", "field"),
    [
        # The same command in the same run and call slot, created the same second: only the
        # request_id tells the two apart, and the statements carry it.
        pytest.param(twin, "request_id", id="another-request-id"),
        # The same request_id, approved for another command.
        pytest.param(harmless, "payload_digest", id="another-command"),
    ],
)
def test_approvals_of_another_request_never_run(
    origin: Origin, relay: HostileRelay, other: Callable[[Asked], dict[str, Any]], field: str
) -> None:
    def forge(asked: Asked) -> dict[str, Any]:
        shown = other(asked)
        return asked.certificate(approval(shown, "beta"), approval(shown, "gamma"))

    relay.tactic = approving(forge)

    result = origin.run(TOUCH)

    mismatch = f"the statement's {field} does not match the request"
    assert_refused(
        origin,
        result,
        UNVERIFIED + f"0 approvals of the 2 needed (counted: nobody; refused: beta: {mismatch}; "
        f"gamma: {mismatch}).",
    )


def test_another_requests_whole_certificate_never_runs(origin: Origin, relay: HostileRelay) -> None:
    # A certificate that verifies on its own (alpha's signature, beta's and gamma's approvals,
    # all genuine): of the twin request, not of this one.
    def forge(asked: Asked) -> dict[str, Any]:
        other = twin(asked)
        signature = sign_request(other, signer("alpha"))
        return build_certificate(other, signature, [approval(other, "beta"), approval(other, "gamma")])

    relay.tactic = approving(forge)

    result = origin.run(TOUCH)

    assert_refused(origin, result, LEAD + f"the quorum certificate's request_id {NOT_THIS_REQUEST}")


# -- 3. a stale certificate from an earlier run -------------------------------------------------------------


def test_a_stale_certificate_of_an_earlier_run_never_runs(origin: Origin, relay: HostileRelay) -> None:
    # The earlier run had the same run id, call id and command, and its certificate is genuine:
    # the relay kept it and hands it back for the new request.
    append = f"echo ran >> {MADE}.log"
    first = origin.run(append, run_id="run-1")
    assert first.status == "completed", first.error_message
    (granted,) = [r for r in origin.records("run-1") if r["event_type"] == "approval_granted"]
    kept = granted["payload"]["certificate"]  # the very certificate alpha accepted and ran on
    relay.tactic = approving(lambda asked: kept)

    second = origin.run(append, run_id="run-1")

    assert (origin.workspace / f"{MADE}.log").read_text() == "ran\n"  # the first run's line only
    assert second.status == "approval_denied"
    reason = LEAD + f"the quorum certificate's request_id {NOT_THIS_REQUEST}"
    assert second.error_message == reason
    refusals = [r for r in origin.records("run-1") if r["event_type"] == "approval_denied"]
    assert [r["payload"]["reason"] for r in refusals] == [reason]
    assert [r["event_type"] for r in origin.records("run-1")].count("tool_call") == 1


# -- 4. this request's certificate, one approval counted twice ---------------------------------------------


@pytest.mark.parametrize(
    "copies",
    [
        pytest.param(lambda asked: [asked.approval("beta")] * 2, id="the-same-approval-twice"),
        pytest.param(
            lambda asked: [asked.approval("beta", int(time.time()) - 1), asked.approval("beta")],
            id="two-valid-approvals-by-beta",
        ),
    ],
)
def test_one_signer_in_place_of_two_never_runs(
    origin: Origin, relay: HostileRelay, copies: Callable[[Asked], list[dict[str, Any]]]
) -> None:
    # gamma's approval replaced by a second one of beta's: both verify, beta counts once.
    relay.tactic = approving(lambda asked: asked.certificate(*copies(asked)))

    result = origin.run(TOUCH)

    assert_refused(origin, result, UNVERIFIED + "1 approval of the 2 needed (counted: beta).")


# -- 5. an approval by a key that is not the peer's -------------------------------------------------------


def test_an_approval_by_a_key_not_configured_for_the_peer_never_runs(
    origin: Origin, relay: HostileRelay
) -> None:
    # It says "gamma" and verifies with its own key; gamma's configured key is another one.
    relay.tactic = approving(
        lambda asked: asked.certificate(asked.approval("beta"), approval_by(STRANGER, asked.request, "gamma"))
    )

    result = origin.run(TOUCH)

    assert_refused(origin, result, NOT_GAMMAS_KEY)


def test_an_approval_by_a_node_that_is_no_peer_never_runs(origin: Origin, relay: HostileRelay) -> None:
    # epsilon's genuine key and signature, over this very request: epsilon is not asked.
    relay.tactic = approving(
        lambda asked: asked.certificate(asked.approval("beta"), approval(asked.request, "epsilon")),
        signers=("beta", "epsilon"),
    )

    result = origin.run(TOUCH)

    assert_refused(
        origin,
        result,
        UNVERIFIED + "1 approval of the 2 needed (counted: beta; refused: epsilon: epsilon is not a "
        "peer of this request).",
    )


# -- 5b. an approval back-dated by a key its peer retired ---------------------------------------------


def test_a_retired_key_back_dating_an_approval_never_runs(
    retiring_origin: Origin, relay: HostileRelay
) -> None:
    # beta's retired key signs this brand-new request as of the last second it was valid: its
    # signature verifies and the key's validity allows that signing time; only rule 4's lower
    # bound (nobody signs a request before it exists) refuses it.
    (retired,) = [key for key in retiring_origin.node.quorum.keys_of("beta") if key.valid_before is not None]
    assert retired.valid_before is not None
    signed_at = retired.valid_before - 1

    def forge(asked: Asked) -> dict[str, Any]:
        compact = sign_approval(asked.request, "beta", signer("beta-retired"), signed_at)
        backdated = {
            "statement": approval_statement(asked.request, "beta", signed_at),
            "signature": compact.signature,
        }
        return asked.certificate(backdated, asked.approval("gamma"))

    relay.tactic = approving(forge)

    result = retiring_origin.run(TOUCH)

    created = relay.last().request["created_at"]
    assert result.error_message is not None
    assert re.fullmatch(
        re.escape(UNVERIFIED + "1 approval of the 2 needed (counted: gamma; refused: beta: it was signed at ")
        + moment_re(signed_at, AGO)
        + ", more than 60 seconds before the request was created at "
        + moment_re(created, AGO)
        + re.escape(")."),
        result.error_message,
    ), result.error_message
    assert_refused(retiring_origin, result, result.error_message)


# -- 6. a denial reported as an approval -------------------------------------------------------------------


def test_a_denial_carried_as_an_approval_never_runs(origin: Origin, relay: HostileRelay) -> None:
    relay.tactic = approving(
        lambda asked: asked.certificate(denial(asked.request, "beta"), asked.approval("gamma"))
    )

    result = origin.run(TOUCH)

    assert_refused(
        origin,
        result,
        UNVERIFIED + "1 approval of the 2 needed (counted: gamma; refused: beta: the statement has the "
        "unknown field reason).",
    )


def test_a_denials_signature_under_an_approval_statement_never_runs(
    origin: Origin, relay: HostileRelay
) -> None:
    # The relay rewrites beta's denial into the approval statement and keeps beta's signature.
    def forge(asked: Asked) -> dict[str, Any]:
        vetoed = denial(asked.request, "beta")
        statement = approval_statement(asked.request, "beta", vetoed["statement"]["signed_at"])
        return asked.certificate(
            {"statement": statement, "signature": vetoed["signature"]}, asked.approval("gamma")
        )

    relay.tactic = approving(forge)

    result = origin.run(TOUCH)

    assert_refused(
        origin,
        result,
        UNVERIFIED + "1 approval of the 2 needed (counted: gamma; refused: beta: the signature does not "
        "verify with beta's configured key: signature namespace is 'teaagent-denial' but 'teaagent-approval' "
        "was expected).",
    )


# -- 6b. a peer's veto hidden: its approval kept, its later denial counted -----------------------------

VETOED = UNVERIFIED + (
    "1 approval of the 2 needed (counted: gamma; refused: beta: beta also denied the request, so its "
    "approval is not counted)."
)
Where = Literal["nowhere", "outcome", "certificate"]


def approved_with(denier: str, where: Where) -> Tactic:
    """An approved outcome: beta's and gamma's genuine approvals, and ``denier``'s genuine denial.

    The denial is signed a second after beta's approval and carried ``where``: beside the
    certificate in the outcome's ``denials``, in the certificate's own ``denials``, or nowhere
    (dropped).
    """

    def tactic(asked: Asked, phase: Phase) -> Answer:
        if phase == "submit":
            return asked.status("pending")
        now = int(time.time())
        approvals = (asked.approval("beta", now - 1), asked.approval("gamma"))
        denials = [asked.denial(denier, now)]
        carried = denials if where == "certificate" else []
        return asked.status(
            "approved",
            certificate=asked.certificate(*approvals, denials=carried),
            signers=["beta", "gamma"],
            denials=denials if where == "outcome" else [],
        )

    return tactic


@pytest.mark.parametrize("where", ["outcome", "certificate"])
def test_an_approval_whose_signer_also_denied_never_runs(
    origin: Origin, relay: HostileRelay, where: Where
) -> None:
    # beta approved, then denied (rule 6: it counts as a denial only). The relay counted the denial
    # (it hands it over) yet keeps beta's approval in the certificate, as if it counted both.
    relay.tactic = approved_with("beta", where)

    result = origin.run(TOUCH)

    assert_refused(origin, result, VETOED)


@pytest.mark.parametrize("where", ["nowhere", "outcome", "certificate"])
def test_a_denial_by_a_peer_that_did_not_approve_leaves_the_quorum_standing(
    origin: Origin, relay: HostileRelay, where: Where
) -> None:
    # The control: delta's denial, wherever it travels, takes no approval away, and beta's and
    # gamma's approvals are a quorum; the certificate alpha audits carries the denial it was shown.
    relay.tactic = approved_with("delta", where)

    result = origin.run(TOUCH)

    assert result.status == "completed", result.error_message
    assert (origin.workspace / MADE).exists()
    (granted,) = [r for r in origin.records(result.run_id) if r["event_type"] == "approval_granted"]
    certificate = granted["payload"]["certificate"]
    assert [a["statement"]["signer"] for a in certificate["approvals"]] == ["beta", "gamma"]
    carried = [d["statement"]["signer"] for d in certificate.get("denials", [])]
    assert carried == ([] if where == "nowhere" else ["delta"])


# -- 7. reordered and repeated events -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("copies", "why"),
    [
        pytest.param(50, "proves 1 approval of the 2 needed (counted: beta).", id="fifty-of-beta"),
        pytest.param(
            MAX_CERTIFICATE_APPROVALS + 1,
            f"carries {MAX_CERTIFICATE_APPROVALS + 1} approvals, more than the limit of "
            f"{MAX_CERTIFICATE_APPROVALS}.",
            id="past-the-limit",
        ),
    ],
)
def test_one_signers_approval_repeated_never_runs(
    origin: Origin, relay: HostileRelay, copies: int, why: str
) -> None:
    # beta's approval over and over, each copy signed at another second: many valid signatures,
    # one signer.
    def forge(asked: Asked) -> dict[str, Any]:
        now = int(time.time())
        signed = [asked.approval("beta", now - n) for n in range(min(copies, 50))]
        return asked.certificate(*(signed[n % len(signed)] for n in range(copies)))

    relay.tactic = approving(forge, signers=("beta",) * copies)

    result = origin.run(TOUCH)

    assert_refused(origin, result, LEAD + "its quorum certificate does not verify: the certificate " + why)


def test_outcomes_that_flip_and_repeat_never_run(origin: Origin, relay: HostileRelay) -> None:
    # Counts that go up and down, "pending" said again and again, then "approved" with the
    # approvals the relay claimed along the way: beta's, twice, and nothing of gamma's.
    def tactic(asked: Asked, phase: Phase) -> Answer:
        steps = [
            asked.status("pending", signers=["beta", "gamma"]),
            asked.status("pending"),
            asked.status("pending", signers=["beta"]),
            asked.status("pending", signers=["beta"]),
            asked.status(
                "approved",
                signers=["beta", "gamma"],
                certificate=asked.certificate(
                    asked.approval("beta", int(time.time()) - 1), asked.approval("beta")
                ),
            ),
            asked.status("approved", signers=["beta", "gamma"], certificate=genuine(asked)),
        ]
        return steps[min(asked.submits + asked.polls - 1, len(steps) - 1)]

    relay.tactic = tactic

    result = origin.run(TOUCH)

    assert_refused(origin, result, UNVERIFIED + "1 approval of the 2 needed (counted: beta).")
    # The first decided answer ends the wait: a later, honest one is never asked for.
    assert (relay.last().submits, relay.last().polls) == (1, 4)


def test_an_earlier_calls_outcome_never_runs_a_later_one(origin: Origin, relay: HostileRelay) -> None:
    # c1 is genuinely approved and runs; the relay answers c2, the same command, with c1's outcome.
    first: list[dict[str, Any]] = []

    def tactic(asked: Asked, phase: Phase) -> Answer:
        if phase == "submit":
            return asked.status("pending")
        if not first:
            first.append(asked.status("approved", signers=["beta", "gamma"], certificate=genuine(asked)))
        return first[0]

    relay.tactic = tactic
    append = f"echo ran >> {MADE}.log"

    result = origin.run(append, append)

    assert (origin.workspace / f"{MADE}.log").read_text() == "ran\n"
    assert result.status == "approval_denied"
    assert result.error_message == LEAD + f"the quorum certificate's request_id {NOT_THIS_REQUEST}"
    kinds = [record["event_type"] for record in origin.records(result.run_id)]
    assert kinds.count("tool_call") == 1
    assert kinds[-3:] == ["approval_request", "approval_denied", "run_end"]
    assert len(relay.asked) == 2
