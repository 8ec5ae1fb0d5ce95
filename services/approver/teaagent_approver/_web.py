"""The operators' web inbox: the approver's own pages under ``/web`` (``teaagent approvals web``).

The pages show what ``teaagent approvals`` shows and decide what it decides, through the very route
functions of the HTTP API (:mod:`teaagent_approver._routes`): everything shown, matched and signed
comes from the request whose origin signature verified here (``Engine.receive``), never from what
the relay says beside it; a decision carries the tool and digest the operator was shown, and the
approver signs nothing for a request that differs (409 ``changed``).

Safety:

- Signing in takes the node's token, or a one-time link (``POST /web/links`` with the token, which
  ``teaagent approvals web`` prints); it gives an HttpOnly, SameSite=Strict session cookie (Secure
  over HTTPS) that lasts ``web_session_seconds``. Sessions live in this process: a restart signs
  everybody out.
- Every form that changes something carries the session's CSRF token, and a POST whose ``Origin``
  is another site's is refused.
- Every page is sent with a strict Content-Security-Policy (scripts and styles from this approver
  only, no inline script, ``frame-ancestors 'none'``); every value of a request is HTML-escaped
  and its invisible characters shown escaped (``\\u202e``), long values folded, never cut.
- The inbox is live: ``/web/events`` is a server-sent event stream that sends a card when a request
  arrives or changes (woken by the relay's inbox stream, by a decision here, or every few seconds
  for decisions made elsewhere), and says when the relay or Redis stopped answering.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teaagent._display import LONG_VALUE_CHARS, long_values, visible
from teaagent._words import moment, plural
from teaagent.approver_client import signed_by
from teaagent.errors import SignatureError, StoreError
from teaagent.quorum import APPROVAL_NAMESPACE, DENIAL_NAMESPACE, shown_policy, statement_bytes
from teaagent.service import require_token
from teaagent.signing import signature_to_wire
from teaagent_approver._engine import Engine
from teaagent_approver._errors import ApiError
from teaagent_approver._models import MAX_REASON_CHARS, ApproveIn, DecisionIn, DenyIn
from teaagent_approver._routes import (
    MAX_LISTED,
    _check_expected,
    _engine,
    _find,
    approve,
    deny,
    get_request,
    get_statement,
    list_requests,
    submit_decision,
)
from teaagent_approver._settings import MAX_BODY_BYTES

__all__ = ["COOKIE", "CSP", "LINK_SECONDS", "WebState", "install_web"]

COOKIE: Final = "teaagent_web"
LINK_SECONDS: Final = 300  # a one-time sign-in link of `teaagent approvals web`
MAX_SESSIONS: Final = 256  # the oldest are dropped beyond it
MAX_LINKS: Final = 32
REFRESH_SECONDS: Final = 2.0  # the event stream looks again at least this often (decisions made elsewhere)
PING_SECONDS: Final = 15.0  # an idle event stream sends a comment this often
FOLD_CHARS: Final = LONG_VALUE_CHARS  # longer strings are folded (<details>), never cut
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS: Final = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make a form's Origin "null"
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)
_ORIGIN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_REQUEST_ID = re.compile(r"^[0-9a-f]{32}$")
_STATIC: Final = {"web.css": "text/css; charset=utf-8", "web.js": "text/javascript; charset=utf-8"}


# -- sessions -------------------------------------------------------------------------------------


@dataclass
class Session:
    """One browser's sign-in: its CSRF token and when it ends (Unix seconds)."""

    csrf: str
    expires_at: float


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class WebState:
    """The web inbox's state in this process: sessions, one-time links, and a wake-up for the streams."""

    def __init__(self, session_seconds: float) -> None:
        self.session_seconds = session_seconds
        self._sessions: dict[str, Session] = {}  # sha256 of the cookie -> session
        self._links: dict[str, float] = {}  # sha256 of the code -> when it stops working
        self._changed = asyncio.Event()

    def open_session(self) -> tuple[str, Session]:
        """A new session: the cookie's value (kept nowhere here) and the session."""
        now = time.time()
        for key in [key for key, session in self._sessions.items() if session.expires_at <= now]:
            del self._sessions[key]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        cookie = secrets.token_urlsafe(32)
        session = Session(csrf=secrets.token_urlsafe(32), expires_at=now + self.session_seconds)
        self._sessions[_digest(cookie)] = session
        return cookie, session

    def session(self, cookie: str | None) -> Session | None:
        """The live session of this cookie, or None (none, unknown, or ended)."""
        if not cookie:
            return None
        session = self._sessions.get(_digest(cookie))
        if session is None:
            return None
        if session.expires_at <= time.time():
            self._sessions.pop(_digest(cookie), None)
            return None
        return session

    def close_session(self, cookie: str | None) -> None:
        if cookie:
            self._sessions.pop(_digest(cookie), None)

    def new_link(self) -> str:
        """A one-time sign-in code, good for :data:`LINK_SECONDS`."""
        now = time.time()
        for key in [key for key, until in self._links.items() if until <= now]:
            del self._links[key]
        while len(self._links) >= MAX_LINKS:
            del self._links[next(iter(self._links))]
        code = secrets.token_urlsafe(32)
        self._links[_digest(code)] = now + LINK_SECONDS
        return code

    def use_link(self, code: str) -> bool:
        """Whether ``code`` is a live one-time code; it never works again either way."""
        until = self._links.pop(_digest(code), None)
        return until is not None and until > time.time()

    def changed(self) -> None:
        """Wake every event stream: something was decided here."""
        self._changed.set()
        self._changed = asyncio.Event()

    def waiter(self) -> asyncio.Event:
        return self._changed


