"""The approver's web inbox in a real browser: Debian's chromium, headless, driven by Playwright.

Against beta's real relay and approver processes (``web_support``): a request appears live and is
approved and settles, one is denied with the keyboard alone, one is signed with an operator's own
key by the real ``ssh-keygen``, hostile arguments stay text, an expired session and a forged or
cross-site form are refused, a lost relay is said, and nothing scrolls sideways at a phone's width.

Playwright's own browser download is never used: the tests launch the system's Chromium
(``/usr/bin/chromium``, or ``$TEAAGENT_CHROMIUM``) and are skipped, in one line, without one.
``TEAAGENT_WEB_SCREENSHOTS=docs`` writes the screenshots of the README and docs/operators.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("TEAAGENT_CHROMIUM", "/usr/bin/chromium")
if importlib.util.find_spec("playwright") is None or not Path(CHROMIUM).is_file():
    pytest.skip(
        f"browser tests skipped: no Chromium at {CHROMIUM} (or no playwright); run "
        "`apt-get install -y chromium` (or set TEAAGENT_CHROMIUM) and `make test` again",
        allow_module_level=True,
    )

from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright  # noqa: E402
from relay_support import ServedApp, wait_until  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.responses import HTMLResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from web_support import (  # noqa: E402
    BIDI,
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    MEGABYTE,
    WebCluster,
    fingerprint_of,
    fixture_web_cluster,  # noqa: F401 - the module's cluster
    hostile_arguments,
    store_past_the_relay,
)

pytestmark = pytest.mark.slow

DOCS = Path(__file__).resolve().parent.parent / "docs"
WAIT_MS = 30_000  # anything the page waits on, on a loaded two-core host
# A session that ends while the test looks: long enough for a sign-in and a page to load first (3 s
# was not, with three test workers on two cores), then waited out; a host slower than that gets a
# session four times as long.
SHORT_SESSION_SECONDS = 12
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    made = browser.new_context(viewport={"width": 1200, "height": 900}, accept_downloads=True)
    made.set_default_timeout(WAIT_MS)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def cluster(web_cluster: WebCluster) -> WebCluster:
    web_cluster.ensure_running()  # a test that stopped the relay has it started again
    return web_cluster


def sign_in(page: Page, cluster: WebCluster, base: str | None = None) -> None:
    """Open the one-time link ``teaagent approvals web`` prints; land on the inbox."""
    page.goto(cluster.link(base))
    expect(page.locator("h1")).to_have_text("Requests for beta")


def screenshot(page: Page, name: str, tmp_path: Path) -> Path:
    folder = DOCS if os.environ.get("TEAAGENT_WEB_SCREENSHOTS") == "docs" else tmp_path
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    return path


def no_horizontal_scroll(page: Page) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_a_request_appears_live_is_approved_and_settles(
    cluster: WebCluster, context: BrowserContext, tmp_path: Path
) -> None:
    inbox = context.new_page()
    sign_in(inbox, cluster)
    inbox.evaluate("window.__sameDocument = true")  # gone if the page reloaded

    request = cluster.deliver(
        cluster.request(call_id="live-1", arguments={"command": "make deploy", "env": "staging"}),
        wait=False,
    )

    card = inbox.locator(f'#pending article[data-key="alpha/{request["request_id"]}"]')
    expect(card).to_be_visible()
    assert inbox.evaluate("window.__sameDocument") is True
    expect(card.locator(".countdown")).to_have_text(re.compile(r"^\d+m \d\ds left$"))
    expect(card).to_contain_text('"command": "make deploy"')
    expect(card).to_contain_text(request["payload_digest"])
    expect(card).to_contain_text("2 approvals needed from beta, gamma, counted by alpha")
    expect(card).to_contain_text("clean the build")
    shots = [screenshot(inbox, "web-inbox.png", tmp_path)]

    decide = context.new_page()
    decide.goto(cluster.url + card.locator("h3 a").get_attribute("href"))
    expect(decide.locator("h1")).to_contain_text("shell.run from alpha")
    shots.append(screenshot(decide, "web-request.png", tmp_path))
    decide.fill("#approve-reason", "staging deploys are fine")
    decide.click("button.approve")

    expect(decide.locator("#notice")).to_contain_text(
        f"Done: this node approved request {request['request_id']}"
    )
    node_key = cluster.beta.key.public_key.fingerprint
    expect(decide.locator("#signed-by")).to_contain_text(f"signed with the node key {node_key}")
    expect(decide.locator("#signed-statement")).to_contain_text('"type": "teaagent.approval"')
    shots.append(screenshot(decide, "web-decision.png", tmp_path))

    # The inbox, left open, moves it to the settled ones by itself.
    settled = inbox.locator(f'#settled article[data-key="alpha/{request["request_id"]}"]')
    expect(settled).to_contain_text("approved by beta")
    expect(inbox.locator(f'#pending article[data-key="alpha/{request["request_id"]}"]')).to_have_count(0)
    assert inbox.evaluate("window.__sameDocument") is True
    decision = cluster.decision(request["request_id"])
    assert (decision.kind, decision.reason, decision.key_fingerprint) == (
        "approval",
        "staging deploys are fine",
        node_key,
    )
    for shot in shots:
        assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_a_denial_with_a_reason_by_the_keyboard_alone(cluster: WebCluster, context: BrowserContext) -> None:
    request = cluster.deliver(cluster.request(call_id="keyboard-1"))
    page = context.new_page()
    sign_in(page, cluster)
    page.goto(f"{cluster.url}/web/requests/alpha/{request['request_id']}")
    unlabelled = page.evaluate(
        "Array.from(document.querySelectorAll('input:not([type=hidden]), textarea, select'))"
        ".filter((e) => e.labels.length === 0).map((e) => e.name)"
    )
    assert unlabelled == []

    seen: list[str] = []
    for _ in range(60):
        page.keyboard.press("Tab")
        focused: dict[str, Any] = page.evaluate(
            "(() => { const e = document.activeElement; const s = getComputedStyle(e);"
            " return {id: e.id, tag: e.tagName, text: e.textContent.trim().slice(0, 40),"
            " outline: s.outlineStyle, width: s.outlineWidth}; })()"
        )
        seen.append(focused["id"] or focused["text"])
        assert focused["outline"] != "none", focused  # the focus is visible wherever it is
        if focused["id"] == "deny-reason":
            break
    else:
        pytest.fail(f"the deny reason is never reached with Tab: {seen}")
    assert seen.index("approve-reason") < seen.index("deny-reason")
    page.keyboard.type("not on a Friday")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Deny"
    page.keyboard.press("Enter")

    expect(page.locator("#notice")).to_contain_text(f"Done: this node denied request {request['request_id']}")
    expect(page.locator("#notice")).to_be_focused()  # read first by a screen reader
    decision = cluster.decision(request["request_id"])
    assert (decision.kind, decision.reason) == ("denial", "not on a Friday")


def test_an_operators_own_key_signs_with_ssh_keygen_and_the_signature_is_uploaded(
    cluster: WebCluster, context: BrowserContext, tmp_path: Path
) -> None:
    request = cluster.deliver(cluster.request(call_id="own-key-1"))
    page = context.new_page()
    sign_in(page, cluster)
    page.goto(f"{cluster.url}/web/requests/alpha/{request['request_id']}")
    page.check("input[name=kind][value=approval]")
    page.click("text=Prepare the statement")

    name = f"teaagent-approval-{request['request_id'][:12]}.json"
    line = page.locator("#sign-line").inner_text()
    assert line == f"ssh-keygen -Y sign -n teaagent-approval -f ~/.ssh/id_ed25519 {name}"
    with page.expect_download() as download:
        page.click("#statement-link")
    statement = tmp_path / download.value.suggested_filename
    download.value.save_as(statement)
    assert statement.name == name
    assert statement.read_text() == page.locator("#statement").inner_text()

    def sign(key_path: Path) -> Path:
        (tmp_path / f"{name}.sig").unlink(missing_ok=True)  # ssh-keygen never overwrites one
        words = [str(key_path) if word == "~/.ssh/id_ed25519" else word for word in shlex.split(line)]
        subprocess.run([*words[:1], "-q", *words[1:]], cwd=tmp_path, check=True, capture_output=True)
        return tmp_path / f"{name}.sig"

    # A key nobody listed for beta: refused, nothing recorded.
    page.set_input_files("#signature", str(sign(cluster.stranger.private_path)))
    page.click("text=Submit the signed approval")
    expect(page.locator("#notice")).to_contain_text("which is not a key of beta")
    assert cluster.decision(request["request_id"]) is None

    # Back on the page a second later, it offers the very statement that was downloaded and signed.
    signed_at = json.loads(statement.read_text())["signed_at"]
    wait_until(lambda: time.time() >= signed_at + 1, timeout=5)
    page.go_back()
    expect(page.locator("#statement")).to_have_text(statement.read_text())
    page.set_input_files("#signature", str(sign(cluster.operator.private_path)))
    page.click("text=Submit the signed approval")

    key = fingerprint_of(cluster.operator)
    expect(page.locator("#notice")).to_contain_text(f"signed with an operator's own key {key}")
    expect(page.locator("#signed-by")).to_contain_text(f"signed with an operator's own key {key}")
    decision = cluster.decision(request["request_id"])
    assert (decision.kind, decision.key_fingerprint) == ("approval", key)


def test_hostile_arguments_render_as_text_and_fit_a_phone(
    cluster: WebCluster, context: BrowserContext
) -> None:
    request = store_past_the_relay(
        cluster,
        cluster.request(call_id="hostile-1", arguments=hostile_arguments(), reason=HOSTILE_IMG + BIDI),
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    sign_in(page, cluster)
    page.goto(f"{cluster.url}/web/requests/alpha/{request['request_id']}")

    arguments = page.locator("#arguments")
    expect(arguments).to_contain_text(HOSTILE_SCRIPT)
    expect(arguments).to_contain_text(json.dumps(HOSTILE_IMG)[1:-1])  # as a JSON string shows it
    expect(arguments).to_contain_text("invoice\\u202egpj.exe")
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("window.__pwned") is None
    # The megabyte is whole in the page, folded after its first characters with its length said.
    assert page.evaluate("document.getElementById('arguments').textContent.length") > MEGABYTE
    fold = arguments.locator("details.fold summary")
    expect(fold).to_have_text(re.compile(f"a string of {MEGABYTE:,} characters"))
    expect(arguments.locator("details.fold .rest")).to_be_hidden()
    fold.click()
    expect(arguments.locator("details.fold .rest")).to_be_visible()
    expect(page.locator("dl.request")).to_contain_text(HOSTILE_IMG + "invoice\\u202egpj.exe")

    page.goto(f"{cluster.url}/web/")
    card = page.locator(f'article[data-key="alpha/{request["request_id"]}"]')
    expect(card).to_contain_text(HOSTILE_SCRIPT)
    assert page.evaluate("window.__pwned") is None

    page.set_viewport_size({"width": 390, "height": 844})
    assert no_horizontal_scroll(page)
    page.goto(f"{cluster.url}/web/requests/alpha/{request['request_id']}")
    assert no_horizontal_scroll(page)
    assert page.evaluate("window.__pwned") is None
    assert [error for error in errors if "Content Security Policy" in error] == []


def test_an_expired_session_is_said_and_signs_nothing(
    web_cluster: WebCluster, context: BrowserContext
) -> None:
    web_cluster.ensure_running()
    for seconds in (SHORT_SESSION_SECONDS, 4 * SHORT_SESSION_SECONDS):
        short = web_cluster.short_session_approver(seconds)
        try:
            request = web_cluster.deliver(web_cluster.request(call_id=f"expired-session-{seconds}"))
            started = time.monotonic()
            page = context.new_page()
            sign_in(page, web_cluster, short.url)
            other = context.new_page()
            other.goto(f"{short.url}/web/requests/alpha/{request['request_id']}")
            if "/web/login" in other.url and time.monotonic() - started >= seconds:
                page.close()  # the host took the whole session to open two pages: again, longer
                other.close()
                continue
            expect(other.locator("button.approve")).to_be_visible()

            # The live inbox says so when the approver ends the session.
            expect(page.locator("#status")).to_contain_text(
                "Your session expired", timeout=WAIT_MS + seconds * 1000
            )
            other.click("button.approve")

            expect(other.locator("main")).to_contain_text(
                "Your session expired; sign in again. Nothing was done."
            )
            assert web_cluster.decision(request["request_id"]) is None
            page.click("#status a")
            expect(page.locator("main")).to_contain_text("Your session expired; sign in again.")
            return
        finally:
            short.stop()
    pytest.fail("every session ended before its second page came back")


def test_a_forged_or_cross_site_decision_is_refused(cluster: WebCluster, context: BrowserContext) -> None:
    request = cluster.deliver(cluster.request(call_id="csrf-1"))
    page = context.new_page()
    sign_in(page, cluster)
    target = f"{cluster.url}/web/requests/alpha/{request['request_id']}"
    page.goto(target)
    token = page.locator("form.form-approve input[name=csrf]").get_attribute("value")
    page.evaluate("document.querySelectorAll('input[name=csrf]').forEach((e) => { e.value = 'forged'; })")
    page.click("button.approve")
    expect(page.locator("#notice")).to_contain_text("does not carry this session's CSRF token")
    assert cluster.decision(request["request_id"]) is None

    # Another site's page, with the very token: the browser sends no cookie (SameSite=Strict).
    evil = (
        f'<!doctype html><form method="post" action="{target}/approve">'
        f'<input type="hidden" name="csrf" value="{token}">'
        '<button type="submit">Win a prize</button></form>'
    )
    app = Starlette(routes=[Route("/", lambda _request: HTMLResponse(evil))])
    with ServedApp(app, name="another site") as site:
        page.goto(site.url.replace("127.0.0.1", "localhost"))
        page.click("text=Win a prize")
        expect(page.locator("main")).to_contain_text("Nothing was done.")
    assert cluster.decision(request["request_id"]) is None


def test_the_inbox_says_when_the_approver_lost_its_relay(
    cluster: WebCluster, context: BrowserContext
) -> None:
    page = context.new_page()
    sign_in(page, cluster)
    cluster.relay.stop()
    try:
        expect(page.locator("#problem")).to_contain_text("This approver lost its relay")
    finally:
        cluster.relay.start()
    expect(page.locator("#problem")).to_be_empty()
