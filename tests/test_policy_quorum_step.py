"""teaagent.policy's quorum step: a high-risk call runs only on a certificate for this call.

The gate is a stand-in that records, carries a changed certificate, or replays one; then a real
quorum signed with real keys (``ssh-keygen``).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from multisig_support import PEERS, config, exactly
from words_support import AGO, DATE

from teaagent._canonical import payload_digest
from teaagent.errors import ApprovalDeniedError
from teaagent.policy import (
    ApprovalPolicy,
    ApprovalPresetStore,
    ApprovalSource,
    MultiSigQuorumConfig,
    PermissionMode,
)
from teaagent.quorum import request_problem

# -- the quorum step of the policy ------------------------------------------------------------------


class RecordingGate:
    """A gate that records the requests it is handed and answers with ``answer``: a value, an
    exception to raise, or a function of the request (a relay making up a certificate)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(copy.deepcopy(request))
        if isinstance(self.answer, BaseException):
            raise self.answer
        if callable(self.answer):
            return self.answer(request)  # type: ignore[no-any-return]
        return self.answer  # type: ignore[no-any-return]


LEAD = "shell.run needs 2 approvals from 3 peers but "


def gated(workspace: Path, gate: Any, mode: str = "danger-full-access", **fields: Any) -> ApprovalPolicy:
    policy = ApprovalPolicy.for_workspace(
        workspace, mode=mode, agent_id="alpha", multi_sig_config=config(), quorum_gate=gate
    )
    return dataclasses.replace(policy, **fields) if fields else policy


@pytest.mark.parametrize("mode", list(PermissionMode))
def test_high_risk_without_a_gate_is_denied_in_every_mode(workspace: Path, mode: PermissionMode) -> None:
    policy = gated(workspace, None, mode=mode.value, allow_all_destructive=True)
    policy.jit_state.approve_session("shell.run")
    with pytest.raises(ApprovalDeniedError, match=r"^shell\.run "):
        policy.assert_allowed("shell.run", "c1", True, {"command": "ls"})


def test_high_risk_without_a_gate_message(workspace: Path) -> None:
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(LEAD + "no quorum could be obtained: no quorum gate is configured."),
    ):
        gated(workspace, None).assert_allowed("shell.run", "c1", True, {"command": "ls"})


def test_local_pre_approvals_do_not_replace_the_quorum(workspace: Path) -> None:
    arguments = {"command": "ls"}
    store = ApprovalPresetStore(workspace)
    store.add("shell.*")
    policy = gated(
        workspace,
        None,
        mode="allow",
        allow_all_destructive=True,
        preapproved_payload_digests=frozenset({payload_digest("shell.run", arguments)}),
        approval_store=store,
    )
    with pytest.raises(ApprovalDeniedError, match="no quorum gate is configured"):
        policy.assert_allowed("shell.run", "c1", True, arguments)


def test_a_high_risk_read_only_tool_needs_the_quorum_too(workspace: Path) -> None:
    policy = gated(workspace, None, multi_sig_config=config(high_risk_patterns=["fs.*"]))
    with pytest.raises(ApprovalDeniedError, match=r"^fs\.read needs 2 approvals from 3 peers"):
        policy.assert_allowed("fs.read", "c1", False, {"path": "a"}, read_only=True)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            ConnectionError("relay http://127.0.0.1:8701 is unreachable"),
            LEAD + "no quorum could be obtained: relay http://127.0.0.1:8701 is unreachable.",
        ),
        (RuntimeError(""), LEAD + "no quorum could be obtained: RuntimeError."),
        (TimeoutError(), LEAD + "no quorum was reached within 120 seconds."),
        (KeyError("request_id"), LEAD + "no quorum could be obtained: 'request_id'."),
    ],
)
def test_a_gate_that_raises_denies(workspace: Path, error: Exception, message: str) -> None:
    with pytest.raises(ApprovalDeniedError, match=exactly(message)):
        gated(workspace, RecordingGate(error)).assert_allowed("shell.run", "c1", True, {"command": "ls"})


def test_a_denial_from_the_gate_keeps_its_own_sentence(workspace: Path) -> None:
    denial = ApprovalDeniedError("shell.run was denied by beta and gamma: not on a Friday.")
    with pytest.raises(ApprovalDeniedError) as caught:
        gated(workspace, RecordingGate(denial)).assert_allowed("shell.run", "c1", True, {"command": "ls"})
    assert caught.value is denial


