"""The approver's web inbox over HTTP (no browser): sign-in, cookies, headers, CSRF, escaping.

Against beta's real relay and approver processes (``web_support``); the browser's own view of the
same pages is in ``test_approver_web_browser.py``.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from relay_support import ApproverProcess, free_port, write_cluster
from web_support import (
    BIDI,
    HOSTILE_SCRIPT,
    MEGABYTE,
    WebCluster,
    csrf_of,
    fixture_web_cluster,  # noqa: F401 - the module's cluster
    hostile_arguments,
    store_past_the_relay,
)

from teaagent.cli._main import run
from teaagent.cli._serve import STOP_GRACE_SECONDS

pytestmark = pytest.mark.slow

SESSION_TRIES = (3, 12, 48)  # seconds: a session ends while the test looks (see its test)


@contextlib.contextmanager
def signed_in(cluster: WebCluster, base: str | None = None) -> Iterator[httpx.Client]:
    """A client with a session cookie, signed in with the node's token."""
    with httpx.Client(base_url=base or cluster.url, timeout=30) as client:
        answer = client.post("/web/login", data={"token": cluster.token}, headers=origin_of(client))
        assert answer.status_code == 303, answer.text
        yield client


def origin_of(client: httpx.Client) -> dict[str, str]:
    return {"Origin": str(client.base_url).rstrip("/")}


def test_every_page_is_sent_with_a_strict_content_security_policy(web_cluster: WebCluster) -> None:
    with signed_in(web_cluster) as client:
        for path in ("/web/login", "/web/", "/web/static/web.js", "/web/static/web.css", "/web/nothing-here"):
            answer = client.get(path)
            policy = answer.headers["content-security-policy"]
            assert "default-src 'none'" in policy
            assert "script-src 'self'" in policy
            assert "frame-ancestors 'none'" in policy
            assert "unsafe-inline" not in policy
            assert "unsafe-eval" not in policy
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["x-frame-options"] == "DENY"
        page = client.get("/web/").text
    # No inline script, no handler attribute, nothing from another host.
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/web/static/web.js" defer>']
    assert not re.search(r"\son[a-z]+=", page)
    assert not re.search(r"(src|href)=\"(https?:)?//", page)


def test_the_pages_need_a_session_and_the_token_gives_one_as_an_httponly_strict_cookie(
    web_cluster: WebCluster,
) -> None:
    with httpx.Client(base_url=web_cluster.url, timeout=30) as client:
        assert client.get("/web/").headers["location"] == "/web/login"
        assert client.get("/web/events").status_code == 401
        wrong = client.post("/web/login", data={"token": "not-the-token"}, headers=origin_of(client))
        assert wrong.status_code == 401
        assert "not this node&#x27;s token" in wrong.text
        assert "set-cookie" not in wrong.headers

        right = client.post("/web/login", data={"token": web_cluster.token}, headers=origin_of(client))

        assert (right.status_code, right.headers["location"]) == (303, "/web/")
        cookie = right.headers["set-cookie"]
        assert cookie.startswith("teaagent_web=")
        attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/web"} <= attributes
        assert "secure" not in attributes  # plain HTTP on loopback: a Secure cookie would never come back
        assert web_cluster.token not in cookie
        assert client.get("/web/").status_code == 200


def test_a_one_time_link_signs_in_once(web_cluster: WebCluster) -> None:
    assert httpx.post(f"{web_cluster.url}/web/links", timeout=10).status_code == 401
    link = web_cluster.link()
    code = link.split("#code=", 1)[1]
    assert link.startswith(f"{web_cluster.url}/web/login#code=")
    with httpx.Client(base_url=web_cluster.url, timeout=30) as first:
        assert first.post("/web/login", data={"code": code}, headers=origin_of(first)).status_code == 303
        assert first.get("/web/").status_code == 200
    with httpx.Client(base_url=web_cluster.url, timeout=30) as second:
        again = second.post("/web/login", data={"code": code}, headers=origin_of(second))
        assert again.status_code == 401
        assert "used already or expired" in again.text


def test_sign_in_from_another_site_is_refused(web_cluster: WebCluster) -> None:
    with httpx.Client(base_url=web_cluster.url, timeout=30) as client:
        answer = client.post(
            "/web/login", data={"token": web_cluster.token}, headers={"Origin": "http://evil.test"}
        )
        assert answer.status_code == 403
        assert "set-cookie" not in answer.headers


