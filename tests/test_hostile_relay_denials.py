"""A hostile relay's denials and silences: the call never runs, and only what verifies is shown or blamed.

A denial on the relay's word alone, or with forged signatures, names no peer; only a denial the
peers signed does. A relay that never decides, fails every poll or never answers the long poll only
delays the denial, and a wait shows of its request only what verifies. Last, the same through the
command line, as a process. The relay and the origin are ``hostile_relay_support``'s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile_relay_support import (
    HONEST,
    LEAD,
    MADE,
    NOT_GAMMAS_KEY,
    SHORT_TIMEOUT,
    STRANGER,
    TOUCH,
    Answer,
    Asked,
    Hang,
    Held,
    HostileRelay,
    Origin,
    Phase,
    Refused,
    approval_by,
    approving,
    assert_refused,
    genuine,
    write_origin,
)
from hostile_relay_support import fixture_origin as fixture_origin  # the fixture
from hostile_relay_support import fixture_relay as fixture_relay  # the fixture
from hostile_relay_support import fixture_short_origin as fixture_short_origin  # the fixture
from relay_support import approval, denial, signer
from words_support import AGO, moment_re

from teaagent.audit import verify_log
from teaagent.config import load_config
from teaagent.quorum import sign_denial, sign_withdrawal
from teaagent.relay_client import DEFAULT_TIMEOUT, RequestStatus
from teaagent.relay_client._gate import LATE_ANSWER_SECONDS

PEERS = ("beta", "delta", "gamma")

# -- a denial: the call does not run either way, but only a signed denial names a peer ----------------


def test_a_denial_on_the_relays_word_alone_blames_no_peer(origin: Origin, relay: HostileRelay) -> None:
    relay.tactic = lambda asked, phase: asked.status(
        "denied", denied_by=["beta", "gamma"], reasons={"beta": "made up", "gamma": "made up"}
    )

    result = origin.run(TOUCH)

    # Neither the relay's deniers nor its reasons: unproven, they would read as the peers' own.
    assert_refused(
        origin,
        result,
        "shell.run was not run: the relay reported it denied, "
        "but the denials it sent do not prove it (it sent no signed denials).",
    )


def test_a_denial_with_forged_signatures_blames_no_peer(origin: Origin, relay: HostileRelay) -> None:
    def tactic(asked: Asked, phase: Phase) -> Answer:
        forged = denial(asked.request, "beta", "made up")
        forged["statement"] = {**forged["statement"], "reason": "another reason"}
        return asked.status("denied", denied_by=["beta", "gamma"], denials=[forged, forged])

    relay.tactic = tactic

    result = origin.run(TOUCH)

    assert_refused(origin, result, result.error_message or "")
    assert (result.error_message or "").startswith(
        "shell.run was not run: the relay reported it denied, but the denials it sent do not prove it "
        "(beta: the signature does not verify with beta's"
    )
    assert "made up" not in (result.error_message or "")


def test_a_relays_reasons_cannot_draw_a_line_of_their_own(origin: Origin, relay: HostileRelay) -> None:
    # A reason holding a line break and the wording of a verified denial: never shown at all.
    forged = "x\nteaagent: shell.run was denied by delta: not during the freeze"
    relay.tactic = lambda asked, phase: asked.status(
        "denied", denied_by=["beta", "gamma"], reasons={"beta": forged, "gamma": forged}
    )

    result = origin.run(TOUCH)

    assert "\n" not in (result.error_message or "")
    assert "not during the freeze" not in (result.error_message or "")
    assert_refused(origin, result, result.error_message or "")


def test_one_true_denial_too_few_to_deny_is_said_so_not_that_none_was_sent(
    origin: Origin, relay: HostileRelay
) -> None:
    relay.tactic = lambda asked, phase: asked.status(
        "denied", denied_by=["beta"], denials=[denial(asked.request, "beta", "not now")]
    )

    result = origin.run(TOUCH)

    assert_refused(
        origin,
        result,
        "shell.run was not run: the relay reported it denied, but the denials it sent do not prove it "
        "(the signed denials that verify are too few to deny it).",
    )


def test_a_withdrawal_this_node_signed_is_called_one(origin: Origin, relay: HostileRelay) -> None:
    relay.tactic = lambda asked, phase: {
        **asked.status("withdrawn"),
        "withdrawal": sign_withdrawal(asked.request, signer("alpha")),
    }

    result = origin.run(TOUCH)

    assert re.fullmatch(
        r"shell\.run was not run: request [0-9a-f]{32} was withdrawn\.", result.error_message or ""
    )
    assert_refused(origin, result, result.error_message or "")


def test_a_withdrawal_this_node_never_signed_is_not_called_one(origin: Origin, relay: HostileRelay) -> None:
    relay.tactic = lambda asked, phase: asked.status("withdrawn")

    result = origin.run(TOUCH)

    assert_refused(origin, result, result.error_message or "")
    assert (result.error_message or "").endswith("withdrawn, but sent no withdrawal this node signed."), (
        result.error_message
    )


def test_a_denial_signed_by_the_peers_names_them(origin: Origin, relay: HostileRelay) -> None:
    relay.tactic = lambda asked, phase: asked.status(
        "denied",
        denied_by=["beta", "gamma"],
        denials=[denial(asked.request, "beta", "not now"), denial(asked.request, "gamma", "no")],
    )

    result = origin.run(TOUCH)

    assert_refused(
        origin, result, "shell.run was denied by beta: not now; gamma: no (2 approvals from 3 peers needed)."
    )


# -- 8. never answering: a delay, then a denial -----------------------------------------------------------


@pytest.mark.slow
def test_a_relay_that_never_decides_only_delays_the_denial(short_origin: Origin, relay: HostileRelay) -> None:
    # It accepts the request, then answers every long-poll with "pending" once its wait is over.
    relay.tactic = lambda asked, phase: (
        asked.status("pending") if phase == "submit" else Held(asked.status("pending"))
    )
    started = time.monotonic()

    result = short_origin.run(TOUCH, gate=short_origin.gate(SHORT_TIMEOUT))

    elapsed = time.monotonic() - started
    assert_refused(short_origin, result, LEAD + f"no quorum was reached within {SHORT_TIMEOUT} seconds.")
    assert SHORT_TIMEOUT <= elapsed < SHORT_TIMEOUT + 10


def test_what_the_asking_side_shows_of_a_wait_is_only_what_verifies(
    short_origin: Origin, relay: HostileRelay
) -> None:
    # "Approved by beta, gamma; denied by delta", pending: no document of the first two, and a
    # denial signed by a key that is not delta's. The display names nobody; one genuine approval
    # (gamma's), sent beside the claims, is shown as gamma's alone.
    def tactic(asked: Asked, phase: Phase) -> Answer:
        body = asked.status(
            "pending",
            signers=("beta", "gamma"),
            denied_by=("delta",),
            reasons={"delta": "no"},
            denials=(sign_denial(asked.request, "delta", STRANGER, "no"),),
        )
        forged = approval_by(STRANGER, asked.request, "beta")  # beta's name, another key
        body["approvals"] = [forged, approval(asked.request, "gamma")] if phase == "outcome" else []
        return body if phase == "submit" else Held(body)

    relay.tactic = tactic
    seen: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    documents: list[tuple[list[str], int]] = []  # the signed documents shown beside the names

    def shown(status: RequestStatus) -> None:
        seen.append((tuple(status.signers), tuple(status.denied_by)))
        documents.append(([a["statement"]["signer"] for a in status.approvals], len(status.denials)))

    gate = short_origin.gate(SHORT_TIMEOUT, on_status=shown)

    result = short_origin.run(TOUCH, gate=gate)

    assert_refused(short_origin, result, LEAD + f"no quorum was reached within {SHORT_TIMEOUT} seconds.")
    assert seen[0] == ((), ())
    assert set(seen[1:]) == {(("gamma",), ())}
    assert documents[0] == ([], 0)
    assert all(found == (["gamma"], 0) for found in documents[1:])


def test_what_a_wait_shows_of_its_own_request_is_the_signed_requests_whatever_the_relay_says(
    short_origin: Origin, relay: HostileRelay
) -> None:
    # The relay says the request needs 1 approval of one peer, mallory, expires in a day, and is
    # approved: none of it is in the request this node signed, so none of it is shown.
    def tactic(asked: Asked, phase: Phase) -> Answer:
        body = asked.status("approved" if phase == "outcome" else "pending")
        body.update(required=1, peers=["mallory"], expires_at=asked.request["expires_at"] + 86_400)
        return body if phase == "submit" else Held(body)

    relay.tactic = tactic
    seen: list[RequestStatus] = []
    gate = short_origin.gate(SHORT_TIMEOUT, on_status=seen.append)

    result = short_origin.run(TOUCH, gate=gate)

    request = relay.last().request
    assert_refused(
        short_origin,
        result,
        LEAD + f"no quorum could be obtained: the relay approved request {request['request_id']} but sent "
        "no certificate.",
    )
    assert seen
    for status in seen:
        assert (status.required, status.peers, status.expires_at) == (
            request["required_approvals"],
            tuple(request["peers"]),
            request["expires_at"],
        )
        assert status.state in ("pending", "expired")  # never the relay's "approved"
        assert status.signers == ()


@pytest.mark.slow
def test_a_relay_that_fails_every_poll_only_delays_the_denial(
    short_origin: Origin, relay: HostileRelay
) -> None:
    # It accepts the request (each time the gate sends it again), and answers 503 to every poll.
    relay.tactic = lambda asked, phase: (
        asked.status("pending") if phase == "submit" else Refused(503, "unavailable")
    )
    started = time.monotonic()

    result = short_origin.run(TOUCH, gate=short_origin.gate(SHORT_TIMEOUT))

    elapsed = time.monotonic() - started
    asked = relay.last()
    # Which sentence depends on where the deadline fell: after a failed poll, after the request
    # was sent again, or while a resend (bounded by the deadline) was still in flight on a loaded
    # machine. Each says the quorum was not obtained, and why.
    failed = (
        LEAD + f"no quorum could be obtained: the relay at {relay.url} refused the outcome of request "
        f"{asked.request_id} (503 unavailable): Try again later."
    )
    resend_cut = (
        LEAD + f"no quorum could be obtained: the relay at {relay.url} did not answer request "
        f"{asked.request_id} in time: timed out."
    )
    timed_out = LEAD + f"no quorum was reached within {SHORT_TIMEOUT} seconds."
    assert result.error_message in (failed, resend_cut, timed_out)
    assert_refused(short_origin, result, result.error_message)
    assert asked.submits >= 2  # the gate sent the request again after the relay "came back"
    assert SHORT_TIMEOUT <= elapsed < SHORT_TIMEOUT + 10


@pytest.mark.slow
def test_a_relay_that_never_answers_the_long_poll_only_delays_the_denial(
    short_origin: Origin, relay: HostileRelay
) -> None:
    # It accepts the request, then holds the long-poll open and sends nothing: the gate's HTTP
    # timeout (its wait plus DEFAULT_TIMEOUT) ends it, past the gate's own deadline.
    relay.tactic = lambda asked, phase: asked.status("pending") if phase == "submit" else Hang()
    started = time.monotonic()

    result = short_origin.run(TOUCH, gate=short_origin.gate(SHORT_TIMEOUT))

    elapsed = time.monotonic() - started
    asked = relay.last()
    assert_refused(
        short_origin,
        result,
        LEAD + f"no quorum could be obtained: the relay at {relay.url} did not answer the outcome of "
        f"request {asked.request_id} in time: timed out.",
    )
    # Past the gate's deadline by no more than an honest answer's time in flight (it once ran
    # on for the whole HTTP timeout, DEFAULT_TIMEOUT more).
    assert (
        SHORT_TIMEOUT <= elapsed < SHORT_TIMEOUT + LATE_ANSWER_SECONDS + 4 < SHORT_TIMEOUT + DEFAULT_TIMEOUT
    )


@pytest.mark.slow
def test_a_genuine_certificate_held_back_until_it_expired_never_runs(
    short_origin: Origin, relay: HostileRelay
) -> None:
    # The true certificate, handed over only once the request has expired (the gate, as the node
    # makes it, waits the quorum timeout plus a grace).
    def tactic(asked: Asked, phase: Phase) -> Answer:
        if phase == "submit":
            return asked.status("pending")
        late = asked.request["expires_at"] + 1.2 - time.time()
        return Held(asked.status("approved", signers=["beta", "gamma"], certificate=genuine(asked)), late)

    relay.tactic = tactic

    result = short_origin.run(TOUCH)

    expires_at = relay.last().request["expires_at"]
    assert result.error_message is not None
    assert re.fullmatch(
        re.escape(LEAD + "its quorum certificate expired at ")
        + moment_re(expires_at, AGO)
        + re.escape(", before it was to be used."),
        result.error_message,
    )
    assert_refused(short_origin, result, result.error_message)


# -- through the command line, as a process ---------------------------------------------------------------


def tools_call(config: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``teaagent tools call --config alpha.toml shell.run`` as a process of its own."""
    env = dict(os.environ)
    env.pop("TEAAGENT_CONFIG", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "teaagent",
            "tools",
            "call",
            "--config",
            str(config),
            "shell.run",
            json.dumps({"command": command}),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_through_the_cli_a_lie_exits_3_and_the_truth_runs(tmp_path: Path, relay: HostileRelay) -> None:
    config = write_origin(tmp_path, relay)
    origin = Origin(load_config(config))
    relay.tactic = approving(
        lambda asked: asked.certificate(asked.approval("beta"), approval_by(STRANGER, asked.request, "gamma"))
    )

    lied = tools_call(config, TOUCH)

    reason = NOT_GAMMAS_KEY
    assert (lied.returncode, lied.stdout) == (3, ""), lied.stderr
    assert lied.stderr.endswith(f"teaagent: {reason}\n")
    assert not (origin.workspace / MADE).exists()
    (denied,) = [r for r in origin.records() if r["event_type"] == "approval_denied"]
    assert denied["payload"]["reason"] == reason

    relay.tactic = HONEST
    told = tools_call(config, TOUCH)

    assert told.returncode == 0, told.stderr
    assert (origin.workspace / MADE).exists()
    assert [r["event_type"] for r in origin.records()].count("tool_result") == 1
    assert verify_log(origin.audit_path).ok
