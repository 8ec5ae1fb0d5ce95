"""The HTML of the operators' web inbox: request cards, the inbox, one request's page and forms.

Pure functions of a request's view (``teaagent_approver._items.item_view``): every value is
HTML-escaped and its invisible characters shown escaped (``\\u202e``), long values folded
(``<details>``), never cut.
"""

from __future__ import annotations

import hashlib
import html
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from fastapi.responses import HTMLResponse

from teaagent._display import LONG_VALUE_CHARS, long_values, visible
from teaagent._words import moment, plural
from teaagent.approver_client import signed_by
from teaagent.quorum import shown_policy
from teaagent_approver._models import MAX_REASON_CHARS
from teaagent_approver._web_session import Session

__all__ = [
    "FOLD_CHARS",
    "Snapshot",
    "card_html",
    "card_version",
    "clock",
    "decided_notice",
    "esc",
    "hidden_fields",
    "inbox_main",
    "json_html",
    "layout",
    "notice_html",
    "page_response",
    "request_main",
    "request_path",
    "shown_text",
]

FOLD_CHARS: Final = LONG_VALUE_CHARS  # longer strings are folded (<details>), never cut


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def shown_text(text: str, *, newlines: bool = False) -> str:
    """Hostile text as HTML: invisible characters escaped, then HTML-escaped."""
    return esc(visible(text, newlines=newlines))


def clock(when: float) -> str:
    """The date alone (``2026-12-06 01:02:03Z``): a page's relative part would go stale."""
    return moment(when).split(",")[0]


def _folded(encoded: str, length: int, what: str) -> str:
    """A long text (already made visible) as its first characters and the rest in a <details>."""
    if len(encoded) <= FOLD_CHARS:
        return esc(encoded)
    return (
        f'{esc(encoded[:FOLD_CHARS])}<details class="fold"><summary>{esc(what)} of {length:,} characters: '
        f"{len(encoded) - FOLD_CHARS:,} more folded here, show them</summary>"
        f'<span class="rest">{esc(encoded[FOLD_CHARS:])}</span></details>'
    )


def _json_string(text: str) -> str:
    encoded = visible(json.dumps(text, ensure_ascii=False))
    return f'<span class="s">{_folded(encoded, len(text), "a string")}</span>'


def json_html(value: Any, depth: int = 0) -> str:
    """``value`` as indented JSON in HTML, keys sorted, strings escaped, long strings folded (never cut)."""
    pad = "  " * depth
    if isinstance(value, dict):
        if not value:
            return "{}"
        members = [
            f"{pad}  {_json_string(str(key))}: {json_html(value[key], depth + 1)}" for key in sorted(value)
        ]
        return "{\n" + ",\n".join(members) + f"\n{pad}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(f"{pad}  {json_html(item, depth + 1)}" for item in value) + f"\n{pad}]"
    if isinstance(value, str):
        return _json_string(value)
    return f'<span class="n">{esc(json.dumps(value))}</span>'


def _long_text(text: str, what: str) -> str:
    return _folded(visible(text, newlines=True), len(text), what)


def _left(view: Mapping[str, Any]) -> str:
    expires = int(view["expires_at"])
    return (
        f'<span class="left" data-expires="{expires}">expires at <time datetime="'
        f'{time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))}">{esc(clock(expires))}</time></span>'
    )


def _policy(view: Mapping[str, Any], node_id: str) -> str:
    # The view's "request" is the document of the request whose signature verified here.
    shown = shown_policy(view["request"], node_id)
    if shown is not None:  # version 2: the rule, its terms, the term this node counts toward
        terms = "".join(f"<li>{esc(name)}: {esc(term)}</li>" for name, term in shown.numbered)
        return f'{esc(shown.heading)}<ul class="terms">{terms}</ul>{esc(shown.counts)}'
    peers = ", ".join(view["peers"])
    needed = plural(int(view["required_approvals"]), "approval")
    return f"{needed} needed from {esc(peers)}, counted by {esc(view['origin'])}"


def _rule(view: Mapping[str, Any]) -> str:
    rule = view.get("rule")
    if rule is None:
        return "none matches: it waits for an operator"
    patterns = "".join(f" {name}={pattern!r}" for name, pattern in sorted(rule["arguments"].items()))
    return esc(f"#{rule['index']} tool={rule['tool']!r}{patterns} -> {rule['decision']}")


