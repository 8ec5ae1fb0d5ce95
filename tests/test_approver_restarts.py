"""The approver across restarts: an ask item notified once, decisions reaching a relay that restarted,
a decision another process left unfinished finished as recorded, a withdrawal never signed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from approver_support import (
    APPROVE_ECHO_DENY_RM,
    WAIT,
    audit_records,
    beta_approver,
    deliver,
    metric,
    relay_item,
)
from approver_support import fixture_beta_relay as fixture_beta_relay  # the fixture
from approver_support import fixture_cluster as fixture_cluster  # the fixture
from relay_support import MakeCluster, Node, error, served, signer, until

from teaagent.signing import fingerprint
from teaagent.store import connect

# -- the notifier, the relay restarting, a decision another process left unfinished -------------


@pytest.mark.anyio
async def test_an_ask_item_is_notified_once_and_not_again_after_a_restart(make_cluster: MakeCluster) -> None:
    from test_approver_notify import receiving

    with receiving() as receiver:
        notify = f'notify = {{ webhook_url = "{receiver.url("/hook")}", format = "json" }}\n'
        cluster = make_cluster("alpha", "beta", rules={"beta": notify + APPROVE_ECHO_DENY_RM})
        alpha, beta = cluster["alpha"], cluster["beta"]
        with served(beta):
            async with beta_approver(beta) as client:
                asked = deliver(alpha, beta, arguments={"command": "make release"}, call_id="call-ask")
                ruled = deliver(alpha, beta, arguments={"command": "echo hi"}, call_id="call-echo")
                assert await until(lambda: receiver.hits_for(asked["request_id"]))
                assert await until(
                    lambda: metric(client, "teaagent_approver_forwards_total", result="ok") >= 1
                )
            async with beta_approver(beta) as client:  # a restart
                assert await until(
                    lambda: metric(client, "teaagent_approver_skipped_total", reason="ask") >= 1
                )
                notified_again = metric(client, "teaagent_approver_notifications_total")

    [hit] = receiver.hits
    assert hit.path == "/hook"
    assert hit.body["request_id"] == asked["request_id"]
    assert hit.body["arguments"] == {"command": "make release"}
    assert receiver.hits_for(ruled["request_id"]) == []
    assert notified_again == 0


@pytest.mark.anyio
async def test_decisions_reach_a_relay_that_restarted_between_two(cluster: dict[str, Node]) -> None:
    alpha, beta = cluster["alpha"], cluster["beta"]
    async with beta_approver(beta, engine=False) as client:
        with served(beta):
            first = deliver(alpha, beta, arguments={"command": "make one"}, call_id="call-1")["request_id"]
            second = deliver(alpha, beta, arguments={"command": "make two"}, call_id="call-2")["request_id"]
            one = await client.post(f"/v1/requests/{first}/approve", json={})
        # The relay stopped, closing the approver's kept-alive connections; then it is back.
        with served(beta):
            two = await client.post(f"/v1/requests/{second}/approve", json={})
            at_relay = await relay_item(beta, second)

    assert one.json()["forwarded"] is True
    assert two.status_code == 200, two.text
    assert two.json()["forwarded"] is True
    assert at_relay["state"] == "approved"


async def record_left_by_another_process(
    node: Node, redis_url: str, request: dict[str, Any], *, kind: str, reason: str, age: float
) -> Any:
    """A decision recorded (not signed, audited or sent) by an approver process that died ``age`` s ago."""
    from teaagent.quorum import approval_statement, denial_statement
    from teaagent_approver._ledger import Ledger, Record

    signed_at = int(time.time() - age)
    statement = (
        approval_statement(request, node.name, signed_at)
        if kind == "approval"
        else denial_statement(request, node.name, signed_at, reason)
    )
    record = Record(
        kind=kind,  # type: ignore[arg-type]
        reason=reason,
        by="operator",
        key_fingerprint=fingerprint(signer(node.name)),
        statement=statement,
        signature=None,
        instance="a-process-that-died",
        recorded_at=time.time() - age,
    )
    store = connect(redis_url, prefix=node.redis_prefix)
    try:
        claim = await Ledger(store).claim(
            request["origin"], request["request_id"], request["expires_at"], record
        )
    finally:
        await store.aclose()
    assert claim.won
    return record


@pytest.mark.anyio
async def test_a_decision_another_process_recorded_is_finished_as_recorded_never_otherwise(
    cluster: dict[str, Node], beta_relay: Node, redis_url: str
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    # The rules approve "echo *"; an operator's denial was recorded first, by a process now dead.
    request = deliver(alpha, beta, arguments={"command": "echo hi"})
    record = await record_left_by_another_process(beta, redis_url, request, kind="denial", reason="no", age=0)
    async with beta_approver(beta, takeover_seconds=1.5) as client:
        # Left to its owner a moment (it might be alive and about to sign it), then finished here.
        assert await until(lambda: metric(client, "teaagent_approver_skipped_total", reason="deferred") >= 1)
        assert (await relay_item(beta, request["request_id"]))["state"] == "pending"
        assert await until(lambda: metric(client, "teaagent_approver_forwards_total", result="ok") >= 1)
        takeovers = metric(client, "teaagent_approver_takeovers_total")
        signatures = metric(client, "teaagent_approver_signatures_total")
        approve = await client.post(f"/v1/requests/{request['request_id']}/approve", json={})
        shown = (await client.get(f"/v1/requests/{request['request_id']}")).json()

    at_relay = await relay_item(beta, request["request_id"])
    assert at_relay["state"] == "denied"
    assert at_relay["decision"]["statement"] == record.statement
    assert (takeovers, signatures) == (1, 1)
    assert error(approve)[:2] == (409, "conflict")
    assert shown["decision"] == {
        "kind": "denial",
        "reason": "no",
        "by": "operator",
        "key_fingerprint": fingerprint(signer("beta")),
        "at": record.signed_at,
    }
    [audited] = audit_records(beta)
    assert (audited["decision"], audited["by"], audited["recovered"]) == ("denial", "operator", True)


def test_the_approvers_keys_sit_in_the_slot_of_the_inbox_item_they_decide() -> None:
    from teaagent.store import Keys

    request_id = "ab" * 16
    keys = Keys("ta:beta")
    mine, item = keys.approver_item("alpha", request_id), keys.inbox_item("alpha", request_id)
    assert (mine.decision, mine.signature, mine.notified) == (
        f"ta:beta:apr:{{alpha/{request_id}}}:decision",
        f"ta:beta:apr:{{alpha/{request_id}}}:signature",
        f"ta:beta:apr:{{alpha/{request_id}}}:notified",
    )
    assert mine.decision.split("{")[1].split("}")[0] == item.doc.split("{")[1].split("}")[0]
    with pytest.raises(ValueError, match=r"^origin 'Alpha' is not a valid agent id$"):
        keys.approver_item("Alpha", request_id)
    with pytest.raises(ValueError, match=r"^request id 'x' is not 32 lowercase hex characters$"):
        keys.approver_item("alpha", "x")


@pytest.mark.anyio
async def test_a_withdrawn_request_is_never_signed_and_listed_as_withdrawn(
    cluster: dict[str, Node], beta_relay: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    from teaagent.quorum import sign_withdrawal

    alpha, beta = cluster["alpha"], beta_relay
    # beta's rules would approve it: withdrawn first, it is signed neither by them nor by an operator.
    request = deliver(alpha, beta, arguments={"command": "echo withdrawn"})
    request_id = request["request_id"]
    withdrawal = sign_withdrawal(request, signer("alpha"))
    response = httpx.post(f"{beta.url}/v1/inbox/{request_id}/withdrawal", json=withdrawal, timeout=10)
    assert response.json()["state"] == "withdrawn"
    async with beta_approver(beta, poll_seconds=0.2) as client:
        engine = client.app.state.engine  # type: ignore[attr-defined]
        item = await engine.relay.get_inbox_item(request_id, origin="alpha")
        assert await engine.handle([item]) == 0
        approved = await client.post(f"/v1/requests/{request_id}/approve", json={})
        denied = await client.post(f"/v1/requests/{request_id}/deny", json={"reason": "no"})
        pending = await client.get("/v1/requests")
        shown = await client.get(f"/v1/requests/{request_id}")
        signatures = metric(client, "teaagent_approver_signatures_total")
        skipped = metric(client, "teaagent_approver_skipped_total", reason="withdrawn")
    sentence = f"Request {request_id} was withdrawn by its origin alpha; this node signs nothing for it."
    assert error(approved) == (409, "withdrawn", sentence)
    assert error(denied) == (409, "withdrawn", sentence)
    assert pending.json()["items"] == []
    assert shown.json()["state"] == "withdrawn"
    assert (signatures, skipped) == (0, 1)
    assert audit_records(beta) == []
    assert (await relay_item(beta, request_id))["decision"] is None


@pytest.mark.anyio
async def test_the_engine_meeting_an_operator_mid_decision_audits_that_decision_once(
    cluster: dict[str, Node], beta_relay: Node
) -> None:
    # The operator's decision is claimed in the ledger and held before its signature is attached;
    # meanwhile the engine sees the item (no rule matches it: asked) and finds that claim.
    from teaagent_approver._engine import Proposal

    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta, engine=False) as client:
        engine = client.app.state.engine  # type: ignore[attr-defined]
        request_id = deliver(alpha, beta, arguments={"command": "make release"})["request_id"]
        [listed] = await engine.relay.list_inbox("pending", limit=10)
        item = engine.receive(listed)
        assert item.request.request_id == request_id
        attach, held, release = engine.ledger.attach, asyncio.Event(), asyncio.Event()
        calls = 0

        async def held_attach(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:  # the operator's: held until the engine has had its go
                held.set()
                await release.wait()
            return await attach(*args, **kwargs)

        engine.ledger.attach = held_attach
        operator = asyncio.ensure_future(
            engine.settle(item, Proposal(kind="approval", reason="looks fine", by="operator"))
        )
        await asyncio.wait_for(held.wait(), WAIT)
        engines_go = asyncio.ensure_future(engine.rounds._asked_item(item))
        # The engine's go, as far as it gets on its own: it ends, or it waits behind the operator
        # for the request's lock (a second user of it).
        ref = item.ref
        assert await until(lambda: engines_go.done() or engine._busy.get(ref, (None, 0))[1] >= 2)
        release.set()
        outcome = await asyncio.wait_for(operator, WAIT)
        await asyncio.wait_for(engines_go, WAIT)

    assert outcome.won
    assert [record["by"] for record in audit_records(beta)] == ["operator"]
