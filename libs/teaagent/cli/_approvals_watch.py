"""``teaagent approvals watch``: follow the requests waiting for this node, and decide from the keyboard."""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Sequence
from typing import Final, TextIO

import typer

from teaagent._display import INVISIBLE_CATEGORIES as _INVISIBLE
from teaagent._display import long_values as _long_values
from teaagent._display import visible
from teaagent._words import time_left
from teaagent.approver_client import (
    ApprovalItem,
    ApproverClient,
    node_approver,
    resolve_request,
    signed_by,
)
from teaagent.cli._exit import EXIT_OK, fail
from teaagent.cli._inbox import (
    decide,
    decision_phrase,
    exit_code,
    left_phrase,
    node_key_of,
    one_line,
    rule_phrase,
    settled_phrase,
    show_lines,
)
from teaagent.config import NodeConfig
from teaagent.errors import ConfigError, RelayError
from teaagent.quorum import (
    shown_policy,
)
from teaagent.signing import (
    Signer,
)

# watch: how it follows the approver.
LONG_POLL_SECONDS: Final = 25.0  # one long-poll while nothing waits
REFRESH_SECONDS: Final = 1.0  # between listings while something waits (the countdown's step)
RETRY_START_SECONDS: Final = 0.5  # first pause after the approver stopped answering
RETRY_CAP_SECONDS: Final = 5.0  # longest pause between attempts, so a restart is seen quickly
REMIND_SECONDS: Final = 30  # a plain-lines watch reminds once when a request has this little left


# -- watch --------------------------------------------------------------------------------------

WATCH_HELP: Final = (
    "commands: a ID [REASON] approve, d ID REASON deny, s ID show, l list, q quit "
    "(ID may be the first characters of a request's id, if no other request shown starts with them)"
)