def carrying(**changes: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A relay's answer: a certificate whose request is the one sent, with ``changes`` made to it."""

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return {"request": {**request, **changes}, "request_signature": "AAAA", "approvals": []}

    return answer


MISMATCH = "does not match the request this node signed for this call."


@pytest.mark.parametrize(
    ("certificate", "message"),
    [
        (None, LEAD + "the quorum gate returned no certificate."),
        ("certificate", LEAD + "the quorum gate returned no certificate."),
        (lambda request: [request], LEAD + "the quorum gate returned no certificate."),
        ({}, LEAD + "the quorum certificate holds no request."),
        ({"request": "shell.run"}, LEAD + "the quorum certificate holds no request."),
        (carrying(request_id="0" * 32), LEAD + f"the quorum certificate's request_id {MISMATCH}"),
        (carrying(origin="beta"), LEAD + f"the quorum certificate's origin {MISMATCH}"),
        (carrying(run_id="run-0"), LEAD + f"the quorum certificate's run_id {MISMATCH}"),
        (carrying(call_id="c0"), LEAD + f"the quorum certificate's call_id {MISMATCH}"),
        (carrying(tool_name="shell.exec"), LEAD + f"the quorum certificate's tool_name {MISMATCH}"),
        (
            carrying(payload_digest=payload_digest("shell.run", {"command": "rm -rf /"})),
            LEAD + f"the quorum certificate's payload_digest {MISMATCH}",
        ),
        (
            carrying(arguments={"command": "rm -rf /"}),
            LEAD + f"the quorum certificate's arguments {MISMATCH}",
        ),
        (carrying(reason="another reason"), LEAD + f"the quorum certificate's reason {MISMATCH}"),
        (carrying(required_approvals=1), LEAD + f"the quorum certificate's required_approvals {MISMATCH}"),
        (carrying(required_approvals=2.0), LEAD + f"the quorum certificate's required_approvals {MISMATCH}"),
        (carrying(expires_at=4102444800), LEAD + f"the quorum certificate's expires_at {MISMATCH}"),
        (carrying(extra="field"), LEAD + f"the quorum certificate's extra {MISMATCH}"),
        (carrying(), None),  # bound to the call, but proves nothing: teaagent.quorum refuses it
    ],
)
def test_a_gate_that_returns_garbage_denies(workspace: Path, certificate: Any, message: str | None) -> None:
    gate = RecordingGate(certificate)
    with pytest.raises(ApprovalDeniedError, match=exactly(message) if message else f"^{re.escape(LEAD)}"):
        gated(workspace, gate).assert_allowed("shell.run", "c1", True, {"command": "ls"}, run_id="run-1")
    assert len(gate.calls) == 1


def test_the_gate_is_handed_a_request_for_exactly_this_call(workspace: Path) -> None:
    gate = RecordingGate(None)
    before = int(time.time())
    with pytest.raises(ApprovalDeniedError):
        gated(workspace, gate).assert_allowed(
            "shell.run", "c4", True, {"command": "ls"}, reason="list files", run_id="run-9"
        )
    (request,) = gate.calls
    assert request_problem(request) is None
    assert re.fullmatch(r"[0-9a-f]{32}", request["request_id"])
    assert before <= request["created_at"] <= int(time.time())
    assert {name: value for name, value in request.items() if name not in ("request_id", "created_at")} == {
        "v": 1,
        "type": "teaagent.request",
        "origin": "alpha",
        "run_id": "run-9",
        "call_id": "c4",
        "tool_name": "shell.run",
        "arguments": {"command": "ls"},
        "payload_digest": payload_digest("shell.run", {"command": "ls"}),
        "reason": "list files",
        "required_approvals": 2,
        "peers": ["beta", "delta", "gamma"],
        "expires_at": request["created_at"] + 120,
    }


def test_each_call_gets_a_request_of_its_own(workspace: Path) -> None:
    gate = RecordingGate(None)
    policy = gated(workspace, gate)
    for _ in range(2):
        with pytest.raises(ApprovalDeniedError):
            policy.assert_allowed("shell.run", "call_1", True, {"command": "ls"}, run_id="run-1")
    first, second = gate.calls
    assert first["request_id"] != second["request_id"]


def test_the_gate_cannot_change_the_request_the_policy_checks_against(workspace: Path) -> None:
    def rewrite_then_answer(request: dict[str, Any]) -> dict[str, Any]:
        request["call_id"] = "c0"  # the gate's copy; the policy keeps its own
        return {"request": request, "request_signature": "AAAA", "approvals": []}

    with pytest.raises(
        ApprovalDeniedError, match=exactly(LEAD + f"the quorum certificate's call_id {MISMATCH}")
    ):
        gated(workspace, RecordingGate(rewrite_then_answer)).assert_allowed(
            "shell.run", "c1", True, {"command": "ls"}
        )


def test_arguments_without_a_digest_cannot_get_a_quorum(workspace: Path) -> None:
    gate = RecordingGate(None)
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(
            LEAD + "its arguments cannot be written as canonical JSON, so no quorum can approve them."
        ),
    ):
        gated(workspace, gate).assert_allowed("shell.run", "c1", True, {"timeout": float("nan")})
    assert gate.calls == []