def _web(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


class _SignIn(Exception):
    """No live session: the page sends the browser to the sign-in page."""

    def __init__(self, expired: bool) -> None:
        super().__init__("sign in")
        self.expired = expired


def _signed_in(request: Request) -> Session:
    cookie = request.cookies.get(COOKIE)
    session = _web(request).session(cookie)
    if session is None:
        raise _SignIn(expired=cookie is not None)
    return session


SignedIn = Annotated[Session, Depends(_signed_in)]


def _same_site(request: Request) -> bool:
    """Whether a POST comes from this approver's own pages (its Origin, or Sec-Fetch-Site, says so)."""
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


class _Refused(Exception):
    """A decision form refused before anything was done: status and sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _form(request: Request, session: Session) -> Mapping[str, Any]:
    """The posted form, once its origin and CSRF token are this session's.

    Raises:
        _Refused: 403 for another site's form or a CSRF token that is not this session's.
    """
    if not _same_site(request):
        raise _Refused(403, "This form was sent from another site; nothing was done.")
    form = await request.form()
    given = form.get("csrf")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), session.csrf.encode()):
        raise _Refused(
            403,
            "This form does not carry this session's CSRF token (a stale page, or a form from elsewhere); "
            "nothing was done. Reload the page and try again.",
        )
    return form


def _text(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


# -- rendering ------------------------------------------------------------------------------------


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _shown(text: str, *, newlines: bool = False) -> str:
    """Hostile text as HTML: invisible characters escaped, then HTML-escaped."""
    return _e(visible(text, newlines=newlines))


def _clock(when: float) -> str:
    """The date alone (``2026-12-06 01:02:03Z``): a page's relative part would go stale."""
    return moment(when).split(",")[0]


def _folded(encoded: str, length: int, what: str) -> str:
    """A long text (already made visible) as its first characters and the rest in a <details>."""
    if len(encoded) <= FOLD_CHARS:
        return _e(encoded)
    return (
        f'{_e(encoded[:FOLD_CHARS])}<details class="fold"><summary>{_e(what)} of {length:,} characters: '
        f"{len(encoded) - FOLD_CHARS:,} more folded here, show them</summary>"
        f'<span class="rest">{_e(encoded[FOLD_CHARS:])}</span></details>'
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
    return f'<span class="n">{_e(json.dumps(value))}</span>'


def _long_text(text: str, what: str) -> str:
    return _folded(visible(text, newlines=True), len(text), what)


def _left(view: Mapping[str, Any]) -> str:
    expires = int(view["expires_at"])
    return (
        f'<span class="left" data-expires="{expires}">expires at <time datetime="'
        f'{time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))}">{_e(_clock(expires))}</time></span>'
    )


def _policy(view: Mapping[str, Any], node_id: str) -> str:
    # The view's "request" is the document of the request whose signature verified here.
    shown = shown_policy(view["request"], node_id)
    if shown is not None:  # version 2: the rule, its terms, the term this node counts toward
        terms = "".join(f"<li>{_e(name)}: {_e(term)}</li>" for name, term in shown.numbered)
        return f'{_e(shown.heading)}<ul class="terms">{terms}</ul>{_e(shown.counts)}'
    peers = ", ".join(view["peers"])
    needed = plural(int(view["required_approvals"]), "approval")
    return f"{needed} needed from {_e(peers)}, counted by {_e(view['origin'])}"


def _rule(view: Mapping[str, Any]) -> str:
    rule = view.get("rule")
    if rule is None:
        return "none matches: it waits for an operator"
    patterns = "".join(f" {name}={pattern!r}" for name, pattern in sorted(rule["arguments"].items()))
    return _e(f"#{rule['index']} tool={rule['tool']!r}{patterns} -> {rule['decision']}")


def _signed_so_far(view: Mapping[str, Any], node_id: str, node_key: str | None) -> str:
    """Who has signed, as this approver knows it: this node's own decision, and the verified outcome."""
    parts = []
    decision = view.get("decision")
    if decision is not None:
        verb = "approved" if decision["kind"] == "approval" else "denied"
        who = signed_by(decision["by"], decision["key_fingerprint"], node_key)
        parts.append(f"{_e(node_id)} {verb}, signed {_e(who)}")
    settled = view.get("settled")
    if settled is not None:
        parts.append(
            f"{_e(settled['outcome'])} at {_e(view['origin'])} by {_e(', '.join(settled['decided_by']))} "
            "(its evidence verified here)"
        )
    if not parts:
        return (
            f"none known here yet (the other peers' decisions go to {_e(view['origin'])}, which counts them)"
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
    return f'<span class="badge badge-{_e(state)}">{_e(words.get(state, state))}</span>'


def _request_path(view: Mapping[str, Any]) -> str:
    return f"/web/requests/{view['origin']}/{view['request_id']}"


def card_html(view: Mapping[str, Any], node_id: str, node_key: str | None) -> str:
    """One request of the inbox: everything but the decision forms (those are on its own page)."""
    key = f"{view['origin']}/{view['request_id']}"
    heading = f"card-{view['origin']}-{view['request_id']}"
    return (
        f'<article class="card state-{_e(view["state"])}" data-key="{_e(key)}" '
        f'aria-labelledby="{_e(heading)}">'
        f'<h3 id="{_e(heading)}"><a href="{_e(_request_path(view))}"><span class="tool">'
        f"{_shown(view['tool_name'])}</span> from {_e(view['origin'])}</a></h3>"
        f'<p class="meta">{_state(view, node_id)} {_left(view) if view["state"] == "pending" else ""}</p>'
        "<dl>"
        f"<dt>Request</dt><dd><code>{_e(view['request_id'])}</code></dd>"
        f"<dt>Origin</dt><dd>{_e(view['origin'])} (run {_shown(view['run_id'])}, "
        f"call {_shown(view['call_id'])})</dd>"
        f'<dt>Reason</dt><dd class="text">{_long_text(view["reason"], "a reason")}</dd>'
        f"<dt>Digest</dt><dd><code>{_e(view['payload_digest'])}</code></dd>"
        f"<dt>Policy</dt><dd>{_policy(view, node_id)}</dd>"
        f"<dt>Signed so far</dt><dd>{_signed_so_far(view, node_id, node_key)}</dd>"
        "</dl>"
        f'<details class="arguments" open><summary>Arguments</summary><pre class="json">'
        f"{json_html(view['arguments'])}</pre></details>"
        + (
            f'<p><a class="button" href="{_e(_request_path(view))}">Review and decide</a></p>'
            if view["state"] == "pending"
            else ""
        )
        + "</article>"
    )


def _version(card: str) -> str:
    return hashlib.sha256(card.encode()).hexdigest()[:16]


def _layout(
    title: str, main: str, *, node_id: str, session: Session | None, page: str, notice: str = ""
) -> str:
    signed = (
        '<form method="post" action="/web/logout" class="signout">'
        f'<input type="hidden" name="csrf" value="{_e(session.csrf)}">'
        '<button type="submit">Sign out</button></form>'
        if session is not None
        else ""
    )
    nav = f'<nav aria-label="Main"><a href="/web/">Inbox</a>{signed}</nav>' if session is not None else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} · {_e(node_id)} · teaagent</title>"
        '<link rel="stylesheet" href="/web/static/web.css">'
        '<script src="/web/static/web.js" defer></script></head>'
        f'<body data-page="{_e(page)}" data-server-now="{int(time.time())}">'
        '<a class="skip" href="#main">Skip to the content</a>'
        f'<header><p class="brand">teaagent · approver of <strong>{_e(node_id)}</strong></p>{nav}</header>'
        '<div id="status" class="status" role="status" aria-live="polite" hidden></div>'
        f'<main id="main" tabindex="-1">{notice}{main}</main></body></html>'
    )


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers={"Cache-Control": "no-store"})