class Watch:
    """``approvals watch``: follow the approver's pending requests and decide from the keyboard.

    A poller thread lists the pending requests (a long-poll while none waits, a listing a second
    while some do, so their countdown moves) and reports each new one, and each that leaves the
    queue; the caller's thread runs the commands typed. When the approver stops answering the
    poller says so once, retries with a growing pause, and says when it answers again.

    A typed id names a request this watch has shown (its first characters will do when no other
    request shown, pending or settled, starts with them), and the decision carries what was shown
    of it: a request that replaced it under the same prefix is never what gets signed.
    """

    def __init__(
        self,
        node: NodeConfig,
        *,
        signer: Signer | None,
        origin: str | None,
        tool: str | None,
        emit: Callable[[str], None],
    ) -> None:
        """Prepare it; nothing runs before :meth:`start`."""
        self.node = node
        self.signer = signer
        self.origin = origin
        self.tool = tool
        self.emit = emit
        self.stop_event = threading.Event()
        self.failure: RelayError | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, ApprovalItem] = {}  # "origin/request_id" -> item, as last listed
        self._shown: dict[str, ApprovalItem] = {}  # every request announced, as it was announced
        self._reminded: set[str] = set()
        self._thread = threading.Thread(target=self._poll, name="approvals-watch", daemon=True)

    # -- the poller --------------------------------------------------------------------------

    def start(self) -> None:
        """Start following the approver."""
        self._thread.start()

    def pending(self) -> list[ApprovalItem]:
        """The pending requests as last listed, soonest to expire first."""
        with self._lock:
            return sorted(self._pending.values(), key=lambda item: (item.expires_at, item.request_id))

    def _poll(self) -> None:
        client = node_approver(self.node)
        pause = RETRY_START_SECONDS
        down = False
        try:
            while not self.stop_event.is_set():
                waiting = bool(self._pending)
                try:
                    items = client.list_requests(
                        "pending",
                        origin=self.origin,
                        tool=self.tool,
                        limit=1000,
                        wait=0.0 if waiting or down else LONG_POLL_SECONDS,  # back: say so at once
                    )
                except RelayError as exc:
                    if exc.status_code is not None and exc.status_code < 500:
                        self.failure = exc  # a wrong token or the like: retrying changes nothing
                        self.stop_event.set()
                        return
                    if not down:
                        self.emit(f"{exc.args[0].rstrip('.')}; retrying until it answers.")
                        down = True
                    self.stop_event.wait(pause)
                    pause = min(pause * 2, RETRY_CAP_SECONDS)
                    continue
                if down:
                    self.emit(f"the approver at {client.shown} answers again.")
                    down, pause = False, RETRY_START_SECONDS
                self._update(client, items)
                if waiting or self._pending:
                    self.stop_event.wait(REFRESH_SECONDS)
        finally:
            client.close()

    def _update(self, client: ApproverClient, items: Sequence[ApprovalItem]) -> None:
        now = time.time()
        listed = {f"{item.origin}/{item.request_id}": item for item in items}
        with self._lock:
            gone = [self._pending[key] for key in self._pending if key not in listed]
            new = [item for key, item in listed.items() if key not in self._pending]
            self._pending = listed
            for key, item in listed.items():
                self._shown.setdefault(key, item)  # before it is announced: a prefix then fits it too
        for item in sorted(new, key=lambda item: item.expires_at):
            for line in self.new_request_lines(item, now):
                self.emit(line)
            if item.expires_at - now <= REMIND_SECONDS:
                self._reminded.add(f"{item.origin}/{item.request_id}")  # its countdown was just shown
        for item in gone:
            self.emit(self._fate(client, item))
        for key, item in listed.items():
            left = item.expires_at - now
            if left <= REMIND_SECONDS and key not in self._reminded:
                self._reminded.add(key)
                self.emit(f"request {item.request_id} of {item.origin} expires in {time_left(left)}.")

    def new_request_lines(self, item: ApprovalItem, now: float) -> list[str]:
        """The lines that announce a new pending request."""
        lines = [
            f"new request {item.request_id} from {item.origin}: {visible(item.tool_name)} "
            f"{one_line(item.arguments, 120)}",
            f"  reason: {visible(item.reason)}" if item.reason else "  reason: (none given)",
            f"  rule: {rule_phrase(item)}",
            f"  expires in {left_phrase(item, now)}; a {item.request_id[:8]} to approve, "
            f"d {item.request_id[:8]} REASON to deny, s {item.request_id[:8]} to see it whole",
        ]
        shown = shown_policy(item.request, self.node.agent_id)
        if shown is not None:  # version 2: the rule, its terms, and the one this node counts toward
            lines.insert(3, f"  quorum: {shown.line()}")
        if any(True for _ in _long_values(item.arguments)) or len(one_line(item.arguments, 120)) >= 120:
            lines.insert(1, f"  (arguments cut; s {item.request_id[:8]} prints them whole)")
        return lines

    def _fate(self, client: ApproverClient, item: ApprovalItem) -> str:
        try:
            now_item = client.get_request(item.request_id, origin=item.origin)
        except RelayError:
            return f"request {item.request_id} of {item.origin} left the queue."
        if now_item.state == "withdrawn" and now_item.decision is None:
            return f"request {item.request_id} of {item.origin} was withdrawn by its origin."
        settled = settled_phrase(now_item, time.time())
        if settled is not None and now_item.decision is None:
            return f"request {item.request_id} of {item.origin} was {settled}."
        if now_item.state == "expired" or now_item.decision is None:
            return f"request {item.request_id} of {item.origin} expired undecided."
        return (
            f"request {item.request_id} of {item.origin}: {self.node.agent_id} "
            f"{decision_phrase(now_item, node_key_of(self.node), time.time())}."
        )

    # -- the commands ------------------------------------------------------------------------

    def shown(self) -> list[ApprovalItem]:
        """Every request this watch has announced, pending or not, as it was announced."""
        with self._lock:
            return list(self._shown.values())

    def resolve(self, client: ApproverClient, text: str) -> ApprovalItem:
        """The request ``text`` names: a full id, or a prefix of one request this watch has shown.

        Raises:
            ValueError: ``text`` is no id, or names no request shown or several.
            RelayError: A full id the approver does not know, or the approver failed.
        """
        return resolve_request(
            client, text, seen=self.shown(), origin=self.origin, among="shown by this watch"
        )

    def command(self, line: str) -> bool:
        """Run one typed command; return False when it is ``q``."""
        words = line.split()
        if not words:
            return True
        verb, rest = words[0].lower(), words[1:]
        if verb in ("q", "quit", "exit"):
            return False
        if verb in ("h", "help", "?"):
            self.emit(WATCH_HELP)
            return True
        if verb in ("l", "list"):
            pending = self.pending()
            now = time.time()
            if not pending:
                self.emit("nothing waits for a decision.")
            for item in pending:
                self.emit(
                    f"{item.request_id} {item.origin} {visible(item.tool_name)} "
                    f"{time_left(item.expires_at - now)} left  {one_line(item.arguments, 60)}"
                )
            return True
        if verb not in ("a", "approve", "d", "deny", "s", "show") or not rest:
            self.emit(f"not a command: {visible(line.strip())!r}; {WATCH_HELP}")
            return True
        reason = " ".join(rest[1:])
        with contextlib.closing(node_approver(self.node)) as client:
            try:
                shown = self.resolve(client, rest[0])
            except (ValueError, RelayError) as exc:
                self.emit(str(exc))
                return True
            if verb in ("s", "show"):
                try:
                    item = client.get_request(shown.request_id, origin=shown.origin)
                except RelayError as exc:
                    self.emit(str(exc))
                    return True
                for text in show_lines(item, self.node.agent_id, node_key=node_key_of(self.node)):
                    self.emit(text)
                return True
            deny = verb in ("d", "deny")
            if deny and not reason:
                self.emit("a denial needs a reason: d ID REASON")
                return True
            try:
                result = decide(client, self.node, shown, deny=deny, reason=reason, signer=self.signer)
            except (RelayError, ConfigError) as exc:
                # The one-shot commands end on a refusal; here it is a line, and the watch goes on.
                self.emit(str(exc))
                return True
        by = signed_by(result.by, result.key_fingerprint, node_key_of(self.node))
        self.emit(
            f"{self.node.agent_id} {result.this_node} request {result.request_id} of {result.origin}, "
            f"signed {by}; "
            f"{'forwarded' if result.forwarded else 'not forwarded yet'}; "
            f"its outcome is counted by {result.origin}."
        )
        return True


