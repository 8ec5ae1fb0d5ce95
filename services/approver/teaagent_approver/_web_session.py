"""Who may use the operators' web inbox: sessions, one-time sign-in links, and checked forms.

A session is an HttpOnly, SameSite=Strict cookie of this process (a restart signs everybody out),
kept only as its SHA-256 here; every form that changes something carries the session's CSRF token
and comes from this approver's own pages (``Origin``, or ``Sec-Fetch-Site``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import Depends, Request

__all__ = [
    "COOKIE",
    "LINK_SECONDS",
    "MAX_LINKS",
    "MAX_SESSIONS",
    "Refused",
    "Session",
    "SignInNeeded",
    "SignedIn",
    "WebState",
    "checked_form",
    "form_text",
    "same_site",
    "web_state",
]

COOKIE: Final = "teaagent_web"
LINK_SECONDS: Final = 300  # a one-time sign-in link of `teaagent approvals web`
MAX_SESSIONS: Final = 256  # the oldest are dropped beyond it
MAX_LINKS: Final = 32


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


def web_state(request: Request) -> WebState:
    state: WebState = request.app.state.web
    return state


class SignInNeeded(Exception):
    """No live session: the page sends the browser to the sign-in page."""

    def __init__(self, expired: bool) -> None:
        super().__init__("sign in")
        self.expired = expired


def _signed_in(request: Request) -> Session:
    cookie = request.cookies.get(COOKIE)
    session = web_state(request).session(cookie)
    if session is None:
        raise SignInNeeded(expired=cookie is not None)
    return session


SignedIn = Annotated[Session, Depends(_signed_in)]


def same_site(request: Request) -> bool:
    """Whether a POST comes from this approver's own pages (its Origin, or Sec-Fetch-Site, says so)."""
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == f"{request.url.scheme}://{request.headers.get('host', '')}"
    return request.headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")


class Refused(Exception):
    """A decision form refused before anything was done: status and sentence."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def checked_form(request: Request, session: Session) -> Mapping[str, Any]:
    """The posted form, once its origin and CSRF token are this session's.

    Raises:
        Refused: 403 for another site's form or a CSRF token that is not this session's.
    """
    if not same_site(request):
        raise Refused(403, "This form was sent from another site; nothing was done.")
    form = await request.form()
    given = form.get("csrf")
    if not isinstance(given, str) or not hmac.compare_digest(given.encode(), session.csrf.encode()):
        raise Refused(
            403,
            "This form does not carry this session's CSRF token (a stale page, or a form from elsewhere); "
            "nothing was done. Reload the page and try again.",
        )
    return form


def form_text(form: Mapping[str, Any], name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""
