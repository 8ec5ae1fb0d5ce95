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

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from lies import Lie, lies
from relay_support import READY_TIMEOUT, approval, denial, free_port, public_line, signer, write_cluster
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from words_support import AGO, moment_re

from teaagent.audit import AuditLogger, verify_log
from teaagent.config import NodeConfig, load_config
from teaagent.llm import ScriptedAdapter
from teaagent.quorum import (
    MAX_CERTIFICATE_APPROVALS,
    approval_statement,
    build_certificate,
    payload_digest,
    sign_approval,
    sign_denial,
    sign_request,
    verify_certificate,
)
from teaagent.relay_client import DEFAULT_TIMEOUT, RelayQuorumGate, RequestStatus
from teaagent.relay_client._gate import LATE_ANSWER_SECONDS
from teaagent.runner import AgentRunner, RunResult
from teaagent.runner._node import node_audit_path, node_policy, node_quorum_gate, node_registry
from teaagent.signing import SSHPrivateKey, fingerprint

PEERS = ("beta", "delta", "gamma")
LEAD = "shell.run needs 2 approvals from 3 peers but "
UNVERIFIED = LEAD + "its quorum certificate does not verify: the certificate proves "
NOT_THIS_REQUEST = "does not match the request this node signed for this call."
MADE = "made"  # what the refused command would create in the workspace
TOUCH = f"touch {MADE}"
SHORT_TIMEOUT = 2  # seconds: the quorum timeout of the tests where the relay never decides

# -- the hostile relay ---------------------------------------------------------------------------------

Phase = Literal["submit", "outcome"]


