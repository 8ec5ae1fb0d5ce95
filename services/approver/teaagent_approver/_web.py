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
import hmac
import json
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any, Final, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from teaagent._display import visible
from teaagent.errors import SignatureError, StoreError
from teaagent.quorum import APPROVAL_NAMESPACE, DENIAL_NAMESPACE, statement_bytes
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
from teaagent_approver._web_html import (
    Snapshot,
    card_html,
    card_version,
    clock,
    decided_notice,
    esc,
    hidden_fields,
    inbox_main,
    layout,
    notice_html,
    page_response,
    request_main,
    request_path,
    shown_text,
)
from teaagent_approver._web_session import (
    COOKIE,
    LINK_SECONDS,
    Refused,
    Session,
    SignedIn,
    SignInNeeded,
    WebState,
    checked_form,
    form_text,
    same_site,
    web_state,
)

__all__ = ["CSP", "install_web"]

REFRESH_SECONDS: Final = 2.0  # the event stream looks again at least this often (decisions made elsewhere)
PING_SECONDS: Final = 15.0  # an idle event stream sends a comment this often
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
# Matched whole (fullmatch): "$" would also match before a final newline, and that id, handed on to
# the relay, comes back without it: a typo would read as a relay that disagrees.
_ORIGIN_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")
_STATIC: Final = {"web.css": "text/css; charset=utf-8", "web.js": "text/javascript; charset=utf-8"}


# -- the inbox ----------------------------------------------------------------------------------


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
                version = card_version(card)
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
    if not _ORIGIN_ID.fullmatch(origin) or not _REQUEST_ID.fullmatch(request_id):
        raise ApiError(
            404, "not_found", "There is no such request: an origin and a 32-character id name one."
        )
    return origin, request_id


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
    main = request_main(view, record, node_id, session, engine.fingerprint)
    return page_response(
        layout(
            f"Request {request_id[:8]}", main, node_id=node_id, session=session, page="request", notice=notice
        ),
        status,
    )


