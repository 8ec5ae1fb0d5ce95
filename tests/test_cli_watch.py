"""The words of a quorum wait, shared by every asking surface (relay_client._progress), and QuorumWatch,
the lines ``tools call`` and ``run`` write from the gate's ``on_wait``."""

from __future__ import annotations

import time
from typing import Any

from relay_support import approval, denial, signer, write_cluster

from teaagent.cli._watch import QuorumWatch
from teaagent.relay_client import (
    RequestStatus,
    WaitProgress,
    describe_wait,
    expiry_sentence,
    next_reminder,
    wait_news,
)

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


ASKED = 100.0


def progress(
    request: dict[str, Any], state: str = "pending", why: str = "changed", **fields: Any
) -> WaitProgress:
    return WaitProgress.of(status(request, state, **fields), tool_name="shell.run", why=why, asked_at=ASKED)  # type: ignore[arg-type]


def a_request(tmp_path: Any) -> dict[str, Any]:
    nodes = write_cluster(tmp_path, ["alpha", *PEERS], redis_url="redis://127.0.0.1:1/0", prefix="t")
    return nodes["alpha"].request()


DELIVERED = {"state": "delivered", "attempts": 1, "error": None, "at": 1.0}
DOWN = "delta's relay at http://127.0.0.1:9/v1/inbox is unreachable: All connection attempts failed"


def test_what_a_relay_says_of_an_unreachable_peer_stays_on_its_one_line(tmp_path: Any) -> None:
    # The relay's own words about a delivery: a line break in them would draw a line of their own,
    # worded as a verified approval, under the ones that verified.
    request = a_request(tmp_path)
    forged = "refused.\nteaagent: \u2713 beta approved (key SHA256:x, 1.2 s after asking): 1 approval\x1b[2K"
    failing = {"state": "failing", "attempts": 1, "error": forged + "x" * 1000, "at": 1.0}

    lines = wait_news(
        progress(request, why="sent"), progress(request, deliveries={"delta": failing}), ASKED + 1
    )

    (line,) = lines
    assert line.startswith("delta could not be reached: refused.\\u000ateaagent: ")
    assert "\n" not in line
    assert "\x1b" not in line
    assert line.endswith("…; retrying until the request expires.")
    assert len(line) < 400  # the relay's words are cut, whatever their length


