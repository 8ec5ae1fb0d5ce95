"""Webhook notifications of the requests that wait for an operator (``[approver] notify``).

The approver calls :meth:`Notifier.notify` for each request its rules leave to a person. The call
only queues the request: one background task per notifier posts the queue to the webhook, one
request at a time, so a slow or failing receiver never delays a decision. Delivery is at least
once: each request is posted until the receiver answers 2xx, the receiver refuses it for good
(a 4xx other than 408, 425 and 429, or a redirect), or the request expires; a receiver that
times out may have received a post it did not acknowledge, so it may see a request twice.

Behaviour a platform team can rely on:

- The queue holds at most ``max_pending`` requests (:data:`MAX_PENDING`); when it is full the
  oldest one waiting is dropped, with a warning, to make room for the new one.
- After a failed attempt a request waits ``backoff_start * 2**(n-1)`` seconds (at most
  ``backoff_cap``, less a random part of up to half so that several approvers sharing one
  receiver spread out), and is dropped with a log line once it would next be tried after it
  expires: nobody can approve an expired request.
- ``Retry-After`` (seconds or an HTTP date) on a 429 or 503 holds every request, since it is the
  receiver, not the request, that asks for the pause.
- One attempt lasts at most ``attempt_timeout`` seconds, from connecting to the last byte.
- The webhook URL is a secret (a Slack incoming-webhook URL is its own credential): logs name
  only its scheme, host and port; its path and query are scrubbed from this module's log records
  and from httpx's own request log line.

Formats: ``json`` posts :data:`EVENT` with the request's fields, the whole arguments and the
approve command; ``slack`` posts Slack's incoming-webhook shape ``{"text", "blocks"}``, with long
argument values cut and marked (the command line's ``show`` prints them whole) and everything that
comes from the origin escaped, so a model's reason cannot mention ``@channel`` or hide a link.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import heapq
import itertools
import json
import logging
import math
import random
import shlex
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol
from urllib.parse import urlsplit

import teaagent
from teaagent._words import moment
from teaagent.quorum import ShownPolicy, shown_policy
from teaagent_approver._items import shown_fields

if TYPE_CHECKING:
    # httpx is imported where a webhook is configured: an approver without one never loads it.
    import httpx

__all__ = [
    "ATTEMPT_TIMEOUT",
    "BACKOFF_CAP",
    "BACKOFF_START",
    "EVENT",
    "FORMATS",
    "MAX_PENDING",
    "Notifier",
    "NotifierStats",
    "NotifyTarget",
]

logger = logging.getLogger("teaagent.approver.notify")

EVENT: Final = "teaagent.request.waiting"
FORMATS: Final = ("slack", "json")
MAX_PENDING: Final = 1000  # requests waiting for an operator at once; a node asked more is flooded anyway
ATTEMPT_TIMEOUT: Final = 5.0  # seconds for one POST: a webhook answers at once or is down
BACKOFF_START: Final = 0.5  # seconds before the first retry
BACKOFF_CAP: Final = 30.0  # seconds between retries at most: a receiver back up is used within 30 s
MAX_RETRY_AFTER: Final = 300.0  # a longer Retry-After outlives most requests; try again by then
MAX_VALUE_CHARS: Final = 500  # one argument value in a chat message; `approvals show` prints it whole
MAX_SECTION_CHARS: Final = 2900  # Slack refuses a section text over 3000 characters
MAX_HEADER_CHARS: Final = 150  # Slack's limit for a header block
MAX_REASON_CHARS: Final = 2000  # a model's reasoning in a chat message
RESPONSE_EXCERPT_BYTES: Final = 200  # of a refusal's body, for the log ("invalid_payload", ...)


class NotifyTarget(Protocol):
    """Where and how to notify: ``[approver] notify`` (``teaagent.config.NotifySettings``)."""

    @property
    def webhook_url(self) -> str: ...

    @property
    def format(self) -> str: ...


class _Node(Protocol):
    """What a notifier needs of the node: its id and its configuration file (``NodeConfig``)."""

    @property
    def agent_id(self) -> str: ...

    @property
    def path(self) -> Path: ...


@dataclass
class NotifierStats:
    """What a notifier did so far (counters for ``/metrics``).

    Attributes:
        queued: Requests accepted by :meth:`Notifier.notify`.
        attempts: POSTs started.
        failed_attempts: POSTs that did not end in a 2xx answer.
        delivered: Requests the receiver answered 2xx.
        dropped_expired: Requests dropped because they expired before a 2xx answer.
        dropped_full: Requests dropped to make room in a full queue.
        dropped_refused: Requests the receiver refused for good (4xx, redirect).
        dropped_closed: Requests still queued when the notifier was closed.
    """

    queued: int = 0
    attempts: int = 0
    failed_attempts: int = 0
    delivered: int = 0
    dropped_expired: int = 0
    dropped_full: int = 0
    dropped_refused: int = 0
    dropped_closed: int = 0


@dataclass(frozen=True)
class _Request:
    """The fields of one inbox item a notification shows, copied when it is queued."""

    request_id: str
    origin: str
    tool_name: str
    arguments: Any  # JSON values, a deep copy
    reason: str
    payload_digest: str
    expires_at: int
    # A version 2 request's rule and terms, and this node's term: from the item's "request", the
    # document whose signature the approver verified (never the relay's description beside it).
    policy: ShownPolicy | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any], node_id: str = "") -> _Request:
        strings = {}
        for name in ("request_id", "origin", "tool_name", "reason", "payload_digest"):
            value = item.get(name)
            if not isinstance(value, str):
                raise ValueError(f"its {name} is not a string")
            strings[name] = value
        expires_at = item.get("expires_at")
        if isinstance(expires_at, bool) or not isinstance(expires_at, int):
            raise ValueError("its expires_at is not an integer")
        arguments = item.get("arguments")
        if not isinstance(arguments, Mapping):
            raise ValueError("its arguments are not an object")
        try:
            # A copy the caller cannot change later, and proof that it can be posted as JSON.
            copied = json.loads(json.dumps(arguments, ensure_ascii=False, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ValueError("its arguments are not JSON") from exc
        request = item.get("request")
        policy = shown_policy(request, node_id) if isinstance(request, Mapping) else None
        return cls(arguments=copied, expires_at=expires_at, policy=policy, **strings)

    @property
    def key(self) -> tuple[str, str]:
        return (self.origin, self.request_id)

    @property
    def named(self) -> str:
        """``request <id> from <origin>``, as the log names it."""
        return f"request {self.request_id} from {self.origin}"


@dataclass
class _Pending:
    request: _Request
    seq: int
    attempts: int = 0
    in_flight: bool = False


@dataclass(frozen=True)
class _Outcome:
    kind: str  # "delivered", "retry" or "refused"
    detail: str
    retry_after: float | None = None


class _Redactor(logging.Filter):
    """Scrubs registered webhook paths from log records, whoever logs them (httpx logs each URL)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._secrets: dict[str, str] = {}  # secret text -> what replaces it

    def add(self, secret: str, replacement: str) -> None:
        # Kept after the notifier closes: a URL once used stays a secret, and it costs nothing.
        with self._lock:
            self._secrets[secret] = replacement

    def scrub(self, text: str) -> str:
        with self._lock:
            secrets = sorted(self._secrets.items(), key=lambda pair: -len(pair[0]))
        for secret, replacement in secrets:
            text = text.replace(secret, replacement)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is the logging module's to report, not ours
            return True
        scrubbed = self.scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self.scrub(logging.Formatter().formatException(record.exc_info))
        return True


