"""The approver's rules over its inbox: each round reads what is new and decides what the rules decide.

:class:`RuleRounds` runs beside the engine (:mod:`teaagent_approver._engine`), whose one decision
path (:meth:`Engine.settle`) every decision by rule takes. A round reads the inbox's news from the
node's store (:class:`teaagent.store._inbox_news.InboxNews`: the requests the relay queued for the
approver since the last round, a page at a time, and the items due for another look), builds
each as the relay hands it over (``GET /v1/inbox``'s item, ``inbox_item_view``), and decides each
pending item by the first matching ``[[approver.rules]]`` entry; ``ask`` (or no match) leaves it
to an operator and hands it to the notifier once. Each item goes through :meth:`Engine.receive`
first, as a listed one did: the store is the relay's, and no more trusted than its answers. With
nothing new, the round waits for the relay to queue a request (``XREAD BLOCK`` on the inbox
queue's stream) or for an item's next look to come due. While a backlog lasts, :meth:`RuleRounds.run`
reads and handles the next page beside the last one (``LOOKS_AT_ONCE``): the approver verifies and
signs while the relay takes the last page's decisions, instead of waiting for its answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Final

from teaagent._tasks import cancel_and_wait
from teaagent.errors import RelayError, StoreError
from teaagent.quorum import MAX_CLOCK_SKEW_SECONDS
from teaagent.relay_client import InboxItem
from teaagent.store._inbox_news import InboxNews
from teaagent.store._inbox_view import inbox_item_view
from teaagent_approver._audit import AuditWriteError
from teaagent_approver._errors import ApiError
from teaagent_approver._items import Received, item_view, matching_rule
from teaagent_approver._ledger import DecisionKind
from teaagent_approver._proposals import Outcome, Proposal

if TYPE_CHECKING:
    from teaagent.store import StoredRequest
    from teaagent_approver._engine import Engine

__all__ = ["RuleRounds"]

logger = logging.getLogger("teaagent.approver")

DEFER_SECONDS: Final = 0.5  # how soon to look again at an item another process is deciding
RETRY_START_SECONDS: Final = 0.25  # the first wait after the relay or Redis failed; doubles per failure
RETRY_CAP_SECONDS: Final = 5.0
REFUSED_RETRY_SECONDS: Final = 5.0  # how soon to look again at an item refused as the relay handed it
MAX_REMEMBERED: Final = 100_000  # inbox items whose disposition is kept in memory
# Looks that run() keeps handling at once while a backlog lasts: the next page is read, verified and
# signed while the relay takes the last page's decisions, instead of the approver waiting for them.
LOOKS_AT_ONCE: Final = 2


class RuleRounds:
    """The engine's rules applied to the inbox's news, round after round (:meth:`run`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.news = InboxNews(engine.store)
        self._skip: dict[tuple[str, str], tuple[float, int]] = {}  # ref -> (monotonic until, expires_at)
        self._due: dict[tuple[str, str], float] = {}  # ref -> monotonic time of its next look
        self._asked: dict[tuple[str, str], int] = {}  # ask items already looked at -> expires_at
        self._failures: dict[tuple[str, str], int] = {}  # ref -> relay failures in a row
        # Items decided at once across every look in flight (signatures, relay calls).
        self._gate = asyncio.Semaphore(engine.settings.concurrency)
        # Why the last finished round failed, None once one succeeds (for /ready).
        self.last_round_error: str | None = None

    async def run(self) -> None:
        """Apply the rules to the inbox until cancelled; survive the relay and Redis going away.

        As :meth:`round` after :meth:`round`, except that while a backlog lasts the next page is
        read and handled beside the last one (up to ``LOOKS_AT_ONCE`` looks at once); caught up,
        every look ends before the wait for news. A look's failure is raised by the round that
        finds it ended.
        """
        failures = 0
        looks: set[asyncio.Task[int]] = set()  # looks still handling what they read
        try:
            while True:
                try:
                    await self._overlapped_round(looks)
                    failures = 0
                    self.last_round_error = None
                except asyncio.CancelledError:
                    raise
                except (RelayError, StoreError) as exc:
                    failures += 1
                    kind = "relay" if isinstance(exc, RelayError) else "redis"
                    self.last_round_error = f"its last round failed on its {kind}: {exc}"
                    self._engine.metrics.engine_errors.labels(kind).inc()
                    log = logger.warning if failures == 1 else logger.debug  # once per outage
                    log("approver of %s waits for its %s: %s", self._engine.agent_id, kind, exc)
                    await asyncio.sleep(min(RETRY_CAP_SECONDS, RETRY_START_SECONDS * 2 ** (failures - 1)))
                except Exception as exc:
                    failures += 1
                    self.last_round_error = f"its last round failed: {exc!r}"
                    self._engine.metrics.engine_errors.labels("other").inc()
                    logger.exception("approver of %s failed a round", self._engine.agent_id)
                    await asyncio.sleep(min(RETRY_CAP_SECONDS, RETRY_START_SECONDS * 2 ** (failures - 1)))
        finally:
            for look in looks:
                look.cancel()
            for look in looks:
                with contextlib.suppress(Exception):  # its failure no longer matters: stopping
                    await cancel_and_wait(look)

    async def _overlapped_round(self, looks: set[asyncio.Task[int]]) -> None:
        """One round of :meth:`run`: read a page once a look in flight leaves room, and handle it
        in a task of its own; caught up, let every look end, then wait for news."""
        await _settle(looks, room=LOOKS_AT_ONCE - 1)
        started = time.monotonic()
        stored = await self._read()
        if stored:
            looks.add(
                asyncio.get_running_loop().create_task(
                    self._handle_read(stored, started), name="teaagent-approver-look"
                )
            )
        self._prune()
        if self.news.caught_up:
            await _settle(looks, room=0)
            await self.news.wait(self._idle_seconds())

    async def round(self) -> int:
        """One round: :meth:`look` at what is new; with nothing left to read, wait for news.

        The wait's XREAD brings the news itself (``InboxNews.wait``), and answers at once when
        requests came while this look acted: the next look needs no read of its own.

        Returns:
            How many items were acted on (recorded, finished or sent).

        Raises:
            RelayError: The relay refused or did not take a decision.
            StoreError: Redis failed.
        """
        acted = await self.look()
        if self.news.caught_up:
            await self.news.wait(self._idle_seconds())
        return acted

    async def look(self) -> int:
        """Read what is new in the inbox once and decide what the rules decide; never waits for news.

        What is new: the requests the relay queued for the approver since the last look (a page
        of them, ``InboxNews``), and those due for another look (deferred, refused, or whose
        relay failed); never the whole pending inbox, so a look costs the same whatever it holds.
        A look that found something is timed (``teaagent_approver_look_seconds``).

        Returns:
            How many items were acted on.

        Raises:
            RelayError: The relay refused or did not take a decision.
            StoreError: Redis failed.
        """
        started = time.monotonic()
        stored = await self._read()
        acted = await self._handle_read(stored, started) if stored else 0
        self._prune()
        return acted

    async def _read(self) -> list[StoredRequest]:
        """The next page of news and the items due for another look (which stay due if Redis fails)."""
        now = time.monotonic()
        due = [ref for ref, until in self._due.items() if until <= now]
        for ref in due:
            del self._due[ref]
        try:
            return await self.news.read(due)
        except BaseException:
            for ref in due:
                self._due.setdefault(ref, now)
            raise

    async def _handle_read(self, stored: list[StoredRequest], started: float) -> int:
        """Handle what a look read, as the relay would hand it over; time the look."""
        at = time.time()
        items = []
        for one in stored:
            try:
                items.append(InboxItem.from_json(inbox_item_view(one, at)))
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("inbox item %s of %s is not readable: %s", one.request_id, one.origin, exc)
        try:
            return await self.handle(items)
        finally:  # a look that failed took its time too
            self._engine.metrics.looks.observe(time.monotonic() - started)

    async def handle(self, items: list[InboxItem]) -> int:
        """Decide each listed item the rules decide, at most ``concurrency`` at once.

        Returns:
            How many items were acted on.

        Raises:
            RelayError: The relay failed (after the other items were handled).
            StoreError: Redis failed (likewise).
        """
        now = time.monotonic()
        todo: list[Received] = []
        for item in items:
            if self._skip.get((item.origin, item.request_id), (0.0, 0))[0] > now:
                continue
            try:
                todo.append(self._engine.receive(item))
            except ApiError:
                # Refused, logged and counted by receive(): left undecided. Looked at again a little
                # later, should the relay's next answer be the truth.
                self._engine.metrics.skipped.labels("refused").inc()
                self._remember((item.origin, item.request_id), _hinted_expiry(item), REFUSED_RETRY_SECONDS)
        if not todo:
            return 0

        async def one(item: Received) -> int:
            async with self._gate:
                return await self._by_rule(item)

        results = await asyncio.gather(*(one(item) for item in todo), return_exceptions=True)
        acted = 0
        failure: BaseException | None = None
        for received, result in zip(todo, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                failure = failure or result
                # Read from the news once only: looked at again after a backoff, never dropped.
                request = received.request
                self._backoff((request.origin, request.request_id), request.expires_at)
            else:
                acted += result
        if failure is not None:
            raise failure
        return acted

    def _remember(self, ref: tuple[str, str], expires_at: int, seconds: float | None) -> None:
        """Skip the item for ``seconds`` (None: for the rest of its life), then read it again."""
        until = float("inf") if seconds is None else time.monotonic() + seconds
        self._skip[ref] = (until, expires_at)
        if seconds is None:
            self._due.pop(ref, None)
        else:
            self._due[ref] = until

    async def _by_rule(self, item: Received) -> int:
        ref = (item.request.origin, item.request.request_id)
        if item.state == "withdrawn":
            self._engine.metrics.skipped.labels("withdrawn").inc()
            self._remember(ref, item.request.expires_at, None)
            return 0
        if item.settled is not None:
            self._engine.metrics.skipped.labels("settled").inc()
            self._remember(ref, item.request.expires_at, None)
            return 0
        if time.time() > item.request.expires_at:
            self._engine.metrics.skipped.labels("expired").inc()
            self._remember(ref, item.request.expires_at, None)
            return 0
        found = matching_rule(self._engine.node.approver.rules, item.request)
        if found is None or found[1].decision == "ask":
            return await self._asked_item(item)
        index, rule = found
        kind: DecisionKind = "approval" if rule.decision == "approve" else "denial"
        try:
            outcome = await self._engine.settle(
                item, Proposal(kind=kind, reason=rule.reason, by=f"rule {index}")
            )
        except ApiError as exc:
            # Expired meanwhile, or the relay refused it for good: nothing more to do for it.
            return self._undecided(item, exc)
        except AuditWriteError as exc:
            logger.error("%s", exc)
            self._backoff(ref, item.request.expires_at)
            return 0
        return self._after(ref, item.request.expires_at, outcome)

    def _undecided(self, item: Received, exc: ApiError) -> int:
        """An item this node will not decide (expired, or refused for good): said, never looked at again."""
        request = item.request
        logger.warning(
            "request %s of %s is left undecided: %s", request.request_id, request.origin, exc.message
        )
        self._remember((request.origin, request.request_id), request.expires_at, None)
        return 0

    def _after(self, ref: tuple[str, str], expires_at: int, outcome: Outcome) -> int:
        if outcome.deferred:
            self._engine.metrics.skipped.labels("deferred").inc()
            self._remember(ref, expires_at, DEFER_SECONDS)
            return 0
        if not outcome.forwarded:
            self._backoff(ref, expires_at)
            return 1 if outcome.won else 0
        self._failures.pop(ref, None)
        self._remember(ref, expires_at, None)
        return 1

    def _backoff(self, ref: tuple[str, str], expires_at: int) -> None:
        failures = self._failures.get(ref, 0) + 1
        self._failures[ref] = failures
        self._remember(ref, expires_at, min(RETRY_CAP_SECONDS, RETRY_START_SECONDS * 2 ** (failures - 1)))

    async def _asked_item(self, item: Received) -> int:
        """An item the rules leave to an operator: finish a decision recorded for it, or notify once."""
        ref = (item.request.origin, item.request.request_id)
        if ref in self._asked:
            self._remember(ref, item.request.expires_at, None)
            return 0
        # First sight in this process: an operator may have decided it through an approver whose
        # relay did not answer, and that process died since; then the decision is finished here.
        # Under the request's lock: an operator deciding it in this process right now has claimed
        # it but not yet audited it, and finishing it beside them would audit it twice.
        async with self._engine.one_at_a_time(ref):
            [(record, signature)] = await self._engine.ledger.read([ref])
            if record is not None:
                try:
                    outcome = await self._engine.finish(item, record, signature, won=False)
                except ApiError as exc:
                    return self._undecided(item, exc)
                return self._after(ref, item.request.expires_at, outcome)
        self._asked[ref] = item.request.expires_at
        self._remember(ref, item.request.expires_at, None)
        self._engine.metrics.skipped.labels("ask").inc()
        if self._engine.notifier is not None and await self._engine.ledger.mark_notified(
            item.request.origin, item.request.request_id, item.request.expires_at
        ):
            self._engine.metrics.notifications.inc()
            view = item_view(item, None, self._engine.node.approver.rules, time.time())
            try:
                await self._engine.notifier.notify(view)
            except Exception:  # the notifier must never stop a decision; it logs its own failures
                logger.exception("the notifier failed on request %s", item.request.request_id)
        return 0

    def _prune(self) -> None:
        """Forget the items that expired a while ago: they are never listed as pending again."""
        if len(self._skip) + len(self._asked) < MAX_REMEMBERED // 2:
            return
        horizon = time.time() - 2 * MAX_CLOCK_SKEW_SECONDS
        for table in (self._skip, self._asked):
            for ref in [ref for ref, value in table.items() if _expiry(value) < horizon]:
                del table[ref]
        for ref in [ref for ref in self._failures if ref not in self._skip]:
            del self._failures[ref]
        while len(self._skip) > MAX_REMEMBERED:
            del self._skip[next(iter(self._skip))]
        while len(self._asked) > MAX_REMEMBERED:
            del self._asked[next(iter(self._asked))]

    def _idle_seconds(self) -> float:
        now = time.monotonic()
        longest = self._engine.settings.poll_seconds  # one wait for news, as one long-poll was
        return max(0.01, min([longest, *(until - now for until in self._due.values())]))


def _hinted_expiry(item: InboxItem) -> int:
    """The expiry a refused item claims, only to bound how long it is remembered."""
    expires_at = item.request.get("expires_at")
    return expires_at if isinstance(expires_at, int) and not isinstance(expires_at, bool) else 0


def _expiry(value: tuple[float, int] | int) -> int:
    return value[1] if isinstance(value, tuple) else value


async def _settle(looks: set[asyncio.Task[int]], *, room: int) -> None:
    """Drop the ``looks`` that ended, raising the first failure among them, until at most ``room``
    still run (every failure is retrieved, so none is reported as never retrieved)."""
    while True:
        ended = {look for look in looks if look.done()}
        looks -= ended
        failures = [look.exception() for look in ended if not look.cancelled()]
        failure = next((exc for exc in failures if exc is not None), None)
        if failure is not None:
            raise failure
        if len(looks) <= room:
            return
        await asyncio.wait(looks, return_when=asyncio.FIRST_COMPLETED)
