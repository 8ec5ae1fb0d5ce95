"""The approver's engine: the node's rules applied to its inbox, and every decision's one path.

A decision, by a rule or by an operator (node key or a key of their own), goes the same way
(:meth:`Engine.settle`):

1. Refuse to sign what must never be signed: a request that expired, that its origin withdrew, or
   that its origin settled (approved or denied) on evidence this node verified itself.
   Before that, every item the relay hands over went through :meth:`Engine.receive`: its request
   verified with the origin's configured keys, addressed to this node, and the relay's description
   of it equal to that request; only the :class:`~teaagent_approver._items.Received` it returns,
   built on a :class:`~teaagent.quorum.VerifiedRequest`, can be matched, shown or signed.
2. Record the decision in Redis with ``SET NX`` (:class:`~teaagent_approver._ledger.Ledger`),
   before anything is signed. A process that finds a decision recorded (another approver process,
   or its own earlier life) never signs a different one: it finishes the recorded one.
3. Sign the recorded statement with the node key, unless it was signed elsewhere; the first
   signature stored for it stands (``SET NX``), so every process sends the same one.
4. Write the audit record (exactly one per decision, see :mod:`teaagent_approver._audit`).
5. Hand the signed decision to the node's relay (``POST /v1/inbox/{id}/decision``), which
   forwards it to the origin. If the relay does not answer, the decision stays recorded and the
   engine sends it again until the relay takes it or the request expires.

A decision recorded by another process that is not finished (unsigned, or never sent: that
process died) is finished by this one once ``takeover_seconds`` have passed since it was recorded;
before that, it is left to its owner.

The rules are applied to the inbox round after round by :class:`~teaagent_approver._rounds.RuleRounds`
(``Engine.rounds``): each round reads only what is new in the inbox, and decides by this path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import redis.exceptions

from teaagent._reload import Trust, TrustReloader
from teaagent._words import moment
from teaagent.config import ConfigError, NodeConfig, load_config
from teaagent.errors import QuorumError, RelayError, SignatureError, StatementError, StoreError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    Settlement,
    VerifiedRequest,
    canonical,
    check_rebuilt,
    check_signing_time,
    decision_kind,
    dev_signature_allowed,
    is_dev_signature,
    stated_kind,
    statement_bytes,
    verify_decision,
    verify_request,
    verify_settlement,
    wire_signature,
)
from teaagent.relay_client import AsyncRelayClient, InboxItem
from teaagent.signing import Signer, fingerprint, parse_sshsig, sshsig_sign
from teaagent.store import Store
from teaagent.store._inbox_news import WAKE_BLOCK_SECONDS
from teaagent.trust import SignerKey
from teaagent_approver._audit import DecisionAudit
from teaagent_approver._errors import ApiError, sentence
from teaagent_approver._items import Received, settled_sentence
from teaagent_approver._ledger import DecisionKind, Ledger, Record
from teaagent_approver._metrics import ApproverMetrics
from teaagent_approver._proposals import Notifies, Outcome, Proposal
from teaagent_approver._rounds import MAX_REMEMBERED, RuleRounds
from teaagent_approver._settings import Settings
from teaagent_approver._wire import DecisionPoster

__all__ = ["Engine", "Notifies", "Outcome", "Proposal"]

logger = logging.getLogger("teaagent.approver")

_TRANSIENT: Final = frozenset({408, 425, 429, 500, 502, 503, 504})
_RELAY_CODES: Final = {403: "forbidden", 404: "not_found", 409: "conflict", 422: "invalid"}


def _clause(error: BaseException) -> str:
    text = str(error).strip().rstrip(".") or type(error).__name__
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


class Engine:
    """The node's signing authority: its rules, its records, its audit log, its relay."""

    def __init__(
        self,
        *,
        node: NodeConfig,
        store: Store,
        relay: AsyncRelayClient,
        poster: DecisionPoster | None = None,
        audit: DecisionAudit,
        metrics: ApproverMetrics,
        settings: Settings,
        signer: Signer,
        notifier: Notifies | None = None,
        trust: TrustReloader | None = None,
    ) -> None:
        # What requests and decisions verify with, swapped whole by a reload (teaagent._reload);
        # every check below reads it once and runs without an await, so it sees one snapshot.
        self.reloader = (
            trust if trust is not None else TrustReloader(node, what=f"the approver of {node.agent_id}")
        )
        self.reloader.subscribe(self._forget_verified)
        self.store = store
        self.relay = relay
        self.poster = poster  # the hot path's own client; the relay client when None
        self.audit = audit
        self.metrics = metrics
        self.settings = settings
        self.signer = signer
        self.notifier = notifier
        self.agent_id = node.agent_id
        self.ledger = Ledger(store)
        self.instance = secrets.token_hex(8)  # this process's name in the records it writes
        self.fingerprint = fingerprint(signer)
        self.allow_dev = node.quorum.allow_dev_signatures
        self._verified: dict[str, VerifiedRequest] = {}  # origin signature -> the request it verified
        self._own_verified: set[tuple[str, bytes]] = set()  # this node's decisions that verified
        # (request signature, canonical evidence) -> what it proved, or why it did not verify
        self._settlements: dict[tuple[str, bytes], Settlement | str] = {}
        self._refused: set[tuple[str, str, str]] = set()  # (origin, id, reason) refusals already logged
        self._busy: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self.rounds = RuleRounds(self)  # the rules over the inbox's news

    @property
    def node(self) -> NodeConfig:
        """The node configuration, its trust as of the last reload."""
        return self.reloader.trust.config

    @property
    def own_keys(self) -> tuple[SignerKey, ...]:
        """The keys that may sign for this node now: its node key, then its operators' keys."""
        return self.reloader.trust.own_keys

    def _forget_verified(self, _trust: Trust) -> None:
        """Drop what verified under the old trust: a peer or a key removed counts for nothing now."""
        self._verified.clear()
        self._own_verified.clear()
        self._settlements.clear()

    # -- what may be shown, matched and signed -------------------------------------------------

    def receive(self, item: InboxItem) -> Received:
        """Verify what the relay handed over; return the item as this node may act on it.

        PROTOCOL.md "What an approving node decides on": the request the item carries must be
        well formed, from a configured peer, addressed to this node, and signed by one of that
        peer's keys (allowed to sign requests at its ``created_at``); and everything the relay
        says beside it (the id and origin it files it under, its own description of the tool,
        arguments, digest, times...; this node's decision it holds) must agree with it. Anything
        else is refused, logged (once per item) and counted in ``teaagent_approver_refused_items``,
        and the item is left undecided. Verifications are cached per signature: an Ed25519
        verification costs more than the comparisons, which run on every answer.

        Raises:
            ApiError: 422 ``invalid`` (a malformed request, a bad signature); 502
                ``relay_disagrees`` (the relay says something else than the signed request).
        """
        verified = self._verified.get(item.signature)
        if verified is None or not verified.is_document(item.request):
            verified = self._verify(item)
        problem = verified.disagreement(
            {**item.described, "request_id": item.request_id, "origin": item.origin}
        )
        if problem is None and item.decision is not None:
            problem = self._decision_problem(verified, item.decision)
        if problem is not None:
            self._refuse(item, "relay_disagrees", problem)
            raise ApiError(
                502,
                "relay_disagrees",
                sentence(
                    f"this node's relay describes request {item.request_id} otherwise than the signed "
                    f"request it carries ({problem}); this node neither shows nor signs it"
                ),
            )
        return Received.of(verified, item, self._settlement(verified, item))

    def _settlement(self, request: VerifiedRequest, item: InboxItem) -> Settlement | None:
        """The outcome at its origin that the evidence the relay holds proves here, or None without any.

        The relay is trusted only for delay: its evidence is verified again under this node's own
        configuration (cached per request signature and evidence). Evidence that does not verify
        is a relay that lies or is broken: the item is refused as any other disagreement is.

        Raises:
            ApiError: 502 ``relay_disagrees``: the evidence does not prove the outcome here.
        """
        if item.settlement is None:
            return None
        try:
            seen = (request.signature, canonical(item.settlement))
        except ValueError as exc:  # not even JSON a verifier could read (a NaN, a huge integer...)
            seen = (request.signature, repr(item.settlement).encode())
            self._settlements[seen] = f"it is not canonical JSON ({_clause(exc)})"
        if seen not in self._settlements:
            found: Settlement | str
            try:
                trust = self.reloader.trust
                found = verify_settlement(
                    request.document(),
                    item.settlement,
                    trust.config.quorum,
                    trust.peer_keys.get(request.origin, ()),
                    now=time.time(),
                )
            except QuorumError as exc:
                found = _clause(exc)
            if len(self._settlements) >= MAX_REMEMBERED:
                self._settlements.clear()
            self._settlements[seen] = found
        found = self._settlements[seen]
        if isinstance(found, Settlement):
            return found
        self._refuse(item, "relay_disagrees", f"the settlement it holds does not verify: {found}")
        raise ApiError(
            502,
            "relay_disagrees",
            sentence(
                f"this node's relay holds a settlement of request {item.request_id} that does not verify "
                f"here ({found}); this node neither shows nor signs it"
            ),
        )

    def _verify(self, item: InboxItem) -> VerifiedRequest:
        origin = item.request.get("origin")
        keys = self.reloader.trust.peer_keys.get(origin) if isinstance(origin, str) else None
        try:
            if keys is None:
                raise QuorumError(
                    f"The request's origin {origin!r} is not a configured peer of {self.agent_id}."
                )
            verified = verify_request(
                item.request, item.signature, keys, recipient=self.agent_id, allow_dev=self.allow_dev
            )
        except QuorumError as exc:
            self._refuse(item, "bad_request", _clause(exc))
            raise ApiError(
                422, "invalid", sentence(f"request {item.request_id} is refused: {_clause(exc)}")
            ) from None
        except SignatureError as exc:
            self._refuse(item, "bad_signature", _clause(exc))
            raise ApiError(422, "invalid", sentence(f"{_clause(exc)}; this node does not sign it")) from None
        if len(self._verified) >= MAX_REMEMBERED:
            self._verified.clear()  # rare; the price is verifying again
        self._verified[item.signature] = verified
        return verified

    def _decision_problem(self, request: VerifiedRequest, decision: Mapping[str, Any]) -> str | None:
        """Why the relay's copy of this node's decision is not one of this node's, or None."""
        statement, signature = decision.get("statement"), decision.get("signature")
        if not isinstance(statement, dict) or not isinstance(signature, str):
            return "the relay holds a decision of this node that is not a signed statement"
        try:
            rebuilt = self.statement_for(
                request,
                stated_kind(statement),
                str(statement.get("reason", "")),
                statement.get("signed_at"),  # type: ignore[arg-type]
            )
            check_rebuilt(statement, rebuilt)
            if is_dev_signature(signature):
                # Fail closed: only this node's own, where development signatures are allowed at all.
                if dev_signature_allowed(signature, self.agent_id, allow_dev=self.allow_dev):
                    return None
                allowed = f"not dev:{self.agent_id}" if self.allow_dev else "not allowed here"
                return f"the decision it holds for this node has a development signature, {allowed}"
            seen = (signature, statement_bytes(statement))
            if seen not in self._own_verified:  # the statement matched; its signature, once
                verify_decision(statement, signature, self.own_keys)
                if len(self._own_verified) >= MAX_REMEMBERED:
                    self._own_verified.clear()
                self._own_verified.add(seen)
        except StatementError as exc:
            return f"the decision it holds for this node: {exc.clause}"
        except (SignatureError, ValueError, TypeError, KeyError) as exc:
            return f"the decision it holds for this node does not verify: {_clause(exc)}"
        return None

    def _refuse(self, item: InboxItem, reason: str, why: str) -> None:
        """Log (once per item and reason) and count an item refused before anything was done with it."""
        self.metrics.refused_items.labels(reason).inc()
        mark = (item.origin, item.request_id, reason)
        if mark in self._refused:
            return
        if len(self._refused) >= MAX_REMEMBERED:
            self._refused.clear()
        self._refused.add(mark)
        logger.warning(
            "inbox item %s filed under %s is refused (%s): %s; it is left undecided",
            item.request_id,
            item.origin,
            reason,
            why,
        )

    def check_signable(self, item: Received, now: float) -> None:
        """Refuse a request this node must never sign (its signature verified in :meth:`receive`).

        Raises:
            ApiError: 409 ``withdrawn``, ``settled`` or ``expired``.
        """
        request = item.request
        if item.settled is not None:
            raise ApiError(409, "settled", settled_sentence(request, item.settled))
        if item.state == "withdrawn":
            raise ApiError(
                409,
                "withdrawn",
                f"Request {request.request_id} was withdrawn by its origin {request.origin}; this node signs "
                "nothing for it.",
            )
        if now > request.expires_at:
            raise ApiError(
                409,
                "expired",
                f"Request {request.request_id} expired at {moment(request.expires_at, now)}; this node signs "
                "nothing for "
                "it any more.",
            )

    # -- one decision ----------------------------------------------------------------------------

    def statement_for(
        self, request: VerifiedRequest, kind: DecisionKind, reason: str, signed_at: int
    ) -> dict[str, Any]:
        """The approval or denial statement of this node on the verified request."""
        if kind == "approval":
            return request.approval(self.agent_id, signed_at)
        return request.denial(self.agent_id, signed_at, reason)

    def check_signed_elsewhere(
        self, item: Received, statement: Mapping[str, Any], signature: str
    ) -> Proposal:
        """Check a decision signed with another key than the node's (an operator's own).

        The statement must be the one rebuilt from the request (this node as signer, every field
        equal, types included), dated within the request's life and not ahead of this clock (rule 4:
        :func:`~teaagent.quorum.check_signing_time`, as the relay checks it), and the signature must
        verify with one of the keys that may sign for this node (``NodeConfig.own_keys``: the node
        key, ``[approver] operators``), allowed for its namespace at its ``signed_at``.

        Raises:
            ApiError: 422 ``invalid`` (not a statement of this request, dated outside rule 4's
                bounds, a malformed signature), 403 ``forbidden`` (signed as another node, or by a
                key that may not sign for it).
        """
        try:
            kind = decision_kind(statement)
        except StatementError as exc:
            raise ApiError(422, "invalid", str(exc)) from exc
        signer = statement.get("signer")
        if signer != self.agent_id:
            raise ApiError(
                403,
                "forbidden",
                sentence(f"the statement is signed as {signer!r}, not as this node ({self.agent_id})"),
            )
        try:
            rebuilt = item.request.rebuild_decision(statement, kind, self.agent_id)  # rule 3 (fields)
            check_signing_time(rebuilt["signed_at"], item.request.document(), time.time())  # rule 4
        except StatementError as exc:
            raise ApiError(422, "invalid", str(exc)) from exc
        reason = rebuilt.get("reason", "")
        try:
            wire = wire_signature(signature)
        except SignatureError as exc:
            raise ApiError(
                422, "invalid", sentence(f"the signature is not an SSH signature: {_clause(exc)}")
            ) from exc
        try:
            key = verify_decision(rebuilt, wire, self.own_keys)
        except SignatureError as exc:
            not_loaded = self._not_loaded_yet(wire)
            if not_loaded is not None:
                raise ApiError(403, "forbidden", sentence(f"the {kind} {not_loaded}")) from exc
            raise ApiError(
                403,
                "forbidden",
                sentence(
                    f"the {kind} was not signed by a key that may sign for {self.agent_id}: {_clause(exc)}"
                ),
            ) from exc
        return Proposal(
            kind=kind,
            reason=str(reason),
            by="operator",
            statement=rebuilt,
            signature=wire,
            key_fingerprint=key.fingerprint,
        )

    def _not_loaded_yet(self, wire: str) -> str | None:
        """Why a decision signed by a key this process does not know is refused, as a clause; else None.

        Read only when a decision did not verify: an operator key added to the files while the
        approver ran (and no reload since) is told apart from a key that is listed nowhere (the
        command that lists it is named). None for a loaded key (a bad signature, a namespace or
        a date it may not sign in) and when the files do not load now: the plain refusal says it.
        """
        try:
            signed_by = parse_sshsig(wire).public_key().identity
            listed = load_config(self.node.path).own_keys()
        except (ConfigError, SignatureError, OSError):
            return None  # the files do not load now either: the plain refusal says enough
        if any(key.key.identity == signed_by for key in self.own_keys):
            return None  # a loaded key whose signature is wrong, or out of its namespaces or dates
        for key in listed:
            if key.key.identity == signed_by:
                return (
                    f"was signed by {key.key.fingerprint}, which {key.source.split(':')[0]} lists for "
                    f"{self.agent_id} but this approver has not loaded yet: reload it "
                    f"(kill -HUP {os.getpid()}, or restart it) and submit the decision again"
                )
        return (
            f"was signed by {fingerprint(parse_sshsig(wire).public_key())}, which is not a key of "
            f"{self.agent_id}: list it first (teaagent operators add KEY.pub --config {self.node.path})"
        )

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, ref: tuple[str, str]) -> AsyncIterator[None]:
        """One path per request at a time in this process (the engine and an operator may meet)."""
        lock, users = self._busy.get(ref, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._busy[ref] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._busy[ref]
            if users <= 1:
                del self._busy[ref]
            else:
                self._busy[ref] = (lock, users - 1)

    async def settle(self, item: Received, proposal: Proposal) -> Outcome:
        """Make ``proposal`` this node's decision on ``item``, or finish the one recorded before it.

        The numbered steps of the module. The standing decision is returned whether it is the
        proposal's or not: compare ``outcome.record.kind`` with what you proposed.

        Raises:
            ApiError: 409 ``expired``, 422 ``invalid`` (bad origin signature): nothing is recorded;
                403, 404, 409 or 422 when the relay refuses the signed decision for good.
            StoreError: Redis failed (calling again is safe).
            AuditWriteError: The audit record could not be written; the decision is not sent.
        """
        ref = (item.request.origin, item.request.request_id)
        async with self.one_at_a_time(ref):
            now = time.time()
            self.check_signable(item, now)  # step 1
            statement = proposal.statement or self.statement_for(
                item.request, proposal.kind, proposal.reason, int(now)
            )
            record = Record(
                kind=proposal.kind,
                reason=proposal.reason,
                by=proposal.by,
                key_fingerprint=proposal.key_fingerprint or self.fingerprint,
                statement=statement,
                signature=proposal.signature,
                instance=self.instance,
                recorded_at=now,
            )
            claim = await self.ledger.claim(
                item.request.origin, item.request.request_id, item.request.expires_at, record
            )  # step 2
            if claim.won:
                self.metrics.decisions.labels(proposal.by.split(" ")[0], proposal.kind).inc()
            return await self.finish(item, claim.record, claim.signature, won=claim.won)

    async def finish(self, item: Received, record: Record, signature: str | None, *, won: bool) -> Outcome:
        """Steps 3 to 5 for the standing record (ours, or one another process left unfinished)."""
        ours = won or record.instance == self.instance
        if not ours and time.time() - record.recorded_at < self.settings.takeover_seconds:
            # Recorded by another process a moment ago: it signs, audits and sends it itself.
            return Outcome(record, won=False, forwarded=False, deferred=True)
        if signature is None:  # step 3
            if time.time() > item.request.expires_at:
                raise ApiError(
                    409,
                    "expired",
                    f"Request {item.request.request_id} expired at {moment(item.request.expires_at)}; "
                    "this node signs nothing for it any more.",
                )
            made = self._sign(item, record)
            signature = await self.ledger.attach(
                item.request.origin, item.request.request_id, item.request.expires_at, made
            )
        # Step 4. The recording process audits at once; any other first looks for its record.
        if won:
            self.audit.record(item.request.document(), record)
        elif not self.audit.has(item.request.origin, item.request.request_id):
            self.audit.record(item.request.document(), record, recovered=not ours)
        if not ours:
            self.metrics.takeovers.inc()
            logger.info(
                "finished request %s of %s, recorded by another approver process (%s) at %.0f",
                item.request.request_id,
                item.request.origin,
                record.instance,
                record.recorded_at,
            )
        forwarded = await self._forward(item, record, signature)  # step 5
        return Outcome(record, won=won, forwarded=forwarded)

    def _sign(self, item: Received, record: Record) -> str:
        """Sign the recorded statement with the node key; return the signature in wire form.

        What ``sign_approval``/``sign_denial`` do, minus checking the request again (step 1 did):
        the recorded statement is compared with the one rebuilt from the request first, so a
        record that does not match its request (written by a broken or hostile process) is never
        signed.

        Raises:
            ApiError: 409 ``conflict`` when the record does not match the request.
        """
        try:
            rebuilt = self.statement_for(item.request, record.kind, record.reason, record.signed_at)
            check_rebuilt(record.statement, rebuilt)
        except (KeyError, ValueError, TypeError, StatementError):
            raise ApiError(
                409,
                "conflict",
                f"The decision recorded for request {item.request.request_id} does not match the request; "
                "this node signs nothing for it.",
            ) from None
        namespace = APPROVAL_NAMESPACE if record.kind == "approval" else DENIAL_NAMESPACE
        armored = sshsig_sign(statement_bytes(rebuilt), self.signer, namespace)
        self.metrics.signatures.inc()
        return wire_signature(armored)

    async def _forward(self, item: Received, record: Record, signature: str) -> bool:
        """Hand the signed decision to the relay; False when it did not answer (sent again later).

        Raises:
            ApiError: The relay refused it for good (its status and code, its sentence).
        """
        try:
            if self.poster is not None:
                await self.poster.post(item.request.request_id, record.statement, signature)
            else:
                await self.relay.submit_decision(item.request.request_id, record.statement, signature)
        except RelayError as exc:
            if exc.status_code is None or exc.status_code in _TRANSIENT:
                self.metrics.forwards.labels("retry").inc()
                logger.warning(
                    "the decision on request %s waits for the relay: %s", item.request.request_id, exc
                )
                return False
            self.metrics.forwards.labels("refused").inc()
            status = exc.status_code if exc.status_code in _RELAY_CODES else 409
            # Withdrawn between the listing and here: said as such (its signature counts nowhere).
            code = exc.code if exc.code in ("withdrawn", "settled") else _RELAY_CODES.get(status, "conflict")
            raise ApiError(status, code, sentence(str(exc))) from exc
        self.metrics.forwards.labels("ok").inc()
        return True

    # -- the rules, over the inbox (teaagent_approver._rounds) ------------------------------------

    async def run(self) -> None:
        """Apply the rules to the inbox until cancelled (:meth:`RuleRounds.run`)."""
        await self.rounds.run()

    async def handle(self, items: list[InboxItem]) -> int:
        """Decide each item the rules decide (:meth:`RuleRounds.handle`); how many were acted on."""
        return await self.rounds.handle(items)

    @property
    def last_round_error(self) -> str | None:
        """Why the engine's last finished round failed, None once one succeeds (for /ready)."""
        return self.rounds.last_round_error

    async def _stream_last_id(self) -> Any:
        stream = self.store.keys.queue(self.store.inbox_queue.name).stream
        try:
            last: Any = await self.store.client.xrevrange(stream, "+", "-", count=1)
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"Redis at {self.store.url} failed: {exc}") from exc
        return last[0][0] if last else "0-0"

    async def _wait_for_news(self, last_id: Any, seconds: float) -> None:
        """Block until the relay queues a new request for the approver, or ``seconds`` pass."""
        stream = self.store.keys.queue(self.store.inbox_queue.name).stream
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            block = max(1, int(min(remaining, WAKE_BLOCK_SECONDS) * 1000))
            try:
                news = await self.store.blocking.xread({stream: last_id}, count=1, block=block)
            except redis.exceptions.RedisError as exc:
                raise StoreError(f"Redis at {self.store.url} failed: {exc}") from exc
            if news:
                return

    def spawn(self, coroutine: Any, name: str) -> asyncio.Task[Any]:
        """Run ``coroutine`` in the background, holding the task (the loop keeps only a weak reference)."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