def _notice(message: str, kind: Literal["error", "done"]) -> str:
    role = "alert" if kind == "error" else "status"
    return f'<div class="notice notice-{kind}" role="{role}" tabindex="-1" id="notice">{_e(message)}</div>'


# -- the inbox ----------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """The inbox as the approver sees it now, or why it cannot tell (its relay or Redis)."""

    views: list[dict[str, Any]]
    problem: str | None


async def _snapshot(request: Request, engine: Engine) -> Snapshot:
    """The requests this node received, verified, pending first (the route of ``GET /v1/requests``)."""
    try:
        listed = await list_requests(
            request, engine, None, state="all", origin=None, tool=None, limit=MAX_LISTED, wait=0.0
        )
    except ApiError as exc:
        return Snapshot([], f"This approver lost its relay: {exc.message}")
    except StoreError as exc:
        return Snapshot([], f"This approver lost its Redis: {exc}")
    return Snapshot(listed["items"], None)


def _problem_banner(problem: str | None) -> str:
    if problem is None:
        return ""
    return (
        f'<div class="notice notice-error" role="alert">{_e(problem)} The page updates when it answers.</div>'
    )


def _inbox_main(snapshot: Snapshot, node_id: str, node_key: str | None) -> str:
    pending = [view for view in snapshot.views if view["state"] == "pending"]
    others = [view for view in snapshot.views if view["state"] != "pending"]

    def cards(views: list[dict[str, Any]]) -> str:
        return "".join(card_html(view, node_id, node_key) for view in views)

    return (
        f"<h1>Requests for {_e(node_id)}</h1>"
        f'<p class="lede">Peers ask {_e(node_id)} to approve these tool calls. Each decision here is '
        f"{_e(node_id)}'s own; the request's origin counts the outcome from every peer's.</p>"
        f'<div id="problem">{_problem_banner(snapshot.problem)}</div>'
        '<section aria-labelledby="pending-h"><h2 id="pending-h">Waiting for a decision '
        f'<span class="count" id="pending-count">({len(pending)})</span></h2>'
        f'<div id="pending" class="cards">{cards(pending)}</div>'
        f'<p class="empty" id="pending-empty"{" hidden" if pending else ""}>Nothing waits for '
        f"{_e(node_id)}.</p></section>"
        '<section aria-labelledby="settled-h"><h2 id="settled-h">Settled</h2>'
        f'<div id="settled" class="cards">{cards(others)}</div>'
        f'<p class="empty" id="settled-empty"{" hidden" if others else ""}>None yet.</p></section>'
    )