def test_a_call_that_is_not_high_risk_never_reaches_the_gate(workspace: Path) -> None:
    gate = RecordingGate(AssertionError("the gate must not be consulted"))
    policy = gated(workspace, gate)
    assert policy.authorize("fs.write", "c1", False, {"path": "a"}).certificate is None
    policy.assert_allowed("fs.read", "c2", False, {"path": "a"}, read_only=True)
    assert gate.calls == []


def test_a_disabled_configuration_never_reaches_the_gate(workspace: Path) -> None:
    gate = RecordingGate(AssertionError("the gate must not be consulted"))
    policy = ApprovalPolicy.for_workspace(
        workspace,
        mode="danger-full-access",
        multi_sig_config=MultiSigQuorumConfig(enabled=False, high_risk_patterns=["*"]),
        quorum_gate=gate,
    )
    policy.assert_allowed("shell.run", "c1", True, {"command": "ls"})
    assert gate.calls == []


def test_the_local_check_comes_first(workspace: Path) -> None:
    gate = RecordingGate(AssertionError("the gate must not be consulted"))
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly("shell.run is destructive and the permission mode is workspace-write."),
    ):
        gated(workspace, gate, mode="workspace-write").assert_allowed(
            "shell.run", "c1", True, {"command": "ls"}
        )
    assert gate.calls == []


# -- a real quorum, signed with real keys -----------------------------------------------------------


class SigningGate:
    """A quorum gate that plays the peers itself: it builds and signs the request and the approvals
    with real SSH keys through teaagent.quorum, as the relay work will over the network."""

    def __init__(
        self,
        quorum_config: MultiSigQuorumConfig,
        origin_key: Path,
        peer_keys: dict[str, Path],
        signers: list[str],
        tamper: Callable[[dict[str, Any]], None] | None = None,
        sign_arguments: dict[str, Any] | None = None,
    ) -> None:
        self.config = quorum_config
        self.sign_arguments = sign_arguments
        self.origin_key = origin_key
        self.peer_keys = peer_keys
        self.signers = signers
        self.tamper = tamper
        self.issued: list[dict[str, Any]] = []  # every certificate handed out, as a relay would keep them

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        from teaagent.quorum import build_certificate, build_request, sign_approval, sign_request
        from teaagent.signing import load_private_key

        if self.sign_arguments is not None:
            # Signed for other arguments: everything else as the policy asked.
            request = build_request(
                origin=request["origin"],
                run_id=request["run_id"],
                call_id=request["call_id"],
                tool_name=request["tool_name"],
                arguments=self.sign_arguments,
                reason=request["reason"],
                config=self.config,
                request_id=request["request_id"],
            )
        request_signature = sign_request(request, load_private_key(self.origin_key))
        approvals = [
            sign_approval(request, peer, load_private_key(self.peer_keys[peer])) for peer in self.signers
        ]
        certificate = build_certificate(request, request_signature, approvals)
        if self.tamper is not None:
            self.tamper(certificate)
        self.issued.append(copy.deepcopy(certificate))
        return certificate


@pytest.fixture
def cluster(ssh_key_factory: Callable[..., Any]) -> tuple[MultiSigQuorumConfig, Any, dict[str, Path]]:
    keys = {peer: ssh_key_factory(f"policy-{peer}") for peer in PEERS}
    origin = ssh_key_factory("policy-alpha")
    quorum_config = config(peer_public_keys={peer: key.public_line for peer, key in keys.items()})
    return quorum_config, origin, {peer: key.private_path for peer, key in keys.items()}


