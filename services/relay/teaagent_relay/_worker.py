"""The delivery worker: claims queued deliveries and POSTs them to the peers' relays.

At least once: an entry is acknowledged only after the peer answered 2xx, so a relay killed
between claiming and acknowledging leaves it pending, and the next claim of any consumer takes it
over once it has been idle ``delivery_min_idle_seconds``. Receivers are idempotent (a request
stored twice is one request, a decision counted twice counts once).

The deliveries due to one peer at the same moment go out together, in one ``POST /v1/deliveries``
(``_batched.py`` serves it), each answered there as its own call; what each delivery then does
with its answer (acknowledged, retried, given up) is what it would do with its own call's. A lone
delivery goes out as its own call, at once; the ones that come while a batch is out wait for it
and go as the next (``teaagent._batch.Coalescer``). A batch answered 5xx, 408, 425 or 429 is
that answer for each of its deliveries (retried later). A peer whose relay answers a batch
otherwise, or without a result for each delivery (404 or 405: an older relay without the route),
gets each delivery of it, and every later one, as its own call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from teaagent._batch import Coalescer
from teaagent._http import HTTPPool, NoAnswer, http_pool
from teaagent._json import JSONDepthError, check_json_depth, parse_json
from teaagent._tasks import cancel_and_wait
from teaagent.errors import StoreError
from teaagent.store import CONSUMER_RETENTION_SECONDS, Delivery, DeliveryStateName
from teaagent_relay._batched import BATCH_DEPTH
from teaagent_relay._models import MAX_DELIVERY_BATCH
from teaagent_relay._relay import Relay
from teaagent_relay._settings import MAX_BODY_BYTES

if TYPE_CHECKING:
    import httpx

__all__ = ["CLAIM_BATCH", "DeliveryWorker", "consumer_name"]

logger = logging.getLogger("teaagent.relay")

CLAIM_BATCH: Final = 32  # deliveries claimed at once; a burst of requests fans out in parallel
# Deliveries in flight at once in a running worker: a claim goes out as soon as there is room,
# not once a whole batch has ended (a batch waited for its slowest peer while the queue grew).
MAX_IN_FLIGHT: Final = 128
CLAIM_BLOCK_MS: Final = 2000  # one blocking read; the store caps it under its socket timeout anyway
MAX_DELIVERY_TIMEOUT: Final = 10.0  # seconds for one POST; a peer relay answers in milliseconds
STORE_BACKOFF_START: Final = 0.25  # seconds to wait after Redis failed, doubling per failure
STORE_BACKOFF_CAP: Final = 5.0
_TEMPORARY: Final = frozenset({408, 425, 429})  # 4xx answers that a later attempt may turn into 2xx
PRUNE_EVERY_SECONDS: Final = 600.0  # how often a worker removes the consumer names of dead processes
SWEEP_EVERY_SECONDS: Final = 60.0  # how often it removes inbox entries that no longer wait for anyone
BATCH_PATH: Final = "/v1/deliveries"
_BATCH_HEAD: Final = b'{"deliveries":['
_BATCH_TAIL: Final = b"]}"


def consumer_name() -> str:
    """The consumer name of this process in the queue's group: ``<hostname>-<pid>``."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _refusal(status: int, answer: bytes) -> str:
    """The peer's reason for a refusal: its ``ErrorOut``, else the start of its answer.

    Raises:
        JSONDepthError: The answer nests arrays and objects deeper than ``MAX_JSON_DEPTH``.
    """
    check_json_depth(answer, what="The answer")
    try:
        body = json.loads(answer)
        return f"{body['error']}: {body['message']}"
    except (ValueError, KeyError, TypeError):
        text = answer[:200].decode("utf-8", "replace")
        try:
            return text or HTTPStatus(status).phrase
        except ValueError:
            return "no reason given"


