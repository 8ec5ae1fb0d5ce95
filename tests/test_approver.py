"""The approver service in-process, against its node's relay on a real socket and a real Redis.

What an operator does through the HTTP API (approve, deny, a signature made with ``ssh-keygen``),
what is refused and with which ``ErrorOut`` code, what is never signed (an expired request, one
whose origin signature does not verify), and what the audit log then holds. Restarts and decisions
left unfinished are in ``test_approver_restarts.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from approver_support import audit_records, beta_approver, deliver, metric, relay_item, ssh_sign
from approver_support import fixture_beta_relay as fixture_beta_relay  # the fixture
from approver_support import fixture_cluster as fixture_cluster  # the fixture
from conftest import SSHKey
from relay_support import Node, error, signer, until
from words_support import AGO, moment_re

from teaagent._canonical import canonical
from teaagent.audit import verify_log
from teaagent.cli._main import run as cli
from teaagent.errors import StatementTimeError
from teaagent.quorum import check_signing_time, sign_request
from teaagent.signing import fingerprint
from teaagent.store import connect
from teaagent_approver import AUDIT_FILE_NAME

# -- an operator decides -----------------------------------------------------------------------


@pytest.mark.anyio
async def test_an_ask_item_waits_then_is_approved_through_the_api(
    cluster: dict[str, Node], beta_relay: Node
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        request = deliver(alpha, beta, arguments={"command": "make release"})
        request_id = request["request_id"]
        assert await until(lambda: metric(client, "teaagent_approver_skipped_total", reason="ask") >= 1)
        listed = await client.get("/v1/requests")
        shown = await client.get(f"/v1/requests/{request_id}")
        # Left to an operator: nothing recorded, signed or sent.
        assert (await relay_item(beta, request_id))["state"] == "pending"
        assert metric(client, "teaagent_approver_signatures_total") == 0

        approved = await client.post(f"/v1/requests/{request_id}/approve", json={"reason": "release day"})
        again = await client.post(f"/v1/requests/{request_id}/approve", json={})
        otherwise = await client.post(f"/v1/requests/{request_id}/deny", json={"reason": "changed my mind"})
        after = await client.get(f"/v1/requests/{request_id}")
        at_relay = await relay_item(beta, request_id)

    [item] = listed.json()["items"]
    one = shown.json()
    # The two reads may fall on either side of a second: the time left is the one field that moves.
    assert 0 <= item["seconds_left"] - one["seconds_left"] <= 1
    assert {**item, "seconds_left": None} == {**one, "seconds_left": None}
    assert item["state"] == "pending"
    assert item["decision"] is None
    assert item["rule"] is None
    assert item["request"] == request
    assert item["arguments"] == {"command": "make release"}
    assert 0 < item["seconds_left"] <= 120
    expected = {
        "request_id": request_id,
        "origin": "alpha",
        "decision": "approval",
        "reason": "release day",
        "this_node": "approved",
        "by": "operator",
        "key_fingerprint": fingerprint(signer("beta")),
        "forwarded": True,
        "note": "This node's decision; the request's outcome is counted by its origin, alpha.",
    }
    assert (approved.status_code, approved.json()) == (200, expected)
    assert (again.status_code, again.json()) == (200, expected)
    assert error(otherwise) == (
        409,
        "conflict",
        f"This node already approved request {request_id} (operator); it never signs another decision on it.",
    )
    assert after.json()["state"] == "approved"
    assert after.json()["decision"]["by"] == "operator"
    assert at_relay["state"] == "approved"
    assert at_relay["decision"]["statement"]["signer"] == "beta"
    [record] = audit_records(beta)
    assert record["request_id"] == request_id
    assert record["decision"] == "approval"
    assert record["by"] == "operator"
    assert record["key_fingerprint"] == fingerprint(signer("beta"))


@pytest.mark.anyio
async def test_the_rules_approve_one_command_and_deny_another(
    cluster: dict[str, Node], beta_relay: Node
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        echo = deliver(alpha, beta, arguments={"command": "echo hi"}, call_id="call-echo")
        remove = deliver(alpha, beta, arguments={"command": "rm -rf /"}, call_id="call-rm")
        assert await until(lambda: metric(client, "teaagent_approver_forwards_total", result="ok") >= 2)
        listed = await client.get("/v1/requests", params={"state": "all"})

    by_id = {item["request_id"]: item for item in listed.json()["items"]}
    assert by_id[echo["request_id"]]["state"] == "approved"
    assert by_id[echo["request_id"]]["decision"]["by"] == "rule 2"
    assert by_id[echo["request_id"]]["rule"] == {
        "index": 2,
        "tool": "shell.run",
        "arguments": {"command": "echo *"},
        "decision": "approve",
    }
    assert by_id[remove["request_id"]]["state"] == "denied"
    assert by_id[remove["request_id"]]["decision"]["reason"] == "nothing is removed here"
    assert (await relay_item(beta, remove["request_id"]))["decision"]["statement"]["reason"] == (
        "nothing is removed here"
    )
    records = {record["request_id"]: record for record in audit_records(beta)}
    assert {rid: (r["decision"], r["by"]) for rid, r in records.items()} == {
        echo["request_id"]: ("approval", "rule 2"),
        remove["request_id"]: ("denial", "rule 1"),
    }


@pytest.mark.anyio
async def test_a_signature_made_with_ssh_keygen_over_the_statement_bytes_is_accepted(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        request_id = deliver(alpha, beta, arguments={"command": "make release"})["request_id"]
        fetched = await client.get(f"/v1/requests/{request_id}/statement")
        body = fetched.json()
        armored = ssh_sign(beta.folder / "keys" / "beta", body["bytes"].encode(), tmp_path)
        submitted = await client.post(
            f"/v1/requests/{request_id}/decision", json={"statement": body["statement"], "signature": armored}
        )
        at_relay = await relay_item(beta, request_id)

    assert fetched.status_code == 200
    assert body["bytes"].encode() == canonical(body["statement"])
    assert body["statement"]["signer"] == "beta"
    assert abs(body["statement"]["signed_at"] - time.time()) < 60
    assert submitted.status_code == 200, submitted.text
    assert submitted.json()["this_node"] == "approved"
    assert submitted.json()["key_fingerprint"] == fingerprint(signer("beta"))
    assert submitted.json()["forwarded"] is True
    assert at_relay["state"] == "approved"
    assert at_relay["decision"]["statement"] == body["statement"]
    [record] = audit_records(beta)
    assert (record["by"], record["key_fingerprint"]) == ("operator", fingerprint(signer("beta")))


@pytest.mark.anyio
async def test_a_denial_signed_with_ssh_keygen_carries_its_reason(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        request_id = deliver(alpha, beta, arguments={"command": "make release"})["request_id"]
        body = (
            await client.get(
                f"/v1/requests/{request_id}/statement", params={"kind": "denial", "reason": "not on Fridays"}
            )
        ).json()
        armored = ssh_sign(beta.folder / "keys" / "beta", body["bytes"].encode(), tmp_path, "teaagent-denial")
        submitted = await client.post(
            f"/v1/requests/{request_id}/decision", json={"statement": body["statement"], "signature": armored}
        )

    assert submitted.status_code == 200, submitted.text
    assert (submitted.json()["this_node"], submitted.json()["reason"]) == ("denied", "not on Fridays")


@pytest.mark.anyio
async def test_a_key_that_may_not_sign_for_this_node_is_403_and_nothing_is_recorded(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path, ssh_key_factory: Callable[..., SSHKey]
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    stranger = ssh_key_factory("stranger")
    async with beta_approver(beta) as client:
        request_id = deliver(alpha, beta, arguments={"command": "make release"})["request_id"]
        body = (await client.get(f"/v1/requests/{request_id}/statement")).json()
        armored = ssh_sign(stranger.private_path, body["bytes"].encode(), tmp_path)
        refused = await client.post(
            f"/v1/requests/{request_id}/decision", json={"statement": body["statement"], "signature": armored}
        )
        after = await client.get(f"/v1/requests/{request_id}")

    status, code, message = error(refused)
    assert (status, code) == (403, "forbidden")
    assert message == (
        f"The approval was signed by {fingerprint(stranger.public_line)}, which is not a key of beta: "
        f"list it first (teaagent operators add KEY.pub --config {beta.config_path})."
    )
    assert after.json()["state"] == "pending"
    assert after.json()["decision"] is None
    assert audit_records(beta) == []


@pytest.mark.anyio
async def test_a_statement_that_does_not_match_its_request_is_422(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        request_id = deliver(alpha, beta, arguments={"command": "make release"})["request_id"]
        body = (await client.get(f"/v1/requests/{request_id}/statement")).json()
        statement = {**body["statement"], "tool_name": "fs.delete"}
        armored = ssh_sign(beta.folder / "keys" / "beta", canonical(statement), tmp_path)
        refused = await client.post(
            f"/v1/requests/{request_id}/decision", json={"statement": statement, "signature": armored}
        )
        as_other = await client.post(
            f"/v1/requests/{request_id}/decision",
            json={"statement": {**body["statement"], "signer": "gamma"}, "signature": armored},
        )

    assert error(refused) == (
        422,
        "invalid",
        f"The statement's tool_name does not match request {request_id}.",
    )
    assert error(as_other) == (
        403,
        "forbidden",
        "The statement is signed as 'gamma', not as this node (beta).",
    )
    assert audit_records(beta) == []


@pytest.mark.anyio
async def test_a_statement_dated_outside_its_requests_life_is_422_with_dates_a_person_reads(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        request = deliver(alpha, beta, arguments={"command": "make release"})
        request_id, created, expires = request["request_id"], request["created_at"], request["expires_at"]
        body = (await client.get(f"/v1/requests/{request_id}/statement")).json()
        refused = {}
        for name, signed_at in (("late", expires + 1), ("early", created - 61), ("ahead", created + 90)):
            statement = {**body["statement"], "signed_at": signed_at}
            armored = ssh_sign(beta.folder / "keys" / "beta", canonical(statement), tmp_path)
            refused[name] = error(
                await client.post(
                    f"/v1/requests/{request_id}/decision", json={"statement": statement, "signature": armored}
                )
            )

    assert {name: (status, code) for name, (status, code, _) in refused.items()} == {
        name: (422, "invalid") for name in ("late", "early", "ahead")
    }
    expected = {  # dates with how far they are from now, never Unix seconds
        "late": f"The statement was signed at {moment_re(expires + 1)}, after the request expired at "
        f"{moment_re(expires)}\\.",
        # Rule 4's words are the quorum's (check_signing_time), as the relay says them.
        "early": f"The statement was signed at {moment_re(created - 61, AGO)}, more than 60 seconds before "
        f"the request was created at {moment_re(created, AGO)}\\.",
        "ahead": f"The statement is dated {moment_re(created + 90)}, more than 60 seconds in the future\\.",
    }
    for name, pattern in expected.items():
        assert re.fullmatch(pattern, refused[name][2]), refused[name][2]
    assert audit_records(beta) == []


def rule_4(signed_at: int, request: dict[str, Any], now: float) -> str:
    """What ``teaagent.quorum.check_signing_time`` says of ``signed_at`` at ``now``."""
    try:
        check_signing_time(signed_at, request, now)
    except StatementTimeError:
        return "refused"
    return "taken"


@pytest.mark.anyio
async def test_the_approver_refuses_a_signing_time_exactly_where_the_quorum_rule_does(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path
) -> None:
    # Rule 4 is written once, in teaagent.quorum: a decision dated at each bound and one second
    # outside it is refused by the approver exactly when check_signing_time refuses it. Each probe
    # names another tool than its request's, so one that passes the time (and signature) check is
    # 409 changed and nothing is decided: a request serves every probe.
    alpha, beta = cluster["alpha"], beta_relay
    start = int(time.time())
    # Created 90 s ago, expiring in 30 s: its lower bound and its expiry are the first bounds met.
    ask = {"command": "make release"}  # neither rule decides it
    old = deliver(alpha, beta, arguments=ask, now=start - 90, call_id="call-old")
    # Created now, expiring in 120 s: the clock skew (now + 60) is met before the expiry.
    fresh = deliver(alpha, beta, arguments=ask, call_id="call-fresh")
    created, expires = old["created_at"], old["expires_at"]
    cases: list[tuple[str, dict[str, Any], Callable[[], int], str]] = [
        ("before creation - 60", old, lambda: created - 61, "refused"),
        ("at creation - 60", old, lambda: created - 60, "taken"),
        ("at expiry", old, lambda: expires, "taken"),
        ("after expiry", old, lambda: expires + 1, "refused"),
        ("at now + 60", fresh, lambda: int(time.time()) + 60, "taken"),
        ("after now + 60", fresh, lambda: int(time.time()) + 61, "refused"),
    ]
    seen = {}
    async with beta_approver(beta) as client:
        for name, request, dated, expected in cases:
            path = f"/v1/requests/{request['request_id']}"
            body = (await client.get(f"{path}/statement")).json()
            for _ in range(5):  # again when the clock's second turned between the dating and the answer
                before = time.time()  # before the dating: ssh-keygen's signing may see the second turn
                signed_at = dated()
                statement = {**body["statement"], "signed_at": signed_at}
                armored = ssh_sign(beta.folder / "keys" / "beta", canonical(statement), tmp_path)
                response = await client.post(
                    f"{path}/decision",
                    json={"statement": statement, "signature": armored, "expect_tool_name": "fs.read"},
                )
                rule = {rule_4(signed_at, request, at) for at in (before, time.time())}
                if len(rule) == 1:
                    break
            status, code, message = error(response)
            assert (status, code) in {(409, "changed"), (422, "invalid")}, message
            seen[name] = ("taken" if status == 409 else "refused", *rule, expected)
        after = (await client.get(f"/v1/requests/{old['request_id']}")).json()

    assert seen == {name: (expected,) * 3 for name, _, _, expected in cases}
    assert (after["state"], after["decision"]) == ("pending", None)
    assert audit_records(beta) == []


@pytest.mark.anyio
async def test_a_decision_on_another_request_than_the_one_confirmed_is_409_changed(
    cluster: dict[str, Node], beta_relay: Node, tmp_path: Path
) -> None:
    # What an operator confirmed (tool, digest) goes with the decision; the approver compares it with
    # the request its origin signed: a request swapped in under the same id or prefix is not signed.
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        request = deliver(alpha, beta, arguments={"command": "make release"})
        path = f"/v1/requests/{request['request_id']}"
        shown = {"expect_tool_name": "shell.run", "expect_payload_digest": request["payload_digest"]}
        zeros = "sha256:" + "0" * 64
        other_tool = {**shown, "expect_tool_name": "fs.read"}
        other_digest = {**shown, "expect_payload_digest": zeros}
        neither = {"expect_tool_name": "fs.read", "expect_payload_digest": zeros}
        approved = await client.post(f"{path}/approve", json=other_tool)
        denied = await client.post(f"{path}/deny", json={"reason": "no", **other_digest})
        approved_neither = await client.post(f"{path}/approve", json=neither)
        statement = await client.get(f"{path}/statement", params=other_tool)
        body = (await client.get(f"{path}/statement", params=shown)).json()
        armored = ssh_sign(beta.folder / "keys" / "beta", body["bytes"].encode(), tmp_path)
        submitted = await client.post(
            f"{path}/decision", json={"statement": body["statement"], "signature": armored, **other_digest}
        )
        malformed = await client.post(f"{path}/approve", json={"expect_payload_digest": "md5:x"})
        signatures = metric(client, "teaagent_approver_signatures_total")
        after = (await client.get(path)).json()
        at_relay = await relay_item(beta, request["request_id"])
        audited = audit_records(beta)
        confirmed = await client.post(f"{path}/approve", json=shown)  # the control: what was shown

    def changed(what: str) -> tuple[int, str, str]:
        return (
            409,
            "changed",
            f"Request {request['request_id']} of alpha is not the request the operator confirmed: its "
            f"signed {what}; this node signs nothing for it.",
        )

    assert error(approved) == changed("tool differs")
    assert error(denied) == changed("payload digest differs")
    assert error(approved_neither) == changed("tool and payload digest differ")
    assert error(statement) == changed("tool differs")
    assert error(submitted) == changed("payload digest differs")
    assert error(malformed)[:2] == (422, "invalid")
    assert signatures == 0
    assert (after["state"], after["decision"]) == ("pending", None)
    assert (at_relay["state"], at_relay["decision"]) == ("pending", None)
    assert audited == []
    assert confirmed.status_code == 200, confirmed.text
    assert confirmed.json()["this_node"] == "approved"


# -- what is never signed ----------------------------------------------------------------------


async def store_in_inbox(
    node: Node, redis_url: str, request: dict[str, Any], signature: str, **kw: Any
) -> None:
    """Write a request into the node's inbox and queue it for the approver, past the relay's checks."""
    store = connect(redis_url, prefix=node.redis_prefix)
    try:
        document = canonical({"request": request, "signature": signature})
        await store.inbox.accept(
            request["origin"], request["request_id"], document, expires_at=request["expires_at"], **kw
        )
        payload = json.dumps({"origin": request["origin"], "request_id": request["request_id"]}).encode()
        await store.inbox_queue.enqueue("approver", request["request_id"], payload, request["expires_at"])
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_request_whose_origin_signature_does_not_verify_is_never_signed(
    cluster: dict[str, Node], beta_relay: Node, redis_url: str
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    # Signed by gamma's key, sent as alpha's: the relay refuses this at its door; the store may not.
    request = alpha.request(arguments={"command": "echo hi"})
    await store_in_inbox(beta, redis_url, request, sign_request(request, signer("gamma")))
    async with beta_approver(beta) as client:
        assert await until(
            lambda: metric(client, "teaagent_approver_refused_items_total", reason="bad_signature") >= 1
        )
        approved = await client.post(f"/v1/requests/{request['request_id']}/approve", json={})
        statement = await client.get(f"/v1/requests/{request['request_id']}/statement")
        signatures = metric(client, "teaagent_approver_signatures_total")

    lead = (
        f"The origin signature of request {request['request_id']} does not verify with the keys configured "
        "for alpha: "
    )
    for answer in (approved, statement):
        status, code, message = error(answer)
        assert (status, code) == (422, "invalid")
        assert message.startswith(lead), message
        assert message.endswith("; this node does not sign it."), message
        assert fingerprint(signer("gamma")) in message
    assert signatures == 0
    assert (await relay_item(beta, request["request_id"]))["state"] == "pending"
    assert audit_records(beta) == []


@pytest.mark.anyio
async def test_an_expired_request_is_never_signed(
    cluster: dict[str, Node], beta_relay: Node, redis_url: str
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    now = int(time.time())
    # Stored while it was still pending (as if the approver had been down since), expired now.
    request = alpha.request(arguments={"command": "echo hi"}, now=now - alpha.timeout_seconds - 1)
    await store_in_inbox(beta, redis_url, request, sign_request(request, signer("alpha")), now=now - 50)
    assert request["expires_at"] < now
    async with beta_approver(beta) as client:
        approved = await client.post(f"/v1/requests/{request['request_id']}/approve", json={})
        shown = await client.get(f"/v1/requests/{request['request_id']}")
        engine = client.app.state.engine  # type: ignore[attr-defined]
        # The engine's own check, whatever a listing says: an expired item is skipped, not signed.
        item = await engine.relay.get_inbox_item(request["request_id"], origin="alpha")
        assert await engine.handle([item]) == 0
        signatures = metric(client, "teaagent_approver_signatures_total")
        skipped = metric(client, "teaagent_approver_skipped_total", reason="expired")

    status, code, message = error(approved)
    assert (status, code) == (409, "expired")
    assert re.fullmatch(  # a date with how long ago, not Unix seconds
        f"Request {request['request_id']} expired at {moment_re(request['expires_at'], AGO)}; "
        "this node signs nothing for it any more\\.",
        message,
    ), message
    assert shown.json()["state"] == "expired"
    assert shown.json()["seconds_left"] == 0
    assert (signatures, skipped) == (0, 1)
    assert audit_records(beta) == []


# -- every refusal is an ErrorOut --------------------------------------------------------------


@pytest.mark.anyio
async def test_every_refusal_is_an_error_out_with_its_code(
    cluster: dict[str, Node], beta_relay: Node
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    unknown = "0" * 32
    async with beta_approver(beta) as client:
        request_id = deliver(alpha, beta, arguments={"command": "make release"})["request_id"]
        no_token = await client.get("/v1/requests", headers={"Authorization": ""})
        wrong_token = await client.get(
            "/v1/requests", headers={"Authorization": "Bearer nope-nope-nope-nope"}
        )
        no_route = await client.get("/v1/nothing")
        wrong_method = await client.delete("/v1/requests")
        bad_state = await client.get("/v1/requests", params={"state": "maybe"})
        bad_limit = await client.get("/v1/requests", params={"limit": 0})
        bad_id = await client.get("/v1/requests/NOT-AN-ID")
        not_found = await client.get(f"/v1/requests/{unknown}")
        not_found_from = await client.post(f"/v1/requests/{request_id}/approve", json={"origin": "gamma"})
        no_reason = await client.post(f"/v1/requests/{request_id}/deny", json={"reason": ""})
        blank_reason = await client.post(f"/v1/requests/{request_id}/deny", json={"reason": "  \t"})
        extra_field = await client.post(f"/v1/requests/{request_id}/approve", json={"reasons": "x"})
        not_json = await client.post(
            f"/v1/requests/{request_id}/approve", content=b"{", headers={"Content-Type": "application/json"}
        )
        too_large = await client.post(f"/v1/requests/{request_id}/approve", content=b"x" * 70_000)
        not_a_statement = await client.post(
            f"/v1/requests/{request_id}/decision",
            json={"statement": {"request_id": request_id}, "signature": "x"},
        )
        health = await client.get("/health", headers={"Authorization": ""})
        metrics = await client.get("/metrics", headers={"Authorization": ""})
        openapi = await client.get("/openapi.json")

    assert error(no_token)[:2] == (401, "unauthorized")
    assert error(wrong_token)[:2] == (401, "unauthorized")
    assert error(no_route) == (404, "not_found", "There is no such resource on this approver.")
    assert error(wrong_method)[:2] == (405, "method_not_allowed")
    assert error(bad_state)[:2] == (422, "invalid")
    assert error(bad_limit)[:2] == (422, "invalid")
    assert error(bad_id)[:2] == (422, "invalid")
    assert error(not_found) == (404, "not_found", f"No request {unknown} is in this node's inbox.")
    assert error(not_found_from) == (
        404,
        "not_found",
        f"No request {request_id} from gamma is in this node's inbox.",
    )
    assert error(no_reason)[:2] == (422, "invalid")
    assert error(blank_reason)[:2] == (422, "invalid")
    assert "a denial needs a reason for the origin's operators, not only blanks" in error(blank_reason)[2]
    assert error(extra_field)[:2] == (422, "invalid")
    assert error(not_json)[:2] == (400, "invalid")
    assert error(too_large) == (413, "too_large", "The request body is larger than the limit of 65536 bytes.")
    assert error(not_a_statement)[:2] == (422, "invalid")
    assert health.status_code == 200
    assert health.json()["service"] == "approver"
    assert "teaagent_approver_refusals_total" in metrics.text
    paths = openapi.json()["paths"]
    assert set(paths) >= {
        "/v1/requests",
        "/v1/requests/{request_id}",
        "/v1/requests/{request_id}/statement",
        "/v1/requests/{request_id}/approve",
        "/v1/requests/{request_id}/deny",
        "/v1/requests/{request_id}/decision",
        "/health",
        "/metrics",
        "/v1/reload",
    }


@pytest.mark.anyio
async def test_the_relay_down_is_503_unavailable(cluster: dict[str, Node]) -> None:
    beta = cluster["beta"]  # its relay does not run
    async with beta_approver(beta, engine=False) as client:
        listed = await client.get("/v1/requests")
        shown = await client.get(f"/v1/requests/{'1' * 32}")

    assert error(listed)[:2] == (503, "unavailable")
    assert error(shown)[:2] == (503, "unavailable")


# -- the audit log -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_audit_log_verifies_and_holds_one_record_per_decision_with_its_key(
    cluster: dict[str, Node], beta_relay: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    alpha, beta = cluster["alpha"], beta_relay
    async with beta_approver(beta) as client:
        decided = [
            deliver(alpha, beta, arguments={"command": f"echo {n}"}, call_id=f"call-{n}")["request_id"]
            for n in range(5)
        ]
        asked = deliver(alpha, beta, arguments={"command": "make"}, call_id="call-ask")["request_id"]
        assert await until(lambda: metric(client, "teaagent_approver_forwards_total", result="ok") >= 5)
        await client.post(f"/v1/requests/{asked}/deny", json={"reason": "no"})
        await client.post(f"/v1/requests/{asked}/deny", json={"reason": "no"})  # the same, again

    path = beta.data_dir / AUDIT_FILE_NAME
    report = verify_log(path)
    assert report.ok, report.message
    records = audit_records(beta)
    assert sorted(record["request_id"] for record in records) == sorted([*decided, asked])
    assert {record["key_fingerprint"] for record in records} == {fingerprint(signer("beta"))}
    assert cli(["audit", "verify", str(path)]) == 0
    assert "6" in capsys.readouterr().out