@pytest.mark.slow
def test_story_of_a_real_quorum(
    workspace: Path, cluster: tuple[MultiSigQuorumConfig, Any, dict[str, Path]]
) -> None:
    quorum_config, origin, peer_keys = cluster
    arguments = {"command": "rm -rf build"}

    def policy_with(gate: SigningGate, mode: str = "danger-full-access") -> ApprovalPolicy:
        return ApprovalPolicy.for_workspace(
            workspace, mode=mode, agent_id="alpha", multi_sig_config=quorum_config, quorum_gate=gate
        )

    def gate(signers: list[str], tamper: Callable[[dict[str, Any]], None] | None = None) -> SigningGate:
        return SigningGate(quorum_config, origin.private_path, peer_keys, signers, tamper)

    # Threshold met: the call runs, and the certificate comes back for the audit log.
    result = policy_with(gate(["beta", "gamma"])).authorize("shell.run", "c1", True, arguments)
    assert result.source is ApprovalSource.PERMISSION_MODE
    assert result.certificate is not None
    assert result.certificate["request"]["payload_digest"] == payload_digest("shell.run", arguments)
    assert sorted(item["statement"]["signer"] for item in result.certificate["approvals"]) == [
        "beta",
        "gamma",
    ]

    # Every approval source still needs its quorum too: a session approval plus the certificate.
    prompting = policy_with(gate(["beta", "delta", "gamma"]), mode="allow")
    prompting.jit_state.approve_session("shell.run")
    assert prompting.authorize("shell.run", "c2", True, arguments).source is ApprovalSource.JIT_SESSION

    # One short fails.
    with pytest.raises(
        ApprovalDeniedError, match=rf"^{re.escape(LEAD)}its quorum certificate does not verify: "
    ) as short:
        policy_with(gate(["beta"])).assert_allowed("shell.run", "c3", True, arguments)
    assert str(short.value).endswith("the certificate proves 1 approval of the 2 needed (counted: beta).")

    # A certificate for other arguments is not this call's.
    ls_gate = SigningGate(
        quorum_config, origin.private_path, peer_keys, ["beta", "gamma"], None, {"command": "ls"}
    )
    with pytest.raises(ApprovalDeniedError, match=f"payload_digest {MISMATCH}"):
        policy_with(ls_gate).assert_allowed("shell.run", "c4", True, arguments)

    # Tampered fails: everything was signed for "ls", then rewritten to look like this call.
    def rewrite(certificate: dict[str, Any]) -> None:
        digest = payload_digest("shell.run", arguments)
        certificate["request"]["arguments"] = dict(arguments)
        certificate["request"]["payload_digest"] = digest
        certificate["request"]["reason"] = ""
        for approval in certificate["approvals"]:
            approval["statement"]["payload_digest"] = digest

    tampered = SigningGate(
        quorum_config, origin.private_path, peer_keys, ["beta", "gamma"], rewrite, {"command": "ls"}
    )
    with pytest.raises(ApprovalDeniedError, match="its quorum certificate does not verify") as why:
        policy_with(tampered).assert_allowed("shell.run", "c5", True, arguments)
    assert "counted: nobody; refused: beta: the signature does not verify" in str(why.value)

    # Wrong key fails: a signature by a key that is not the configured one.
    def forge_beta(certificate: dict[str, Any]) -> None:
        from teaagent.quorum import approval_statement, statement_bytes
        from teaagent.signing import load_private_key, signature_to_wire, sshsig_sign

        statement = approval_statement(certificate["request"], "beta", certificate["request"]["created_at"])
        signature = sshsig_sign(
            statement_bytes(statement), load_private_key(origin.private_path), "teaagent-approval"
        )
        certificate["approvals"][0] = {"statement": statement, "signature": signature_to_wire(signature)}

    with pytest.raises(ApprovalDeniedError, match="its quorum certificate does not verify") as why:
        policy_with(gate(["beta", "gamma"], forge_beta)).assert_allowed("shell.run", "c6", True, arguments)
    assert "counted: gamma; refused: beta: the signature does not verify with beta's configured key" in str(
        why.value
    )

    # A certificate for another call id is not this call's.
    def other_call(certificate: dict[str, Any]) -> None:
        certificate["request"]["call_id"] = "c0"

    with pytest.raises(ApprovalDeniedError, match=f"call_id {MISMATCH}"):
        policy_with(gate(["beta", "gamma"], other_call)).assert_allowed("shell.run", "c7", True, arguments)