class DeliveryWorker:
    """Delivers the ``deliveries`` queue of one relay until cancelled."""

    def __init__(
        self,
        relay: Relay,
        *,
        consumer: str | None = None,
        min_idle_seconds: float,
        transport: httpx.AsyncBaseTransport | None = None,
        consumer_retention_seconds: float = CONSUMER_RETENTION_SECONDS,
        batches: bool = True,
    ) -> None:
        self.relay = relay
        self.consumer = consumer or consumer_name()
        self.consumer_retention_seconds = consumer_retention_seconds
        # Under the min-idle time, so a live worker's entry is never taken over while it delivers it.
        timeout = min(MAX_DELIVERY_TIMEOUT, min_idle_seconds / 2)
        self._timeout = timeout
        # Peers' https:// relays are verified against [tls] ca when set, else the public CAs.
        self._verify = relay.config.tls.client_verify()
        # Deliveries go out through one pool per peer relay, as large as the deliveries in
        # flight (teaagent._http); ``transport`` (tests: an app in the same process) is httpx's.
        self._peers: dict[str, HTTPPool] = {}
        self._transport = transport
        # The deliveries due to one peer at one moment, sent together (one coalescer per peer).
        self._batches: dict[str, Coalescer[_Call, tuple[int, bytes]]] = {}
        self._no_batches: set[str] = set()  # peers' relays that have no POST /v1/deliveries
        self._batching = batches  # off: each delivery its own call (TEAAGENT_RELAY_DELIVERY_BATCHES=0)

    async def aclose(self) -> None:
        """Close the connections to the peers."""
        for peer in self._peers.values():
            await peer.aclose()
        self._peers.clear()
        self._batches.clear()

    async def _post(self, base_url: str, path: str, body: object, payload: bytes) -> tuple[int, bytes]:
        """POST ``body`` as JSON to ``path`` of a peer relay, alone or in a batch; its status and answer.

        ``payload`` is the queued delivery (``{"path", "body"}``), as a batch carries it.

        Raises:
            NoAnswer: The peer's relay did not answer.
        """
        call = _Call(path, body, payload)
        if not self._batching or base_url in self._no_batches:
            return await self._post_alone(base_url, call)
        batches = self._batches.get(base_url)
        if batches is None:

            async def send(calls: list[_Call]) -> list[_Answer]:
                return await self._post_many(base_url, calls)

            batches = self._batches[base_url] = Coalescer(
                send, "teaagent-relay-delivery-batch", max_batch=MAX_DELIVERY_BATCH
            )
        return await batches.call(call)

    async def _post_many(self, base_url: str, calls: list[_Call]) -> list[_Answer]:
        """The calls to one peer of one moment: one ``POST /v1/deliveries`` for as many as its body
        limit holds, each at once; a call alone as its own call."""
        chunks: list[list[_Call]] = []
        size = 0  # the bytes of the last chunk's batch
        for call in calls:
            grown = size + len(call.payload) + 1  # and its comma
            if not chunks or grown > MAX_BODY_BYTES:
                chunks.append([call])
                size = len(_BATCH_HEAD) + len(_BATCH_TAIL) + len(call.payload)
            else:
                chunks[-1].append(call)
                size = grown
        return await _gathered([(len(chunk), self._post_chunk(base_url, chunk)) for chunk in chunks])

    async def _post_chunk(self, base_url: str, calls: list[_Call]) -> list[_Answer]:
        """One batch's calls, sent in one POST (a call alone, as its own call).

        Raises:
            NoAnswer: The peer's relay did not answer the batch.
        """
        if len(calls) == 1:
            return [await self._post_alone(base_url, calls[0])]
        if base_url in self._no_batches:  # learnt while this batch waited
            return await self._each_alone(base_url, calls)
        data = _BATCH_HEAD + b",".join(call.payload for call in calls) + _BATCH_TAIL
        status, answer = await self._send(base_url, BATCH_PATH, data)
        if status >= 500 or status in _TEMPORARY:
            return [(status, answer)] * len(calls)  # each retried, as its own call would be
        answers = _batch_answers(answer, len(calls)) if status == 200 else None
        if answers is not None:
            return answers
        # A relay without the route (404, 405: an older one), one that reads batches otherwise, or
        # one that answers without a result for each: each delivery alone, now and from now on.
        self._no_batches.add(base_url)
        logger.log(
            logging.INFO if status in (404, 405) else logging.WARNING,
            "%s answered a batch of deliveries %s; it gets each delivery as its own call from now on",
            base_url,
            status if status != 200 else "without a result for each",
        )
        return await self._each_alone(base_url, calls)

    async def _each_alone(self, base_url: str, calls: list[_Call]) -> list[_Answer]:
        return await _gathered([(1, self._post_chunk(base_url, [call])) for call in calls])

    async def _post_alone(self, base_url: str, call: _Call) -> tuple[int, bytes]:
        """One delivery as its own call.

        Raises:
            NoAnswer: The peer's relay did not answer.
        """
        return await self._send(base_url, call.path, json.dumps(call.body, separators=(",", ":")).encode())

    async def _send(self, base_url: str, path: str, data: bytes) -> tuple[int, bytes]:
        """POST ``data`` (JSON) to ``path`` of a peer relay; its status and answer.

        Raises:
            NoAnswer: The peer's relay did not answer.
        """
        peer = self._peers.get(base_url)
        if peer is None:
            peer = self._peers[base_url] = http_pool(
                base_url,
                headers={"User-Agent": "teaagent-relay"},
                connections=MAX_IN_FLIGHT,  # a delivery never waits for a connection
                timeout=self._timeout,
                verify=self._verify,
                transport=self._transport,
            )
        try:
            return await peer.post(path, data)
        except ValueError as exc:  # a peer's URL that is not an http(s) URL
            raise NoAnswer(str(exc)) from exc

    async def run(self) -> None:
        """Claim and deliver until cancelled; failures (Redis down) are waited out with a backoff.

        Beside the deliveries, a housekeeping task removes the consumer names that dead relay
        processes left in the queue's group (every ``PRUNE_EVERY_SECONDS``) and the inbox entries
        whose request was decided or expired (every ``SWEEP_EVERY_SECONDS``, and page after page
        while it finds full ones); its failures are logged and never hold a delivery up.
        """
        housekeeping = asyncio.get_running_loop().create_task(
            self._housekeep(), name="teaagent-relay-housekeeping"
        )
        try:
            await self._deliver_forever()
        finally:
            await cancel_and_wait(housekeeping)

    async def _deliver_forever(self) -> None:
        failures = 0
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    await self._claim_into(in_flight)
                    failures = 0
                except Exception as exc:  # Redis down, or a bug: the worker must outlive both
                    failures += 1
                    delay = min(STORE_BACKOFF_CAP, STORE_BACKOFF_START * 2 ** min(failures - 1, 10))
                    if failures == 1:
                        if isinstance(exc, StoreError):
                            logger.warning("delivery worker: %s; retrying", exc)
                        else:
                            logger.exception("delivery worker failed; retrying")
                    await asyncio.sleep(delay)
        finally:
            for task in list(in_flight):
                await cancel_and_wait(task)

    async def _claim_into(self, in_flight: set[asyncio.Task[None]]) -> None:
        """Claim as many deliveries as there is room for and start each; wait for room when full.

        Raises:
            StoreError: Redis failed (the claim).
        """
        room = MAX_IN_FLIGHT - len(in_flight)
        if room <= 0:
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            return
        batch = await self.relay.deliveries.claim(self.consumer, min(CLAIM_BATCH, room), CLAIM_BLOCK_MS)
        loop = asyncio.get_running_loop()
        for delivery in batch:
            task = loop.create_task(
                self._deliver_alone(delivery), name=f"teaagent-delivery-{delivery.entry_id}"
            )
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

    async def _deliver_alone(self, delivery: Delivery) -> None:
        """``deliver`` in a task of its own: a failure is logged, and the entry stays pending.

        Its entry is then taken over by the next claim once idle ``delivery_min_idle_seconds``.
        """
        try:
            await self.deliver(delivery)
        except StoreError as exc:
            logger.warning(
                "delivery %s to %s: %s; it is taken over later", delivery.entry_id, delivery.target, exc
            )
        except Exception:
            logger.exception(
                "delivery %s to %s failed; it is taken over later", delivery.entry_id, delivery.target
            )

    async def _housekeep(self) -> None:
        next_prune = next_sweep = 0.0
        while True:
            now = time.monotonic()
            if now >= next_prune:
                next_prune = now + PRUNE_EVERY_SECONDS
                try:
                    removed = await self.relay.deliveries.prune_consumers(
                        self.consumer, min_idle_seconds=self.consumer_retention_seconds
                    )
                    if removed:
                        logger.info("removed idle delivery consumers: %s", ", ".join(removed))
                except Exception as exc:  # the next round tries again
                    logger.warning("pruning delivery consumers failed: %s", exc)
            if now >= next_sweep:
                next_sweep = now + SWEEP_EVERY_SECONDS
                try:
                    await self.relay.sweep_inbox_queue()
                    if self.relay.inbox_sweep_behind:
                        next_sweep = now  # a full page: the next one now, not a minute later
                except Exception as exc:
                    logger.warning("sweeping the inbox queue failed: %s", exc)
            await asyncio.sleep(max(0.0, min(next_prune, next_sweep) - time.monotonic()))

    async def run_once(self, block_ms: int = CLAIM_BLOCK_MS) -> int:
        """Claim one batch (blocking up to ``block_ms`` when none is ready) and deliver it, all of it.

        A step for tests and tools; ``run`` instead keeps up to ``MAX_IN_FLIGHT`` deliveries
        going and claims more as each ends.

        Returns:
            How many deliveries were handled.

        Raises:
            StoreError: Redis failed.
        """
        batch = await self.relay.deliveries.claim(self.consumer, CLAIM_BATCH, block_ms)
        if batch:
            await asyncio.gather(*(self.deliver(delivery) for delivery in batch))
        return len(batch)

    async def deliver(self, delivery: Delivery) -> None:
        """POST one delivery, then ack it, schedule a retry, or dead-letter it.

        A delivery of one of this node's own requests to a peer's relay is also noted on the
        request (``RequestBook.record_delivery``), so that its origin's user sees who received it
        and who could not be reached (``GET /v1/requests/{id}``).

        Raises:
            StoreError: Redis failed (the entry stays pending and is taken over later).
        """
        metrics = self.relay.metrics
        peer = self.relay.config.peers.get(delivery.target)
        if peer is None:
            await self._dead(delivery, f"{delivery.target} is not a configured peer of this node")
            return
        try:
            payload = json.loads(delivery.payload)
            path, body = payload["path"], payload["body"]
            url = peer.relay_url.rstrip("/") + path
        except (ValueError, KeyError, TypeError):
            await self._dead(delivery, "the queued delivery is not a JSON object with path and body")
            return
        own = _is_own_request(payload, self.relay.agent_id)
        if own and delivery.attempts and await self.relay.withdrawn_here(delivery.request_id):
            # Withdrawn while this peer was out of reach: it never needs the request. Noted as given
            # up, so that its withdrawal, answered 404 there, ends too (below). Only retries ask: a
            # first attempt leaves right after the submission, before any withdrawal.
            await self.relay.deliveries.ack(delivery)
            metrics.deliveries.labels("withdrawn").inc()
            await self._note(delivery, "given_up", f"withdrawn before it reached {delivery.target}")
            return
        try:
            status, answer = await self._post(peer.relay_url, path, body, delivery.payload)
        except NoAnswer as exc:
            await self._retry(
                delivery, f"{delivery.target}'s relay at {url} is unreachable: {exc.detail}", own=own
            )
            return
        if 200 <= status < 300:
            if own:  # acked, then noted: sent together, in that order, in one batch of the store's
                await asyncio.gather(
                    self.relay.deliveries.ack(delivery), self._note(delivery, "delivered", None)
                )
            else:
                await self.relay.deliveries.ack(delivery)
            metrics.deliveries.labels("ok").inc()
            return
        try:
            error = f"{delivery.target}'s relay at {url} answered {status} {_refusal(status, answer)}"
        except JSONDepthError as exc:
            # No relay answers that (an ErrorOut is flat): a hostile or broken peer, which another
            # attempt would only feed. Given up at once, whatever the status.
            await self._dead(
                delivery,
                f"{delivery.target}'s relay at {url} answered {status} with JSON nested more than "
                f"{exc.limit} levels deep",
                own=own,
            )
            return
        notice = _own_notice(payload, self.relay.agent_id)
        if status == 404 and notice is not None:
            await self._unknown_there(delivery, error, notice)
        elif status >= 500 or status in _TEMPORARY:
            await self._retry(delivery, error, own=own)
        else:
            await self._dead(delivery, error, own=own)

    async def _unknown_there(self, delivery: Delivery, error: str, notice: str) -> None:
        """A peer answered 404 to the withdrawal or the settlement (``notice``) of one of this
        node's requests.

        Either the notice overtook its request (both are delivered concurrently, and a slow or
        returning peer may store the request after the notice was refused), or the request never
        reached that peer. The first must not leave the peer offering a request nobody waits for,
        so the notice is retried until the request's own delivery to that peer is known to have
        ended without reaching it (given up, or dropped once withdrawn), or it expires.

        Raises:
            StoreError: Redis failed.
        """
        stored = await self.relay.store.requests.get(delivery.request_id)
        state = stored.deliveries.get(delivery.target) if stored is not None else None
        if stored is None or (state is not None and state.state == "given_up"):
            await self.relay.deliveries.ack(delivery)  # the peer never had it: nothing to tell it
            self.relay.metrics.deliveries.labels(notice).inc()
            return
        await self._retry(delivery, f"{error} (the request may still be on its way there)")

    async def _retry(self, delivery: Delivery, error: str, *, own: bool = False) -> None:
        result = await self.relay.deliveries.retry_later(delivery, error)
        if result.action == "retry":
            self.relay.metrics.retries.inc()
        elif result.action == "dead":
            self.relay.metrics.deliveries.labels("dead").inc()
            logger.warning("delivery %s to %s given up: %s", delivery.entry_id, delivery.target, error)
        if own and result.action != "gone":
            await self._note(delivery, "failing" if result.action == "retry" else "given_up", error)

    async def _dead(self, delivery: Delivery, error: str, *, own: bool = False) -> None:
        logger.warning("delivery %s to %s refused for good: %s", delivery.entry_id, delivery.target, error)
        result = await self.relay.dead_letters.retry_later(delivery, error)
        if result.action == "dead":
            self.relay.metrics.deliveries.labels("dead").inc()
        if own and result.action != "gone":
            await self._note(delivery, "given_up", error)

    async def _note(self, delivery: Delivery, state: DeliveryStateName, error: str | None) -> None:
        """Record the attempt on the request; a failure here is logged, never the delivery's."""
        try:
            await self.relay.store.requests.record_delivery(
                delivery.request_id, delivery.target, state=state, attempts=delivery.attempts + 1, error=error
            )
        except (StoreError, ValueError) as exc:
            logger.warning("the delivery state of request %s is not recorded: %s", delivery.request_id, exc)


