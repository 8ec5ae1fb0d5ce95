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

The engine's loop long-polls the relay's inbox (``GET /v1/inbox?state=pending``) and decides each
pending item by the first matching ``[[approver.rules]]`` entry; ``ask`` (or no match) leaves it to
an operator and hands it to the notifier once. Items that need nothing (asked, refused, deferred)
would make every listing answer at once, so the loop then waits for the relay's inbox queue
(the stream the relay appends to for each new request) to grow, by ``XREAD BLOCK`` in the node's
Redis, rather than polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import redis.exceptions

from teaagent._reload import Trust, TrustReloader
from teaagent._words import moment
from teaagent.config import ConfigError, NodeConfig, load_config
from teaagent.errors import QuorumError, RelayError, SignatureError, StatementError, StoreError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    DENIAL_TYPE,
    MAX_CLOCK_SKEW_SECONDS,
    Settlement,
    VerifiedRequest,
    canonical,
    check_rebuilt,
    decision_kind,
    is_dev_signature,
    statement_bytes,
    verify_decision,
    verify_request,
    verify_settlement,
    wire_signature,
)
from teaagent.relay_client import AsyncRelayClient, InboxItem
from teaagent.signing import Signer, fingerprint, parse_sshsig, sshsig_sign
from teaagent.store import Store
from teaagent.trust import SignerKey
from teaagent_approver._audit import AuditWriteError, DecisionAudit
from teaagent_approver._errors import ApiError, sentence
from teaagent_approver._items import Received, item_view, matching_rule, settled_sentence
from teaagent_approver._ledger import DecisionKind, Ledger, Record
from teaagent_approver._metrics import ApproverMetrics
from teaagent_approver._settings import Settings
from teaagent_approver._wire import DecisionPoster

__all__ = ["Engine", "Outcome", "Proposal"]

logger = logging.getLogger("teaagent.approver")

LIST_LIMIT: Final = 1000  # one inbox listing: the relay's own bound
WAKE_BLOCK_SECONDS: Final = 2.0  # one XREAD block, under the store client's socket timeout
IDLE_RELIST_SECONDS: Final = 10.0  # with nothing to do, list again at least this often anyway
DEFER_SECONDS: Final = 0.5  # how soon to look again at an item another process is deciding
RETRY_START_SECONDS: Final = 0.25  # the first wait after the relay or Redis failed; doubles per failure
RETRY_CAP_SECONDS: Final = 5.0
REFUSED_RETRY_SECONDS: Final = 5.0  # how soon to look again at an item refused as the relay handed it
MAX_REMEMBERED: Final = 100_000  # inbox items whose disposition is kept in memory
_TRANSIENT: Final = frozenset({408, 425, 429, 500, 502, 503, 504})
_RELAY_CODES: Final = {403: "forbidden", 404: "not_found", 409: "conflict", 422: "invalid"}