class ReplayingGate:
    """A relay that answers every request with a certificate it kept from an earlier one."""

    def __init__(self, certificate: dict[str, Any]) -> None:
        self.certificate = certificate

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(self.certificate)


@pytest.mark.slow
def test_a_stale_certificate_for_the_same_call_of_an_earlier_run_never_runs_a_new_call(
    workspace: Path, cluster: tuple[MultiSigQuorumConfig, Any, dict[str, Path]]
) -> None:
    # Call ids repeat across runs (call_1, call_2 ...): the same command in the same call slot of
    # a run with the same id yields a certificate equal in tool, digest, origin, call and run id.
    quorum_config, origin, peer_keys = cluster
    arguments = {"command": "rm -rf build"}
    signing_gate = SigningGate(quorum_config, origin.private_path, peer_keys, ["beta", "gamma"])

    def policy_with(gate: Any) -> ApprovalPolicy:
        return ApprovalPolicy.for_workspace(
            workspace,
            mode="danger-full-access",
            agent_id="alpha",
            multi_sig_config=quorum_config,
            quorum_gate=gate,
            use_presets=False,
        )

    policy_with(signing_gate).assert_allowed("shell.run", "call_1", True, arguments, run_id="run-1")
    (old,) = signing_gate.issued
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(LEAD + f"the quorum certificate's request_id {MISMATCH}"),
    ):
        policy_with(ReplayingGate(old)).assert_allowed("shell.run", "call_1", True, arguments, run_id="run-1")


@pytest.mark.slow
def test_a_certificate_that_expired_before_its_use_never_runs_the_call(
    workspace: Path, cluster: tuple[MultiSigQuorumConfig, Any, dict[str, Path]]
) -> None:
    quorum_config, origin, peer_keys = cluster
    quorum_config = dataclasses.replace(quorum_config, timeout_seconds=1)
    signing_gate = SigningGate(quorum_config, origin.private_path, peer_keys, ["beta", "gamma"])

    class SlowGate:
        """A relay that hands back the right certificate, but only once its request has expired."""

        def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
            certificate = signing_gate.obtain(request)
            deadline = time.monotonic() + 30
            while time.time() <= request["expires_at"] and time.monotonic() < deadline:
                time.sleep(0.05)
            return certificate

    policy = ApprovalPolicy.for_workspace(
        workspace,
        mode="danger-full-access",
        agent_id="alpha",
        multi_sig_config=quorum_config,
        quorum_gate=SlowGate(),
    )
    with pytest.raises(
        ApprovalDeniedError,
        match=rf"^{re.escape(LEAD)}its quorum certificate expired at {DATE}, {AGO}, before it was to be "
        r"used\.$",
    ):
        policy.assert_allowed("shell.run", "c1", True, {"command": "make"})
    # The same certificate, as an offline audit reads it, still verifies: expiry is information there.
    from teaagent.quorum import verify_certificate

    assert verify_certificate(signing_gate.issued[0], quorum_config).state == "approved"


@pytest.mark.slow
def test_the_origin_signature_is_checked_when_the_origin_key_is_known(
    workspace: Path,
    cluster: tuple[MultiSigQuorumConfig, Any, dict[str, Path]],
    ssh_key_factory: Callable[..., Any],
) -> None:
    quorum_config, origin, peer_keys = cluster
    signing_gate = SigningGate(quorum_config, origin.private_path, peer_keys, ["beta", "gamma"])
    base = ApprovalPolicy.for_workspace(
        workspace,
        mode="danger-full-access",
        agent_id="alpha",
        multi_sig_config=quorum_config,
        quorum_gate=signing_gate,
    )
    dataclasses.replace(base, origin_public_key=origin.public_line).assert_allowed(
        "shell.run", "c1", True, {"command": "make"}
    )
    stranger = ssh_key_factory("policy-stranger").public_line
    with pytest.raises(
        ApprovalDeniedError, match="its quorum certificate does not verify: the request signature"
    ):
        dataclasses.replace(base, origin_public_key=stranger).assert_allowed(
            "shell.run", "c2", True, {"command": "make"}
        )