def _error_page(request: Request, session: Session | None, status: int, message: str) -> HTMLResponse:
    config = request.app.state.config
    back = '<p><a href="/web/">Back to the inbox</a></p>'
    main = f"<h1>Nothing was done</h1>{notice_html(message, 'error')}{back}"
    return page_response(
        layout("Refused", main, node_id=config.agent_id, session=session, page="error"), status
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
    page = layout(
        "Inbox",
        inbox_main(snapshot, engine.agent_id, engine.fingerprint),
        node_id=engine.agent_id,
        session=session,
        page="inbox",
    )
    return page_response(page)


@router.get("/events")
async def events(request: Request) -> Response:
    session = web_state(request).session(request.cookies.get(COOKIE))
    if session is None:
        return Response("Sign in first.", status_code=401, media_type="text/plain")
    engine = await _engine(request)
    return StreamingResponse(
        _events(request, engine, web_state(request), session),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _login_page(request: Request, message: str = "", status: int = 200) -> HTMLResponse:
    node_id = request.app.state.config.agent_id
    notice = notice_html(message, "error") if message else ""
    main = (
        f"<h1>Sign in to {esc(node_id)}'s approver</h1>"
        "<p>Paste the node's token (<code>token</code> in node.toml, or <code>data_dir/token</code>), "
        "or open "
        "the one-time link <code>teaagent approvals web</code> prints.</p>"
        '<form method="post" action="/web/login" id="login">'
        '<label for="token">Node token</label>'
        '<input type="password" id="token" name="token" autocomplete="off" spellcheck="false">'
        '<input type="hidden" id="code" name="code" value="">'
        '<button type="submit">Sign in</button></form>'
    )
    return page_response(
        layout("Sign in", main, node_id=node_id, session=None, page="login", notice=notice), status
    )


@router.get("/login")
async def login_form(request: Request, expired: int = 0) -> Response:
    if web_state(request).session(request.cookies.get(COOKIE)) is not None:
        return RedirectResponse("/web/", status_code=303)
    return _login_page(request, "Your session expired; sign in again." if expired else "")


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_site(request):
        return _login_page(request, "This sign-in form was sent from another site; sign in here.", 403)
    form = await request.form()
    token, code = form_text(form, "token"), form_text(form, "code")
    web = web_state(request)
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
        await checked_form(request, session)
    except Refused as refused:
        return _error_page(request, session, refused.status, refused.message)
    web_state(request).close_session(request.cookies.get(COOKIE))
    response = RedirectResponse("/web/login", status_code=303)
    response.delete_cookie(COOKIE, path="/web", httponly=True, samesite="strict")
    return response


@router.post("/links", dependencies=[Depends(require_token)])
async def new_link(request: Request) -> Any:
    """A one-time sign-in link (the node's bearer token): ``teaagent approvals web`` prints it."""
    code = web_state(request).new_link()
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
        form = await checked_form(request, session)
        engine = await _engine(request)
        reason = form_text(form, "reason")
        fields: dict[str, Any] = {
            "reason": reason,
            "origin": origin,
            "expect_tool_name": form_text(form, "expect_tool_name") or None,
            "expect_payload_digest": form_text(form, "expect_payload_digest") or None,
        }
        try:
            if kind == "approval":
                outcome = await approve(request_id, ApproveIn(**fields), engine, None)
            else:
                if not reason.strip():
                    raise Refused(
                        422, "A denial needs a reason for the origin's operators; nothing was signed."
                    )
                outcome = await deny(request_id, DenyIn(**fields), engine, None)
        except ValidationError as exc:
            raise Refused(
                422, f"The form is not a decision: {exc.errors()[0]['msg']}; nothing was signed."
            ) from exc
        web_state(request).changed()
        return await _request_page(
            request, engine, session, origin, request_id, notice=decided_notice(outcome, engine.fingerprint)
        )
    except (Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)


def _refusal_page(request: Request, session: Session, exc: Refused | ApiError | StoreError) -> Response:
    """The page of a refusal: this page's own, the approver's (its ErrorOut), or a lost Redis."""
    if isinstance(exc, Refused):
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
        raise Refused(422, "The decision to sign is an approval or a denial.")
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
    if not (at.isascii() and at.isdigit()):  # isdigit alone takes "²", which int() refuses
        raise Refused(422, "The statement's time is not a Unix time; prepare the statement again.")
    item = await _find(engine, request_id, origin)
    _check_expected(item, tool_name, payload_digest)
    try:
        return engine.statement_for(item.request, kind, reason if kind == "denial" else "", int(at))
    except ValueError as exc:
        raise Refused(422, f"The statement cannot be built: {exc}") from exc


@dataclass(frozen=True, slots=True)
class _Offered:
    """The statement a signing page offers, as its address names it: the request (path), the
    decision's kind and reason, and ``at``, when the statement was dated (query)."""

    origin: str
    request_id: str
    kind: str = "approval"
    reason: str = ""
    at: str = ""

    def decision(self) -> Literal["approval", "denial"]:
        """The kind of decision offered, once the address names a request.

        Raises:
            ApiError: 404 ``not_found``: the address names no request.
            Refused: 422: the kind is neither ``approval`` nor ``denial``.
        """
        _ref(self.origin, self.request_id)
        return _kind(self.kind)


Offered = Annotated[_Offered, Depends()]


@router.get("/requests/{origin}/{request_id}/own-key")
async def own_key_page(request: Request, offered: Offered, session: SignedIn) -> Response:
    """The statement to sign, its ``ssh-keygen`` line and the upload form.

    The statement is dated once (``at``, added to the address by a redirect): going back to the
    page, or reloading it, shows the very statement that was downloaded and signed.
    """
    origin, request_id, reason, at = offered.origin, offered.request_id, offered.reason, offered.at
    try:
        decision = offered.decision()
        if decision == "denial" and not reason.strip():
            raise Refused(422, "A denial needs a reason for the origin's operators; write one and try again.")
        if len(reason) > MAX_REASON_CHARS:
            raise Refused(422, f"The reason is longer than {MAX_REASON_CHARS} characters.")
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
        path = request_path(view)
        if not at:
            dated = f"{path}/own-key?{query}&at={to_sign['statement']['signed_at']}"
            return RedirectResponse(dated, status_code=303)
        statement = await _rebuilt(
            engine, origin, request_id, decision, signed_reason, at, view["tool_name"], view["payload_digest"]
        )
    except (Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)
    query = f"{query}&at={at}"
    name = _statement_name(decision, request_id)
    namespace = APPROVAL_NAMESPACE if decision == "approval" else DENIAL_NAMESPACE
    line = f"ssh-keygen -Y sign -n {namespace} -f ~/.ssh/id_ed25519 {name}"
    fields = hidden_fields(
        csrf=session.csrf,
        kind=decision,
        reason=reason if decision == "denial" else "",
        at=at,
        expect_tool_name=str(view["tool_name"]),
        expect_payload_digest=str(view["payload_digest"]),
    )
    main = (
        f"<h1>Sign the {decision} of request <code>{esc(request_id[:12])}</code> with your own key</h1>"
        f"<p>{shown_text(view['tool_name'])} from {esc(origin)}; "
        f"digest <code>{esc(view['payload_digest'])}</code>. "
        f'<a href="{esc(path)}">Back to the request</a></p>'
        '<ol class="steps">'
        f'<li><p>Download the statement: <a id="statement-link" download="{esc(name)}" '
        f'href="{esc(path)}/statement?{esc(query)}">{esc(name)}</a>. It is exactly these bytes '
        "(no trailing newline):</p>"
        f'<pre class="json" id="statement">{esc(visible(statement_bytes(statement).decode()))}</pre></li>'
        "<li><p>Sign it in the folder you downloaded it to, with your key in place of "
        "<code>~/.ssh/id_ed25519</code>:</p>"
        f'<pre class="line"><code id="sign-line">{esc(line)}</code></pre></li>'
        f"<li><p>Upload the signature it wrote, <code>{esc(name)}.sig</code>:</p>"
        f'<form method="post" action="{esc(path)}/own-key" enctype="multipart/form-data">{fields}'
        '<label for="signature">Signature file (.sig)</label>'
        '<input type="file" id="signature" name="signature" accept=".sig" required>'
        f'<button type="submit">Submit the signed {decision}</button></form></li></ol>'
        f"<p>The request expires at {esc(clock(view['expires_at']))}; the statement must be signed "
        "before.</p>"
    )
    return page_response(
        layout("Sign with your key", main, node_id=engine.agent_id, session=session, page="own-key")
    )


def _url_quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


@router.get("/requests/{origin}/{request_id}/statement")
async def statement_file(request: Request, offered: Offered, session: SignedIn) -> Response:
    """The offered statement as a file to sign (``at`` names the time it was dated)."""
    try:
        decision = offered.decision()
        engine = await _engine(request)
        statement = await _rebuilt(
            engine, offered.origin, offered.request_id, decision, offered.reason, offered.at, None, None
        )
    except (Refused, ApiError, StoreError) as exc:
        return _refusal_page(request, session, exc)
    request_id = offered.request_id
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
        form = await checked_form(request, session)
        decision = _kind(form_text(form, "kind"))
        upload = form.get("signature")
        if not isinstance(upload, UploadFile):
            raise Refused(422, "Choose the signature file (.sig) that ssh-keygen wrote.")
        raw = await upload.read(MAX_BODY_BYTES + 1)
        try:
            signature = signature_to_wire(raw.decode("ascii"))
        except (UnicodeDecodeError, SignatureError) as exc:
            detail = "it is not ASCII" if isinstance(exc, UnicodeDecodeError) else str(exc).rstrip(".")
            raise Refused(
                422, f"The file {upload.filename or ''} is not an SSH signature: {detail}."
            ) from exc
        engine = await _engine(request)
        tool_name = form_text(form, "expect_tool_name") or None
        digest = form_text(form, "expect_payload_digest") or None
        statement = await _rebuilt(
            engine,
            origin,
            request_id,
            decision,
            form_text(form, "reason"),
            form_text(form, "at"),
            tool_name,
            digest,
        )
        body = DecisionIn(
            statement=statement, signature=signature, expect_tool_name=tool_name, expect_payload_digest=digest
        )
        outcome = await submit_decision(request_id, body, engine, None)
        web_state(request).changed()
        return await _request_page(
            request, engine, session, origin, request_id, notice=decided_notice(outcome, engine.fingerprint)
        )
    except ValidationError as exc:
        return _error_page(request, session, 422, f"The form is not a decision: {exc.errors()[0]['msg']}.")
    except (Refused, ApiError, StoreError) as exc:
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

    @app.exception_handler(SignInNeeded)
    async def _sign_in(request: Request, exc: SignInNeeded) -> Response:
        if request.method == "GET":
            target = "/web/login?expired=1" if exc.expired else "/web/login"
            return RedirectResponse(target, status_code=303)
        message = "Your session expired; sign in again." if exc.expired else "Sign in first."
        return _login_page(request, f"{message} Nothing was done.", 401)

    app.add_middleware(WebHeadersMiddleware)