class Notifies(Protocol):
    """What the engine needs of the notifier (``teaagent_approver._notify.Notifier``)."""

    async def notify(self, item: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """A decision someone wants this node to make.

    Attributes:
        kind: ``approval`` or ``denial``.
        reason: The reason (a denial signs it).
        by: ``rule N`` or ``operator``.
        statement: The statement, when it was signed elsewhere; None to build it now.
        signature: Its signature, when signed elsewhere; None to sign with the node key.
        key_fingerprint: The fingerprint of the key that signed it elsewhere.
    """

    kind: DecisionKind
    reason: str
    by: str
    statement: dict[str, Any] | None = None
    signature: str | None = None
    key_fingerprint: str | None = None


@dataclass(frozen=True)
class Outcome:
    """What became of a proposal: the decision that stands for the request, and where it is.

    Attributes:
        record: The standing decision (the proposal's, or one recorded before it).
        won: True when this call recorded it.
        forwarded: True when the relay took it.
        deferred: True when another process recorded it a moment ago and is finishing it.
    """

    record: Record
    won: bool
    forwarded: bool
    deferred: bool = False


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
        self._skip: dict[tuple[str, str], tuple[float, int]] = {}  # ref -> (monotonic until, expires_at)
        self._asked: dict[tuple[str, str], int] = {}  # ask items already looked at -> expires_at
        self._failures: dict[tuple[str, str], int] = {}  # ref -> relay failures in a row
        self._busy: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # Why the engine's last finished round failed, None once one succeeds (for /ready).
        self.last_round_error: str | None = None

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
        if is_dev_signature(signature) and self.allow_dev:
            return None
        try:
            kind: DecisionKind = "denial" if statement.get("type") == DENIAL_TYPE else "approval"
            rebuilt = self.statement_for(
                request,
                kind,
                str(statement.get("reason", "")),
                statement.get("signed_at"),  # type: ignore[arg-type]
            )
            check_rebuilt(statement, rebuilt)
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
        equal, types included), dated within the request's life and not ahead of this clock, and
        the signature must verify with one of the keys that may sign for this node
        (``NodeConfig.own_keys``: the node key, ``[approver] operators``), allowed for its namespace
        at its ``signed_at``.

        Raises:
            ApiError: 422 ``invalid`` (not a statement of this request, a malformed signature),
                403 ``forbidden`` (signed as another node, or by a key that may not sign for it).
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
            rebuilt = item.request.rebuild_decision(statement, kind, self.agent_id)
        except StatementError as exc:
            raise ApiError(422, "invalid", str(exc)) from exc
        signed_at, reason = rebuilt["signed_at"], rebuilt.get("reason", "")
        request = item.request
        now = time.time()
        if signed_at > request.expires_at:
            raise ApiError(
                422,
                "invalid",
                f"The statement was signed at {moment(signed_at, now)}, after the request expired at "
                f"{moment(request.expires_at, now)}.",
            )
        if signed_at < request.created_at - MAX_CLOCK_SKEW_SECONDS:  # rule 4: nobody signs before it exists
            raise ApiError(
                422,
                "invalid",
                f"The statement is dated {moment(signed_at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} "
                f"seconds before the request was created at {moment(request.created_at, now)}.",
            )
        if signed_at > now + MAX_CLOCK_SKEW_SECONDS:
            raise ApiError(
                422,
                "invalid",
                f"The statement is dated {moment(signed_at, now)}, more than {MAX_CLOCK_SKEW_SECONDS} "
                "seconds in the future.",
            )
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
    async def _one_at_a_time(self, ref: tuple[str, str]) -> AsyncIterator[None]:
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
        async with self._one_at_a_time(ref):
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
            return await self._finish(item, claim.record, claim.signature, won=claim.won)

    async def _finish(self, item: Received, record: Record, signature: str | None, *, won: bool) -> Outcome:
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

    # -- the rules, over the inbox ---------------------------------------------------------------

    async def run(self) -> None:
        """Apply the rules to the inbox until cancelled; survive the relay and Redis going away."""
        failures = 0
        while True:
            try:
                await self.round()
                failures = 0
                self.last_round_error = None
            except asyncio.CancelledError:
                raise
            except (RelayError, StoreError) as exc:
                failures += 1
                kind = "relay" if isinstance(exc, RelayError) else "redis"
                self.last_round_error = f"its last round failed on its {kind}: {exc}"
                self.metrics.engine_errors.labels(kind).inc()
                log = logger.warning if failures == 1 else logger.debug  # once per outage
                log("approver of %s waits for its %s: %s", self.agent_id, kind, exc)
                await asyncio.sleep(min(RETRY_CAP_SECONDS, RETRY_START_SECONDS * 2 ** (failures - 1)))
            except Exception as exc:
                failures += 1
                self.last_round_error = f"its last round failed: {exc!r}"
                self.metrics.engine_errors.labels("other").inc()
                logger.exception("approver of %s failed a round", self.agent_id)
                await asyncio.sleep(min(RETRY_CAP_SECONDS, RETRY_START_SECONDS * 2 ** (failures - 1)))

    async def round(self) -> int:
        """List the pending inbox once, decide what the rules decide; wait when nothing is to do.

        Returns:
            How many items were acted on (recorded, finished or sent).

        Raises:
            RelayError: The relay is unreachable or refused the listing.
            StoreError: Redis failed.
        """
        last_id = await self._stream_last_id()
        items = await self.relay.list_inbox("pending", limit=LIST_LIMIT, wait=self.settings.poll_seconds)
        acted = await self.handle(items)
        self._prune()
        if items and not acted:
            await self._wait_for_news(last_id, self._idle_seconds())
        return acted

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
                todo.append(self.receive(item))
            except ApiError:
                # Refused, logged and counted by receive(): left undecided. Looked at again a little
                # later, should the relay's next answer be the truth.
                self.metrics.skipped.labels("refused").inc()
                self._remember((item.origin, item.request_id), _hinted_expiry(item), REFUSED_RETRY_SECONDS)
        if not todo:
            return 0
        gate = asyncio.Semaphore(self.settings.concurrency)

        async def one(item: Received) -> int:
            async with gate:
                return await self._by_rule(item)

        results = await asyncio.gather(*(one(item) for item in todo), return_exceptions=True)
        acted = 0
        failure: BaseException | None = None
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                failure = failure or result
            else:
                acted += result
        if failure is not None:
            raise failure
        return acted

    def _remember(self, ref: tuple[str, str], expires_at: int, seconds: float | None) -> None:
        """Skip the item for ``seconds`` (None: for the rest of its life) in later listings."""
        until = float("inf") if seconds is None else time.monotonic() + seconds
        self._skip[ref] = (until, expires_at)

    async def _by_rule(self, item: Received) -> int:
        ref = (item.request.origin, item.request.request_id)
        if item.state == "withdrawn":
            self.metrics.skipped.labels("withdrawn").inc()
            self._remember(ref, item.request.expires_at, None)
            return 0
        if item.settled is not None:
            self.metrics.skipped.labels("settled").inc()
            self._remember(ref, item.request.expires_at, None)
            return 0
        if time.time() > item.request.expires_at:
            self.metrics.skipped.labels("expired").inc()
            self._remember(ref, item.request.expires_at, None)
            return 0
        found = matching_rule(self.node.approver.rules, item.request)
        if found is None or found[1].decision == "ask":
            return await self._asked_item(item)
        index, rule = found
        kind: DecisionKind = "approval" if rule.decision == "approve" else "denial"
        try:
            outcome = await self.settle(item, Proposal(kind=kind, reason=rule.reason, by=f"rule {index}"))
        except ApiError as exc:
            # Expired meanwhile, or the relay refused it for good: nothing more to do for it.
            logger.warning(
                "request %s of %s is left undecided: %s",
                item.request.request_id,
                item.request.origin,
                exc.message,
            )
            self._remember(ref, item.request.expires_at, None)
            return 0
        except AuditWriteError as exc:
            logger.error("%s", exc)
            self._backoff(ref, item.request.expires_at)
            return 0
        return self._after(ref, item.request.expires_at, outcome)

    def _after(self, ref: tuple[str, str], expires_at: int, outcome: Outcome) -> int:
        if outcome.deferred:
            self.metrics.skipped.labels("deferred").inc()
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
        async with self._one_at_a_time(ref):
            [(record, signature)] = await self.ledger.read([ref])
            if record is not None:
                try:
                    outcome = await self._finish(item, record, signature, won=False)
                except ApiError as exc:
                    logger.warning(
                        "request %s of %s is left undecided: %s",
                        item.request.request_id,
                        item.request.origin,
                        exc.message,
                    )
                    self._remember(ref, item.request.expires_at, None)
                    return 0
                return self._after(ref, item.request.expires_at, outcome)
        self._asked[ref] = item.request.expires_at
        self._remember(ref, item.request.expires_at, None)
        self.metrics.skipped.labels("ask").inc()
        if self.notifier is not None and await self.ledger.mark_notified(
            item.request.origin, item.request.request_id, item.request.expires_at
        ):
            self.metrics.notifications.inc()
            view = item_view(item, None, self.node.approver.rules, time.time())
            try:
                await self.notifier.notify(view)
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
        due = [until - now for until, _expires in self._skip.values() if now < until != float("inf")]
        return max(0.01, min([IDLE_RELIST_SECONDS, *due]))

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


def _hinted_expiry(item: InboxItem) -> int:
    """The expiry a refused item claims, only to bound how long it is remembered."""
    expires_at = item.request.get("expires_at")
    return expires_at if isinstance(expires_at, int) and not isinstance(expires_at, bool) else 0


def _expiry(value: tuple[float, int] | int) -> int:
    return value[1] if isinstance(value, tuple) else value
