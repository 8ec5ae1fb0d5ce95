"""The relay's origin side: this node's own requests, stored, fanned out to the peers, and counted.

Its agent submits a signed request (``POST /v1/requests``); the relay stores it, queues it for
every peer's relay, counts the peers' signed decisions as they arrive (PROTOCOL.md "Counting",
rules 1 to 4 here, the rest in the store's counting script), and answers the outcome, long-polled.
An approved or denied request's evidence goes to the peers that did not decide it; a withdrawal,
signed by this node's key, to every peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from teaagent._canonical import canonical
from teaagent._reload import Trust
from teaagent._tasks import cancel_and_wait
from teaagent.errors import RequestConflictError, RequestNotFoundError, StoreError
from teaagent.quorum import build_certificate, is_expired, request_policy, request_problem
from teaagent.store import DecisionResult, StoredRequest
from teaagent_relay._base import MAX_WAIT_SECONDS, RelayBase, delivery, envelope, redis_failures, whose_keys
from teaagent_relay._errors import ApiError
from teaagent_relay._protocol import (
    check_request_signature,
    check_statement,
    sentence,
    verify_decision,
)
from teaagent_relay._settings import Settings
from teaagent_relay._writer import DecisionWriter

__all__ = ["KnownRequest", "OwnRequests"]

logger = logging.getLogger("teaagent.relay")

MAX_KNOWN_REQUESTS: Final = 10_000  # parsed own requests kept in memory; a decision then costs one round trip
# One block of an outcome long-poll: a stopping relay answers its long-polls within it (serve_app
# gives the requests in flight 5 s), at the price of one more round trip a second per waiter.
OUTCOME_WAKE_SECONDS: Final = 1.0
# A stopping relay queues the settlements still in their grace at once; it waits this long for them.
SETTLEMENT_FLUSH_SECONDS: Final = 5.0


@dataclass(frozen=True)
class KnownRequest:
    """One of this node's own requests, parsed once, with who may count for it and how many must.

    Only what never changes is kept here: who decided what is the store's alone (the counting
    script reads and writes it atomically), so any number of relay processes sharing the store
    count alike.
    """

    request: dict[str, Any]
    signature: str
    peers: tuple[str, ...]
    required: int


def _not_found(request_id: str) -> ApiError:
    # The store's own sentence for the same case (RequestNotFoundError), so both read alike.
    return ApiError(
        404, "not_found", f"Request {request_id} is not stored here (it never arrived, or it expired)."
    )


def _deliveries(peers: tuple[str, ...], stored: StoredRequest) -> dict[str, dict[str, Any]]:
    """How the request's delivery to each counted peer went; a peer not tried yet is ``pending``."""
    out: dict[str, dict[str, Any]] = {}
    for peer in peers:
        known = stored.deliveries.get(peer)
        out[peer] = (
            known.to_dict()
            if known is not None
            else {"state": "pending", "attempts": 0, "error": None, "at": None}
        )
    return out


def _withdrawal_path(request_id: str) -> str:
    return f"/v1/inbox/{request_id}/withdrawal"


def _settled_path(request_id: str) -> str:
    return f"/v1/inbox/{request_id}/settled"