def _signed_so_far(view: Mapping[str, Any], node_id: str, node_key: str | None) -> str:
    """Who has signed, as this approver knows it: this node's own decision, and the verified outcome."""
    parts = []
    decision = view.get("decision")
    if decision is not None:
        verb = "approved" if decision["kind"] == "approval" else "denied"
        who = signed_by(decision["by"], decision["key_fingerprint"], node_key)
        parts.append(f"{esc(node_id)} {verb}, signed {esc(who)}")
    settled = view.get("settled")
    if settled is not None:
        parts.append(
            f"{esc(settled['outcome'])} at {esc(view['origin'])} by {esc(', '.join(settled['decided_by']))} "
            "(its evidence verified here)"
        )
    if not parts:
        return (
            f"none known here yet (the other peers' decisions go to {esc(view['origin'])}, which counts them)"
        )
    return "; ".join(parts)


def _state(view: Mapping[str, Any], node_id: str) -> str:
    state = view["state"]
    words = {
        "pending": "waiting for a decision",
        "approved": f"approved by {node_id}",
        "denied": f"denied by {node_id}",
        "expired": "expired undecided",
        "withdrawn": "withdrawn by its origin",
        "settled": "decided at its origin without this node",
    }
    return f'<span class="badge badge-{esc(state)}">{esc(words.get(state, state))}</span>'


def request_path(view: Mapping[str, Any]) -> str:
    return f"/web/requests/{view['origin']}/{view['request_id']}"


def card_html(view: Mapping[str, Any], node_id: str, node_key: str | None) -> str:
    """One request of the inbox: everything but the decision forms (those are on its own page)."""
    key = f"{view['origin']}/{view['request_id']}"
    heading = f"card-{view['origin']}-{view['request_id']}"
    return (
        f'<article class="card state-{esc(view["state"])}" data-key="{esc(key)}" '
        f'aria-labelledby="{esc(heading)}">'
        f'<h3 id="{esc(heading)}"><a href="{esc(request_path(view))}"><span class="tool">'
        f"{shown_text(view['tool_name'])}</span> from {esc(view['origin'])}</a></h3>"
        f'<p class="meta">{_state(view, node_id)} {_left(view) if view["state"] == "pending" else ""}</p>'
        "<dl>"
        f"<dt>Request</dt><dd><code>{esc(view['request_id'])}</code></dd>"
        f"<dt>Origin</dt><dd>{esc(view['origin'])} (run {shown_text(view['run_id'])}, "
        f"call {shown_text(view['call_id'])})</dd>"
        f'<dt>Reason</dt><dd class="text">{_long_text(view["reason"], "a reason")}</dd>'
        f"<dt>Digest</dt><dd><code>{esc(view['payload_digest'])}</code></dd>"
        f"<dt>Policy</dt><dd>{_policy(view, node_id)}</dd>"
        f"<dt>Signed so far</dt><dd>{_signed_so_far(view, node_id, node_key)}</dd>"
        "</dl>"
        f'<details class="arguments" open><summary>Arguments</summary><pre class="json">'
        f"{json_html(view['arguments'])}</pre></details>"
        + (
            f'<p><a class="button" href="{esc(request_path(view))}">Review and decide</a></p>'
            if view["state"] == "pending"
            else ""
        )
        + "</article>"
    )


def card_version(card: str) -> str:
    return hashlib.sha256(card.encode()).hexdigest()[:16]


def layout(
    title: str, main: str, *, node_id: str, session: Session | None, page: str, notice: str = ""
) -> str:
    signed = (
        '<form method="post" action="/web/logout" class="signout">'
        f'<input type="hidden" name="csrf" value="{esc(session.csrf)}">'
        '<button type="submit">Sign out</button></form>'
        if session is not None
        else ""
    )
    nav = f'<nav aria-label="Main"><a href="/web/">Inbox</a>{signed}</nav>' if session is not None else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · {esc(node_id)} · teaagent</title>"
        '<link rel="stylesheet" href="/web/static/web.css">'
        '<script src="/web/static/web.js" defer></script></head>'
        f'<body data-page="{esc(page)}" data-server-now="{int(time.time())}">'
        '<a class="skip" href="#main">Skip to the content</a>'
        f'<header><p class="brand">teaagent · approver of <strong>{esc(node_id)}</strong></p>{nav}</header>'
        '<div id="status" class="status" role="status" aria-live="polite" hidden></div>'
        f'<main id="main" tabindex="-1">{notice}{main}</main></body></html>'
    )