@dataclass
class Asked:
    """One request alpha sent to its relay, as the relay holds it: the request and alpha's signature."""

    request: dict[str, Any]
    signature: str
    submits: int = 0
    polls: int = 0

    @property
    def request_id(self) -> str:
        return str(self.request["request_id"])

    def approval(self, name: str, signed_at: int | None = None) -> dict[str, Any]:
        """``name``'s genuine approval of this very request (what an honest peer sends)."""
        return approval(self.request, name, signed_at)

    def certificate(
        self, *approvals: dict[str, Any], denials: Sequence[dict[str, Any]] = ()
    ) -> dict[str, Any]:
        """This request, alpha's genuine signature over it, ``approvals`` (and ``denials`` when any)."""
        certificate = build_certificate(self.request, self.signature, list(approvals))
        return {**certificate, "denials": list(denials)} if denials else certificate

    def denial(self, name: str, signed_at: int, reason: str = "changed my mind") -> dict[str, Any]:
        """``name``'s genuine denial of this very request, signed at ``signed_at``."""
        return sign_denial(self.request, name, signer(name), reason, signed_at)

    def status(
        self,
        state: str,
        *,
        certificate: object = None,
        signers: Sequence[str] = (),
        denied_by: Sequence[str] = (),
        denials: Sequence[dict[str, Any]] = (),
        reasons: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The body of the real relay's answer (``_status`` in teaagent_relay), saying what we like."""
        return {
            "request_id": self.request_id,
            "state": state,
            "required": self.request["required_approvals"],
            "peers": list(self.request["peers"]),
            "signers": list(signers),
            "denied_by": list(denied_by),
            "denial_reasons": dict(reasons or {}),
            "expires_at": self.request["expires_at"],
            "accepted_at": self.request["created_at"],
            "decided_at": None if state == "pending" else int(time.time()),
            "certificate": certificate,
            "denials": list(denials),
        }


@dataclass(frozen=True)
class Held:
    """Answer ``body`` after ``seconds``, or once the long-poll's wait is over (a relay with nothing new)."""

    body: dict[str, Any]
    seconds: float | None = None


@dataclass(frozen=True)
class Refused:
    """Answer with an ``ErrorOut`` body and this status."""

    status_code: int
    code: str


class Hang:
    """Never answer: hold the connection open and send nothing."""


Answer = dict[str, Any] | Held | Refused | Hang
Tactic = Callable[[Asked, Phase], Answer]


def approving(forge: Callable[[Asked], object], signers: Sequence[str] = ("beta", "gamma")) -> Tactic:
    """Accept the request as pending, then say "approved by beta, gamma" with what ``forge`` makes."""

    def tactic(asked: Asked, phase: Phase) -> Answer:
        if phase == "submit":
            return asked.status("pending")
        return asked.status("approved", certificate=forge(asked), signers=signers)

    return tactic


def genuine(asked: Asked) -> dict[str, Any]:
    """The certificate an honest relay builds: beta's and gamma's approvals of this very request."""
    return asked.certificate(asked.approval("beta"), asked.approval("gamma"))


HONEST = approving(genuine)


class HostileRelay:
    """alpha's own relay, replaced: it keeps what alpha sends and answers whatever ``tactic`` says.

    Served by uvicorn in a thread of the test process, on a loopback port, so that the real gate
    (and a ``teaagent`` process) reach it over real sockets.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.tactic: Tactic = HONEST
        self.asked: dict[str, Asked] = {}
        self._closing = threading.Event()
        app = Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/requests", self._submit, methods=["POST"]),
                Route("/v1/requests/{request_id}", self._outcome),
                Route("/v1/requests/{request_id}/outcome", self._outcome),
            ]
        )
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="hostile-relay", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def last(self) -> Asked:
        """The request alpha sent last."""
        return list(self.asked.values())[-1]

    def __enter__(self) -> HostileRelay:
        self._thread.start()
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the hostile relay did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()  # releases the connections held open by Hang and Held
        self._server.should_exit = True
        self._thread.join(timeout=15)

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _submit(self, request: Request) -> Response:
        body = await request.json()
        document = body["request"]
        asked = self.asked.setdefault(document["request_id"], Asked(document, body["signature"]))
        asked.submits += 1
        return await self._answer(asked, "submit", wait=0.0, status_code=201)

    async def _outcome(self, request: Request) -> Response:
        asked = self.asked.get(request.path_params["request_id"])
        if asked is None:
            return JSONResponse({"error": "not_found", "message": "No such request."}, status_code=404)
        asked.polls += 1
        return await self._answer(asked, "outcome", wait=float(request.query_params.get("wait", "0")))

    async def _answer(self, asked: Asked, phase: Phase, *, wait: float, status_code: int = 200) -> Response:
        answer = self.tactic(asked, phase)
        if isinstance(answer, Hang | Held):
            hold = float("inf") if isinstance(answer, Hang) else answer.seconds
            until = time.monotonic() + (wait if hold is None else hold)
            while time.monotonic() < until and not self._closing.is_set():
                await asyncio.sleep(0.02)
            if isinstance(answer, Hang):
                return Response(status_code=204)  # the test is over; nobody reads it
            answer = answer.body
        if isinstance(answer, Refused):
            body = {"error": answer.code, "message": "Try again later."}
            return JSONResponse(body, status_code=answer.status_code)
        return JSONResponse(answer, status_code=status_code)


# -- the origin: a real node whose relay_url is the hostile relay ----------------------------------------


@dataclass
class Origin:
    """alpha: its node.toml, its workspace and its audit log."""

    node: NodeConfig

    @property
    def workspace(self) -> Path:
        return self.node.workspace

    @property
    def audit_path(self) -> Path:
        return node_audit_path(self.node)

    def records(self, run_id: str | None = None) -> list[dict[str, Any]]:
        lines = self.audit_path.read_text().splitlines()
        found = [json.loads(line) for line in lines]
        return [record for record in found if run_id is None or record["run_id"] == run_id]

    def gate(self, timeout: float, on_status: Callable[[Any], None] | None = None) -> RelayQuorumGate:
        """The node's gate, as ``node_quorum_gate`` makes it, but waiting ``timeout`` seconds in all."""
        node = self.node
        return RelayQuorumGate(
            on_status=on_status,
            relay_url=node.relay_url,
            token=node.load_token(),
            origin=node.agent_id,
            private_key_signer=node.signer(),
            config=node.quorum,
            timeout=timeout,
        )

    def run(self, *commands: str, run_id: str | None = None, gate: Any = None) -> RunResult:
        """One agent run of the scripted model: a turn per ``shell.run`` command, then a final answer.

        The tools, policy, quorum gate and audit log are the node's own (``teaagent run`` builds
        them the same way). The call ids are c1, c2... in every run, as a model's may be.
        """
        node = self.node
        turns: list[dict[str, Any]] = [
            {
                "content": f"Step {number}.",
                "tool_calls": [
                    {"tool_name": "shell.run", "arguments": {"command": command}, "call_id": f"c{number}"}
                ],
            }
            for number, command in enumerate(commands, 1)
        ]
        turns.append({"content": "Done."})
        audit = AuditLogger(self.audit_path)
        try:
            runner = AgentRunner(
                adapter=ScriptedAdapter(turns),
                registry=node_registry(node),
                policy=node_policy(node, quorum_gate=gate if gate is not None else node_quorum_gate(node)),
                audit=audit,
                run_id=run_id,
            )
            return runner.run("Run the commands.")
        finally:
            audit.close()


def write_origin(
    folder: Path,
    relay: HostileRelay,
    *,
    timeout_seconds: int = 60,
    operators: dict[str, list[str]] | None = None,
) -> Path:
    """alpha's node.toml (peers beta, delta, gamma; 2 approvals), its relay being ``relay``.

    ``operators`` names, per peer, operators whose keys alpha lists in that peer's allowed_signers
    file (``<peer>.operators``, which a test may rewrite before loading the configuration).
    """
    nodes = write_cluster(
        folder,
        ["alpha", *PEERS],
        redis_url="embedded",
        prefix="hostile",
        ports={"alpha": relay.port},
        timeout_seconds=timeout_seconds,
        operators=operators,
    )
    path = nodes["alpha"].config_path
    with path.open("a") as config:
        # danger-full-access: the local check lets everything through, so only the quorum stands.
        config.write('\n[agent]\npermission_mode = "danger-full-access"\nprovider = "scripted"\n')
    (folder / "workspace-alpha").mkdir()
    return path


@pytest.fixture(name="relay")
def fixture_relay() -> Iterator[HostileRelay]:
    with HostileRelay(free_port()) as relay:
        yield relay


@pytest.fixture(name="origin")
def fixture_origin(tmp_path: Path, relay: HostileRelay) -> Origin:
    return Origin(load_config(write_origin(tmp_path, relay)))


# A key beta retired on 1 January 2026: alpha still lists it for beta, valid until then.
RETIRED_LINE = f'beta valid-before="20260101" {public_line("beta-retired")} retired@laptop\n'


@pytest.fixture(name="retiring_origin")
def fixture_retiring_origin(tmp_path: Path, relay: HostileRelay) -> Origin:
    """alpha, whose allowed_signers for beta still list the key beta retired (``RETIRED_LINE``)."""
    config = write_origin(tmp_path, relay, operators={"beta": ["beta-retired"]})
    (tmp_path / "beta.operators").write_text(RETIRED_LINE)
    return Origin(load_config(config))


@pytest.fixture(name="short_origin")
def fixture_short_origin(tmp_path: Path, relay: HostileRelay) -> Origin:
    """alpha with a quorum timeout of SHORT_TIMEOUT seconds."""
    return Origin(load_config(write_origin(tmp_path, relay, timeout_seconds=SHORT_TIMEOUT)))


def assert_refused(origin: Origin, result: RunResult, reason: str) -> None:
    """The call never ran, the run ended approval_denied, and the audit log says ``reason``."""
    assert not (origin.workspace / MADE).exists()
    assert result.status == "approval_denied", result.error_message
    assert result.error_message == reason
    kinds = [record["event_type"] for record in origin.records(result.run_id)]
    assert kinds[-3:] == ["approval_request", "approval_denied", "run_end"]
    assert "tool_call" not in kinds
    assert "tool_result" not in kinds
    (denied,) = [r for r in origin.records(result.run_id) if r["event_type"] == "approval_denied"]
    assert denied["payload"]["reason"] == reason
    assert denied["payload"]["arguments"] == {"command": TOUCH}
    assert verify_log(origin.audit_path).ok


def approval_by(key: SSHPrivateKey, request: dict[str, Any], name: str) -> dict[str, Any]:
    """An approval of ``request`` that says ``name`` signed it, made with ``key``."""
    compact = sign_approval(request, name, key)
    return {
        "statement": approval_statement(request, name, int(compact.timestamp)),
        "signature": compact.signature,
    }


def twin(asked: Asked) -> dict[str, Any]:
    """The same call asked once more: alpha's request field for field, but for a new request_id."""
    return dict(asked.request, request_id=secrets.token_hex(16))


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

STRANGER = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment="gamma")
NOT_GAMMAS_KEY = (
    UNVERIFIED + "1 approval of the 2 needed (counted: beta; refused: gamma: the signature does not "
    f"verify with gamma's configured key: the signature was made by key {fingerprint(STRANGER)} but key "
    f"{fingerprint(signer('gamma'))} was expected)."
)


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


# -- a denial: the call does not run either way, but only a signed denial names a peer ----------------


def test_a_denial_on_the_relays_word_alone_blames_no_peer(origin: Origin, relay: HostileRelay) -> None:
    relay.tactic = lambda asked, phase: asked.status(
        "denied", denied_by=["beta", "gamma"], reasons={"beta": "made up", "gamma": "made up"}
    )

    result = origin.run(TOUCH)

    assert_refused(
        origin,
        result,
        "shell.run was not run: the relay reported it denied by beta: made up; gamma: made up "
        "(2 approvals from 3 peers needed), "
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
    assert (result.error_message or "").startswith("shell.run was not run: the relay reported it denied by ")
    assert "but the denials it sent do not prove it (beta: the signature does not verify with beta's" in (
        result.error_message or ""
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
