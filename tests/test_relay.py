"""The relay service in-process (httpx over ASGI, the real Redis): own requests and counting decisions.

The outcome's long-poll and the service's operations are in ``test_relay_operations.py``; the inbox
and the refusals of peers' calls in ``test_relay_inbox.py``, the delivery worker in
``test_relay_delivery.py``; real processes exchanging requests, and the faults, in
``test_relay_cluster.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import httpx
import pytest
from relay_support import (
    MakeCluster,
    Node,
    approval,
    decisions_path,
    denial,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
    public_line,
    served,
    signer,
    submit,
)
from words_support import moment_re

from teaagent.quorum import approval_statement, sign_denial, sign_request, verify_certificate

# -- submitting own requests ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_request_is_stored_once_and_queued_for_every_peer(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        first = await submit(client, alpha, request)
        again = await submit(client, alpha, request)
        relay = client.app.state.relay  # type: ignore[attr-defined]
        queued = await relay.deliveries.claim("test", 10, 0)

    assert first.status_code == 201
    assert again.status_code == 200
    status = first.json()
    assert status["state"] == "pending"
    assert status["peers"] == ["beta", "delta", "gamma"]
    assert status["required"] == 2
    assert status["certificate"] is None
    # Every submission queues the deliveries again (a retry after a crash completes them).
    assert sorted(entry.target for entry in queued) == ["beta", "beta", "delta", "delta", "gamma", "gamma"]
    payload = json.loads(queued[0].payload)
    assert payload["path"] == "/v1/inbox"
    assert payload["body"]["request"] == request


@pytest.mark.anyio
async def test_a_new_request_is_answered_as_stored_without_reading_it_back(
    nodes: dict[str, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    from teaagent_relay._relay import Relay

    reads: list[str] = []
    original = Relay.status

    async def counted(self: Relay, request_id: str) -> dict[str, Any]:
        reads.append(request_id)
        return await original(self, request_id)

    monkeypatch.setattr(Relay, "status", counted)
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        before = int(time.time())
        first = await submit(client, alpha, request)
        read_after_new = list(reads)
        shown = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)
        again = await submit(client, alpha, request)

    assert read_after_new == []  # answered from what was stored, not read back
    assert reads.count(request["request_id"]) >= 2  # the read of the status, and the repeat's answer
    assert first.status_code == 201
    assert again.status_code == 200
    # The answer is the status a read gives: the same fields, the same values.
    assert first.json() == shown.json() == again.json()
    assert before <= first.json()["accepted_at"] <= int(time.time())


@pytest.mark.anyio
async def test_a_request_is_refused_without_the_nodes_token(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        missing = await client.post("/v1/requests", json=alpha.signed(request))
        wrong = await client.post(
            "/v1/requests",
            json=alpha.signed(request),
            headers={"Authorization": "Bearer not-the-token-at-all"},
        )
        stored = await client.app.state.relay.store.requests.get(request["request_id"])  # type: ignore[attr-defined]

    for response in (missing, wrong):
        assert error(response) == (
            401,
            "unauthorized",
            "This call needs the node's bearer token (Authorization: Bearer <token>).",
        )
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert stored is None


@pytest.mark.anyio
async def test_a_request_must_be_signed_with_the_nodes_own_key(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        forged = {
            "request": request,
            "signature": nodes["beta"].signed(dict(request, origin="alpha"))["signature"],
        }
        # beta signed a document naming alpha as origin: the key is not alpha's.
        response = await client.post("/v1/requests", json=forged, headers=alpha.headers)
        stored = await client.app.state.relay.store.requests.get(request["request_id"])  # type: ignore[attr-defined]

    status, code, message = error(response)
    assert (status, code) == (403, "bad_signature")
    assert message.startswith("The request signature does not verify with this node's own key:")
    assert stored is None


@pytest.mark.anyio
async def test_a_request_of_another_origin_is_forbidden(nodes: dict[str, Node]) -> None:
    alpha, beta = nodes["alpha"], nodes["beta"]
    async with in_process(alpha, deliver=False) as client:
        response = await client.post("/v1/requests", json=beta.signed(beta.request()), headers=alpha.headers)

    assert error(response) == (403, "forbidden", "The request's origin beta is not this node (alpha).")


@pytest.mark.anyio
async def test_a_malformed_request_is_invalid(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        signed = alpha.signed(request)
        del signed["request"]["reason"]
        lacking = await client.post("/v1/requests", json=signed, headers=alpha.headers)
        extra = await client.post(
            "/v1/requests", json={**alpha.signed(request), "more": 1}, headers=alpha.headers
        )
        not_json = await client.post(
            "/v1/requests", content=b"{nope", headers={**alpha.headers, "Content-Type": "application/json"}
        )

    assert error(lacking) == (422, "invalid", "The request lacks the field reason.")
    assert error(extra) == (422, "invalid", "More: Extra inputs are not permitted.")
    status, code, message = error(not_json)
    assert (status, code) == (400, "invalid")
    assert message.startswith("The request body is not valid JSON:")


@pytest.mark.anyio
async def test_another_document_under_a_stored_id_is_a_conflict(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        other = alpha.request(arguments={"command": "rm -rf /"}, request_id=request["request_id"])
        response = await submit(client, alpha, other)
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert error(response) == (
        409,
        "conflict",
        f"Request {request['request_id']} is already stored with a different document.",
    )
    assert status.json()["state"] == "pending"


@pytest.mark.anyio
async def test_a_request_the_configured_peers_cannot_approve_is_refused(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        request["peers"] = ["beta", "omega"]  # omega is no peer of alpha: one countable peer, two needed
        signed = {"request": request, "signature": sign_request(request, alpha.key)}
        response = await client.post("/v1/requests", json=signed, headers=alpha.headers)

    assert error(response) == (
        422,
        "invalid",
        f"Request {request['request_id']} needs 2 approvals but only 1 of its peers are configured peers "
        "of this node.",
    )


# -- counting decisions: the story of PROTOCOL.md "Counting" ---------------------------------------


@pytest.mark.anyio
async def test_counting_tampered_fails_wrong_key_fails_one_short_waits_threshold_met_approves(
    nodes: dict[str, Node],
) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        path = decisions_path(request)

        tampered = approval(request, "beta")
        tampered["statement"]["payload_digest"] = "sha256:" + "0" * 64
        refused_tampered = await client.post(path, json=tampered)

        wrong_key = approval(request, "gamma")
        wrong_key["statement"] = approval_statement(request, "beta", wrong_key["statement"]["signed_at"])
        refused_wrong_key = await client.post(path, json=wrong_key)

        one = await client.post(path, json=approval(request, "beta"))
        short = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)
        two = await client.post(path, json=approval(request, "gamma"))
        done = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert error(refused_tampered) == (
        422,
        "invalid",
        f"The statement's payload_digest does not match request {request['request_id']}.",
    )
    status, code, message = error(refused_wrong_key)
    assert (status, code) == (403, "bad_signature")
    assert message.startswith("The approval does not verify with the key configured for beta:")
    assert one.json() | {"request_id": "-"} == {
        "request_id": "-",
        "origin": "alpha",
        "signer": "beta",
        "kind": "approval",
        "state": "pending",
        "counted": True,
        "decided": False,
        "approvals": 1,
        "denials": 0,
    }
    assert short.json()["state"] == "pending"
    assert short.json()["signers"] == ["beta"]
    assert two.json()["state"] == "approved"
    assert two.json()["decided"] is True
    body = done.json()
    assert body["state"] == "approved"
    assert body["signers"] == ["beta", "gamma"]
    outcome = verify_certificate(body["certificate"], alpha.quorum(), origin_public_key=public_line("alpha"))
    assert outcome.signers == ("beta", "gamma")


@pytest.mark.anyio
async def test_the_same_decision_five_times_counts_once(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        document = approval(request, "beta")
        answers = await asyncio.gather(
            *(client.post(decisions_path(request), json=document) for _ in range(5))
        )
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert [answer.status_code for answer in answers] == [200] * 5
    assert sorted(answer.json()["counted"] for answer in answers) == [False, False, False, False, True]
    assert {answer.json()["approvals"] for answer in answers} == {1}
    assert status.json()["state"] == "pending"


@pytest.mark.anyio
async def test_denials_past_what_the_quorum_can_spare_deny_the_request(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        first = await client.post(decisions_path(request), json=denial(request, "delta", "not on Fridays"))
        second = await client.post(decisions_path(request), json=denial(request, "gamma", ""))
        late = await client.post(decisions_path(request), json=approval(request, "beta"))
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    # 3 peers, 2 required: one denial can be spared, the second one decides.
    assert (first.json()["state"], first.json()["counted"]) == ("pending", True)
    assert (second.json()["state"], second.json()["decided"]) == ("denied", True)
    assert (late.json()["state"], late.json()["counted"]) == ("denied", False)
    body = status.json()
    assert body["state"] == "denied"
    assert body["denied_by"] == ["delta", "gamma"]
    assert body["denial_reasons"] == {"delta": "not on Fridays", "gamma": ""}
    assert body["certificate"] is None


@pytest.mark.anyio
async def test_a_signer_that_denied_counts_as_a_denial_only_and_is_never_in_the_certificate(
    nodes: dict[str, Node],
) -> None:
    alpha = nodes["alpha"]  # peers beta, delta, gamma; 2 required
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        path = decisions_path(request)
        approved = await client.post(path, json=approval(request, "beta"))
        vetoed = await client.post(path, json=denial(request, "beta", "changed my mind"))
        turned = await client.post(path, json=approval(request, "beta"))
        await client.post(path, json=approval(request, "gamma"))
        decided = await client.post(path, json=approval(request, "delta"))
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    counts = [
        (r.status_code, r.json()["counted"], r.json()["approvals"], r.json()["denials"])
        for r in (approved, vetoed, turned)
    ]
    # PROTOCOL.md rule 6: the denial after beta's approval counts and takes it away; the approval
    # after the denial is no error, and not counted.
    assert counts == [(200, True, 1, 0), (200, True, 0, 1), (200, False, 0, 1)]
    assert (decided.json()["state"], decided.json()["approvals"], decided.json()["denials"]) == (
        "approved",
        2,
        1,
    )
    body = status.json()
    assert (body["signers"], body["denied_by"]) == (["delta", "gamma"], ["beta"])
    assert [item["statement"]["signer"] for item in body["certificate"]["approvals"]] == ["delta", "gamma"]
    outcome = verify_certificate(body["certificate"], alpha.quorum(), origin_public_key=public_line("alpha"))
    assert outcome.signers == ("delta", "gamma")


def test_an_approved_outcome_carries_the_counted_denials_in_its_certificate(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]  # peers beta, delta, gamma; 2 required
    vetoed_request, plain_request = alpha.request(), alpha.request()
    vetoed = denial(vetoed_request, "delta", "not on Fridays")
    bodies: list[dict[str, Any]] = []
    with served(alpha, deliver=False), httpx.Client(timeout=10) as client:
        for request, documents in (
            (vetoed_request, [vetoed, approval(vetoed_request, "beta"), approval(vetoed_request, "gamma")]),
            (plain_request, [approval(plain_request, "beta"), approval(plain_request, "gamma")]),
        ):
            client.post(f"{alpha.url}/v1/requests", json=alpha.signed(request), headers=alpha.headers)
            for document in documents:
                response = client.post(f"{alpha.url}{decisions_path(request)}", json=document)
                assert response.json()["counted"] is True
            outcome_url = f"{alpha.url}/v1/requests/{request['request_id']}/outcome"
            bodies.append(client.get(outcome_url, params={"wait": 0}, headers=alpha.headers).json())

    body, plain = bodies
    assert (body["state"], body["signers"], body["denied_by"]) == ("approved", ["beta", "gamma"], ["delta"])
    certificate = body["certificate"]
    assert certificate["denials"] == body["denials"] == [vetoed]
    outcome = verify_certificate(certificate, alpha.quorum(), origin_public_key=public_line("alpha"))
    assert (outcome.signers, outcome.denied_by) == (("beta", "gamma"), ("delta",))
    assert outcome.denial_reasons == {"delta": "not on Fridays"}
    # Without a denial, the certificate has the shape it always had.
    assert plain["state"] == "approved"
    assert set(plain["certificate"]) == {"request", "request_signature", "approvals"}
    assert plain["denials"] == []


@pytest.mark.anyio
async def test_a_denial_after_the_signers_approval_can_deny_the_request(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]  # 2 of 3: a second denial decides
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        path = decisions_path(request)
        await client.post(path, json=approval(request, "beta"))
        await client.post(path, json=denial(request, "gamma"))
        denied = await client.post(path, json=denial(request, "beta", "not after all"))
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    receipt = denied.json()
    assert (receipt["state"], receipt["decided"], receipt["approvals"], receipt["denials"]) == (
        "denied",
        True,
        0,
        2,
    )
    body = status.json()
    assert (body["state"], body["signers"], body["denied_by"]) == ("denied", [], ["beta", "gamma"])
    assert body["denial_reasons"] == {"beta": "not after all", "gamma": "not today"}
    assert body["certificate"] is None


@pytest.mark.anyio
async def test_relay_processes_sharing_a_store_count_a_signer_alike(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    # Two relays of one node on one store (two workers): what each knows of a request is only what
    # never changes; who decided what is the script's alone.
    async with in_process(alpha, deliver=False) as first, in_process(alpha, deliver=False) as second:
        request = alpha.request()
        await submit(first, alpha, request)
        path = decisions_path(request)
        await first.post(path, json=approval(request, "beta"))
        vetoed = await second.post(path, json=denial(request, "beta"))
        turned = await first.post(path, json=approval(request, "beta"))
        status = await second.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert (vetoed.status_code, vetoed.json()["counted"], vetoed.json()["approvals"]) == (200, True, 0)
    assert (turned.status_code, turned.json()["counted"], turned.json()["denials"]) == (200, False, 1)
    assert (status.json()["state"], status.json()["signers"], status.json()["denied_by"]) == (
        "pending",
        [],
        ["beta"],
    )


@pytest.mark.anyio
async def test_a_signer_that_may_not_sign_is_forbidden(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        stranger = await client.post(decisions_path(request), json=approval(request, "mallory"))
        origin = await client.post(decisions_path(request), json=approval(request, "alpha"))

    assert error(stranger) == (
        403,
        "forbidden",
        f"'mallory' is not a peer of request {request['request_id']}.",
    )
    assert error(origin) == (403, "forbidden", "The origin cannot approve or deny its own request.")


@pytest.mark.anyio
async def test_a_request_peer_that_this_node_does_not_know_is_forbidden(make_cluster: MakeCluster) -> None:
    nodes = make_cluster("alpha", "beta", "gamma", "omega", required=1, peers_of={"alpha": ["beta", "gamma"]})
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        request["peers"] = ["beta", "gamma", "omega"]
        await client.post(
            "/v1/requests",
            json={"request": request, "signature": sign_request(request, alpha.key)},
            headers=alpha.headers,
        )
        response = await client.post(decisions_path(request), json=approval(request, "omega"))

    assert error(response) == (403, "forbidden", "Omega is not a configured peer of this node.")


@pytest.mark.anyio
async def test_decision_times_follow_rule_4(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        now = int(time.time())
        future = await client.post(
            decisions_path(request),
            json=approval(
                request, "beta", signed_at=now + 90
            ),  # before expires_at (about now + 120) on a loaded machine too
        )
        after = await client.post(
            decisions_path(request), json=approval(request, "beta", signed_at=request["expires_at"] + 1)
        )
        skew = await client.post(decisions_path(request), json=approval(request, "gamma", signed_at=now + 55))

    status, code, message = error(future)
    assert (status, code) == (422, "invalid")
    assert re.fullmatch(
        f"The statement is dated {moment_re(now + 90)}, more than 60 seconds in the future\\.", message
    ), message
    status, code, message = error(after)
    assert (status, code) == (422, "invalid")
    expiry = request["expires_at"]
    assert re.fullmatch(
        f"The statement was signed at {moment_re(expiry + 1)}, after the request expired at "
        f"{moment_re(expiry)}\\.",
        message,
    ), message
    assert skew.status_code == 200  # within the clock skew


def test_decisions_count_from_sixty_seconds_before_their_request_was_created(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]  # peers beta, delta, gamma; 2 required
    request = alpha.request()
    created = request["created_at"]
    path = f"{alpha.url}{decisions_path(request)}"
    with served(alpha, deliver=False), httpx.Client(timeout=10) as client:
        client.post(f"{alpha.url}/v1/requests", json=alpha.signed(request), headers=alpha.headers)
        early_approval = client.post(path, json=approval(request, "beta", signed_at=created - 61))
        early_denial = client.post(
            path, json=sign_denial(request, "gamma", signer("gamma"), "no", created - 61)
        )
        approved_at_bound = client.post(path, json=approval(request, "beta", signed_at=created - 60))
        denied_at_bound = client.post(
            path, json=sign_denial(request, "gamma", signer("gamma"), "no", created - 60)
        )

    too_early = (
        f"The statement was signed at {moment_re(created - 61)}, more than 60 seconds before the request "
        f"was created at {moment_re(created)}\\."
    )
    for early in (early_approval, early_denial):
        status, code, message = error(early)
        assert (status, code) == (422, "invalid")
        assert re.fullmatch(too_early, message), message
    assert (approved_at_bound.status_code, approved_at_bound.json()["counted"]) == (200, True)
    assert (denied_at_bound.status_code, denied_at_bound.json()["counted"]) == (200, True)
    assert (denied_at_bound.json()["approvals"], denied_at_bound.json()["denials"]) == (1, 1)


@pytest.mark.anyio
async def test_a_decision_half_a_second_past_the_expiry_is_late(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        relay = client.app.state.relay  # type: ignore[attr-defined]
        expires_at = request["expires_at"]
        beta, gamma = approval(request, "beta", expires_at), approval(request, "gamma", expires_at)
        at_expiry = await relay.count(
            request["request_id"], beta["statement"], beta["signature"], now=expires_at
        )
        # The script counts whole seconds: rounded down, this one would count and approve.
        late = await relay.count(
            request["request_id"], gamma["statement"], gamma["signature"], now=expires_at + 0.5
        )
        stored = await relay.store.requests.get(request["request_id"])

    assert (at_expiry["state"], at_expiry["counted"]) == ("pending", True)
    assert (late["state"], late["counted"], late["decided"]) == ("expired", False, True)
    assert (stored.state, stored.decided_at, list(stored.approvals)) == ("expired", expires_at + 1, ["beta"])


@pytest.mark.anyio
async def test_an_expired_request_counts_nothing_and_says_expired(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request(now=time.time() - 200)  # expired 80 seconds ago
        created = await submit(client, alpha, request)
        late = await client.post(
            decisions_path(request), json=approval(request, "beta", signed_at=request["expires_at"] - 1)
        )
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert created.status_code == 201
    assert created.json()["state"] == "expired"
    assert (late.status_code, late.json()["state"], late.json()["counted"]) == (200, "expired", False)
    assert status.json()["signers"] == []


@pytest.mark.anyio
async def test_a_decision_for_an_unknown_request_is_not_found(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        response = await client.post(decisions_path(request), json=approval(request, "beta"))
        bad_id = await client.post("/v1/requests/NOT-AN-ID/decisions", json=approval(request, "beta"))
        status = await client.get(f"/v1/requests/{request['request_id']}", headers=alpha.headers)

    assert error(response) == (
        404,
        "not_found",
        f"Request {request['request_id']} is not stored here (it never arrived, or it expired).",
    )
    assert error(bad_id) == (422, "invalid", "The request id in the path is not 32 lowercase hex characters.")
    assert error(status)[:2] == (404, "not_found")


@pytest.mark.anyio
async def test_a_decision_body_of_the_wrong_shape_is_invalid(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        path = decisions_path(request)
        not_json = await client.post(path, content=b"{statement")
        no_signature = await client.post(path, json={"statement": {}})
        wrong_type = await client.post(
            path, json={"statement": approval_statement(request, "beta", 1) | {"type": "x"}, "signature": "a"}
        )

    status, code, _ = error(not_json)
    assert (status, code) == (400, "invalid")
    assert error(no_signature) == (422, "invalid", "Signature: Field required.")
    assert error(wrong_type) == (
        422,
        "invalid",
        "The statement's type is neither teaagent.approval nor teaagent.denial.",
    )