def test_each_change_is_one_line_deliveries_then_decisions_with_key_and_time(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    lines: list[str] = []

    def news(before: WaitProgress | None, after: WaitProgress, now: float) -> None:
        lines.extend(wait_news(before, after, now))

    sent = progress(request, why="sent")
    news(None, sent, ASKED)
    assert lines == []
    failing = {"state": "failing", "attempts": 1, "error": DOWN, "at": 1.0}
    deliveries = {"beta": DELIVERED, "delta": failing, "gamma": {"state": "pending", "attempts": 0}}
    first = progress(request, deliveries=deliveries)
    news(sent, first, ASKED + 1)
    again = progress(request, deliveries={**deliveries, "delta": {**failing, "attempts": 2}})
    news(first, again, ASKED + 1)  # no new line
    assert lines == [
        "beta's relay received the request.",
        f"delta could not be reached: {DOWN}; retrying until the request expires.",
    ]
    deliveries["gamma"] = DELIVERED
    signed = progress(request, deliveries=deliveries, signers=["beta"], approvals=[approval(request, "beta")])
    news(again, signed, ASKED + 2.5)
    news(signed, signed, ASKED + 2.5)
    fingerprint = signer("beta").public_key.fingerprint
    assert lines[2:] == [
        "gamma's relay received the request.",
        f"✓ beta approved (key {fingerprint}, 2.5 s after asking): 1 approval of the 2 needed.",
    ]
    denied = progress(
        request,
        "denied",
        deliveries=deliveries,
        signers=["beta"],
        denied_by=["gamma"],
        denial_reasons={"gamma": "not today"},
        denials=[denial(request, "gamma")],
    )
    news(signed, denied, ASKED + 4)
    assert lines[4:] == [
        f"✗ gamma denied (key {signer('gamma').public_key.fingerprint}, 4.0 s after asking): not today."
    ]


def test_a_wait_reads_as_a_count_who_received_it_the_time_left_and_the_command(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    failing = {"state": "failing", "attempts": 1, "error": DOWN, "at": 1.0}
    wait = progress(
        request,
        deliveries={"beta": DELIVERED, "gamma": DELIVERED, "delta": failing},
        signers=["beta"],
        approvals=[approval(request, "beta")],
    )
    short = request["request_id"][:8]
    now = request["expires_at"] - 118
    assert describe_wait(wait, now) == (
        f"request {short} for shell.run: 1 approval of the 2 needed (beta); received by beta, gamma; "
        f"not reached yet: delta; 1m 58s left (expires at "
        f"{time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(request['expires_at']))}). "
        f"A peer's operator approves it with: teaagent approvals approve {short} --config <their node.toml>"
    )
    assert "approve" not in describe_wait(wait, now, command=False)
    assert (
        wait.to_dict(now)["approve_command"]
        == f"teaagent approvals approve {short} --config <their node.toml>"
    )
    assert wait.to_dict(now)["seconds_left"] == 118


def test_what_is_shown_of_a_wait_is_only_what_verifies_here(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    # The relay says beta approved, but sends no signed approval: the gate's verified status has
    # no signer, and nothing shows one (the gate builds WaitProgress from its verified status only).
    gate_verified = progress(request, signers=[], deliveries={"beta": DELIVERED})
    assert "1 approval" not in describe_wait(gate_verified)
    assert "0 approvals of the 2 needed" in describe_wait(gate_verified)


def test_reminders_are_sparse_for_a_long_wait_and_close_at_its_end() -> None:
    assert next_reminder(3600) == 3300
    assert next_reminder(700) == 600
    assert next_reminder(600) == 540
    assert next_reminder(119) == 60
    assert next_reminder(60) == 30
    assert next_reminder(30) == 10
    assert next_reminder(10) is None
    marks = []
    left: float | None = 300.0
    while left is not None:
        left = next_reminder(left)
        if left is not None:
            marks.append(left)
    assert marks == [240, 180, 120, 60, 30, 10]


def test_the_watch_writes_the_wait_when_sent_and_reminded_and_the_news_between(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    lines: list[str] = []
    watch = QuorumWatch(lines.append)
    watch(progress(request, why="sent"))
    assert len(lines) == 1
    assert lines[0].startswith(
        f"request {request['request_id'][:8]} for shell.run: 0 approvals of the 2 needed; "
    )
    assert lines[0].endswith(" --config <their node.toml>")
    watch(progress(request, deliveries={"beta": DELIVERED}))
    assert lines[1:] == ["beta's relay received the request."]
    watch(progress(request, why="reminder", deliveries={"beta": DELIVERED}))
    assert lines[2].startswith(
        f"request {request['request_id'][:8]} for shell.run: 0 approvals of the 2 needed; "
    )
    assert len(lines) == 3


def test_an_expiry_names_who_never_answered_and_who_was_never_reached(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    lines: list[str] = []
    watch = QuorumWatch(lines.append)
    given_up = {"state": "given_up", "attempts": 7, "error": DOWN, "at": 1.0}
    deliveries = {"beta": DELIVERED, "gamma": DELIVERED, "delta": given_up}
    watch(progress(request, why="sent"))
    watch(progress(request, "expired", why="decided", deliveries=deliveries, signers=["beta"]))
    rid = request["request_id"]
    assert lines[-1] == (
        f"request {rid} expired: approved by beta (1 approval of the 2 needed); never answered: gamma; "
        f"unreachable: delta ({DOWN}; 7 attempts)."
    )
    assert "delta could not be reached, and the relay gave up: " + DOWN + "." in lines


def test_without_delivery_states_every_silent_peer_never_answered(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    assert expiry_sentence(progress(request, "expired")) == (
        f"request {request['request_id']} expired: approved by nobody (0 approvals of the 2 needed); "
        "never answered: beta, delta, gamma."
    )


def test_a_peer_not_tried_yet_is_unreachable_without_a_reason(tmp_path: Any) -> None:
    request = a_request(tmp_path)
    pending = {"state": "pending", "attempts": 0, "error": None, "at": None}
    sentence = expiry_sentence(
        progress(request, "expired", deliveries={"beta": DELIVERED, "delta": pending, "gamma": DELIVERED})
    )
    assert sentence.endswith("never answered: beta, gamma; unreachable: delta (not tried yet).")
