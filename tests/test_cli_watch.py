"""QuorumWatch: the lines a user sees while a quorum is awaited (tools call, run), from relay statuses."""

from __future__ import annotations

from typing import Any

from relay_support import approval, denial, signer, write_cluster

from teaagent.cli._watch import QuorumWatch, expiry_sentence
from teaagent.relay_client import RequestStatus

PEERS = ["beta", "delta", "gamma"]


def status(request: dict[str, Any], state: str = "pending", **fields: Any) -> RequestStatus:
    data: dict[str, Any] = {
        "request_id": request["request_id"],
        "state": state,
        "required": 2,
        "peers": PEERS,
        "signers": [],
        "denied_by": [],
        "denial_reasons": {},
        "expires_at": request["expires_at"],
        "accepted_at": request["created_at"],
        "decided_at": None,
        "certificate": None,
        "denials": [],
        "approvals": [],
        "deliveries": {},
    }
    data.update(fields)
    return RequestStatus.from_json(data)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def a_request(tmp_path: Any) -> dict[str, Any]:
    nodes = write_cluster(tmp_path, ["alpha", *PEERS], redis_url="redis://127.0.0.1:1/0", prefix="t")
    return nodes["alpha"].request()


DELIVERED = {"state": "delivered", "attempts": 1, "error": None, "at": 1.0}
DOWN = "delta's relay at http://127.0.0.1:9/v1/inbox is unreachable: All connection attempts failed"


def test_each_change_is_one_line_deliveries_then_decisions_with_key_and_time(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    lines: list[str] = []
    clock = Clock()
    watch = QuorumWatch(lines.append, clock=clock)
    watch(status(request))  # the submission's status: the time of asking
    assert lines == []
    failing = {"state": "failing", "attempts": 1, "error": DOWN, "at": 1.0}
    deliveries = {"beta": DELIVERED, "delta": failing, "gamma": {"state": "pending", "attempts": 0}}
    watch(status(request, deliveries=deliveries))
    watch(status(request, deliveries={**deliveries, "delta": {**failing, "attempts": 2}}))  # no new line
    assert lines == [
        "beta's relay received the request.",
        f"delta could not be reached: {DOWN}; retrying until the request expires.",
    ]
    clock.now = 102.5
    deliveries["gamma"] = DELIVERED
    watch(status(request, deliveries=deliveries, signers=["beta"], approvals=[approval(request, "beta")]))
    watch(status(request, deliveries=deliveries, signers=["beta"], approvals=[approval(request, "beta")]))
    fingerprint = signer("beta").public_key.fingerprint
    assert lines[2:] == [
        "gamma's relay received the request.",
        f"✓ beta approved (key {fingerprint}, 2.5 s after asking): 1 of 2 needed.",
    ]
    clock.now = 104.0
    watch(
        status(
            request,
            "denied",
            deliveries=deliveries,
            signers=["beta"],
            denied_by=["gamma"],
            denial_reasons={"gamma": "not today"},
            denials=[denial(request, "gamma")],
        )
    )
    assert lines[4:] == [
        f"✗ gamma denied (key {signer('gamma').public_key.fingerprint}, 4.0 s after asking): not today."
    ]
    watch(status(request, "denied", signers=["beta"], denied_by=["gamma", "delta"]))  # decided: silent
    assert len(lines) == 5


def test_an_expiry_names_who_never_answered_and_who_was_never_reached(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    lines: list[str] = []
    watch = QuorumWatch(lines.append)
    given_up = {"state": "given_up", "attempts": 7, "error": DOWN, "at": 1.0}
    deliveries = {"beta": DELIVERED, "gamma": DELIVERED, "delta": given_up}
    watch(status(request))
    watch(status(request, "expired", deliveries=deliveries, signers=["beta"]))
    rid = request["request_id"]
    assert lines[-1] == (
        f"request {rid} expired: approved by beta (1 of 2 needed); never answered: gamma; "
        f"unreachable: delta ({DOWN}; 7 attempts)."
    )
    assert "delta could not be reached, and the relay gave up: " + DOWN + "." in lines


def test_without_delivery_states_every_silent_peer_never_answered(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    assert expiry_sentence(status(request, "expired")) == (
        f"request {request['request_id']} expired: approved by nobody (0 of 2 needed); "
        "never answered: beta, delta, gamma."
    )


def test_a_peer_not_tried_yet_is_unreachable_without_a_reason(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    pending = {"state": "pending", "attempts": 0, "error": None, "at": None}
    sentence = expiry_sentence(
        status(request, "expired", deliveries={"beta": DELIVERED, "delta": pending, "gamma": DELIVERED})
    )
    assert sentence.endswith("never answered: beta, gamma; unreachable: delta (not tried yet).")
