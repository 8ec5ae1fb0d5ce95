"""teaagent.relay_client: the relay API's clients and the quorum gate, against real relays.

The relays run in this process (uvicorn in a thread, or the app over ASGI): real HTTP, real Redis.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from relay_support import (
    MakeCluster,
    Node,
    approval,
    denial,
    public_line,
    refusing_port,
    served,
)

from teaagent.errors import ApprovalDeniedError, RelayError
from teaagent.quorum import verify_certificate
from teaagent.relay_client import (
    AsyncRelayClient,
    InboxDecision,
    RelayClient,
    RelayQuorumGate,
    RequestStatus,
)

WAIT = 20.0


@pytest.fixture
def nodes(make_cluster: MakeCluster) -> dict[str, Node]:
    """alpha asks beta and gamma (2 of 2); beta and gamma know alpha."""
    return make_cluster("alpha", "beta", "gamma", required=2, star="alpha")


def approve_next(node: Node, *, deny_reason: str | None = None) -> None:
    with RelayClient(node.url, token=node.token) as client:
        [item, *_] = client.list_inbox(wait=WAIT)
        if deny_reason is None:
            document = approval(item.request, node.name)
        else:
            document = denial(item.request, node.name, deny_reason)
        client.submit_decision(item.request_id, document["statement"], document["signature"])


def in_threads(*calls: tuple[Node, str | None]) -> list[threading.Thread]:
    threads = [
        threading.Thread(target=approve_next, args=(node,), kwargs={"deny_reason": reason}, daemon=True)
        for node, reason in calls
    ]
    for thread in threads:
        thread.start()
    return threads


# -- the clients ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_client_speaks_every_call_of_the_api(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    with served(alpha, beta, deliver=False):
        alpha_client = RelayClient(alpha.url, token=alpha.token)
        beta_client = RelayClient(beta.url, token=beta.token)
        request = alpha.request()
        signature = alpha.signed(request)["signature"]
        submitted = alpha_client.submit_request(request, signature)
        delivered = beta_client.deliver_request(request, signature)  # as alpha's relay would
        listed = beta_client.list_inbox()
        item = beta_client.get_inbox_item(request["request_id"], origin="alpha")
        document = approval(request, "beta")
        receipt = beta_client.submit_decision(
            request["request_id"], document["statement"], document["signature"]
        )
        counted = alpha_client.deliver_decision(
            request["request_id"], document["statement"], document["signature"]
        )
        waited = alpha_client.wait_outcome(request["request_id"], 0.5)
        health = alpha_client.health()
        alpha_client.close()
        beta_client.close()

    assert submitted.state == "pending"
    assert submitted.peers == ("beta", "gamma")
    assert delivered == {
        "request_id": request["request_id"],
        "origin": "alpha",
        "state": "pending",
        "created": True,
    }
    assert [entry.request_id for entry in listed] == [request["request_id"]]
    assert item.request["tool_name"] == item.described["tool_name"] == "shell.run"
    assert item.to_dict()["arguments"] == {"command": "rm -rf build"}
    assert receipt == InboxDecision(
        request_id=request["request_id"],
        origin="alpha",
        signer="beta",
        kind="approval",
        this_node="approved",
        counted=True,
        note="This node's decision, sent to alpha; the request's outcome is counted there.",
    )
    assert (counted.counted, counted.state, counted.approvals) == (True, "pending", 1)
    assert waited.state == "pending"  # one of two: the wait ran out
    assert waited.describe() == "waiting: 1 approval of the 2 needed (asked of 2 peers)"
    assert health["agent_id"] == "alpha"


@pytest.mark.anyio
async def test_the_async_client_reports_the_relays_refusals(nodes: dict[str, Node]) -> None:
    from relay_support import in_process

    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as app_client:
        transport = httpx.ASGITransport(app=app_client.app)  # type: ignore[attr-defined]
        async with AsyncRelayClient(
            alpha.url, token="wrong-token-wrong-token", transport=transport
        ) as client:
            with pytest.raises(RelayError) as refused:
                await client.get_request("a" * 32)
        async with AsyncRelayClient(alpha.url, token=alpha.token, transport=transport) as client:
            with pytest.raises(RelayError) as missing:
                await client.get_request("a" * 32)
            request = alpha.request()
            status = await client.submit_request(request, alpha.signed(request)["signature"])

    assert refused.value.status_code == 401
    assert refused.value.code == "unauthorized"
    assert str(refused.value) == (
        f"The relay at {alpha.url} refused the status of request {'a' * 32} (401 unauthorized): "
        "This call needs the node's bearer token (Authorization: Bearer <token>)."
    )
    assert (missing.value.status_code, missing.value.code) == (404, "not_found")
    assert status.state == "pending"


def test_an_unreachable_relay_is_a_relay_error() -> None:
    with refusing_port() as down:
        url = f"http://127.0.0.1:{down}"
        with RelayClient(url, token="t" * 20, timeout=2) as client, pytest.raises(RelayError) as unreachable:
            client.get_request("a" * 32)

    assert unreachable.value.status_code is None
    assert str(unreachable.value).startswith(
        f"The relay at {url} is unreachable (the status of request {'a' * 32}):"
    )


def test_the_client_refuses_a_bad_url_or_timeout() -> None:
    with pytest.raises(ValueError, match=r"^the relay URL 'ftp://x' is not an http or https URL$"):
        RelayClient("ftp://x")
    with pytest.raises(ValueError, match=r"^timeout must be positive, not 0$"):
        RelayClient("http://127.0.0.1:1", timeout=0)


def test_a_status_describes_itself() -> None:
    base = {
        "request_id": "a" * 32,
        "required": 2,
        "peers": ["beta", "delta", "gamma"],
        "signers": ["beta", "gamma"],
        "denied_by": [],
        "expires_at": 2,
        "accepted_at": 1,
        "decided_at": None,
        "certificate": None,
    }
    approved = RequestStatus.from_json({**base, "state": "approved"})
    denied = RequestStatus.from_json(
        {
            **base,
            "state": "denied",
            "signers": [],
            "denied_by": ["delta", "gamma"],
            "denial_reasons": {"delta": "no"},
        }
    )
    expired = RequestStatus.from_json({**base, "state": "expired", "signers": []})

    assert approved.describe() == "approved by beta, gamma (2 approvals of the 2 needed)"
    assert denied.describe() == "denied by delta: no; gamma (2 approvals from 3 peers needed)"
    assert expired.describe() == "expired with 0 approvals of the 2 needed"
    assert [approved.decided, denied.decided, expired.decided] == [True, True, True]


# -- the quorum gate ---------------------------------------------------------------------------------


def gate_of(alpha: Node, **overrides: object) -> RelayQuorumGate:
    values: dict[str, object] = {
        "relay_url": alpha.url,
        "token": alpha.token,
        "origin": "alpha",
        "private_key_signer": alpha.key,
        "config": alpha.quorum(),
        "timeout": WAIT,
    }
    values.update(overrides)
    return RelayQuorumGate(**values)  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_gate_returns_the_certificate_of_the_quorum(nodes: dict[str, Node]) -> None:
    alpha, beta, gamma = nodes["alpha"], nodes["beta"], nodes["gamma"]
    progress: list[str] = []
    with served(alpha, beta, gamma):
        gate = gate_of(alpha, on_progress=progress.append)
        threads = in_threads((beta, None), (gamma, None))
        certificate = gate.obtain(
            alpha.request(arguments={"command": "make"}, call_id="c-1", run_id="", reason="build")
        )
        for thread in threads:
            thread.join(WAIT)
        gate.close()

    outcome = verify_certificate(certificate, alpha.quorum(), origin_public_key=public_line("alpha"))
    assert outcome.signers == ("beta", "gamma")
    assert certificate["request"]["run_id"] == ""
    assert certificate["request"]["reason"] == "build"
    assert progress[0].startswith("shell.run needs 2 approvals from 2 peers; request ")
    assert progress[-1].endswith(": approved by beta, gamma (2 approvals of the 2 needed).")


@pytest.mark.slow
def test_the_gate_raises_the_denial_with_who_and_why(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    with served(alpha, beta):
        gate = gate_of(alpha)
        [thread] = in_threads((beta, "too risky"))
        with pytest.raises(
            ApprovalDeniedError,
            match=r"^shell\.run was denied by beta: too risky \(2 approvals from 2 peers needed\)\.$",
        ):
            gate.obtain(alpha.request(arguments={"command": "rm"}, call_id="c", run_id="r", reason=""))
        thread.join(WAIT)
        gate.close()


@pytest.mark.slow
def test_the_gate_raises_expired_when_the_peers_stay_silent(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", required=1, timeout_seconds=1)
    alpha = nodes["alpha"]
    with served(alpha, deliver=False):
        gate = gate_of(alpha)
        started = time.monotonic()
        with pytest.raises(
            ApprovalDeniedError,
            match=r"^The request for shell\.run expired with 0 approvals of the 1 needed\.$",
        ):
            gate.obtain(alpha.request(arguments={"command": "rm"}, call_id="c", run_id="r", reason=""))
        gate.close()

    assert time.monotonic() - started < WAIT


@pytest.mark.slow
def test_the_gate_gives_up_after_its_timeout(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    with served(alpha, deliver=False):
        gate = gate_of(alpha, timeout=0.5)
        with pytest.raises(TimeoutError, match=r"^no quorum was reached for shell\.run within 0\.5 seconds$"):
            gate.obtain(alpha.request(arguments={"command": "rm"}, call_id="c", run_id="r", reason=""))
        gate.close()


def test_the_gate_reports_a_relay_that_refuses_or_is_away(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    with refusing_port() as down:
        away = gate_of(alpha, relay_url=f"http://127.0.0.1:{down}")
        with pytest.raises(RelayError, match=r"is unreachable \(request [0-9a-f]{32}\)"):
            away.obtain(alpha.request(arguments={"command": "rm"}, call_id="c", run_id="r", reason=""))
        away.close()


def test_the_gate_refuses_an_origin_among_its_peers_and_a_bad_timeout(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    with pytest.raises(ValueError, match=r"^the origin beta is among the configured peers$"):
        gate_of(alpha, origin="beta")
    with pytest.raises(ValueError, match=r"^timeout must be positive, not 0$"):
        gate_of(alpha, timeout=0)


# -- the async client against the sync one ---------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_the_async_client_answers_as_the_sync_client_does(nodes: dict[str, Node]) -> None:

    alpha, beta = nodes["alpha"], nodes["beta"]
    request = alpha.request()
    signature = alpha.signed(request)["signature"]
    rid = request["request_id"]

    def answer(call: Any) -> object:
        try:
            return call()
        except RelayError as exc:
            return (str(exc), exc.status_code, exc.code)

    async def async_answers() -> list[object]:
        async with (
            AsyncRelayClient(alpha.url, token=alpha.token) as client,
            AsyncRelayClient(beta.url, token=beta.token) as peer,
            AsyncRelayClient(alpha.url, token="wrong-token-wrong-token") as wrong,
        ):
            answers: list[object] = []
            for call in (
                lambda: client.submit_request(request, signature),
                lambda: peer.deliver_request(request, signature),
                lambda: peer.list_inbox(limit=5),
                lambda: peer.get_inbox_item(rid, origin="alpha"),
                lambda: client.get_request(rid),
                lambda: client.wait_outcome(rid, 0.2),
                lambda: wrong.get_request(rid),
                lambda: client.get_request("a" * 32),
            ):
                try:
                    answers.append(await call())
                except RelayError as exc:
                    answers.append((str(exc), exc.status_code, exc.code))
            return answers

    with served(alpha, beta, deliver=False):
        first = await async_answers()
        with (
            RelayClient(alpha.url, token=alpha.token) as client,
            RelayClient(beta.url, token=beta.token) as peer,
            RelayClient(alpha.url, token="wrong-token-wrong-token") as wrong,
        ):
            second = [
                answer(lambda: client.submit_request(request, signature)),
                answer(lambda: peer.deliver_request(request, signature)),
                answer(lambda: peer.list_inbox(limit=5)),
                answer(lambda: peer.get_inbox_item(rid, origin="alpha")),
                answer(lambda: client.get_request(rid)),
                answer(lambda: client.wait_outcome(rid, 0.2)),
                answer(lambda: wrong.get_request(rid)),
                answer(lambda: client.get_request("a" * 32)),
            ]

    # The second round's submission and delivery are repeats: the same answers, but "created".
    assert first[0].state == second[0].state == "pending"  # type: ignore[attr-defined]
    assert first[1] == {**second[1], "created": True}  # type: ignore[dict-item]
    assert first[2:] == second[2:]
    assert first[6][1:] == (401, "unauthorized")  # type: ignore[index]
    assert first[7][1:] == (404, "not_found")  # type: ignore[index]


@pytest.mark.anyio
async def test_the_async_client_says_when_a_relay_is_unreachable_or_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    async def main() -> tuple[str, RelayError, RelayError]:
        with refusing_port() as down:
            url = closed = f"http://127.0.0.1:{down}"
            async with AsyncRelayClient(url, token="t" * 20, timeout=2) as client:
                with pytest.raises(RelayError) as unreachable:
                    await client.get_request("a" * 32)
        with socket.socket() as silent:  # accepts, never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen()
            url = f"http://127.0.0.1:{silent.getsockname()[1]}"
            async with AsyncRelayClient(url, token="t" * 20, timeout=0.5) as client:
                with pytest.raises(RelayError) as late:
                    await client.get_request("a" * 32)
        return closed, unreachable.value, late.value

    closed, unreachable, late = await main()
    assert unreachable.status_code is None
    assert str(unreachable).startswith(
        f"The relay at {closed} is unreachable (the status of request {'a' * 32}):"
    )
    assert " did not answer the status of request " in str(late)
    assert str(late).endswith("in time: no answer in time.")