def test_a_decision_without_this_sessions_csrf_token_is_refused_and_nothing_is_signed(
    web_cluster: WebCluster,
) -> None:
    request = web_cluster.deliver(web_cluster.request(call_id="csrf-http"))
    path = f"/web/requests/alpha/{request['request_id']}"
    with signed_in(web_cluster) as client:
        page = client.get(path).text
        token = csrf_of(page)
        form = {
            "reason": "looks fine",
            "expect_tool_name": request["tool_name"],
            "expect_payload_digest": request["payload_digest"],
        }
        missing = client.post(f"{path}/approve", data=form, headers=origin_of(client))
        wrong = client.post(
            f"{path}/approve", data={**form, "csrf": token[:-2] + "xx"}, headers=origin_of(client)
        )
        elsewhere = client.post(
            f"{path}/approve", data={**form, "csrf": token}, headers={"Origin": "http://evil.test"}
        )
        for answer in (missing, wrong, elsewhere):
            assert answer.status_code == 403
            assert "nothing was done" in answer.text
        assert web_cluster.decision(request["request_id"]) is None

        done = client.post(f"{path}/approve", data={**form, "csrf": token}, headers=origin_of(client))

        assert done.status_code == 200, done.text
        assert "Done: this node approved" in done.text
    decision = web_cluster.decision(request["request_id"])
    assert (decision.kind, decision.by, decision.reason) == ("approval", "operator", "looks fine")


def test_a_request_that_changed_since_the_page_is_not_signed(web_cluster: WebCluster) -> None:
    request = web_cluster.deliver(web_cluster.request(call_id="changed-http"))
    path = f"/web/requests/alpha/{request['request_id']}"
    with signed_in(web_cluster) as client:
        token = csrf_of(client.get(path).text)
        answer = client.post(
            f"{path}/approve",
            data={
                "csrf": token,
                "expect_tool_name": "fs.read",
                "expect_payload_digest": request["payload_digest"],
            },
            headers=origin_of(client),
        )
    assert answer.status_code == 409
    assert "not the request the operator confirmed" in answer.text
    assert web_cluster.decision(request["request_id"]) is None


def test_a_request_id_with_a_trailing_newline_is_no_request_not_a_relay_that_disagrees(
    web_cluster: WebCluster,
) -> None:
    request = web_cluster.deliver(web_cluster.request(call_id="newline-http"))
    request_id = request["request_id"]
    with signed_in(web_cluster) as client:
        assert client.get(f"/web/requests/alpha/{request_id}").status_code == 200
        for path in (f"/web/requests/alpha/{request_id}%0A", f"/web/requests/alpha%0A/{request_id}"):
            answer = client.get(path)
            assert answer.status_code == 404, (path, answer.status_code)
            assert "There is no such request" in answer.text
            assert "disagree" not in answer.text


def test_a_statement_time_of_other_digits_than_ascii_is_refused_in_our_words(web_cluster: WebCluster) -> None:
    request = web_cluster.deliver(web_cluster.request(call_id="superscript-http"))
    path = f"/web/requests/alpha/{request['request_id']}/statement"
    with signed_in(web_cluster) as client:
        # str.isdigit takes "²" and "٣", which int() refuses in Python's own words.
        for at in ("\u00b2", "\u0663", "x"):
            answer = client.get(path, params={"kind": "approval", "at": at})
            assert answer.status_code == 422, (at, answer.status_code)
            assert "is not a Unix time" in answer.text
            assert "invalid literal" not in answer.text


def test_a_sign_in_form_that_cannot_be_read_is_refused_as_a_form_not_as_json(web_cluster: WebCluster) -> None:
    with httpx.Client(base_url=web_cluster.url, timeout=30) as client:
        answer = client.post(
            "/web/login",
            content=b"garbage",
            headers={"Content-Type": "multipart/form-data", **origin_of(client)},
        )
    assert answer.status_code == 400
    assert answer.json()["message"] == (
        "The request body could not be read as the JSON or the form its content type names."
    )


def test_a_denial_needs_a_reason(web_cluster: WebCluster) -> None:
    request = web_cluster.deliver(web_cluster.request(call_id="deny-http"))
    path = f"/web/requests/alpha/{request['request_id']}"
    with signed_in(web_cluster) as client:
        token = csrf_of(client.get(path).text)
        answer = client.post(f"{path}/deny", data={"csrf": token, "reason": "  "}, headers=origin_of(client))
    assert answer.status_code == 422
    assert "needs a reason" in answer.text
    assert web_cluster.decision(request["request_id"]) is None


