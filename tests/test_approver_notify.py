"""teaagent_approver._notify: webhook notifications, against a real HTTP receiver in this process.

The receiver is a Starlette app served by uvicorn in a thread on a port of its own; each test
scripts its answers (200, 500, 429 with Retry-After, a hang) and reads what it received. Backoff
and timeouts are made small through the notifier's keywords so the suite stays quick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from words_support import AGO, moment_re

from teaagent.config import NotifySettings
from teaagent_approver._notify import EVENT, Notifier

WAIT = 10.0  # seconds any awaited event may take on a loaded host
HANG_LIMIT = 30.0  # a hanging answer gives up by itself, should a test forget to release it
SHORT_TIMEOUT = 1.0  # an attempt timeout to exceed on purpose; a loaded host still answers a 200 within it
DRIP_INTERVAL = 0.1  # seconds between bytes: under httpx's per-read timeout, so only a whole bound stops it
SECRET_PATH = "/services/T0SECRET/B0SECRET/xoxbSECRETtoken"
FAST = {"backoff_start": 0.02, "backoff_cap": 0.1, "attempt_timeout": 2.0}


def target(url: str, format: str = "json") -> NotifySettings:
    """``[approver] notify`` as the configuration loads it."""
    return NotifySettings(webhook_url=url, format=format)  # type: ignore[arg-type]  # "xml" on purpose


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False  # wait for Receiver.release before answering
    drip: bool = False  # answer at once, then send the body a byte every DRIP_INTERVAL until released


@dataclass(frozen=True)
class Hit:
    path: str
    query: str
    body: Any
    monotonic: float
    wall: float

    @property
    def request_id(self) -> str:
        body = self.body
        if "request_id" in body:
            return str(body["request_id"])
        return str(body["text"].split("(request ")[1].split(",")[0])


class Receiver:
    """A webhook receiver: answers each POST with the next scripted Reply, then with ``default``."""

    def __init__(self, *replies: Reply, default: Reply | None = None) -> None:
        self.replies = list(replies)
        self.default = default or Reply()
        self.hits: list[Hit] = []
        self.answered = 0
        self.release = threading.Event()
        self.on_hit: Callable[[Hit], None] = lambda hit: None
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))  # held from here on: no other process can take the port
        self.port = int(self._socket.getsockname()[1])
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["POST"])])
        self._server = uvicorn.Server(
            uvicorn.Config(app, log_config=None, access_log=False, timeout_graceful_shutdown=2)
        )
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="webhook", daemon=True
        )

    def url(self, path: str = SECRET_PATH) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def where(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hits_for(self, request_id: str) -> list[Hit]:
        with self._lock:
            return [hit for hit in self.hits if hit.request_id == request_id]

    async def _handle(self, request: Request) -> Response:
        hit = Hit(request.url.path, request.url.query, await request.json(), time.monotonic(), time.time())
        with self._lock:
            self.hits.append(hit)
            reply = self.replies.pop(0) if self.replies else self.default
        self.on_hit(hit)
        if reply.hang:
            deadline = time.monotonic() + HANG_LIMIT
            while not self.release.is_set() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        with self._lock:
            self.answered += 1
        if reply.drip:
            return StreamingResponse(self._drip(), reply.status, headers=reply.headers)
        return PlainTextResponse("ok" if reply.status < 300 else "no", reply.status, headers=reply.headers)

    async def _drip(self) -> AsyncIterator[bytes]:
        deadline = time.monotonic() + HANG_LIMIT
        while not self.release.is_set() and time.monotonic() < deadline:
            yield b"."
            await asyncio.sleep(DRIP_INTERVAL)

    def __enter__(self) -> Receiver:
        self._thread.start()
        deadline = time.monotonic() + WAIT
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the webhook receiver did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()  # a hanging answer would hold the server's shutdown
        self._server.should_exit = True
        self._thread.join(timeout=15)
        self._socket.close()


@contextlib.contextmanager
def receiving(*replies: Reply, default: Reply | None = None) -> Iterator[Receiver]:
    with Receiver(*replies, default=default) as receiver:
        yield receiver


async def eventually(predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Wait for ``predicate`` to hold (polled), failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout} s: {predicate}")
        await asyncio.sleep(0.01)
    return value


def an_item(*, expires_in: int = 300, **fields: Any) -> dict[str, Any]:
    """An approver inbox item, as the approver hands it to notify()."""
    now = int(time.time())
    item: dict[str, Any] = {
        "request_id": secrets.token_hex(16),
        "origin": "alpha",
        "tool_name": "shell.run",
        "arguments": {"command": "rm -rf build", "cwd": "/srv/app"},
        "reason": "The build folder is stale.",
        "payload_digest": "sha256:" + "ab" * 32,
        "run_id": "run-1",
        "call_id": "call-1",
        "required_approvals": 2,
        "peers": ["beta", "gamma"],
        "created_at": now,
        "expires_at": now + expires_in,
        "seconds_left": expires_in,
        "state": "pending",
    }
    item.update(fields)
    return item


def notifier_for(
    receiver: Receiver, config: Path, *, format: str = "json", path: str = SECRET_PATH, **limits: Any
) -> Notifier:
    return Notifier(
        settings=target(receiver.url(path), format),
        agent_id="beta",
        config_path=config,
        **{**FAST, **limits},
    )


@pytest.mark.anyio
async def test_a_receiver_answering_200_gets_each_item_once_in_the_documented_json(tmp_path: Path) -> None:
    config = tmp_path / "my node" / "node.toml"  # a space, so the command must quote it
    first, second = an_item(), an_item(origin="gamma", arguments={"path": "a.txt", "n": [1, 2]})
    with receiving() as receiver:
        async with notifier_for(receiver, config) as notifier:
            await notifier.notify(first)
            await notifier.notify(second)
            await eventually(lambda: notifier.stats.delivered == 2)
            assert notifier.pending == 0  # nothing left that could be posted again
    assert [hit.request_id for hit in receiver.hits] == [first["request_id"], second["request_id"]]
    for item, hit in zip((first, second), receiver.hits, strict=True):
        assert hit.path == SECRET_PATH
        body = dict(hit.body)
        seconds_left = body.pop("seconds_left")
        assert body == {
            "event": EVENT,
            "node": "beta",
            "request_id": item["request_id"],
            "origin": item["origin"],
            "tool_name": "shell.run",
            "arguments": item["arguments"],
            "reason": "The build folder is stale.",
            "payload_digest": "sha256:" + "ab" * 32,
            "expires_at": item["expires_at"],
            "approve_command": f"teaagent approvals approve {item['request_id']} --config '{config}'",
        }
        # Counted when posted, in whole seconds: the receipt is within the same second or the next.
        assert (
            item["expires_at"] - math.floor(hit.wall)
            <= seconds_left
            <= item["expires_at"] - math.floor(hit.wall) + 1
        )
    assert notifier.stats.queued == 2
    assert notifier.stats.attempts == 2


@pytest.mark.anyio
async def test_slack_format_posts_text_and_blocks_with_everything_escaped_and_long_values_cut(
    tmp_path: Path,
) -> None:
    config = tmp_path / "node.toml"
    item = an_item(
        arguments={
            "command": "echo <!channel> & ```not a fence```",
            "script": "x" * 5000,
            "nested": {"lines": ["y" * 600, "short"]},
        },
        reason="Deploy now <https://evil.example|click here> <!here>",
    )
    request_id = item["request_id"]
    with receiving() as receiver:
        async with notifier_for(receiver, config, format="slack") as notifier:
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.delivered == 1)
    [hit] = receiver.hits
    message = hit.body
    assert set(message) == {"text", "blocks"}
    # The time left is counted when posted, in whole seconds: the receipt's second or the one before.
    at_receipt = item["expires_at"] - math.floor(hit.wall)
    lefts = {f"{n // 60} min {n % 60} s" for n in (at_receipt, at_receipt + 1)}
    assert message["text"] in {
        f"alpha asks beta to approve shell.run (request {request_id}, {left} left)" for left in lefts
    }
    blocks = message["blocks"]
    assert 0 < len(blocks) <= 50
    assert {block["type"] for block in blocks} <= {"header", "section", "context"}
    texts: list[dict[str, Any]] = []  # every Slack text object in the message
    for block in blocks:
        if block["type"] == "header":
            assert block["text"]["type"] == "plain_text"
            assert len(block["text"]["text"]) <= 150
            texts.append(block["text"])
        elif block["type"] == "section":
            if "text" in block:
                assert len(block["text"]["text"]) <= 3000
                texts.append(block["text"])
            for text in block.get("fields", []):
                assert len(text["text"]) <= 2000
                texts.append(text)
        else:
            texts.extend(block["elements"])
    mrkdwn = [text["text"] for text in texts if text["type"] == "mrkdwn"]
    plain = [text["text"] for text in texts if text["type"] == "plain_text"]
    # Nothing from the origin can mention a channel or hide a link: < and > only as entities.
    assert all("<" not in text and ">" not in text for text in [*mrkdwn, message["text"]])
    assert f"Reason: {item['reason']}" in plain  # plain text: shown as written, never as markup
    [arguments] = [text for text in mrkdwn if text.startswith("*Arguments*")]
    assert arguments.count("```") == 2  # the argument's own ``` is broken, the block stays one block
    assert "echo &lt;!channel&gt; &amp;" in arguments
    assert "… [cut: 5000 characters in all]" in arguments
    assert "… [cut: 600 characters in all]" in arguments
    assert '"short"' in arguments
    assert "x" * 500 in arguments
    assert "x" * 501 not in arguments
    everything = "\n".join(mrkdwn + plain)
    assert f"teaagent approvals show {request_id} --config {config}` prints them whole" in everything
    assert f"*To approve*\n```teaagent approvals approve {request_id} --config {config}```" in mrkdwn
    assert "Payload digest `sha256:" + "ab" * 32 + "`" in mrkdwn
    assert "*Origin*\nalpha" in mrkdwn
    assert "*Tool*\n`shell.run`" in mrkdwn
    expires = datetime.fromtimestamp(item["expires_at"], tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert any(f"*Time left*\n{left} (expires {expires})" in mrkdwn for left in lefts)
    assert "Approval needed: shell.run from alpha" in plain


@pytest.mark.anyio
async def test_a_receiver_failing_twice_then_answering_200_sees_exactly_three_attempts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="teaagent.approver.notify")
    item = an_item()
    with receiving(Reply(500), Reply(500)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml") as notifier:
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.delivered == 1)
            assert notifier.pending == 0
    assert len(receiver.hits_for(item["request_id"])) == 3
    assert receiver.hits[0].body == receiver.hits[2].body | {
        "seconds_left": receiver.hits[0].body["seconds_left"]
    }
    stats = notifier.stats
    assert (stats.attempts, stats.failed_attempts, stats.delivered) == (3, 2, 1)
    messages = [record.getMessage() for record in caplog.records]
    assert sum("failed (HTTP 500 'no', attempt" in message for message in messages) == 2
    assert f"Notified {receiver.where} of request {item['request_id']} from alpha (attempt 3)." in messages


@pytest.mark.anyio
async def test_an_attempt_that_hangs_past_the_attempt_timeout_is_abandoned_and_retried(
    tmp_path: Path,
) -> None:
    item = an_item()
    with receiving(Reply(hang=True)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml", attempt_timeout=SHORT_TIMEOUT) as notifier:
            queued = time.monotonic()
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.delivered == 1)
            assert receiver.answered == 1  # the second attempt's answer; the first one still hangs
    first, second = receiver.hits_for(item["request_id"])
    # It waited the attempt timeout, then gave up. The hits are stamped as each request arrives,
    # after its attempt began (on a loaded host the first may come late by a fraction of a second):
    # the first attempt began after the notify, the second at least the timeout after the first.
    assert queued <= first.monotonic < second.monotonic
    assert second.monotonic - queued >= SHORT_TIMEOUT
    assert (notifier.stats.attempts, notifier.stats.failed_attempts) == (2, 1)


@pytest.mark.anyio
async def test_an_attempt_is_bounded_as_a_whole_not_only_per_read(tmp_path: Path) -> None:
    item = an_item()
    # A 500 whose body trickles in: every read is quick, the attempt as a whole is not.
    with receiving(Reply(500, drip=True)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml", attempt_timeout=SHORT_TIMEOUT) as notifier:
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.delivered == 1)
    first, second = receiver.hits_for(item["request_id"])
    # The hits are stamped when each request arrives, a little after its attempt began: on a
    # loaded host the first stamp may come late by some milliseconds, never by a tenth of the bound.
    assert second.monotonic - first.monotonic >= SHORT_TIMEOUT * 0.9
    assert (notifier.stats.attempts, notifier.stats.failed_attempts) == (2, 1)


@pytest.mark.anyio
async def test_a_2xx_counts_when_it_is_answered_however_slow_its_body(tmp_path: Path) -> None:
    with receiving(Reply(200, drip=True)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml", attempt_timeout=SHORT_TIMEOUT) as notifier:
            await notifier.notify(an_item())
            await eventually(lambda: notifier.stats.delivered == 1)
    assert len(receiver.hits) == 1
    assert notifier.stats.failed_attempts == 0


@pytest.mark.anyio
async def test_retry_after_on_429_is_honoured(tmp_path: Path) -> None:
    item = an_item()
    with receiving(Reply(429, headers={"Retry-After": "1"})) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml", backoff_start=0.01) as notifier:
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.delivered == 1)
    first, second = receiver.hits_for(item["request_id"])
    assert second.monotonic - first.monotonic >= 0.95  # the backoff alone would be 0.01 s


@pytest.mark.anyio
async def test_an_item_whose_request_expires_while_the_receiver_fails_is_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="teaagent.approver.notify")
    doomed = an_item(expires_in=2)  # expires in 1 to 2 s: whole seconds
    with receiving(default=Reply(500)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml") as notifier:
            await notifier.notify(doomed)
            await eventually(lambda: notifier.stats.dropped_expired == 1)
            assert notifier.pending == 0  # nothing is left to post
            attempts = receiver.hits_for(doomed["request_id"])
            assert len(attempts) >= 2  # it was retried while it lived...
            # ... and never posted after it expired (now > expires_at, in Unix seconds).
            assert all(hit.wall < doomed["expires_at"] + 1 for hit in attempts)
            receiver.default = Reply(200)
            later = an_item()
            await notifier.notify(later)
            await eventually(lambda: notifier.stats.delivered == 1)
            assert len(receiver.hits_for(doomed["request_id"])) == len(attempts)
    drops = [r.getMessage() for r in caplog.records if "is dropped after" in r.getMessage()]
    assert len(drops) == 1
    assert drops[0].startswith(
        f"The notification of request {doomed['request_id']} from alpha is dropped after {len(attempts)} "
        f"attempts without a 2xx from {receiver.where}: "
    )
    assert re.search(f"\\(the request's expiry: {moment_re(doomed['expires_at'])}\\)\\.$", drops[0]), drops[0]


@pytest.mark.anyio
async def test_notify_returns_before_the_receiver_is_hit_and_while_it_hangs(tmp_path: Path) -> None:
    first, second = an_item(), an_item()
    events: list[tuple[str, str]] = []
    with receiving(Reply(hang=True)) as receiver:
        receiver.on_hit = lambda hit: events.append(("received", hit.request_id))
        async with notifier_for(receiver, tmp_path / "node.toml", attempt_timeout=WAIT) as notifier:
            await asyncio.wait_for(notifier.notify(first), WAIT)
            events.append(("returned", first["request_id"]))
            await eventually(lambda: len(receiver.hits) == 1)
            # The only delivery task is stuck in the first post; queueing another must not wait.
            await asyncio.wait_for(notifier.notify(second), WAIT)
            events.append(("returned", second["request_id"]))
            assert receiver.answered == 0
            receiver.release.set()
            await eventually(lambda: notifier.stats.delivered == 2)
    assert events == [
        ("returned", first["request_id"]),
        ("received", first["request_id"]),
        ("returned", second["request_id"]),
        ("received", second["request_id"]),
    ]


@pytest.mark.anyio
async def test_the_webhook_path_never_appears_in_the_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything, httpx's own request lines included
    path = SECRET_PATH + "?key=QuerySECRET"
    with receiving(Reply(500)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml", path=path) as notifier:
            await notifier.notify(an_item())
            await eventually(lambda: notifier.stats.delivered == 1)
        dead_port = Receiver().port  # bound, never listening: connections are refused
        dead = Notifier(
            settings=target(f"http://127.0.0.1:{dead_port}{path}", "slack"),
            agent_id="beta",
            config_path=tmp_path / "node.toml",
            **FAST,
        )
        async with dead:
            await dead.notify(an_item())
            await eventually(lambda: dead.stats.failed_attempts >= 1)
    assert receiver.hits[0].query == "key=QuerySECRET"  # the whole URL was used...
    logged = caplog.text + "\n".join(record.getMessage() for record in caplog.records)
    assert "SECRET" not in logged  # ... and none of its path or query was logged
    assert f'HTTP Request: POST {receiver.where}/… "HTTP/1.1 500' in logged  # httpx's line, scrubbed
    assert f"Notified {receiver.where} of request" in logged
    assert f"Notifying http://127.0.0.1:{dead_port} of request" in logged


@pytest.mark.anyio
async def test_a_refusal_is_not_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="teaagent.approver.notify")
    item = an_item()
    with receiving(default=Reply(400)) as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml") as notifier:
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.dropped_refused == 1)
            assert notifier.pending == 0
    assert len(receiver.hits) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"The webhook at {receiver.where} refused the notification of request {item['request_id']} "
        "from alpha (HTTP 400 'no'); it is not retried."
    ]


@pytest.mark.anyio
async def test_a_full_queue_drops_the_oldest_waiting_request_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="teaagent.approver.notify")
    posting, oldest, middle, newest = (an_item() for _ in range(4))
    with receiving(Reply(hang=True)) as receiver:
        async with notifier_for(
            receiver, tmp_path / "node.toml", max_pending=3, attempt_timeout=WAIT
        ) as notifier:
            await notifier.notify(posting)
            await eventually(lambda: len(receiver.hits) == 1)  # being posted: it stays
            for item in (oldest, middle, newest):
                await notifier.notify(item)
            assert notifier.pending == 3
            receiver.release.set()
            await eventually(lambda: notifier.stats.delivered == 3)
    assert [hit.request_id for hit in receiver.hits] == [
        posting["request_id"],
        middle["request_id"],
        newest["request_id"],
    ]
    assert notifier.stats.dropped_full == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"The notification queue for {receiver.where} is full (3 requests): request {oldest['request_id']} "
        "from alpha, the oldest, is dropped unnotified."
    ]


@pytest.mark.anyio
async def test_aclose_stops_at_once_while_a_post_hangs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="teaagent.approver.notify")
    with receiving(Reply(hang=True)) as receiver:
        notifier = notifier_for(receiver, tmp_path / "node.toml", attempt_timeout=HANG_LIMIT)
        await notifier.notify(an_item())
        await notifier.notify(an_item())
        await eventually(lambda: len(receiver.hits) == 1)
        # The attempt would last HANG_LIMIT seconds; closing must not wait for it.
        await asyncio.wait_for(notifier.aclose(), WAIT)
        await notifier.notify(an_item())  # after close: logged, not raised, not posted
        await notifier.aclose()  # twice is fine
    assert len(receiver.hits) == 1
    assert notifier.stats.dropped_closed == 2
    messages = [r.getMessage() for r in caplog.records]
    assert f"The notifier for {receiver.where} stopped with 2 requests not notified." in messages
    assert any(message.startswith(f"The notifier for {receiver.where} is closed;") for message in messages)


@pytest.mark.anyio
async def test_an_item_queued_twice_expired_or_malformed_is_not_posted_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="teaagent.approver.notify")
    item = an_item()
    expired = an_item(expires_in=-1)
    with receiving() as receiver:
        async with notifier_for(receiver, tmp_path / "node.toml") as notifier:
            await notifier.notify(item)
            await notifier.notify(dict(item))  # the same origin and id while it is queued
            await notifier.notify(expired)
            await notifier.notify({"request_id": "x", "origin": "alpha"})  # never raises into the caller
            await notifier.notify(an_item(arguments={"n": float("nan")}))
            await eventually(lambda: notifier.stats.delivered == 1)
            assert notifier.pending == 0
    assert [hit.request_id for hit in receiver.hits] == [item["request_id"]]
    assert (notifier.stats.queued, notifier.stats.dropped_expired) == (1, 1)
    messages = [r.getMessage() for r in caplog.records]
    request_id, expires_at = expired["request_id"], expired["expires_at"]
    expired_line = (
        f"Request {request_id} from alpha expired at {moment_re(expires_at, AGO)} before it could be "
        "notified\\."
    )
    assert any(re.fullmatch(expired_line, message) for message in messages), messages
    assert "Request 'x' cannot be notified: its tool_name is not a string." in messages
    assert any(message.endswith("cannot be notified: its arguments are not JSON.") for message in messages)


def test_settings_are_checked_and_a_wrong_url_is_not_repeated(tmp_path: Path) -> None:
    def build(url: str, format: str = "json", **limits: Any) -> Notifier:
        return Notifier(settings=target(url, format), agent_id="beta", config_path=tmp_path, **limits)

    with pytest.raises(ValueError, match=r"^The notify format must be 'slack' or 'json', not 'xml'\.$"):
        build("https://hooks.example/x", "xml")
    for url in (
        "ftp://hooks.example/T0SECRET",
        "https:///T0SECRET",
        "hooks.example/T0SECRET",
        "https://hooks.example:99999/T0SECRET",
        "http://[::1/T0SECRET",
    ):
        with pytest.raises(
            ValueError, match=r"^The notify webhook_url must be an http:// or https:// URL with a host\.$"
        ):
            build(url)
    with pytest.raises(ValueError, match=r"^max_pending must be at least 1, not 0\.$"):
        build("https://hooks.example/x", max_pending=0)
    with pytest.raises(ValueError, match=r"^backoff_start must be positive, not 0\.0\.$"):
        build("https://hooks.example/x", backoff_start=0.0)
    notifier = build("https://user:pw@hooks.example:8443/T0SECRET/x?y=1")
    assert notifier.where == "https://hooks.example:8443"


@dataclass(frozen=True)
class _NodeLike:
    """Stands for ``NodeConfig``: what for_node reads of it."""

    agent_id: str
    path: Path


@pytest.mark.anyio
async def test_for_node_takes_the_id_and_configuration_path_of_the_node(tmp_path: Path) -> None:
    item = an_item()
    with receiving() as receiver:
        node = _NodeLike("gamma", tmp_path / "n.toml")
        async with Notifier.for_node(node, target(receiver.url()), **FAST) as notifier:
            await notifier.notify(item)
            await eventually(lambda: notifier.stats.delivered == 1)
    [hit] = receiver.hits
    assert hit.body["node"] == "gamma"
    assert (
        hit.body["approve_command"] == f"teaagent approvals approve {item['request_id']} --config {node.path}"
    )