def page_response(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})


def notice_html(message: str, kind: Literal["error", "done"]) -> str:
    role = "alert" if kind == "error" else "status"
    return f'<div class="notice notice-{kind}" role="{role}" tabindex="-1" id="notice">{esc(message)}</div>'


@dataclass
class Snapshot:
    """The inbox as the approver sees it now, or why it cannot tell (its relay or Redis)."""

    views: list[dict[str, Any]]
    problem: str | None


def _problem_banner(problem: str | None) -> str:
    if problem is None:
        return ""
    banner = f"{esc(problem)} The page updates when it answers."
    return f'<div class="notice notice-error" role="alert">{banner}</div>'


def inbox_main(snapshot: Snapshot, node_id: str, node_key: str | None) -> str:
    pending = [view for view in snapshot.views if view["state"] == "pending"]
    others = [view for view in snapshot.views if view["state"] != "pending"]

    def cards(views: list[dict[str, Any]]) -> str:
        return "".join(card_html(view, node_id, node_key) for view in views)

    return (
        f"<h1>Requests for {esc(node_id)}</h1>"
        f'<p class="lede">Peers ask {esc(node_id)} to approve these tool calls. Each decision here is '
        f"{esc(node_id)}'s own; the request's origin counts the outcome from every peer's.</p>"
        f'<div id="problem">{_problem_banner(snapshot.problem)}</div>'
        '<section aria-labelledby="pending-h"><h2 id="pending-h">Waiting for a decision '
        f'<span class="count" id="pending-count">({len(pending)})</span></h2>'
        f'<div id="pending" class="cards">{cards(pending)}</div>'
        f'<p class="empty" id="pending-empty"{" hidden" if pending else ""}>Nothing waits for '
        f"{esc(node_id)}.</p></section>"
        '<section aria-labelledby="settled-h"><h2 id="settled-h">Settled</h2>'
        f'<div id="settled" class="cards">{cards(others)}</div>'
        f'<p class="empty" id="settled-empty"{" hidden" if others else ""}>None yet.</p></section>'
    )


def hidden_fields(**fields: str) -> str:
    return "".join(
        f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">' for name, value in fields.items()
    )


def _confirmed(view: Mapping[str, Any], session: Session) -> str:
    return hidden_fields(
        csrf=session.csrf,
        expect_tool_name=str(view["tool_name"]),
        expect_payload_digest=str(view["payload_digest"]),
    )


def _decide_forms(view: Mapping[str, Any], session: Session, node_id: str, fingerprint: str) -> str:
    path = esc(request_path(view))
    origin = esc(view["origin"])
    return (
        '<section class="decide" aria-labelledby="decide-h">'
        f'<h2 id="decide-h">Decide as {esc(node_id)}</h2>'
        f"<p>Signed with the node key <code>{esc(fingerprint)}</code> by this approver, which records the "
        "decision before it signs it and never signs another on this request.</p>"
        '<div class="forms">'
        f'<form method="post" action="{path}/approve" class="form-approve">{_confirmed(view, session)}'
        '<label for="approve-reason">Reason for approving (optional, kept in the audit log)</label>'
        f'<textarea id="approve-reason" name="reason" rows="2" maxlength="{MAX_REASON_CHARS}"></textarea>'
        '<button type="submit" class="approve">Approve</button></form>'
        f'<form method="post" action="{path}/deny" class="form-deny">{_confirmed(view, session)}'
        f'<label for="deny-reason">Reason for denying (required: signed, and read by {origin}\'s '
        "operators)</label>"
        f'<textarea id="deny-reason" name="reason" rows="2" required maxlength="{MAX_REASON_CHARS}">'
        "</textarea>"
        '<button type="submit" class="deny">Deny</button></form>'
        "</div></section>"
        '<section class="own-key" aria-labelledby="own-h">'
        '<h2 id="own-h">Or sign with your own key</h2>'
        f"<p>An operator's key listed in {esc(node_id)}'s <code>[approver] operators</code> signs the "
        "statement with <code>ssh-keygen</code>; the signature comes back here.</p>"
        f'<form method="get" action="{path}/own-key">'
        "<fieldset><legend>Decision to sign</legend>"
        '<label class="choice"><input type="radio" name="kind" value="approval" checked> Approval</label>'
        '<label class="choice"><input type="radio" name="kind" value="denial"> Denial</label></fieldset>'
        '<label for="own-reason">Reason (a denial needs one)</label>'
        f'<textarea id="own-reason" name="reason" rows="2" maxlength="{MAX_REASON_CHARS}"></textarea>'
        '<button type="submit">Prepare the statement</button></form></section>'
    )


