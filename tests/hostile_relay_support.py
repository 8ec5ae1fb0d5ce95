"""The hostile relay tests' parts: :class:`HostileRelay` in place of alpha's own relay, and alpha.

:class:`HostileRelay` is a small Starlette app on a loopback port that speaks the relay API to the
real :class:`~teaagent.relay_client.RelayQuorumGate` of a real node (:class:`Origin`: node.toml, key,
policy, tools, audit log); a test gives it the tactic of its lie. It holds real signatures by the
peers' real keys, so that each lie is the strongest a relay could tell: genuine approvals, of
something else. Test modules take its fixtures with
``from hostile_relay_support import fixture_origin, fixture_relay  # noqa: F401``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import uvicorn
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from relay_support import READY_TIMEOUT, approval, free_port, public_line, signer, write_cluster
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from teaagent.audit import AuditLogger, verify_log
from teaagent.config import NodeConfig, load_config
from teaagent.llm import ScriptedAdapter
from teaagent.quorum import approval_statement, build_certificate, sign_approval, sign_denial
from teaagent.relay_client import RelayQuorumGate
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


# A key gamma never had, and how the origin refuses its approval.
STRANGER = SSHPrivateKey.from_cryptography(Ed25519PrivateKey.generate(), comment="gamma")
NOT_GAMMAS_KEY = (
    UNVERIFIED + "1 approval of the 2 needed (counted: beta; refused: gamma: the signature does not "
    f"verify with gamma's configured key: the signature was made by key {fingerprint(STRANGER)} but key "
    f"{fingerprint(signer('gamma'))} was expected)."
)


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