def test_hostile_arguments_are_text_on_every_page(web_cluster: WebCluster) -> None:
    request = store_past_the_relay(
        web_cluster,
        web_cluster.request(
            call_id="hostile-http", arguments=hostile_arguments(), reason=HOSTILE_SCRIPT + BIDI
        ),
    )
    with signed_in(web_cluster) as client:
        deadline = time.monotonic() + 30
        while (page := client.get(f"/web/requests/alpha/{request['request_id']}")).status_code != 200:
            assert time.monotonic() < deadline, page.text
        inbox = client.get("/web/").text
    for text in (page.text, inbox):
        assert "<script>window" not in text
        assert "<img" not in text
        assert "&lt;script&gt;window.__pwned" in text
        assert "&lt;img src=x onerror=" in text
        assert "\u202e" not in text
        assert "invoice\\u202egpj.exe" in text
        # The megabyte is all there (folded after its first characters, never cut).
        assert text.count("A") >= MEGABYTE
        assert f"a string of {MEGABYTE:,} characters" in text
    assert f"blob is {MEGABYTE:,} characters long" in page.text


def test_an_expired_session_sends_the_browser_to_sign_in_again(web_cluster: WebCluster) -> None:
    # A session short enough to wait out, and long enough for the sign-in and the first page; on a
    # host so loaded that the session ended before the first page came back, again with a longer one.
    for seconds in SESSION_TRIES:
        short = web_cluster.short_session_approver(seconds)
        try:
            started = time.monotonic()
            with signed_in(web_cluster, short.url) as client:
                first = client.get("/web/")
                if first.status_code != 200 and time.monotonic() - started >= seconds:
                    continue
                token = csrf_of(first.text)
                deadline = time.monotonic() + 30 + seconds
                while (answer := client.get("/web/")).status_code == 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
                assert answer.headers["location"] == "/web/login?expired=1"
                assert "Your session expired" in client.get("/web/login?expired=1").text
                refused = client.post("/web/logout", data={"csrf": token}, headers=origin_of(client))
                assert refused.status_code == 401
                assert "Your session expired" in refused.text
                return
        finally:
            short.stop()
    pytest.fail(f"every session ({SESSION_TRIES} s) ended before its first page came back")


def test_approvals_web_prints_a_one_time_link_and_opens_no_browser_without_a_desktop(
    web_cluster: WebCluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr("webbrowser.open", lambda url: opened.append(url) or True)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)

    code = run(["approvals", "web", "--config", str(web_cluster.beta.config_path)])

    out = capsys.readouterr().out
    assert code == 0
    link = re.search(r"(http://127\.0\.0\.1:\d+/web/login#code=\S+)", out)
    assert link, out
    assert opened == []
    with httpx.Client(base_url=web_cluster.url, timeout=30) as client:
        code_value = link.group(1).split("#code=")[1]
        assert (
            client.post("/web/login", data={"code": code_value}, headers=origin_of(client)).status_code == 303
        )

    monkeypatch.setenv("DISPLAY", ":0")
    assert run(["approvals", "web", "--config", str(web_cluster.beta.config_path)]) == 0
    assert len(opened) == 1
    assert "#code=" in opened[0]


def test_an_open_inbox_does_not_hold_the_approver_up_on_sigterm(web_cluster: WebCluster) -> None:
    process = ApproverProcess(
        web_cluster.beta, web_cluster.approver.log_path.parent, port=free_port()
    ).start()
    streamed = threading.Event()

    def follow() -> None:
        with (
            contextlib.suppress(httpx.HTTPError),
            signed_in(web_cluster, process.url) as client,
            client.stream("GET", "/web/events", timeout=60) as events,
        ):
            for line in events.iter_lines():
                if line.startswith("event: inbox"):
                    streamed.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        assert streamed.wait(30), "the inbox's event stream sent nothing"
        assert process.process is not None
        started = time.monotonic()
        process.process.terminate()
        assert process.process.wait(timeout=20) == 0
        # Its stream ended when the approver was told to stop, not when uvicorn's grace ran out.
        assert time.monotonic() - started < STOP_GRACE_SECONDS
    finally:
        process.stop()
    reader.join(timeout=20)
    assert not reader.is_alive()


def test_approvals_web_without_an_approver_names_the_command_that_starts_it(
    tmp_path: Path, redis_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = write_cluster(tmp_path, ["alpha", "beta"], redis_url=redis_server, prefix="test:web-none")

    code = run(["approvals", "web", "--no-browser", "--config", str(nodes["beta"].config_path)])

    err = capsys.readouterr().err
    assert code == 1
    assert err == (
        f"teaagent: the approver at http://127.0.0.1:{nodes['beta'].approver_port} does not answer; start it "
        f"with `teaagent approver serve --config {nodes['beta'].config_path}`.\n"
    )