_REDACTOR = _Redactor()
_REDACTED_LOGGERS = (logger, logging.getLogger("httpx"))
for _logger in _REDACTED_LOGGERS:
    _logger.addFilter(_REDACTOR)


class Notifier:
    """Posts each request that waits for an operator to a webhook, in the background.

    Build it with :meth:`for_node`; call :meth:`notify` from the approver's event loop and
    :meth:`aclose` when the service stops (or use ``async with``).
    """

    def __init__(
        self,
        *,
        settings: NotifyTarget,
        agent_id: str,
        config_path: Path | str,
        max_pending: int = MAX_PENDING,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        backoff_start: float = BACKOFF_START,
        backoff_cap: float = BACKOFF_CAP,
    ) -> None:
        """Check the settings; nothing is started until the first :meth:`notify`.

        Args:
            settings: The webhook URL and the format, ``slack`` or ``json``.
            agent_id: This node's id (the approving node), shown in each message.
            config_path: The node's configuration file, for the approve command in each message.
            max_pending: Requests held at most; the oldest waiting is dropped beyond.
            attempt_timeout: Seconds one POST may take.
            backoff_start: Seconds before the first retry; doubled after each failure.
            backoff_cap: Seconds between retries at most.

        Raises:
            ValueError: The format is not ``slack`` or ``json``, the URL is not http(s) with a host,
                or a limit is not positive.
        """
        if settings.format not in FORMATS:
            raise ValueError(f"The notify format must be 'slack' or 'json', not {settings.format!r}.")
        import httpx

        try:
            parts = urlsplit(settings.webhook_url)
            port = parts.port
            httpx.URL(settings.webhook_url)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        except (ValueError, httpx.InvalidURL):
            valid = False
        if not valid:
            # The URL itself is not repeated (nor chained): it may be a secret, and a wrong one still is.
            raise ValueError("The notify webhook_url must be an http:// or https:// URL with a host.")
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, not {max_pending}.")
        for name, value in (
            ("attempt_timeout", attempt_timeout),
            ("backoff_start", backoff_start),
            ("backoff_cap", backoff_cap),
        ):
            if not value > 0:
                raise ValueError(f"{name} must be positive, not {value}.")
        self._url = settings.webhook_url
        self._format = settings.format
        self._agent_id = agent_id
        self._config_path = str(config_path)
        self._max_pending = max_pending
        self._attempt_timeout = attempt_timeout
        self._backoff_start = backoff_start
        self._backoff_cap = max(backoff_cap, backoff_start)
        self.where = (
            f"{parts.scheme}://{parts.hostname}{'' if port is None else f':{port}'}"  # what logs name
        )
        self._register_secret(settings.webhook_url)

        self._stats = NotifierStats()
        self._pending: dict[int, _Pending] = {}  # by seq, oldest first
        self._by_key: dict[tuple[str, str], int] = {}
        self._heap: list[tuple[float, int]] = []  # (loop time due, seq); stale entries skipped
        self._due: dict[int, float] = {}
        self._seq = itertools.count()
        self._hold_until = 0.0  # loop time before which nothing is posted (Retry-After)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self._closed = False

    @classmethod
    def for_node(cls, node: _Node, settings: NotifyTarget, **limits: Any) -> Notifier:
        """Build the notifier of a node: ``Notifier.for_node(node, node.approver.notify)``.

        Args:
            node: The node's configuration (its ``agent_id`` and ``path``).
            settings: Its ``[approver] notify`` table.
            **limits: ``max_pending``, ``attempt_timeout``, ``backoff_start``, ``backoff_cap``.

        Returns:
            The notifier, not started yet.

        Raises:
            ValueError: As :class:`Notifier`.
        """
        return cls(settings=settings, agent_id=node.agent_id, config_path=node.path, **limits)

    def _register_secret(self, url: str) -> None:
        import httpx

        parts = urlsplit(url)
        parsed = httpx.URL(url)
        for full in (url, str(parsed)):
            _REDACTOR.add(full, f"{self.where}/…")
        if parts.username is not None or parts.password is not None:
            _REDACTOR.add(parts.netloc, parts.hostname or "")
        # The path alone too, as in "POST /services/T.../B.../..." lines; "/" alone is no secret.
        tails = (url.split(parts.netloc, 1)[1], parsed.raw_path.decode("ascii", "replace"), parts.path)
        for tail in tails:
            if len(tail.strip("/")) > 0:
                _REDACTOR.add(tail, "/…")

    @property
    def stats(self) -> NotifierStats:
        """A copy of the counters so far."""
        return replace(self._stats)

    @property
    def pending(self) -> int:
        """Requests queued or being posted."""
        return len(self._pending)

    async def __aenter__(self) -> Notifier:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def notify(self, item: Mapping[str, Any]) -> None:
        """Queue one waiting request for the webhook and return at once; never raises.

        Args:
            item: The approver's inbox item: ``request_id``, ``origin``, ``tool_name``,
                ``arguments``, ``reason``, ``payload_digest``, ``expires_at`` (Unix seconds).
                A request already queued (same origin and id) is not queued twice.
        """
        try:
            self._enqueue(item)
        except Exception:  # the caller is deciding requests; a notification never stops that
            logger.exception("A notification for %s was not queued.", self.where)

    def _enqueue(self, item: Mapping[str, Any]) -> None:
        if self._closed:
            logger.warning(
                "The notifier for %s is closed; request %s is not notified.",
                self.where,
                item.get("request_id"),
            )
            return
        try:
            request = _Request.from_item(item, self._agent_id)
        except ValueError as exc:
            logger.error("Request %r cannot be notified: %s.", item.get("request_id"), exc)
            return
        if request.key in self._by_key:
            return
        if time.time() > request.expires_at:
            self._stats.dropped_expired += 1
            logger.info(
                "Request %s from %s expired at %s before it could be notified.",
                request.request_id,
                request.origin,
                moment(request.expires_at),
            )
            return
        if len(self._pending) >= self._max_pending:
            self._drop_oldest_waiting()
        seq = next(self._seq)
        self._pending[seq] = _Pending(request, seq)
        self._by_key[request.key] = seq
        self._stats.queued += 1
        self._start()
        self._schedule(seq, asyncio.get_running_loop().time())

    def _drop_oldest_waiting(self) -> None:
        # The request being posted stays: its attempt is under way and may succeed.
        oldest = next((entry for entry in self._pending.values() if not entry.in_flight), None)
        if oldest is None:
            return
        self._remove(oldest)
        self._stats.dropped_full += 1
        logger.warning(
            "The notification queue for %s is full (%d requests): %s, the oldest, is dropped unnotified.",
            self.where,
            self._max_pending,
            oldest.request.named,
        )

    def _start(self) -> None:
        if self._task is not None and self._task.done() and not self._task.cancelled():
            # Only a bug ends the task (each attempt's errors are caught); say so, and deliver again.
            logger.error("The notification task for %s had stopped: %r", self.where, self._task.exception())
            self._task = None
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self._attempt_timeout),
                follow_redirects=False,  # a redirect is a misconfigured URL, not a place to post to
                headers={"user-agent": f"teaagent/{teaagent.__version__}"},
            )
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"teaagent-notify-{self.where}"
            )

    def _schedule(self, seq: int, due: float) -> None:
        self._due[seq] = due
        heapq.heappush(self._heap, (due, seq))
        if len(self._heap) > 2 * len(self._pending) + 64:
            # Dropped requests leave their entries behind; rebuild before they pile up.
            self._heap = [(when, key) for key, when in self._due.items()]
            heapq.heapify(self._heap)
        self._wake.set()

    def _remove(self, entry: _Pending) -> None:
        self._pending.pop(entry.seq, None)
        self._due.pop(entry.seq, None)
        self._by_key.pop(entry.request.key, None)

    async def _next(self) -> _Pending:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            while self._heap and self._due.get(self._heap[0][1]) != self._heap[0][0]:
                heapq.heappop(self._heap)  # stale: dropped, or scheduled again since
            if not self._heap:
                await self._wake.wait()
                continue
            due, seq = self._heap[0]
            start = max(due, self._hold_until)
            wait = start - loop.time()
            if wait <= 0:
                heapq.heappop(self._heap)
                del self._due[seq]
                return self._pending[seq]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _run(self) -> None:
        while True:
            entry = await self._next()
            entry.in_flight = True
            try:
                await self._attempt(entry)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the deliveries of every later request
                self._remove(entry)
                logger.exception(
                    "Notifying %s of request %s failed unexpectedly; the request is dropped.",
                    self.where,
                    entry.request.request_id,
                )
            finally:
                entry.in_flight = False

    async def _attempt(self, entry: _Pending) -> None:
        request = entry.request
        now = time.time()
        if now > request.expires_at:
            self._drop_expired(entry, "it expired")
            return
        entry.attempts += 1
        self._stats.attempts += 1
        body = json.dumps(self._message(request, now), ensure_ascii=False).encode("utf-8")
        outcome = await self._post(body)
        if outcome.kind == "delivered":
            self._remove(entry)
            self._stats.delivered += 1
            logger.info("Notified %s of %s (attempt %d).", self.where, request.named, entry.attempts)
            return
        self._stats.failed_attempts += 1
        if outcome.kind == "refused":
            self._remove(entry)
            self._stats.dropped_refused += 1
            logger.error(
                "The webhook at %s refused the notification of %s (%s); it is not retried.",
                self.where,
                request.named,
                outcome.detail,
            )
            return
        self._retry(entry, outcome)

    def _retry(self, entry: _Pending, outcome: _Outcome) -> None:
        loop = asyncio.get_running_loop()
        nominal = min(self._backoff_cap, self._backoff_start * 2 ** (entry.attempts - 1))
        delay = nominal * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not a secret
        if outcome.retry_after is not None:
            self._hold_until = max(self._hold_until, loop.time() + outcome.retry_after)
        start = max(loop.time() + delay, self._hold_until)
        if time.time() + (start - loop.time()) > entry.request.expires_at:
            self._drop_expired(entry, f"it expires before the next attempt (last: {outcome.detail})")
            return
        logger.warning(
            "Notifying %s of %s failed (%s, attempt %d); retrying in %.1f s.",
            self.where,
            entry.request.named,
            outcome.detail,
            entry.attempts,
            start - loop.time(),
        )
        self._schedule(entry.seq, start)

    def _drop_expired(self, entry: _Pending, why: str) -> None:
        self._remove(entry)
        self._stats.dropped_expired += 1
        logger.warning(
            "The notification of %s is dropped after %d attempts without a 2xx from %s: "
            "%s (the request's expiry: %s).",
            entry.request.named,
            entry.attempts,
            self.where,
            why,
            moment(entry.request.expires_at),
        )

    async def _post(self, body: bytes) -> _Outcome:
        import httpx

        assert self._client is not None  # made with the task
        try:
            # httpx's timeout bounds each phase; this bounds the attempt (a receiver answering slowly).
            async with asyncio.timeout(self._attempt_timeout):
                async with self._client.stream(
                    "POST", self._url, content=body, headers={"content-type": "application/json"}
                ) as response:
                    status = response.status_code
                    # A 2xx accepts as soon as it is said; only a failure's body is read, for the log.
                    excerpt = "" if 200 <= status < 300 else await _excerpt(response)
        except (TimeoutError, httpx.TimeoutException):
            return _Outcome("retry", f"no answer within {self._attempt_timeout:g} s")
        except httpx.HTTPError as exc:
            return _Outcome("retry", f"{type(exc).__name__}: {_REDACTOR.scrub(str(exc)) or 'no detail'}")
        detail = f"HTTP {status}" + (f" {excerpt!r}" if excerpt else "")
        if 200 <= status < 300:
            return _Outcome("delivered", detail)
        if status in (408, 425, 429) or status >= 500:
            retry_after = _retry_after(response.headers.get("retry-after")) if status in (429, 503) else None
            return _Outcome("retry", detail, retry_after)
        return _Outcome("refused", detail)

    def _message(self, request: _Request, now: float) -> dict[str, Any]:
        seconds_left = max(0, request.expires_at - math.floor(now))
        approve = (
            f"teaagent approvals approve {shlex.quote(request.request_id)} "
            f"--config {shlex.quote(self._config_path)}"
        )
        if self._format == "json":
            return {
                "event": EVENT,
                "node": self._agent_id,
                **shown_fields(request),
                "expires_at": request.expires_at,
                "seconds_left": seconds_left,
                "approve_command": approve,
            } | ({} if request.policy is None else {"quorum": request.policy.to_dict()})
        show = (
            f"teaagent approvals show {shlex.quote(request.request_id)} "
            f"--config {shlex.quote(self._config_path)}"
        )
        return _slack_message(request, self._agent_id, seconds_left, approve, show)

    async def aclose(self) -> None:
        """Stop at once: an attempt under way is abandoned, the queue is dropped (with a warning)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._task is not None:
                self._task.cancel()
                try:
                    await self._task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # aclose itself is cancelled: pass that on, not only the task's
        finally:
            if self._client is not None:
                await self._client.aclose()
            if self._pending:
                self._stats.dropped_closed += len(self._pending)
                logger.warning(
                    "The notifier for %s stopped with %d requests not notified.",
                    self.where,
                    len(self._pending),
                )
            self._pending.clear()
            self._by_key.clear()
            self._due.clear()
            self._heap.clear()


async def _excerpt(response: httpx.Response) -> str:
    """The start of the response body, for the log; the rest is not read."""
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= RESPONSE_EXCERPT_BYTES:
            break
    return _REDACTOR.scrub(data[:RESPONSE_EXCERPT_BYTES].decode("utf-8", "replace").strip())


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def _duration(seconds: int) -> str:
    """``4 min 10 s``, ``1 h 2 min``, ``45 s``."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def _escape(text: str) -> str:
    """Slack mrkdwn: ``&``, ``<`` and ``>`` are control characters (links, mentions)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code_block(text: str) -> str:
    # A ``` inside would end the block and let the rest render as mrkdwn: break it with a ZWSP.
    return "```" + _escape(text).replace("```", "`\u200b`\u200b`") + "```"


def _code(text: str) -> str:
    return f"`{_escape(text)}`" if "`" not in text and text else _escape(text)


def _cut(text: str, limit: int, marker: str) -> str:
    return text if len(text) <= limit else text[: max(0, limit - len(marker))] + marker


def _cut_values(value: Any, limit: int) -> tuple[Any, bool]:
    """The value with each string longer than ``limit`` cut and marked; whether any was cut."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}… [cut: {len(value)} characters in all]", True
    if isinstance(value, list):
        pairs = [_cut_values(inner, limit) for inner in value]
        return [inner for inner, _ in pairs], any(cut for _, cut in pairs)
    if isinstance(value, dict):
        items = {key: _cut_values(inner, limit) for key, inner in value.items()}
        return {key: inner for key, (inner, _) in items.items()}, any(cut for _, cut in items.values())
    return value, False