class OwnRequests(RelayBase):
    """This node's own requests: submitted by its agent, counted from its peers' decisions."""

    def _open(self, settings: Settings) -> None:
        super()._open(settings)
        self._known: OrderedDict[str, KnownRequest] = OrderedDict()
        self.reloader.subscribe(lambda _trust: self._known.clear())  # counted peers follow the trust
        self.writer = DecisionWriter(self.store)
        self._grace = settings.settlement_grace_seconds
        # Own requests decided here whose settlement waits out its grace -> the peers whose late
        # decision this process verified meanwhile (they are not told: they decided).
        self._late: dict[str, set[str]] = {}
        self._graces: set[asyncio.Task[None]] = set()
        self._flush = asyncio.Event()  # set by a stopping relay: every settlement goes out now

    def _counting(self, request: dict[str, Any], trust: Trust | None = None) -> tuple[tuple[str, ...], int]:
        """Who counts for a request here and how many must approve (as ``evaluate`` counts it)."""
        config = (trust or self.trust).config
        peers = tuple(p for p in request["peers"] if p in config.peers and p != request["origin"])
        policy = request_policy(request)
        if policy is not None:
            # Version 2: the policy's terms decide (record_decision.lua); the largest term's
            # threshold is what the store keeps for readers.
            return peers, policy.required
        required = max(request["required_approvals"], config.quorum.required_approvals, 1)
        return peers, required

    @staticmethod
    def _script_policy(request: dict[str, Any], peers: tuple[str, ...]) -> str:
        """A version 2 request's policy for ``record_decision.lua``, terms limited to ``peers``; else ""."""
        policy = request_policy(request)
        return "" if policy is None else policy.only(peers).script_form()

    def _remember(self, known: KnownRequest) -> KnownRequest:
        request_id = known.request["request_id"]
        self._known[request_id] = known
        self._known.move_to_end(request_id)
        while len(self._known) > MAX_KNOWN_REQUESTS:
            self._known.popitem(last=False)
        return known

    async def known_request(self, request_id: str) -> KnownRequest:
        """Return one of this node's stored requests, parsed (from memory when seen before).

        Raises:
            ApiError: 404 when no such request is stored.
        """
        known = self._known.get(request_id)
        if known is not None:
            return known
        stored = await self.store.requests.get(request_id)
        if stored is None:
            raise _not_found(request_id)
        request, signature = envelope(stored.document)
        peers, _required = self._counting(request)
        return self._remember(KnownRequest(request, signature, peers, stored.required))

    async def submit(self, request: dict[str, Any], signature: str) -> tuple[bool, dict[str, Any]]:
        """Store a request of this node's agent and queue it for every peer; idempotent.

        Returns ``(created, status)``.

        Raises:
            ApiError: 422 malformed or not countable here, 403 not this node's or a bad signature,
                409 another document holds the id.
            StoreError: Redis failed.
        """
        problem = request_problem(request)
        if problem is not None:
            raise ApiError(422, "invalid", sentence(problem))
        request_id = request["request_id"]
        if request["origin"] != self.agent_id:
            raise self._not_this_node(f"the request's origin {request['origin']}")
        peers, required = self._counting(request)
        if required > len(peers):
            raise ApiError(
                422,
                "invalid",
                f"Request {request_id} needs {required} approvals but only {len(peers)} of its peers "
                "are configured peers of this node.",
            )
        policy = request_policy(request)
        for term in policy.only(peers).terms if policy is not None else ():
            if term.required > len(term.peers):
                raise ApiError(
                    422,
                    "invalid",
                    f"Request {request_id} needs {term.required} approvals of a term of which only "
                    f"{len(term.peers)} peers are configured peers of this node.",
                )
        # Never trust the body: the signature must verify with this node's own configured key.
        wire = check_request_signature(
            request, signature, self.own_node_key, allow_dev=self.allow_dev, whose="this node's own key"
        )
        document = canonical({"request": request, "signature": wire})
        # Queued for every peer on every submission, not only the first: a retry after a crash
        # completes it. Stored and queued in one step on one server (RequestBook.submit).
        payload = delivery("/v1/inbox", {"request": request, "signature": wire})
        try:
            result = await self.store.requests.submit(
                request_id,
                document,
                required_approvals=required,
                peers=len(peers),
                expires_at=request["expires_at"],
                queue=self.deliveries,
                deliveries=[(peer, payload) for peer in peers],
            )
            created, state, fresh = result.created, result.state, result.stored
        except RequestConflictError:
            stored = await self.store.requests.get(request_id)
            if stored is None or envelope(stored.document)[0] != request:
                raise ApiError(
                    409, "conflict", f"Request {request_id} is already stored with a different document."
                ) from None
            # The same request signed again (ECDSA signatures differ each time): the first one
            # stays, and it is the one queued for the peers.
            created, state, wire, fresh = False, stored.state, envelope(stored.document)[1], None
            if state == "pending":
                payload = delivery("/v1/inbox", {"request": request, "signature": wire})
                await asyncio.gather(
                    *(
                        self.deliveries.enqueue(peer, request_id, payload, request["expires_at"])
                        for peer in peers
                    )
                )
        if request_id not in self._known:
            self._remember(KnownRequest(request, wire, peers, required))
        self.metrics.quorum_requests.labels("own", "created" if created else "duplicate").inc()
        # A request this call created is answered as stored, without reading it back.
        return created, self._status(fresh) if fresh is not None else await self.status(request_id)

    async def status(self, request_id: str) -> dict[str, Any]:
        """Return the counting state of an own request, settling its expiry when due.

        Raises:
            ApiError: 404 when no such request is stored.
            StoreError: Redis failed.
        """
        stored = await self.store.requests.get(request_id)
        if stored is None:
            raise _not_found(request_id)
        if stored.state == "pending" and time.time() > stored.expires_at:
            await self._settle(request_id)
            stored = await self.store.requests.get(request_id) or stored
        return self._status(stored)

    async def wait(
        self, request_id: str, wait: float, counted: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """Block until the request is decided or ``wait`` seconds pass (XREAD BLOCK on its events).

        With ``counted`` (the approvals and denials the caller last saw), it also answers as soon as
        the counted decisions differ: a caller showing progress holds one long-poll per change.

        Raises:
            ApiError: 404 when no such request is stored.
            StoreError: Redis failed.
        """
        deadline = time.monotonic() + min(wait, MAX_WAIT_SECONDS)
        with self.metrics.long_polls.labels("outcome").track_inprogress():
            while True:
                remaining = max(0.0, deadline - time.monotonic())
                block = min(remaining, OUTCOME_WAKE_SECONDS)
                stored = await self.store.requests.wait_outcome(request_id, block, counted=counted)
                moved = counted is not None and (len(stored.approvals), len(stored.denials)) != counted
                if (
                    stored.state != "pending"
                    or moved
                    or remaining <= OUTCOME_WAKE_SECONDS
                    or self.stopping.is_set()
                ):
                    return self._status(stored)

    async def _settle(self, request_id: str, now: int | None = None) -> DecisionResult:
        result = await self.store.requests.settle_expiry(request_id, now=now)
        if result.decided:
            self.metrics.outcomes.labels(result.state).inc()
        return result

    def _status(self, stored: StoredRequest) -> dict[str, Any]:
        request, signature = envelope(stored.document)
        peers, _required = self._counting(request)
        order = {peer: index for index, peer in enumerate(request["peers"])}

        def position(signer: str) -> int:
            return order.get(signer, len(order))

        approvals = [json.loads(stored.approvals[s]) for s in sorted(stored.approvals, key=position)]
        denials = {s: json.loads(stored.denials[s]) for s in sorted(stored.denials, key=position)}
        # The counted denials travel in the certificate too, so that the origin's agent applies rule 6
        # itself (the relay is not trusted to have applied it).
        certificate = (
            build_certificate(request, signature, approvals, list(denials.values()))
            if stored.state == "approved"
            else None
        )
        return {
            "request_id": stored.request_id,
            "state": stored.state,
            "required": stored.required,
            "peers": list(peers),
            "signers": [approval["statement"]["signer"] for approval in approvals],
            "denied_by": list(denials),
            "denial_reasons": {s: str(d["statement"].get("reason", "")) for s, d in denials.items()},
            "expires_at": stored.expires_at,
            "accepted_at": stored.accepted_at,
            "decided_at": stored.decided_at,
            "certificate": certificate,
            "denials": list(denials.values()),
            "withdrawal": json.loads(stored.withdrawal) if stored.withdrawal is not None else None,
            "approvals": approvals,
            "deliveries": _deliveries(peers, stored),
        }

    async def count(
        self, request_id: str, statement: dict[str, Any], signature: str, *, now: float | None = None
    ) -> dict[str, Any]:
        """Verify a peer's decision on an own request and count it (PROTOCOL.md "Counting").

        Rules 1 to 4 are checked here; the counting script applies the rest atomically (each signer
        once; a signer that denied counts as a denial only; the thresholds; a decided outcome never
        changes), as :class:`teaagent.quorum.Tally` does. So a repeat, or an approval of a signer
        that denied, answers 200 with ``counted: false``; a denial of a signer that approved counts
        and takes that approval away: it is never in a certificate.

        Args:
            request_id: The own request decided on.
            statement: The signed statement, as carried.
            signature: Its signature.
            now: The time of the count in Unix seconds; the clock when None.

        Raises:
            ApiError: 404 unknown request; 422 not a statement of this request; 403 a signer that
                may not sign it, or a signature that does not verify.
            StoreError: Redis failed.
        """
        known = await self.known_request(request_id)
        request = known.request
        trust = self.trust  # from here to the verification, no await: one snapshot
        counted, _required = self._counting(request, trust)
        clock = time.time() if now is None else now
        # The script counts whole seconds. Rounded up, ``at > expires_at`` (an integer) holds exactly
        # when ``clock > expires_at`` does: rounded down, a decision half a second late would count.
        at = math.ceil(clock)
        try:
            kind, signer, rebuilt = check_statement(request, statement, configured=counted, now=clock)
        except ApiError:
            self.metrics.decisions.labels("peer", "rejected").inc()
            raise
        if is_expired(at, request["expires_at"]):
            # Rule 4: nothing counts on an expired request; settle it and say so.
            result = await self._settle(request_id, at)
            self.metrics.decisions.labels("peer", "late").inc()
            return self._receipt(request, signer, kind, result)
        # Rules 2 and 3: the signature verifies over the rebuilt statement with the configured key.
        try:
            verified = verify_decision(
                kind,
                rebuilt,
                signature,
                trust.peer_keys[signer],
                allow_dev=self.allow_dev,
                whose=whose_keys(trust.peer_keys[signer], signer),
            )
        except ApiError:
            self.metrics.decisions.labels("peer", "rejected").inc()
            raise
        # Rules 5 and 6 are the script's: it alone sees every relay process's decisions at once.
        result = await self.writer.record(
            request_id,
            kind=kind,
            signer=signer,
            decision=verified.stored,
            now=at,
            policy=self._script_policy(request, counted),
        )
        self.metrics.decisions.labels("peer", "counted" if result.counted else "duplicate").inc()
        if result.decided:
            self.metrics.outcomes.labels(result.state).inc()
            await self._send_settlement(known, result)
        elif request_id in self._late:
            self._late[request_id].add(signer)  # verified above: it decided, so it needs no evidence
        return self._receipt(request, signer, kind, result)

    async def _send_settlement(self, known: KnownRequest, result: DecisionResult) -> None:
        """Queue the evidence of an own request's outcome for the relays of the peers that did not
        decide it (approved or denied), once its grace is over.

        Sent once, by the call that settled the outcome (``result``); a crash before it costs the
        peers only time (their items expire). When every peer it would be sent to
        (``known.peers``) has decided, nobody is left to tell and nothing is read: the script
        counts each signer once, on one side (rule 6), and only those peers' decisions verify
        here, so ``result``'s counts reaching their number say so.

        Otherwise the evidence waits ``settlement_grace_seconds`` in a task of its own (a stopping
        relay sends it at once): the decisions of the other peers, often on their way already
        (an automatic approver answers in milliseconds), count for nothing once the outcome is
        decided, but each one this process verifies in the grace spares its peer the evidence,
        which it would verify signature by signature only to learn what it already acted on. A
        peer that decided is told nothing, as when it decided before the outcome.

        Raises:
            StoreError: Redis failed (no grace: a settlement sent at once).
        """
        if result.approvals + result.denials >= len(known.peers):
            return
        if self._grace <= 0:
            await self._settle_peers(known, set())
            return
        request_id = known.request["request_id"]
        self._late[request_id] = set()
        task = asyncio.get_running_loop().create_task(
            self._settle_later(known), name=f"teaagent-relay-settlement-{request_id}"
        )
        self._graces.add(task)
        task.add_done_callback(self._graces.discard)

    async def _settle_later(self, known: KnownRequest) -> None:
        """:meth:`_settle_peers` once the grace is over, or the relay stops; failures are logged."""
        request_id = known.request["request_id"]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush.wait(), self._grace)
            await self._settle_peers(known, self._late.get(request_id, set()))
        except StoreError as exc:
            logger.warning("the settlement of request %s was not queued: %s", request_id, exc)
        except Exception:
            logger.exception("the settlement of request %s was not queued", request_id)
        finally:
            self._late.pop(request_id, None)

    async def close_settlements(self) -> None:
        """Queue every settlement still in its grace now and wait for them (a stopping relay).

        Waits at most ``SETTLEMENT_FLUSH_SECONDS``; those not queued by then are given up (their
        peers' items expire, as after a crash).
        """
        self._flush.set()
        waiting = set(self._graces)
        if not waiting:
            return
        _done, late = await asyncio.wait(waiting, timeout=SETTLEMENT_FLUSH_SECONDS)
        for task in late:
            await cancel_and_wait(task)

    async def _settle_peers(self, known: KnownRequest, decided_late: set[str]) -> None:
        """Queue the settlement for the peers whose decision is neither in the evidence nor in
        ``decided_late``.

        The certificate is the one the origin's agent receives.

        Raises:
            StoreError: Redis failed.
        """
        request = known.request
        request_id = request["request_id"]
        stored = await self.store.requests.get(request_id)
        if stored is None or stored.state not in ("approved", "denied"):
            return
        status = self._status(stored)
        body: dict[str, Any] = (
            {"origin": self.agent_id, "certificate": status["certificate"]}
            if stored.state == "approved"
            else {"origin": self.agent_id, "denials": status["denials"]}
        )
        payload = delivery(_settled_path(request_id), body)
        # Only to the peers whose decision is not in the evidence: the others decided already (and
        # a node never counts its own signature as a peer's, so it could not verify its own part).
        in_evidence = set(status["signers"]) | set(status["denied_by"])
        silent = [peer for peer in known.peers if peer not in in_evidence and peer not in decided_late]
        await asyncio.gather(
            *(self.deliveries.enqueue(peer, request_id, payload, request["expires_at"]) for peer in silent)
        )
        self.metrics.settlements.labels("queued").inc(len(silent))
        spared = (decided_late & set(known.peers)) - in_evidence
        self.metrics.settlements.labels("spared").inc(len(spared))

    @staticmethod
    def _receipt(request: dict[str, Any], signer: str, kind: str, result: DecisionResult) -> dict[str, Any]:
        return {
            "request_id": request["request_id"],
            "origin": request["origin"],
            "signer": signer,
            "kind": kind,
            "state": result.state,
            "counted": result.counted,
            "decided": result.decided,
            "approvals": result.approvals,
            "denials": result.denials,
        }

    async def withdraw(self, request_id: str, statement: dict[str, Any], signature: str) -> dict[str, Any]:
        """Withdraw one of this node's own requests, signed by this node's key, and tell every peer.

        The request becomes ``withdrawn``, a final state: decisions arriving later are answered
        with that state and not counted, and the outcome long-poll returns it. A repeat is
        harmless (the first withdrawal stays, and is queued for the peers again, in case the
        relay died before queueing it).

        Raises:
            ApiError: 404 unknown request; 403 not this node's withdrawal, or a bad signature; 422
                not a withdrawal of this request; 409 ``already_decided`` when it was approved,
                denied or expired first.
            StoreError: Redis failed.
        """
        known = await self.known_request(request_id)
        request = known.request
        origin = statement.get("origin")
        if origin != self.agent_id:
            raise self._not_this_node(f"the withdrawal's origin {origin!r}")
        now = time.time()
        data = self._verified_withdrawal(
            request, statement, signature, self.own_node_key, whose="this node's own key", now=now
        )
        try:
            result = await self.store.requests.withdraw(request_id, withdrawal=data, now=math.ceil(now))
        except RequestNotFoundError:
            raise _not_found(request_id) from None
        if result.state != "withdrawn":
            if result.state == "expired":
                self.metrics.outcomes.labels("expired").inc()
            raise ApiError(
                409,
                "already_decided",
                f"Request {request_id} is already {result.state}; it can no longer be withdrawn.",
            )
        if result.withdrawn:
            self.metrics.outcomes.labels("withdrawn").inc()
            logger.info("request %s withdrawn by this node", request_id)
        stored = await self.store.requests.get(request_id)
        if stored is None:
            raise _not_found(request_id)
        # The stored withdrawal, not this one: a repeat signed anew (ECDSA) sends the first again.
        body = json.loads(stored.withdrawal) if stored.withdrawal is not None else json.loads(data)
        payload = delivery(_withdrawal_path(request_id), body)
        await asyncio.gather(
            *(
                self.deliveries.enqueue(peer, request_id, payload, request["expires_at"])
                for peer in known.peers
            )
        )
        return self._status(stored)

    async def withdrawn_here(self, request_id: str) -> bool:
        """True when one of this node's own requests is withdrawn (one HGET: its fan-out need not leave).

        Raises:
            StoreError: Redis failed.
        """
        with redis_failures(self.store):
            state = await self.store.client.hget(self.store.keys.request(request_id).outcome, "state")
        return state == b"withdrawn"