@dataclass(frozen=True)
class _Call:
    """One delivery's call: its path and body, and the queued delivery that a batch carries."""

    path: str
    body: Any
    payload: bytes


_Answer = tuple[int, bytes] | Exception  # a call's status and answer, or why it has none


async def _gathered(parts: list[tuple[int, Coroutine[Any, Any, list[_Answer]]]]) -> list[_Answer]:
    """The answers of each part (how many calls it sends, and the send), at once and in order; a
    send that raised gives its error to each of its calls."""
    sent = await asyncio.gather(*(send for _count, send in parts), return_exceptions=True)
    answers: list[_Answer] = []
    for (count, _send), result in zip(parts, sent, strict=True):
        if not isinstance(result, BaseException):
            answers.extend(result)
        elif isinstance(result, Exception):
            answers.extend([result] * count)
        else:
            raise result
    return answers


def _batch_answers(answer: bytes, count: int) -> list[_Answer] | None:
    """Each delivery's status and answer from a batch's, or None: not ``count`` results."""
    try:
        results = parse_json(answer, limit=BATCH_DEPTH, what="The answer")["results"]
        if not isinstance(results, list) or len(results) != count:
            return None
        answers: list[_Answer] = []
        for result in results:
            status = result["status"]
            if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
                return None
            answers.append((status, json.dumps(result["body"], separators=(",", ":")).encode()))
    except (ValueError, KeyError, TypeError, JSONDepthError):
        return None
    return answers


def _is_own_request(payload: dict[str, object], agent_id: str) -> bool:
    """True for the fan-out of one of this node's own requests (not a decision sent to an origin)."""
    body = payload.get("body")
    request = body.get("request") if isinstance(body, dict) else None
    return (
        payload.get("path") == "/v1/inbox" and isinstance(request, dict) and request.get("origin") == agent_id
    )


def _own_notice(payload: dict[str, object], agent_id: str) -> str | None:
    """``withdrawn`` for the withdrawal of one of this node's own requests sent to a peer's relay,
    ``settled`` for its settlement; None for anything else."""
    body = payload.get("body")
    path = payload.get("path")
    if not (isinstance(path, str) and path.startswith("/v1/inbox/") and isinstance(body, dict)):
        return None
    statement = body.get("statement")
    if path.endswith("/withdrawal") and isinstance(statement, dict) and statement.get("origin") == agent_id:
        return "withdrawn"
    if path.endswith("/settled") and body.get("origin") == agent_id:
        return "settled"
    return None
