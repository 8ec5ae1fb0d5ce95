"""What the relay does, apart from HTTP: store, verify, count, queue.

Stored forms (all in the node's store, ``teaagent.store``):

- a request (own or received) is the JSON envelope ``{"request": ..., "signature": <wire>}``, the
  request exactly as its origin signed it;
- a decision is ``{"statement": <rebuilt from the request>, "signature": <wire>}``, stored only
  after it verified, so a certificate is built from stored decisions without checking them again
  (the origin's agent verifies the certificate itself anyway);
- a delivery (queue ``deliveries``, target = the peer's agent id) carries
  ``{"path": "/v1/...", "body": {...}}``; the worker looks the peer's relay URL up in the node
  configuration when it delivers;
- an inbox entry (queue ``inbox``, target ``approver``) carries ``{"origin", "request_id"}`` for the
  node's approver, which may also list ``GET /v1/inbox``;
- a withdrawal (own request or received one) is ``{"statement": <rebuilt from the request>,
  "signature": <wire>}`` on the request's outcome, stored only after it verified; it is queued for
  every peer's relay (``/v1/inbox/{id}/withdrawal``) as a decision is queued for its origin;
- a settlement (own request approved or denied here) is its evidence, ``{"certificate": ...}`` or
  ``{"denials": [...]}``, queued for every peer's relay (``/v1/inbox/{id}/settled``) when the
  outcome is recorded; a received one is stored on the inbox item, verbatim, only after it verified.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Final

from teaagent._batch import Coalescer
from teaagent._canonical import canonical
from teaagent._reload import Trust, TrustReloader
from teaagent._words import moment
from teaagent.config import NodeConfig
from teaagent.errors import (
    QuorumError,
    RequestConflictError,
    RequestNotFoundError,
    SignatureError,
    StoreError,
)
from teaagent.quorum import (
    MAX_CLOCK_SKEW_SECONDS,
    build_certificate,
    is_expired,
    request_policy,
    request_problem,
    verify_settlement,
    verify_withdrawal,
    wire_signature,
    withdrawal_problem,
)
from teaagent.relay_client._inbox_view import inbox_item_view
from teaagent.store import (
    REDIS_ERRORS,
    DecisionResult,
    DecisionToCount,
    Intake,
    RequestState,
    Store,
    StoredRequest,
)
from teaagent.trust import SignerKey
from teaagent_relay._errors import ApiError
from teaagent_relay._metrics import RelayMetrics
from teaagent_relay._protocol import (
    DEV_SIGNATURE_PREFIX,
    check_request_signature,
    check_statement,
    decision_bytes,
    sentence,
    verify_decision,
)
from teaagent_relay._settings import Settings
from teaagent_relay._writer import DecisionWriter, store_error

__all__ = ["APPROVER_TARGET", "MAX_WAIT_SECONDS", "KnownRequest", "Relay"]

logger = logging.getLogger("teaagent.relay")

MAX_WAIT_SECONDS: Final = 60.0  # one long-poll; proxies commonly cut idle HTTP at 60-100 s
MAX_KNOWN_REQUESTS: Final = 10_000  # parsed own requests kept in memory; a decision then costs one round trip
APPROVER_TARGET: Final = "approver"  # the inbox queue's only consumer
INBOX_WAKE_SECONDS: Final = 1.0  # one block of an inbox long-poll, under the store's socket timeout
# One block of an outcome long-poll: a stopping relay answers its long-polls within it (serve_app
# gives the requests in flight 5 s), at the price of one more round trip a second per waiter.
OUTCOME_WAKE_SECONDS: Final = 1.0
INBOX_SWEEP_BATCH: Final = 500  # inbox queue entries looked at per sweep; the next sweep goes on from there


@dataclass(frozen=True)
class RateLimit:
    """A per-origin window: ``max_calls`` per ``window_seconds``."""

    max_calls: int
    window_seconds: float


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


def _own_decision(stored: StoredRequest) -> bytes | None:
    """This node's recorded decision on a received request (only this node decides its inbox), or None."""
    return next(iter(stored.approvals.values()), None) or next(iter(stored.denials.values()), None)


def _configured(keys: Sequence[SignerKey], peer: str) -> str:
    """A peer's configured keys as a phrase for messages."""
    return f"the key configured for {peer}" if len(keys) == 1 else f"the keys configured for {peer}"