def _signed_section(view: Mapping[str, Any], record: Any, node_id: str, node_key: str) -> str:
    """What this node signed, by which key: the statement exactly as signed (the approver's record)."""
    decision = view.get("decision")
    if decision is None:
        return ""
    verb = "approved" if decision["kind"] == "approval" else "denied"
    statement = record.statement if record is not None else None
    body = (
        f'<pre class="json" id="signed-statement">{json_html(statement)}</pre>'
        if statement is not None
        else "<p>The relay holds this decision; this approver has no record of its statement.</p>"
    )
    reason = f" Reason: {shown_text(decision['reason'])}." if decision["reason"] else ""
    return (
        '<section class="signed" aria-labelledby="signed-h">'
        f'<h2 id="signed-h">What {esc(node_id)} signed</h2>'
        f'<p id="signed-by">{esc(node_id)} {verb} this request, signed '
        f"{esc(signed_by(decision['by'], decision['key_fingerprint'], node_key))} "
        f"at {esc(clock(decision['at']))}.{reason}</p>"
        f"{body}</section>"
    )


def request_main(
    view: Mapping[str, Any], record: Any, node_id: str, session: Session, fingerprint: str
) -> str:
    notes = "".join(
        f"<li>{shown_text(path)} is {length:,} characters long: folded above, open it to read it whole.</li>"
        for path, length in long_values(view["arguments"])
    )
    settled = view.get("settled")
    rows = [
        ("Request", f"<code>{esc(view['request_id'])}</code>"),
        (
            "Origin",
            f"{esc(view['origin'])} (run {shown_text(view['run_id'])}, call {shown_text(view['call_id'])})",
        ),
        ("Tool", f'<span class="tool">{shown_text(view["tool_name"])}</span>'),
        ("Reason", f'<span class="text">{_long_text(view["reason"], "a reason")}</span>'),
        ("Digest", f"<code>{esc(view['payload_digest'])}</code>"),
        ("Quorum", _policy(view, node_id)),
        (
            node_id,
            f"{_state(view, node_id)} (this node's own decision, not the request's outcome)",
        ),
        ("Signed so far", _signed_so_far(view, node_id, fingerprint)),
        ("Created", esc(clock(view["created_at"]))),
        (
            "Time left",
            _left(view) if view["state"] == "pending" else f"expires at {esc(clock(view['expires_at']))}",
        ),
        ("Rule", _rule(view)),
    ]
    if settled is not None:
        rows.append(
            (
                "Settled",
                f"{esc(settled['outcome'])} at {esc(view['origin'])} by "
                f"{esc(', '.join(settled['decided_by']))} (its evidence verified here)",
            )
        )
    table = "".join(f"<dt>{esc(name)}</dt><dd>{value}</dd>" for name, value in rows)
    actionable = view["state"] == "pending" and view["expires_at"] > time.time()
    return (
        f'<h1><span class="tool">{shown_text(view["tool_name"])}</span> from {esc(view["origin"])}</h1>'
        f'<dl class="request">{table}</dl>'
        '<section aria-labelledby="arguments-h"><h2 id="arguments-h">Arguments</h2>'
        f'<pre class="json" id="arguments">{json_html(view["arguments"])}</pre>'
        + (f'<ul class="notes">{notes}</ul>' if notes else "")
        + "</section>"
        + _signed_section(view, record, node_id, fingerprint)
        + (_decide_forms(view, session, node_id, fingerprint) if actionable else "")
    )


def decided_notice(outcome: Mapping[str, Any], node_key: str) -> str:
    verb = outcome["this_node"]
    forwarded = (
        f"Forwarded to {outcome['origin']} through this node's relay."
        if outcome["forwarded"]
        else f"Not forwarded to {outcome['origin']} yet: the approver sends it again until the relay "
        "takes it."
    )
    who = signed_by(outcome["by"], outcome["key_fingerprint"], node_key)
    return notice_html(
        f"Done: this node {verb} request {outcome['request_id']} of {outcome['origin']}, signed {who}. "
        f"{forwarded} {outcome['note']}",
        "done",
    )