def _plain_watch(watch: Watch, stdin: TextIO) -> int:
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stdin:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="approvals-watch-input", daemon=True).start()
    watch.start()
    stdin_open = True
    while not watch.stop_event.is_set():
        try:
            line = lines.get(timeout=0.2) if stdin_open else None
        except queue.Empty:
            continue
        if line is None:
            # No more commands (a pipe or /dev/null): keep following until interrupted.
            stdin_open = False
            watch.stop_event.wait(0.2)
            continue
        if not watch.command(line):
            watch.stop_event.set()
    if watch.failure is not None:
        return fail(str(watch.failure), exit_code(watch.failure))
    return EXIT_OK


def _live_watch(watch: Watch, node: NodeConfig) -> int:  # pragma: no cover - exercised through a pty
    import termios
    import tty

    from rich.console import Console, Group
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    console = Console()
    typed: list[str] = []

    def render() -> Group:
        table = Table(title=f"waiting for {node.agent_id}", expand=False)
        for column in ("request", "origin", "tool", "left", "rule", "arguments"):
            table.add_column(column, overflow="fold" if column == "request" else "ellipsis")
        now = time.time()
        for item in watch.pending():
            rule = "ask (no rule)" if item.rule is None else f"#{item.rule.index} {item.rule.decision}"
            table.add_row(
                item.request_id,
                item.origin,
                visible(item.tool_name),
                time_left(item.expires_at - now),
                rule,
                one_line(item.arguments, 50),
            )
        return Group(table, Text(WATCH_HELP, style="dim"), Text("> " + "".join(typed)))

    descriptor = sys.stdin.fileno()
    saved = termios.tcgetattr(descriptor)
    with Live(get_renderable=render, console=console, refresh_per_second=4, transient=True) as live:
        watch.emit = lambda line: live.console.print(Text(line))
        watch.start()
        tty.setcbreak(descriptor)
        try:
            while not watch.stop_event.is_set():
                chunk = os.read(descriptor, 1024).decode("utf-8", "replace")
                if not chunk:
                    break
                for char in chunk:
                    if char in ("\r", "\n"):
                        line, typed[:] = "".join(typed), []
                        live.console.print(Text("> " + line, style="bold"))
                        if not watch.command(line):
                            watch.stop_event.set()
                            break
                    elif char in ("\x7f", "\b"):
                        del typed[-1:]
                    elif char == "\x15":  # ctrl-U: clear the line
                        typed.clear()
                    elif unicodedata.category(char) not in _INVISIBLE:
                        typed.append(char)
        finally:
            termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)
    if watch.failure is not None:
        return fail(str(watch.failure), exit_code(watch.failure))
    return EXIT_OK


def run_watch(
    node: NodeConfig, *, signer: Signer | None, origin: str | None, tool: str | None, plain: bool
) -> int:
    """Follow the node's waiting requests until the operator leaves; return the exit code."""
    lock = threading.Lock()  # the poller and the commands print from two threads

    def emit(line: str) -> None:
        with lock:
            typer.echo(line)
            sys.stdout.flush()

    follower = Watch(node, signer=signer, origin=origin, tool=tool, emit=emit)
    live = not plain and sys.stdin.isatty() and sys.stdout.isatty()
    signed_by = (
        "the node key (through the approver)" if signer is None else f"key {signer.public_key.fingerprint}"
    )
    emit(
        f"watching the requests waiting for {node.agent_id} at http://127.0.0.1:{node.approver.port}; "
        f"decisions are signed with {signed_by}."
    )
    if not live:
        emit(WATCH_HELP)
    try:
        return _live_watch(follower, node) if live else _plain_watch(follower, sys.stdin)
    except KeyboardInterrupt:
        return EXIT_OK  # ctrl-C is how a watch ends
    finally:
        follower.stop_event.set()
