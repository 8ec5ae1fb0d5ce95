"""Operators see a version 2 request's rule, its terms and their own term, in every view, in one wording.

``approvals show`` and ``watch``, the TUI's ``/inbox``, the approver's webhooks (json and slack) and
its web inbox all word the policy through :func:`teaagent.quorum.shown_policy`, which reads it from
the signed request the approver verified. Signatures are real Ed25519 SSHSIGs (``relay_support``).
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from relay_support import public_line, signer
from test_approver_notify import an_item, eventually, notifier_for, receiving
from test_quorum_policy import NOW, request

from teaagent.approver_client import ApprovalItem
from teaagent.quorum import shown_policy, sign_request, verify_request
from teaagent.trust import SignerKey

ALPHA = (SignerKey(line=public_line("alpha")),)
HEADING = "rule git.push*: all of 2 terms, counted by alpha"
TERMS = ("2 of beta, delta, gamma", "1 of epsilon, zeta")
EPSILON = "epsilon's decision counts toward term 2"
LINE = f"{HEADING}; term 1: {TERMS[0]}; term 2: {TERMS[1]}; {EPSILON}"


def push() -> tuple[dict[str, Any], str]:
    """A version 2 request (git.push: 2 of ops and 1 of security), signed by its origin alpha."""
    doc = request("git.push")
    return doc, sign_request(doc, signer("alpha"))


def an_approval_item(doc: dict[str, Any], signature: str, expires_at: int | None = None) -> ApprovalItem:
    fields = ("request_id", "origin", "tool_name", "arguments", "reason", "payload_digest", "run_id")
    return ApprovalItem.from_json(
        {
            **{name: doc[name] for name in (*fields, "call_id", "required_approvals", "peers", "created_at")},
            "expires_at": doc["expires_at"] if expires_at is None else expires_at,
            "seconds_left": 60,
            "state": "pending",
            "decision": None,
            "rule": None,
            "request": doc,
            "signature": signature,
        }
    )


def test_the_policy_shown_is_the_verified_requests_rule_terms_and_this_nodes_term() -> None:
    doc, signature = push()
    verified = verify_request(doc, signature, ALPHA, recipient="epsilon")

    shown = shown_policy(verified, "epsilon")
    assert shown is not None
    assert shown.heading == HEADING
    assert shown.numbered == (("term 1", TERMS[0]), ("term 2", TERMS[1]))
    assert shown.counts == EPSILON
    assert shown.line() == LINE
    assert shown.to_dict() == {
        "rule": "git.push*",
        "every": "all",
        "terms": list(TERMS),
        "counts_toward": [2],
        "text": LINE,
    }
    assert shown_policy(verified, "omega").counts == (  # type: ignore[union-attr]
        "omega is in none of its terms: its decision counts toward nothing"
    )
    assert shown_policy(request("shell.run"), "beta") is None  # version 1: N of the peers, no rule


def test_approvals_watch_announces_the_rule_its_terms_and_this_nodes_term() -> None:
    from teaagent.cli._approvals_watch import Watch

    doc, signature = push()
    node: Any = SimpleNamespace(agent_id="epsilon")
    watch = Watch(node, signer=None, origin=None, tool=None, emit=lambda line: None)

    lines = watch.new_request_lines(an_approval_item(doc, signature, int(time.time()) + 60), time.time())

    assert f"  quorum: {LINE}" in lines
    plain = request("shell.run")
    v1 = watch.new_request_lines(an_approval_item(plain, sign_request(plain, signer("alpha"))), NOW)
    assert not any(line.startswith("  quorum:") for line in v1)


def test_the_tuis_inbox_says_each_version_2_requests_rule_terms_and_this_nodes_term() -> None:
    from teaagent.tui._inbox import inbox_policy_lines

    doc, signature = push()
    plain = request("shell.run")
    items = [an_approval_item(doc, signature), an_approval_item(plain, sign_request(plain, signer("alpha")))]

    assert inbox_policy_lines(items, "epsilon") == [f"{doc['request_id'][:8]} {LINE}"]


@pytest.mark.anyio
async def test_webhooks_carry_the_rule_its_terms_and_this_nodes_term_from_the_signed_request(
    tmp_path: Path,
) -> None:
    doc, signature = push()
    # The approver's view: described fields beside the request whose signature verified.
    item = an_item(tool_name="git.push", arguments=doc["arguments"], request=doc, signature=signature)
    plain = an_item()  # no signed version 2 request: no quorum shown
    with receiving() as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml") as notifier:
            await notifier.notify(item)
            await notifier.notify(plain)
            await eventually(lambda: notifier.stats.delivered == 2)
        async with notifier_for(receiver, tmp_path / "node.toml", format="slack") as notifier:
            await notifier.notify(an_item(request=doc, signature=signature))
            await eventually(lambda: notifier.stats.delivered == 1)
    first, second, slack = (hit.body for hit in receiver.hits)
    beta = LINE.replace(EPSILON, "beta's decision counts toward term 1")  # the notifier is beta's
    assert first["quorum"] == {
        "rule": "git.push*",
        "every": "all",
        "terms": list(TERMS),
        "counts_toward": [1],
        "text": beta,
    }
    assert "quorum" not in second
    sections = [
        block["text"]["text"] for block in slack["blocks"] if block["type"] == "section" and "text" in block
    ]
    assert (
        f"*Quorum*\n{HEADING}\nterm 1: {TERMS[0]}\nterm 2: {TERMS[1]}\nbeta's decision counts toward term 1"
        in sections
    )


def test_the_web_inbox_shows_the_rule_its_terms_and_this_nodes_term() -> None:
    from teaagent_approver._web_html import card_html

    doc, signature = push()
    view = {
        **an_item(tool_name="git.push", arguments=doc["arguments"]),
        "request": doc,
        "signature": signature,
        "decision": None,
        "settled": None,
        "rule": None,
    }

    card = html.unescape(card_html(view, "epsilon", None))

    assert (
        f'<dt>Policy</dt><dd>{HEADING}<ul class="terms"><li>term 1: {TERMS[0]}</li>'
        f"<li>term 2: {TERMS[1]}</li></ul>{EPSILON}</dd>"
    ) in card