async def _events(request: Request, engine: Engine, web: WebState, session: Session) -> AsyncIterator[str]:
    """The inbox's event stream: ``inbox`` events (the order, and each card not sent yet), ``expired``."""
    node_id = engine.agent_id
    sent: set[str] = set()
    last: tuple[Any, ...] | None = None
    quiet_since = time.monotonic()
    stopping: asyncio.Event = getattr(request.app.state, "stopping", None) or asyncio.Event()
    while not stopping.is_set():  # set on SIGTERM: an open inbox never holds the approver up
        left = session.expires_at - time.time()
        if left <= 0:
            yield "event: expired\ndata: {}\n\n"
            return
        wake = web.waiter()
        try:
            last_id = await engine._stream_last_id()
        except StoreError:
            last_id = None
        snapshot = await _snapshot(request, engine)
        cards: dict[str, str] = {}
        order: dict[str, list[list[str]]] = {"pending": [], "settled": []}
        if snapshot.problem is None:
            for view in snapshot.views:
                card = card_html(view, node_id, engine.fingerprint)
                version = _version(card)
                key = f"{view['origin']}/{view['request_id']}"
                order["pending" if view["state"] == "pending" else "settled"].append([key, version])
                if version not in sent:
                    cards[version] = card
        now_state = (snapshot.problem, json.dumps(order))
        if now_state != last or cards:
            last = now_state
            sent.update(cards)
            payload = {
                "now": time.time(),
                "problem": snapshot.problem,
                "order": None if snapshot.problem is not None else order,
                "cards": cards,
            }
            yield f"event: inbox\ndata: {json.dumps(payload)}\n\n"
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= PING_SECONDS:
            yield ": still here\n\n"
            quiet_since = time.monotonic()
        await _wait_for_change(engine, (wake, stopping), last_id, min(REFRESH_SECONDS, max(0.05, left)))


async def _wait_for_change(
    engine: Engine, events: tuple[asyncio.Event, ...], last_id: Any, seconds: float
) -> None:
    """Until the relay queues a request for this node, one of ``events`` is set (a decision made here,
    the service stopping), or ``seconds`` pass."""
    waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(event.wait()) for event in events]
    if last_id is not None:
        waits.append(asyncio.ensure_future(engine._wait_for_news(last_id, seconds)))
    try:
        deadline = time.monotonic() + seconds
        pending = set(waits)
        while pending and (remaining := deadline - time.monotonic()) > 0:
            done, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if any(not task.cancelled() and task.exception() is None for task in done):
                return  # woken; a failed news wait (Redis) leaves the others to run out the time
    finally:
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


# -- one request ----------------------------------------------------------------------------------


def _ref(origin: str, request_id: str) -> tuple[str, str]:
    if not _ORIGIN_ID.match(origin) or not _REQUEST_ID.match(request_id):
        raise ApiError(
            404, "not_found", "There is no such request: an origin and a 32-character id name one."
        )
    return origin, request_id


def _hidden(**fields: str) -> str:
    return "".join(
        f'<input type="hidden" name="{_e(name)}" value="{_e(value)}">' for name, value in fields.items()
    )


def _confirmed(view: Mapping[str, Any], session: Session) -> str:
    return _hidden(
        csrf=session.csrf,
        expect_tool_name=str(view["tool_name"]),
        expect_payload_digest=str(view["payload_digest"]),
    )