def _envelope(document: bytes) -> tuple[dict[str, Any], str]:
    parsed = json.loads(document)
    return parsed["request"], parsed["signature"]


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


def _payload(path: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"path": path, "body": body}, separators=(",", ":")).encode()


@contextmanager
def _redis(store: Store) -> Iterator[None]:
    """Turn a Redis error of a direct client call into the store's ``StoreError``."""
    try:
        yield
    except REDIS_ERRORS as exc:  # a cluster client's own refusals are no RedisError
        raise StoreError(f"Redis at {store.url} failed: {exc}") from exc


class Relay:
    """One node's relay: its configuration, its store, and the rules of PROTOCOL.md."""

    def __init__(
        self,
        *,
        config: NodeConfig,
        store: Store,
        settings: Settings,
        metrics: RelayMetrics,
        stopping: asyncio.Event | None = None,
        trust: TrustReloader | None = None,
    ) -> None:
        # What peers and keys verify with: one snapshot per call (``trust = self.trust``), swapped
        # whole by a reload (SIGHUP, POST /v1/reload; teaagent._reload).
        self.reloader = (
            trust if trust is not None else TrustReloader(config, what=f"the relay of {config.agent_id}")
        )
        self.reloader.subscribe(lambda _trust: self._known.clear())  # counted peers follow the trust
        # Set when the service stops: every long-poll answers at once with the state as it is.
        self.stopping = stopping if stopping is not None else asyncio.Event()
        self.store = store
        self.metrics = metrics
        self.agent_id = config.agent_id
        self.token = config.load_token()
        self.own_key = config.own_public_key()
        # What this node's own requests and withdrawals verify with: its node key, which its agent signs with.
        self.own_node_key = (SignerKey(line=self.own_key.to_line(), source="this node's key"),)
        self.allow_dev = config.quorum.allow_dev_signatures
        self.inbox_limit = RateLimit(settings.inbox_rate_limit, settings.inbox_rate_window_seconds)
        self.inbox_max_pending = settings.inbox_max_pending
        self.deliveries = store.queue(
            "deliveries",
            max_attempts=None,  # a peer down for hours gets the delivery once back, until expiry
            min_idle_seconds=settings.delivery_min_idle_seconds,
            retry_base_seconds=settings.delivery_retry_base_seconds,
            retry_cap_seconds=settings.delivery_retry_cap_seconds,
        )
        # The same queue with one attempt: retry_later on it dead-letters at once (a permanent refusal).
        self.dead_letters = store.queue("deliveries", max_attempts=1)
        self._known: OrderedDict[str, KnownRequest] = OrderedDict()
        self._sweep_cursor: str | None = None  # where the next inbox sweep goes on
        self.writer = DecisionWriter(store)
        # This node's own decisions (its approver's, many at once): the reads, the records and the
        # queued deliveries of concurrent calls each share one round trip.
        self._inbox_reads: Coalescer[tuple[str, str], StoredRequest | None] = Coalescer(
            self._read_inbox, "teaagent-relay-inbox-reads", wrap=store_error
        )
        self._inbox_writes: Coalescer[tuple[str, DecisionToCount], DecisionResult] = Coalescer(
            store.inbox.record_decisions,
            "teaagent-relay-own-decisions",
            wrap=store_error,
        )
        self._enqueues: Coalescer[tuple[str, str, bytes, int], str] = Coalescer(
            self._enqueue_deliveries, "teaagent-relay-enqueues", wrap=store_error
        )

    @property
    def trust(self) -> Trust:
        """The trust in use now (peers, their keys, this node's keys): read once per call, then kept."""
        return self.reloader.trust

    @property
    def config(self) -> NodeConfig:
        """The node configuration, its trust as of the last reload."""
        return self.reloader.trust.config

    # -- own requests ----------------------------------------------------------------------------

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
        request, signature = _envelope(stored.document)
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
            raise ApiError(
                403,
                "forbidden",
                f"The request's origin {request['origin']} is not this node ({self.agent_id}).",
            )
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
        payload = _payload("/v1/inbox", {"request": request, "signature": wire})
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
            if stored is None or _envelope(stored.document)[0] != request:
                raise ApiError(
                    409, "conflict", f"Request {request_id} is already stored with a different document."
                ) from None
            # The same request signed again (ECDSA signatures differ each time): the first one
            # stays, and it is the one queued for the peers.
            created, state, wire, fresh = False, stored.state, _envelope(stored.document)[1], None
            if state == "pending":
                payload = _payload("/v1/inbox", {"request": request, "signature": wire})
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
        request, signature = _envelope(stored.document)
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
            wire = verify_decision(
                kind,
                rebuilt,
                signature,
                trust.peer_keys[signer],
                allow_dev=self.allow_dev,
                whose=_configured(trust.peer_keys[signer], signer),
            )
        except ApiError:
            self.metrics.decisions.labels("peer", "rejected").inc()
            raise
        # Rules 5 and 6 are the script's: it alone sees every relay process's decisions at once.
        result = await self.writer.record(
            request_id,
            kind=kind,
            signer=signer,
            decision=decision_bytes(rebuilt, wire),
            now=at,
            policy=self._script_policy(request, counted),
        )
        self.metrics.decisions.labels("peer", "counted" if result.counted else "duplicate").inc()
        if result.decided:
            self.metrics.outcomes.labels(result.state).inc()
            await self._send_settlement(known)
        return self._receipt(request, signer, kind, result)

    async def _send_settlement(self, known: KnownRequest) -> None:
        """Queue the evidence of an own request's outcome for the relays of the peers that did not
        decide it (approved or denied).

        Sent once, by the call that settled the outcome; a crash before it costs the peers only
        time (their items expire). The certificate is the one the origin's agent receives.

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
        payload = _payload(_settled_path(request_id), body)
        # Only to the peers whose decision is not in the evidence: the others decided already (and
        # a node never counts its own signature as a peer's, so it could not verify its own part).
        decided = set(status["signers"]) | set(status["denied_by"])
        await asyncio.gather(
            *(
                self.deliveries.enqueue(peer, request_id, payload, request["expires_at"])
                for peer in known.peers
                if peer not in decided
            )
        )

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

    # -- withdrawals -----------------------------------------------------------------------------

    def _verified_withdrawal(
        self,
        request: dict[str, Any],
        statement: dict[str, Any],
        signature: str,
        keys: Sequence[SignerKey],
        *,
        whose: str,
        now: float,
    ) -> bytes:
        """Check a withdrawal of ``request`` (PROTOCOL.md, Withdrawal); return its stored form.

        1. the carried statement is the withdrawal rebuilt from the request, types included;
        2. it is not dated beyond the clock skew in this node's future;
        3. its signature verifies with one of ``keys``, the keys the origin's requests verify
           with here, allowed by its namespaces and validity to sign at ``withdrawn_at``.

        Raises:
            ApiError: 422 ``invalid`` (not a withdrawal of this request, dated in the future), 403
                ``bad_signature`` (it does not verify with any of ``keys``).
        """
        problem = withdrawal_problem(request, statement)
        if problem is not None:
            raise ApiError(422, "invalid", sentence(problem))
        withdrawn_at = statement["withdrawn_at"]
        if withdrawn_at > now + MAX_CLOCK_SKEW_SECONDS:
            raise ApiError(
                422,
                "invalid",
                f"The withdrawal is dated {moment(withdrawn_at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} "
                "seconds in the future.",
            )
        if not isinstance(signature, str) or signature.startswith(DEV_SIGNATURE_PREFIX):
            # A development signature stands for a signer's vote in experiments, never for an origin.
            raise ApiError(403, "bad_signature", f"The withdrawal is not signed with {whose}.")
        try:
            rebuilt = verify_withdrawal(request, statement, signature, keys)
        except QuorumError as exc:  # withdrawal_problem said None: not reached, but never a 500
            raise ApiError(422, "invalid", str(exc)) from exc
        except (SignatureError, ValueError, TypeError) as exc:
            raise ApiError(
                403,
                "bad_signature",
                sentence(f"the withdrawal does not verify with {whose}: {str(exc).strip().rstrip('.')}"),
            ) from exc
        return decision_bytes(rebuilt, wire_signature(signature))

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
            raise ApiError(
                403,
                "forbidden",
                sentence(f"the withdrawal's origin {origin!r} is not this node ({self.agent_id})"),
            )
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
        payload = _payload(_withdrawal_path(request_id), body)
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
        with _redis(self.store):
            state = await self.store.client.hget(self.store.keys.request(request_id).outcome, "state")
        return state == b"withdrawn"

    async def receive_withdrawal(
        self, request_id: str, statement: dict[str, Any], signature: str
    ) -> dict[str, Any]:
        """Mark a received request ``withdrawn`` on its origin's signed word.

        Checked before anything is written: the origin is a configured peer, the request is in the
        inbox, the statement is its withdrawal, and the signature verifies with the key the
        origin's requests verify with here. An item this node already decided keeps its decision
        (its decision is on its way; the origin counts nothing any more); an expired one stays
        expired. Both answer 200 with that state, so the origin's delivery ends.

        Raises:
            ApiError: 422 malformed or not a withdrawal of that request; 403 unknown origin or bad
                signature; 404 no such request from that origin.
            StoreError: Redis failed.
        """
        origin = statement.get("origin")
        if not isinstance(origin, str):
            raise ApiError(422, "invalid", "The withdrawal's origin is not a string.")
        trust = self.trust  # one snapshot for the check and the verification, across the read below
        if origin not in trust.peer_keys:
            raise ApiError(403, "forbidden", sentence(f"{origin!r} is not a configured peer of this node"))
        if statement.get("request_id") != request_id:
            raise ApiError(422, "invalid", "The withdrawal's request_id is not the request in the path.")
        stored = await self.store.inbox.get(origin, request_id)
        if stored is None:
            raise ApiError(
                404, "not_found", f"No request {request_id} from {origin} is in this node's inbox."
            )
        request, _signature = _envelope(stored.document)
        origin_keys = trust.peer_keys[origin]  # every key of the origin, each with its limits
        data = self._verified_withdrawal(
            request,
            statement,
            signature,
            origin_keys,
            whose=_configured(origin_keys, origin),
            now=time.time(),
        )
        try:
            result = await self.store.inbox.withdraw(
                origin, request_id, withdrawal=data, now=int(time.time())
            )
        except RequestNotFoundError:
            raise ApiError(
                404, "not_found", f"No request {request_id} from {origin} is in this node's inbox."
            ) from None
        if result.withdrawn:
            logger.info("request %s of %s withdrawn by its origin", request_id, origin)
        return {
            "request_id": request_id,
            "origin": origin,
            "state": result.state,
            "withdrawn": result.withdrawn,
        }

    async def receive_settlement(self, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Mark a received request ``settled`` on the verified evidence of its outcome at its origin.

        The origin's relay is not trusted here: ``body`` names the origin (``origin``) and carries
        ``certificate`` (approved) or ``denials`` (denied), which must prove that outcome of the
        very request stored here under this node's own configuration and the origin's keys
        (:func:`teaagent.quorum.verify_settlement`). Nothing is written before it did. An item this
        node decided keeps its decision (and gains the evidence); a withdrawn or expired one stays.

        Raises:
            ApiError: 422 malformed, or evidence that does not prove it (``unverified``); 403 unknown
                origin; 404 no such request from that origin.
            StoreError: Redis failed.
        """
        origin = body.get("origin")
        if not isinstance(origin, str):
            raise ApiError(422, "invalid", "The settlement's origin is not a string.")
        trust = self.trust  # one snapshot for the check and the verification, across the read below
        if origin not in trust.peer_keys:
            raise ApiError(403, "forbidden", sentence(f"{origin!r} is not a configured peer of this node"))
        stored = await self.store.inbox.get(origin, request_id)
        if stored is None:
            raise ApiError(
                404, "not_found", f"No request {request_id} from {origin} is in this node's inbox."
            )
        request, _signature = _envelope(stored.document)
        evidence = {name: value for name, value in body.items() if name != "origin"}
        try:
            settled = verify_settlement(
                request, evidence, trust.config.quorum, trust.peer_keys[origin], now=time.time()
            )
        except QuorumError as exc:
            self.metrics.decisions.labels("settlement", "rejected").inc()
            raise ApiError(422, "unverified", sentence(str(exc))) from None
        try:
            result = await self.store.inbox.settle(
                origin, request_id, settlement=canonical(evidence), now=int(time.time())
            )
        except RequestNotFoundError:
            raise ApiError(
                404, "not_found", f"No request {request_id} from {origin} is in this node's inbox."
            ) from None
        if result.changed:
            logger.info("request %s of %s %s at its origin", request_id, origin, settled.outcome)
        return {
            "request_id": request_id,
            "origin": origin,
            "state": result.state,
            "settled": settled.to_dict(),
        }

    # -- the inbox -------------------------------------------------------------------------------

    async def receive(self, request: dict[str, Any], signature: str) -> tuple[bool, dict[str, Any]]:
        """Accept a peer's request into the inbox and queue it for the approver; idempotent.

        PROTOCOL.md "What a peer's relay refuses": everything is checked before the origin's
        window is charged, and an exact repeat of a stored request is charged to no window, so a
        captured request (it travels to every peer) re-posted forever never shuts the origin out.
        Each origin may hold at most ``inbox_max_pending`` pending requests here, so no peer can
        fill the approver's queue for the others.

        Raises:
            ApiError: 403 unknown origin, not addressed to this node, or a bad signature; 422
                malformed, created too far ahead (``invalid``) or already expired (``expired``);
                429 the origin's window is full (``rate_limited``), or it holds its cap of pending
                requests here (``origin_full``); 409 another document holds the id.
            StoreError: Redis failed.
        """
        origin = request.get("origin")
        trust = self.trust  # one snapshot for the check and the verification
        if isinstance(origin, str) and origin not in trust.peer_keys:
            raise ApiError(403, "forbidden", sentence(f"{origin!r} is not a configured peer of this node"))
        problem = request_problem(request)
        if problem is not None:
            raise ApiError(422, "invalid", sentence(problem))
        assert isinstance(origin, str)  # request_problem checked it
        request_id = request["request_id"]
        now = time.time()
        if request["created_at"] > now + MAX_CLOCK_SKEW_SECONDS:
            # A request from the future would keep its keys here until then (PROTOCOL.md rule 4's skew).
            raise ApiError(
                422,
                "invalid",
                f"Request {request_id} was created at {moment(request['created_at'], now)}, more than "
                f"{MAX_CLOCK_SKEW_SECONDS} seconds ahead of this node's clock.",
            )
        if now > request["expires_at"]:
            # 422, as for the skew above: a well-formed document this node can no longer take (not
            # 410/409, which speak of the target resource's state; not 429, which would invite a
            # retry). Its own code, so an origin can tell it from a malformed one. Checked before
            # the signature and the window, as the skew is: time is free, Ed25519 and Redis are not.
            raise ApiError(
                422,
                "expired",
                f"Request {request_id} expired at {moment(request['expires_at'], now)}; this node no longer "
                "accepts it.",
            )
        if self.agent_id not in request["peers"]:
            raise ApiError(
                403,
                "forbidden",
                f"This node ({self.agent_id}) is not among the peers of request {request_id}.",
            )
        origin_keys = trust.peer_keys[origin]  # every key of the origin, each with its limits
        wire = check_request_signature(
            request,
            signature,
            origin_keys,
            allow_dev=self.allow_dev,
            whose=_configured(origin_keys, origin),
        )
        document = canonical({"request": request, "signature": wire})
        # Already here: a repeat (or a clash) is answered from the store and charges nothing. Else
        # the origin's window, then the request stored and queued for the approver: on one server
        # one script, on a cluster one step each (InboxBook.receive).
        payload = json.dumps({"origin": origin, "request_id": request_id}).encode()
        intake = Intake(
            self.store.rate_limiter,
            f"origin:{origin}",
            self.inbox_limit,
            self.store.inbox_queue,
            APPROVER_TARGET,
            max_pending=self.inbox_max_pending,
        )
        for _attempt in range(2):
            got = await self.store.inbox.receive(
                origin,
                request_id,
                document,
                expires_at=request["expires_at"],
                intake=intake,
                payload=payload,
            )
            if not got.stored_before:
                break
            stored = await self.store.inbox.get(origin, request_id)
            if stored is not None:
                return await self._repeat(origin, request, stored)
            # Gone between the two reads (it expired): taken in again, as a new request.
        else:
            raise self._clash(origin, request_id)
        if got.full:
            # Its share of the inbox, not its pace: room comes back as its requests are decided,
            # withdrawn or expire, so 429 (the origin's relay retries) with nothing charged.
            raise ApiError(
                429,
                "origin_full",
                f"{origin} already holds {got.held} pending requests in this node's inbox, its limit "
                f"of {self.inbox_max_pending}; one must be decided, withdrawn or expire first.",
            )
        decision = got.decision
        assert decision is not None  # not stored before: the window answered
        if not decision.allowed:
            retry_after = max(1, math.ceil(decision.retry_after))
            raise ApiError(
                429,
                "rate_limited",
                f"{origin} is over its limit of {self.inbox_limit.max_calls} requests per "
                f"{self.inbox_limit.window_seconds:g} seconds; retry in {retry_after} s.",
                headers={"Retry-After": str(retry_after)},
            )
        accepted = got.accepted
        assert accepted is not None  # allowed: stored
        return await self._received(
            origin, request, created=accepted.created, state=accepted.state, queued=got.entry_id is not None
        )

    async def _repeat(
        self, origin: str, request: dict[str, Any], stored: StoredRequest
    ) -> tuple[bool, dict[str, Any]]:
        """Answer a request already stored from ``origin``: the same request again, or a clash.

        The same request is the same canonical request document, whoever's copy of the signature
        it carries (ECDSA signatures differ each time; both verified): the first one stays.

        Raises:
            ApiError: 409 another request document holds the id.
            StoreError: Redis failed.
        """
        if canonical(_envelope(stored.document)[0]) != canonical(request):
            raise self._clash(origin, request["request_id"])
        return await self._received(origin, request, created=False, state=stored.state, queued=stored.queued)

    @staticmethod
    def _withdrawn(request_id: str, origin: str) -> ApiError:
        return ApiError(
            409,
            "withdrawn",
            f"Request {request_id} was withdrawn by its origin {origin}; no decision on it counts any more.",
        )

    @staticmethod
    def _settled(request_id: str, origin: str) -> ApiError:
        return ApiError(
            409,
            "settled",
            f"Request {request_id} was already decided at its origin {origin}; no decision on it "
            "counts any more.",
        )

    @staticmethod
    def _clash(origin: str, request_id: str) -> ApiError:
        return ApiError(
            409,
            "conflict",
            f"Request {request_id} from {origin} is already stored with a different document.",
        )

    async def _received(
        self, origin: str, request: dict[str, Any], *, created: bool, state: RequestState, queued: bool
    ) -> tuple[bool, dict[str, Any]]:
        """Count a stored (or repeated) request; queue it for the approver once, while it is pending.

        Raises:
            StoreError: Redis failed.
        """
        request_id = request["request_id"]
        self.metrics.quorum_requests.labels("inbox", "created" if created else "duplicate").inc()
        if state == "pending" and not queued:
            # Also for a repeat of an item not marked queued: the origin repeats only when it got no
            # answer, maybe before this step. A marked one is never queued again, so repeats (free of
            # the window) cannot fill the queue; a crash before the mark costs one extra entry.
            payload = json.dumps({"origin": origin, "request_id": request_id}).encode()
            entry_id = await self.store.inbox_queue.enqueue(
                APPROVER_TARGET, request_id, payload, request["expires_at"]
            )
            await self.store.inbox.mark_queued(origin, request_id, entry_id)
        return created, {"request_id": request_id, "origin": origin, "state": state, "created": created}

    async def sweep_inbox_queue(self, now: float | None = None) -> int:
        """Remove the inbox queue's entries whose request no longer waits for this node's approver.

        The queue holds one entry per received request for the approver. Approvers that decide
        through ``POST /v1/inbox/{id}/decision`` never claim it, and a request may expire
        undecided, so without this the stream would only grow (and, full, refuse new requests).
        The decision of a request decided here is queued for its origin once more first.
        Looks at ``INBOX_SWEEP_BATCH`` entries per call, each call after the last one's (then from
        the oldest again), so requests still waiting at the head never hide the ones behind them;
        removes those decided, expired or gone.

        Returns:
            How many entries were removed.

        Raises:
            StoreError: Redis failed.
        """
        at = time.time() if now is None else now
        queue = self.store.inbox_queue
        entries = await queue.entries(INBOX_SWEEP_BATCH, after=self._sweep_cursor)
        self._sweep_cursor = entries[-1].entry_id if len(entries) == INBOX_SWEEP_BATCH else None
        done = []
        for entry in entries:
            try:
                origin = json.loads(entry.payload)["origin"]
                stored = await self.store.inbox.get(origin, entry.request_id)
            except (ValueError, KeyError, TypeError):
                stored = None  # an entry this relay cannot read waits for nobody
            if stored is None or stored.state == "expired" or at > stored.expires_at:
                done.append(entry.entry_id)
            elif stored.state != "pending":
                # Decided here: send the decision once more before forgetting the entry, in case
                # the relay died between recording it and queueing it (a repeat counts once).
                raw = _own_decision(stored)
                if raw is not None:
                    decision = json.loads(raw)
                    await self._send_decision(
                        origin, _envelope(stored.document)[0], decision["statement"], decision["signature"]
                    )
                done.append(entry.entry_id)
        return await queue.remove(done)

    def _inbox_item(self, stored: StoredRequest, now: float) -> dict[str, Any]:
        return inbox_item_view(stored, now)  # the approver reads its news as the same item

    async def inbox(self, state: RequestState | None, limit: int, wait: float) -> list[dict[str, Any]]:
        """List received requests; with ``wait``, block until one is there (XREAD on the inbox queue).

        Raises:
            StoreError: Redis failed.
        """
        deadline = time.monotonic() + min(wait, MAX_WAIT_SECONDS)
        stream = self.store.keys.queue(self.store.inbox_queue.name).stream
        waiting = self.metrics.long_polls.labels("inbox").track_inprogress() if wait > 0 else nullcontext()
        with waiting:
            return await self._wait_inbox(stream, state, limit, deadline)

    async def _wait_inbox(
        self, stream: str, state: RequestState | None, limit: int, deadline: float
    ) -> list[dict[str, Any]]:
        while True:
            # The stream's last id first: an item queued after it wakes the block below.
            with _redis(self.store):
                last: Any = await self.store.client.xrevrange(stream, "+", "-", count=1)
            last_id: Any = last[0][0] if last else "0-0"
            stored = await self.store.inbox.list_requests(state=state, limit=limit)
            now = time.time()
            items = [self._inbox_item(item, now) for item in stored]
            remaining = deadline - time.monotonic()
            if items or remaining <= 0 or self.stopping.is_set():
                return items
            with _redis(self.store):
                await self.store.blocking.xread(
                    {stream: last_id}, count=1, block=max(1, int(min(remaining, INBOX_WAKE_SECONDS) * 1000))
                )

    async def inbox_item(self, request_id: str, origin: str | None) -> dict[str, Any]:
        """Return one received request, by id (and origin, when several origins used that id).

        Raises:
            ApiError: 404 unknown, 409 ambiguous, 422 an origin that is not an agent id.
            StoreError: Redis failed.
        """
        stored = await self._find_inbox(request_id, origin)
        return self._inbox_item(stored, time.time())

    async def _read_inbox(self, refs: list[tuple[str, str]]) -> list[StoredRequest | Exception | None]:
        """``InboxBook.get`` of each ``(origin, request_id)``, one pipeline (the coalescer's send)."""
        answers: list[StoredRequest | Exception | None] = []
        valid: list[tuple[str, str]] = []
        for origin, request_id in refs:
            try:
                self.store.keys.inbox_item(origin, request_id)
            except ValueError as exc:
                answers.append(exc)
                continue
            answers.append(None)
            valid.append((origin, request_id))
        found = iter(await self.store.inbox.get_many(valid))
        return [answer if isinstance(answer, Exception) else next(found) for answer in answers]

    async def _enqueue_deliveries(self, entries: list[tuple[str, str, bytes, int]]) -> list[str | Exception]:
        """``DeliveryQueue.enqueue`` of each entry, one pipeline (the coalescer's send)."""
        return list(await self.deliveries.enqueue_many(entries))

    async def _find_inbox(self, request_id: str, origin: str | None) -> StoredRequest:
        origins = [origin] if origin is not None else list(self.config.peers)
        if origin is not None and origin not in self.config.peers:
            raise ApiError(
                404, "not_found", f"No request {request_id} from {origin} is in this node's inbox."
            )
        found = [
            item
            for item in await asyncio.gather(*(self._inbox_reads.call((o, request_id)) for o in origins))
            if item
        ]
        if not found:
            where = f" from {origin}" if origin is not None else ""
            raise ApiError(404, "not_found", f"No request {request_id}{where} is in this node's inbox.")
        if len(found) > 1:
            names = ", ".join(sorted(str(item.origin) for item in found))
            raise ApiError(
                409,
                "conflict",
                f"Several origins ({names}) sent a request {request_id}; name one with ?origin=.",
            )
        return found[0]

    async def decide(self, request_id: str, statement: dict[str, Any], signature: str) -> dict[str, Any]:
        """Record this node's own signed decision on a received request and queue it for the origin.

        Raises:
            ApiError: 404 unknown request; 422 not a statement of it; 403 not signed by this node
                or a bad signature; 409 this node decided otherwise before, or the request expired.
            StoreError: Redis failed.
        """
        origin = statement.get("origin")
        if not isinstance(origin, str):
            raise ApiError(422, "invalid", "The statement's origin is not a string.")
        stored = await self._find_inbox(request_id, origin)  # one coalesced read, origin given
        if stored.state == "withdrawn":
            raise self._withdrawn(request_id, origin)
        if stored.state == "settled":
            raise self._settled(request_id, origin)
        request, _signature = _envelope(stored.document)
        signer = statement.get("signer")
        if signer != self.agent_id:
            self.metrics.decisions.labels("own", "rejected").inc()
            raise ApiError(
                403,
                "forbidden",
                sentence(f"the statement is signed as {signer!r}, not as this node ({self.agent_id})"),
            )
        now = time.time()
        own_keys = self.trust.own_keys
        try:
            kind, signer, rebuilt = check_statement(request, statement, configured=(self.agent_id,), now=now)
            wire = verify_decision(
                kind,
                rebuilt,
                signature,
                own_keys,
                allow_dev=self.allow_dev,
                whose="this node's own key" if len(own_keys) == 1 else "this node's keys",
            )
        except ApiError:
            self.metrics.decisions.labels("own", "rejected").inc()
            raise
        if now > request["expires_at"]:
            raise ApiError(
                409,
                "conflict",
                f"Request {request_id} expired at {moment(request['expires_at'], now)}; a decision can no "
                "longer count.",
            )
        data = decision_bytes(rebuilt, wire)
        # Recorded first, queued only once it is this node's decision: a contrary one never leaves.
        result = await self._inbox_writes.call(
            (origin, DecisionToCount(request_id, kind, signer, data, int(now)))
        )
        if result.state == "withdrawn" and not result.counted:
            raise self._withdrawn(request_id, origin)  # withdrawn between the read above and here
        if result.state == "settled" and not result.counted:
            raise self._settled(request_id, origin)  # settled between the read above and here
        if not result.counted:
            self._refuse_another(await self.store.inbox.get(origin, request_id), signer, data, request_id)
        self.metrics.decisions.labels("own", "counted" if result.counted else "duplicate").inc()
        # Queued for a repeat as well, and again by the inbox sweep: a relay that died between
        # recording and queueing still sends the decision (the origin counts a signer once).
        await self._send_decision(origin, request, rebuilt, wire)
        return {
            "request_id": request["request_id"],
            "origin": origin,
            "signer": signer,
            "kind": kind,
            "this_node": "approved" if kind == "approval" else "denied",
            "counted": result.counted,
            "note": f"This node's decision, sent to {origin}; the request's outcome is counted there.",
        }

    async def _send_decision(
        self, origin: str, request: dict[str, Any], statement: dict[str, Any], wire: str
    ) -> None:
        body = {"statement": statement, "signature": wire}
        path = f"/v1/requests/{request['request_id']}/decisions"
        await self._enqueues.call(
            (origin, request["request_id"], _payload(path, body), request["expires_at"])
        )

    @staticmethod
    def _refuse_another(stored: StoredRequest | None, signer: str, data: bytes, request_id: str) -> None:
        """409 when this node already decided the request with another decision (PROTOCOL.md rule 5)."""
        if stored is None:
            return
        previous = stored.approvals.get(signer) or stored.denials.get(signer)
        if previous is not None and previous != data:
            decided = "approved" if signer in stored.approvals else "denied"
            raise ApiError(
                409, "conflict", f"This node already {decided} request {request_id} with another decision."
            )