def _slack_message(
    request: _Request, agent_id: str, seconds_left: int, approve: str, show: str
) -> dict[str, Any]:
    """Slack's incoming-webhook message: a fallback ``text`` and Block Kit ``blocks``."""
    expires = datetime.fromtimestamp(request.expires_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    left = _duration(seconds_left)
    arguments, cut = _cut_values(request.arguments, MAX_VALUE_CHARS)
    pretty = json.dumps(arguments, indent=2, ensure_ascii=False)
    room = MAX_SECTION_CHARS - len("*Arguments*\n``````")
    block = _code_block(pretty)
    if len(block) > room:
        pretty = _cut(pretty, room - 200, f"\n… [arguments cut: {len(pretty)} characters in all]")
        block, cut = _code_block(pretty), True
        if len(block) > room:  # escaping grew it: cut the escaped text itself, keeping the fence
            block = _cut(block[:-3], room - 3, "…") + "```"
    note = f"Long values are cut here; `{_escape(show)}` prints them whole." if cut else ""
    reason = _cut(request.reason, MAX_REASON_CHARS, f"… [cut: {len(request.reason)} characters in all]")
    header = _cut(f"Approval needed: {request.tool_name} from {request.origin}", MAX_HEADER_CHARS, "…")
    text = _escape(
        f"{request.origin} asks {agent_id} to approve {request.tool_name} "
        f"(request {request.request_id}, {left} left)"
    )
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": False}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": _cut(f"*Origin*\n{_escape(request.origin)}", 2000, "…")},
                {"type": "mrkdwn", "text": _cut(f"*Tool*\n{_code(request.tool_name)}", 2000, "…")},
                {"type": "mrkdwn", "text": f"*Time left*\n{left} (expires {expires})"},
                {"type": "mrkdwn", "text": f"*Request*\n{_code(request.request_id)} to {_escape(agent_id)}"},
            ],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*Arguments*\n{block}"}},
    ]
    if request.policy is not None:  # version 2: the rule, its terms, the term this node counts toward
        shown = request.policy
        terms = "\n".join(f"{name}: {term}" for name, term in shown.numbered)
        quorum = _cut(
            f"*Quorum*\n{_escape(shown.heading)}\n{_escape(terms)}\n{_escape(shown.counts)}", 3000, "…"
        )
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": quorum}})
    if note:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": note}]})
    blocks += [
        {
            "type": "section",
            # plain_text: the model's words are shown as written, never as mentions or links.
            "text": {"type": "plain_text", "text": f"Reason: {reason or '(none given)'}", "emoji": False},
        },
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"Payload digest {_code(request.payload_digest)}"}],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*To approve*\n{_code_block(approve)}"}},
    ]
    return {"text": text, "blocks": blocks}