def _decide_forms(view: Mapping[str, Any], session: Session, node_id: str, fingerprint: str) -> str:
    path = _e(_request_path(view))
    origin = _e(view["origin"])
    return (
        '<section class="decide" aria-labelledby="decide-h">'
        f'<h2 id="decide-h">Decide as {_e(node_id)}</h2>'
        f"<p>Signed with the node key <code>{_e(fingerprint)}</code> by this approver, which records the "
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
        f"<p>An operator's key listed in {_e(node_id)}'s <code>[approver] operators</code> signs the "
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
    reason = f" Reason: {_shown(decision['reason'])}." if decision["reason"] else ""
    return (
        '<section class="signed" aria-labelledby="signed-h">'
        f'<h2 id="signed-h">What {_e(node_id)} signed</h2>'
        f'<p id="signed-by">{_e(node_id)} {verb} this request, signed '
        f"{_e(signed_by(decision['by'], decision['key_fingerprint'], node_key))} "
        f"at {_e(_clock(decision['at']))}.{reason}</p>"
        f"{body}</section>"
    )


def _request_main(
    view: Mapping[str, Any], record: Any, node_id: str, session: Session, fingerprint: str
) -> str:
    notes = "".join(
        f"<li>{_shown(path)} is {length:,} characters long: folded above, open it to read it whole.</li>"
        for path, length in long_values(view["arguments"])
    )
    settled = view.get("settled")
    rows = [
        ("Request", f"<code>{_e(view['request_id'])}</code>"),
        ("Origin", f"{_e(view['origin'])} (run {_shown(view['run_id'])}, call {_shown(view['call_id'])})"),
        ("Tool", f'<span class="tool">{_shown(view["tool_name"])}</span>'),
        ("Reason", f'<span class="text">{_long_text(view["reason"], "a reason")}</span>'),
        ("Digest", f"<code>{_e(view['payload_digest'])}</code>"),
        ("Quorum", _policy(view, node_id)),
        (
            node_id,
            f"{_state(view, node_id)} (this node's own decision, not the request's outcome)",
        ),
        ("Signed so far", _signed_so_far(view, node_id, fingerprint)),
        ("Created", _e(_clock(view["created_at"]))),
        (
            "Time left",
            _left(view) if view["state"] == "pending" else f"expires at {_e(_clock(view['expires_at']))}",
        ),
        ("Rule", _rule(view)),
    ]
    if settled is not None:
        rows.append(
            (
                "Settled",
                f"{_e(settled['outcome'])} at {_e(view['origin'])} by "
                f"{_e(', '.join(settled['decided_by']))} (its evidence verified here)",
            )
        )
    table = "".join(f"<dt>{_e(name)}</dt><dd>{value}</dd>" for name, value in rows)
    actionable = view["state"] == "pending" and view["expires_at"] > time.time()
    return (
        f'<h1><span class="tool">{_shown(view["tool_name"])}</span> from {_e(view["origin"])}</h1>'
        f'<dl class="request">{table}</dl>'
        '<section aria-labelledby="arguments-h"><h2 id="arguments-h">Arguments</h2>'
        f'<pre class="json" id="arguments">{json_html(view["arguments"])}</pre>'
        + (f'<ul class="notes">{notes}</ul>' if notes else "")
        + "</section>"
        + _signed_section(view, record, node_id, fingerprint)
        + (_decide_forms(view, session, node_id, fingerprint) if actionable else "")
    )


async def _request_page(
    request: Request,
    engine: Engine,
    session: Session,
    origin: str,
    request_id: str,
    *,
    notice: str = "",
    status: int = 200,
) -> HTMLResponse:
    node_id = engine.agent_id
    view = await get_request(request_id, engine, None, origin)
    [(record, _signature)] = await engine.ledger.read([(origin, request_id)])
    main = _request_main(view, record, node_id, session, engine.fingerprint)
    return _html(
        _layout(
            f"Request {request_id[:8]}", main, node_id=node_id, session=session, page="request", notice=notice
        ),
        status,
    )


def _error_page(request: Request, session: Session | None, status: int, message: str) -> HTMLResponse:
    config = request.app.state.config
    main = f'<h1>Nothing was done</h1>{_notice(message, "error")}<p><a href="/web/">Back to the inbox</a></p>'
    return _html(_layout("Refused", main, node_id=config.agent_id, session=session, page="error"), status)


def _decided_notice(outcome: Mapping[str, Any], node_key: str) -> str:
    verb = outcome["this_node"]
    forwarded = (
        f"Forwarded to {outcome['origin']} through this node's relay."
        if outcome["forwarded"]
        else f"Not forwarded to {outcome['origin']} yet: the approver sends it again until the relay "
        "takes it."
    )
    who = signed_by(outcome["by"], outcome["key_fingerprint"], node_key)
    return _notice(
        f"Done: this node {verb} request {outcome['request_id']} of {outcome['origin']}, signed {who}. "
        f"{forwarded} {outcome['note']}",
        "done",
    )


# -- routes ---------------------------------------------------------------------------------------

router = APIRouter(prefix="/web", include_in_schema=False)


@router.get("")
async def web_root() -> Response:
    return RedirectResponse("/web/", status_code=303)


@router.get("/")
async def inbox(request: Request, session: SignedIn) -> Response:
    engine = await _engine(request)
    snapshot = await _snapshot(request, engine)
    page = _layout(
        "Inbox",
        _inbox_main(snapshot, engine.agent_id, engine.fingerprint),
        node_id=engine.agent_id,
        session=session,
        page="inbox",
    )
    return _html(page)


@router.get("/events")
async def events(request: Request) -> Response:
    session = _web(request).session(request.cookies.get(COOKIE))
    if session is None:
        return Response("Sign in first.", status_code=401, media_type="text/plain")
    engine = await _engine(request)
    return StreamingResponse(
        _events(request, engine, _web(request), session),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _login_page(request: Request, message: str = "", status: int = 200) -> HTMLResponse:
    node_id = request.app.state.config.agent_id
    notice = _notice(message, "error") if message else ""
    main = (
        f"<h1>Sign in to {_e(node_id)}'s approver</h1>"
        "<p>Paste the node's token (<code>token</code> in node.toml, or <code>data_dir/token</code>), "
        "or open "
        "the one-time link <code>teaagent approvals web</code> prints.</p>"
        '<form method="post" action="/web/login" id="login">'
        '<label for="token">Node token</label>'
        '<input type="password" id="token" name="token" autocomplete="off" spellcheck="false">'
        '<input type="hidden" id="code" name="code" value="">'
        '<button type="submit">Sign in</button></form>'
    )
    return _html(_layout("Sign in", main, node_id=node_id, session=None, page="login", notice=notice), status)


@router.get("/login")
async def login_form(request: Request, expired: int = 0) -> Response:
    if _web(request).session(request.cookies.get(COOKIE)) is not None:
        return RedirectResponse("/web/", status_code=303)
    return _login_page(request, "Your session expired; sign in again." if expired else "")


@router.post("/login")
async def login(request: Request) -> Response:
    if not _same_site(request):
        return _login_page(request, "This sign-in form was sent from another site; sign in here.", 403)
    form = await request.form()
    token, code = _text(form, "token"), _text(form, "code")
    web = _web(request)
    node_token: str = request.app.state.token
    ok = (code and web.use_link(code)) or (
        token and hmac.compare_digest(token.strip().encode(), node_token.encode())
    )
    if not ok:
        message = (
            "That sign-in link was used already or expired; run teaagent approvals web again."
            if code
            else "That is not this node's token."
        )
        return _login_page(request, message, 401)
    cookie, _session = web.open_session()
    response = RedirectResponse("/web/", status_code=303)
    # A browser-session cookie: this approver ends the session (web_session_seconds) and says so.
    response.set_cookie(
        COOKIE,
        cookie,
        path="/web",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout(request: Request, session: SignedIn) -> Response:
    try:
        await _form(request, session)
    except _Refused as refused:
        return _error_page(request, session, refused.status, refused.message)
    _web(request).close_session(request.cookies.get(COOKIE))
    response = RedirectResponse("/web/login", status_code=303)
    response.delete_cookie(COOKIE, path="/web", httponly=True, samesite="strict")
    return response


@router.post("/links", dependencies=[Depends(require_token)])
async def new_link(request: Request) -> Any:
    """A one-time sign-in link (the node's bearer token): ``teaagent approvals web`` prints it."""
    code = _web(request).new_link()
    return {"path": f"/web/login#code={code}", "expires_in": LINK_SECONDS}


@router.get("/requests/{origin}/{request_id}")
async def request_page(request: Request, origin: str, request_id: str, session: SignedIn) -> Response:
    try:
        _ref(origin, request_id)
        engine = await _engine(request)
        return await _request_page(request, engine, session, origin, request_id)
    except ApiError as exc:
        return _error_page(request, session, exc.status_code, exc.message)
    except StoreError as exc:
        return _error_page(request, session, 503, f"This approver lost its Redis: {exc}")


async def _decide(
    request: Request, session: Session, origin: str, request_id: str, kind: Literal["approval", "denial"]
) -> Response:
    try:
        _ref(origin, request_id)
        form = await _form(request, session)
        engine = await _engine(request)
        reason = _text(form, "reason")
        fields: dict[str, Any] = {
            "reason": reason,
            "origin": origin,
            "expect_tool_name": _text(form, "expect_tool_name") or None,
            "expect_payload_digest": _text(form, "expect_payload_digest") or None,
        }
        try:
            if kind == "approval":
                outcome = await approve(request_id, ApproveIn(**fields), engine, None)
            else:
                if not reason.strip():
                    raise _Refused(
                        422, "A denial needs a reason for the origin's operators; nothing was signed."
                    )
                outcome = await deny(request_id, DenyIn(**fields), engine, None)
        except ValidationError as exc:
            raise _Refused(
                422, f"The form is not a decision: {exc.errors()[0]['msg']}; nothing was signed."
            ) from exc
        _web(request).changed()
        return await _request_page(
            request, engine, session, origin, request_id, notice=_decided_notice(outcome, engine.fingerprint)
        )
    except (_Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)


def _refusal_page(request: Request, session: Session, exc: _Refused | ApiError | StoreError) -> Response:
    """The page of a refusal: this page's own, the approver's (its ErrorOut), or a lost Redis."""
    if isinstance(exc, _Refused):
        return _error_page(request, session, exc.status, exc.message)
    if isinstance(exc, ApiError):
        return _error_page(request, session, exc.status_code, exc.message)
    return _error_page(request, session, 503, f"This approver lost its Redis: {exc}")


@router.post("/requests/{origin}/{request_id}/approve")
async def approve_form(request: Request, origin: str, request_id: str, session: SignedIn) -> Response:
    return await _decide(request, session, origin, request_id, "approval")


@router.post("/requests/{origin}/{request_id}/deny")
async def deny_form(request: Request, origin: str, request_id: str, session: SignedIn) -> Response:
    return await _decide(request, session, origin, request_id, "denial")


def _kind(text: str) -> Literal["approval", "denial"]:
    if text not in ("approval", "denial"):
        raise _Refused(422, "The decision to sign is an approval or a denial.")
    return "approval" if text == "approval" else "denial"


def _statement_name(kind: str, request_id: str) -> str:
    return f"teaagent-{kind}-{request_id[:12]}.json"


async def _rebuilt(
    engine: Engine,
    origin: str,
    request_id: str,
    kind: Literal["approval", "denial"],
    reason: str,
    at: str,
    tool_name: str | None,
    payload_digest: str | None,
) -> dict[str, Any]:
    """The statement offered for signing at ``at``, rebuilt from the verified request."""
    if not at.isdigit():
        raise _Refused(422, "The statement's time is not a Unix time; prepare the statement again.")
    item = await _find(engine, request_id, origin)
    _check_expected(item, tool_name, payload_digest)
    try:
        return engine.statement_for(item.request, kind, reason if kind == "denial" else "", int(at))
    except ValueError as exc:
        raise _Refused(422, f"The statement cannot be built: {exc}") from exc


@router.get("/requests/{origin}/{request_id}/own-key")
async def own_key_page(
    request: Request,
    origin: str,
    request_id: str,
    session: SignedIn,
    kind: str = "approval",
    reason: str = "",
    at: str = "",
) -> Response:
    """The statement to sign, its ``ssh-keygen`` line and the upload form.

    The statement is dated once (``at``, added to the address by a redirect): going back to the
    page, or reloading it, shows the very statement that was downloaded and signed.
    """
    try:
        _ref(origin, request_id)
        decision = _kind(kind)
        if decision == "denial" and not reason.strip():
            raise _Refused(
                422, "A denial needs a reason for the origin's operators; write one and try again."
            )
        if len(reason) > MAX_REASON_CHARS:
            raise _Refused(422, f"The reason is longer than {MAX_REASON_CHARS} characters.")
        engine = await _engine(request)
        view = await get_request(request_id, engine, None, origin)
        to_sign = await get_statement(
            request_id,
            engine,
            None,
            kind=decision,
            reason=reason if decision == "denial" else "",
            origin=origin,
            expect_tool_name=view["tool_name"],
            expect_payload_digest=view["payload_digest"],
        )
        signed_reason = reason if decision == "denial" else ""
        query = f"kind={decision}&reason=" + _url_quote(signed_reason)
        path = _request_path(view)
        if not at:
            dated = f"{path}/own-key?{query}&at={to_sign['statement']['signed_at']}"
            return RedirectResponse(dated, status_code=303)
        statement = await _rebuilt(
            engine, origin, request_id, decision, signed_reason, at, view["tool_name"], view["payload_digest"]
        )
    except (_Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)
    query = f"{query}&at={at}"
    name = _statement_name(decision, request_id)
    namespace = APPROVAL_NAMESPACE if decision == "approval" else DENIAL_NAMESPACE
    line = f"ssh-keygen -Y sign -n {namespace} -f ~/.ssh/id_ed25519 {name}"
    fields = _hidden(
        csrf=session.csrf,
        kind=decision,
        reason=reason if decision == "denial" else "",
        at=at,
        expect_tool_name=str(view["tool_name"]),
        expect_payload_digest=str(view["payload_digest"]),
    )
    main = (
        f"<h1>Sign the {decision} of request <code>{_e(request_id[:12])}</code> with your own key</h1>"
        f"<p>{_shown(view['tool_name'])} from {_e(origin)}; "
        f"digest <code>{_e(view['payload_digest'])}</code>. "
        f'<a href="{_e(path)}">Back to the request</a></p>'
        '<ol class="steps">'
        f'<li><p>Download the statement: <a id="statement-link" download="{_e(name)}" '
        f'href="{_e(path)}/statement?{_e(query)}">{_e(name)}</a>. It is exactly these bytes '
        "(no trailing newline):</p>"
        f'<pre class="json" id="statement">{_e(visible(statement_bytes(statement).decode()))}</pre></li>'
        "<li><p>Sign it in the folder you downloaded it to, with your key in place of "
        "<code>~/.ssh/id_ed25519</code>:</p>"
        f'<pre class="line"><code id="sign-line">{_e(line)}</code></pre></li>'
        f"<li><p>Upload the signature it wrote, <code>{_e(name)}.sig</code>:</p>"
        f'<form method="post" action="{_e(path)}/own-key" enctype="multipart/form-data">{fields}'
        '<label for="signature">Signature file (.sig)</label>'
        '<input type="file" id="signature" name="signature" accept=".sig" required>'
        f'<button type="submit">Submit the signed {decision}</button></form></li></ol>'
        f"<p>The request expires at {_e(_clock(view['expires_at']))}; the statement must be signed "
        "before.</p>"
    )
    return _html(
        _layout("Sign with your key", main, node_id=engine.agent_id, session=session, page="own-key")
    )


def _url_quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


@router.get("/requests/{origin}/{request_id}/statement")
async def statement_file(
    request: Request,
    origin: str,
    request_id: str,
    session: SignedIn,
    kind: str = "approval",
    reason: str = "",
    at: str = "",
) -> Response:
    try:
        _ref(origin, request_id)
        decision = _kind(kind)
        engine = await _engine(request)
        statement = await _rebuilt(engine, origin, request_id, decision, reason, at, None, None)
    except (_Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)
    return Response(
        statement_bytes(statement),
        media_type="application/json",
        headers={
            "Content-Disposition": f'attachment; filename="{_statement_name(decision, request_id)}"',
            "Cache-Control": "no-store",
        },
    )


@router.post("/requests/{origin}/{request_id}/own-key")
async def own_key_submit(request: Request, origin: str, request_id: str, session: SignedIn) -> Response:
    """The uploaded ``.sig`` of the statement offered, checked as ``teaagent approvals submit`` has it."""
    try:
        _ref(origin, request_id)
        form = await _form(request, session)
        decision = _kind(_text(form, "kind"))
        upload = form.get("signature")
        if not isinstance(upload, UploadFile):
            raise _Refused(422, "Choose the signature file (.sig) that ssh-keygen wrote.")
        raw = await upload.read(MAX_BODY_BYTES + 1)
        try:
            signature = signature_to_wire(raw.decode("ascii"))
        except (UnicodeDecodeError, SignatureError) as exc:
            detail = "it is not ASCII" if isinstance(exc, UnicodeDecodeError) else str(exc).rstrip(".")
            raise _Refused(
                422, f"The file {upload.filename or ''} is not an SSH signature: {detail}."
            ) from exc
        engine = await _engine(request)
        tool_name = _text(form, "expect_tool_name") or None
        digest = _text(form, "expect_payload_digest") or None
        statement = await _rebuilt(
            engine, origin, request_id, decision, _text(form, "reason"), _text(form, "at"), tool_name, digest
        )
        body = DecisionIn(
            statement=statement, signature=signature, expect_tool_name=tool_name, expect_payload_digest=digest
        )
        outcome = await submit_decision(request_id, body, engine, None)
        _web(request).changed()
        return await _request_page(
            request, engine, session, origin, request_id, notice=_decided_notice(outcome, engine.fingerprint)
        )
    except ValidationError as exc:
        return _error_page(request, session, 422, f"The form is not a decision: {exc.errors()[0]['msg']}.")
    except (_Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)


@router.get("/static/{name}")
async def static(name: str) -> Response:
    media = _STATIC.get(name)
    if media is None:
        return Response("Not found.", status_code=404, media_type="text/plain")
    data = resources.files("teaagent_approver").joinpath("static", name).read_bytes()
    return Response(data, media_type=media, headers={"Cache-Control": "no-cache"})


# -- wiring -----------------------------------------------------------------------------------------


class WebHeadersMiddleware:
    """The web inbox's security headers on every ``/web`` answer (pages, files, streams, refusals)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/web"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


def install_web(app: FastAPI, session_seconds: float) -> None:
    """Serve the operators' web inbox under ``/web`` on the approver's application."""
    app.state.web = WebState(session_seconds)
    app.include_router(router)

    @app.exception_handler(_SignIn)
    async def _sign_in(request: Request, exc: _SignIn) -> Response:
        if request.method == "GET":
            target = "/web/login?expired=1" if exc.expired else "/web/login"
            return RedirectResponse(target, status_code=303)
        message = "Your session expired; sign in again." if exc.expired else "Sign in first."
        return _login_page(request, f"{message} Nothing was done.", 401)

    app.add_middleware(WebHeadersMiddleware)
