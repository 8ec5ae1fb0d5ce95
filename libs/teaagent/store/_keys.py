"""Every Redis key name teaagent uses, in one place.

Layout (``P`` is the node's prefix, ``ta:<agent_id>`` by default)::

    P:req:{<id>}:doc          STRING  one of this node's own requests, the signed document verbatim
    P:req:{<id>}:outcome      HASH    counting parameters (required, peers, expires_at) and the state
                                      (an inbox item's also "queued": its approver queue entry id)
    P:req:{<id>}:decisions    HASH    "approval:<signer>" / "denial:<signer>" -> verified decision bytes
    P:req:{<id>}:events       STREAM  accepted / decision / outcome events; waiters XREAD it
    P:req:{<id>}:deliveries   HASH    peer -> JSON {state, attempts, error, at}: how the request's
                                      delivery to that peer's relay went (the delivery worker's word)
    P:in:{<origin>/<id>}:...  the same keys for a request received from peer <origin>
    P:req:index, P:in:index   ZSET    refs by expires_at, for listings
    P:req:pending, P:in:pending  ZSET  the pending ones' refs only, by expires_at: a pending
                              listing never pages through decided requests
    P:in:held:{P/<origin>}    ZSET    the refs of one origin's pending received requests, by
                              expires_at: what it holds of this node's inbox, against its cap
    P:q:{P/<name>}:stream     STREAM  a work queue (consumer group "workers"): deliveries, inbox
    P:q:{P/<name>}:schedule   ZSET    entries waiting for their next attempt, scored by not-before (ms)
    P:q:{P/<name>}:dead       STREAM  entries that kept failing or expired (dead letters)
    P:gcra:{<scope>}          STRING  a rate-limit bucket: its theoretical arrival time (GCRA), microseconds
    P:gcra:{<scope>}:charged:<origin>/<id>  STRING  set once a received request was charged to the
                              bucket (a cluster's receive, in steps), until the request expires
    P:apr:{<origin>/<id>}:decision   STRING  the decision this node's approver recorded on a received
                              request (JSON), written once (SET NX) before anything is signed
    P:apr:{<origin>/<id>}:signature  STRING  the node key's signature over that recorded decision,
                              written once (SET NX): a second signer uses the first one's
    P:apr:{<origin>/<id>}:notified   STRING  set once the request was handed to the notifier

The approver's keys carry the inbox item's own tag (``{<origin>/<id>}``), so they sit in the slot of
the request they decide.

Why the hash tags sit where they do: Redis Cluster hashes only the first ``{...}`` of a key, so a key
can carry exactly one tag. Each Lua script touches the keys of exactly one tag (one request's
keys, or one queue's three keys, or one window), so every script runs on Redis Cluster unchanged while
requests still spread over the cluster's slots. Putting the node's id in the tag instead
(``ta:{alpha}:...``) would pin a whole node to one slot. The price of per-request tags: storing a
request and queueing its deliveries are two steps, not one script; both are idempotent, so a client
that retries after a crash completes them (see ``RequestBook.accept``). Likewise the index sets are
written before a request's script and a settled request leaves the pending set after it; a member
left behind by a crash is skipped and removed by the next listing.

Every key gets a TTL: request keys live until ``expires_at + REQUEST_RETENTION_SECONDS``; queue keys
and the index sets are pushed forward to the latest entry's expiry plus the same retention; an
origin's held set to its latest ref's expiry (an expired ref counts for nothing); a rate-limit
bucket lives until it is full again (at most one window).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "AGENT_ID_PATTERN",
    "MAX_DOCUMENT_BYTES",
    "REQUEST_ID_PATTERN",
    "REQUEST_RETENTION_SECONDS",
    "ApproverKeys",
    "Keys",
    "QueueKeys",
    "RequestKeys",
    "node_prefix",
]

MAX_DOCUMENT_BYTES = (
    1024 * 1024
)  # a signed request or decision, never a file upload; Redis keeps it in memory
REQUEST_RETENTION_SECONDS = 24 * 3600  # an operator can still inspect a request for a day after it expires
MAX_SCOPE_LENGTH = 256  # a tool name or an origin, with room to spare; a key is not a document

AGENT_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # PROTOCOL.md "Actors"
REQUEST_ID_PATTERN = re.compile(r"[0-9a-f]{32}")  # PROTOCOL.md "Request"
_PREFIX_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # no braces (tags), no glob characters
_QUEUE_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def node_prefix(agent_id: str) -> str:
    """Return the key prefix of a node, ``ta:<agent_id>``.

    Raises:
        ValueError: ``agent_id`` is not a valid agent id.
    """
    if not AGENT_ID_PATTERN.fullmatch(agent_id):
        raise ValueError(f"agent id {agent_id!r} is not valid (lowercase letters, digits, '.', '_', '-')")
    return f"ta:{agent_id}"


@dataclass(frozen=True)
class RequestKeys:
    """The keys of one stored request; they share one hash tag."""

    doc: str
    outcome: str
    decisions: str
    events: str
    deliveries: str

    def all(self) -> tuple[str, str, str, str, str]:
        """Return the five keys in a fixed order."""
        return (self.doc, self.outcome, self.decisions, self.events, self.deliveries)


@dataclass(frozen=True)
class ApproverKeys:
    """The approver's keys of one received request; they share the inbox item's hash tag."""

    decision: str
    signature: str
    notified: str


@dataclass(frozen=True)
class QueueKeys:
    """The keys of one work queue; they share one hash tag."""

    name: str
    stream: str
    schedule: str
    dead: str


class Keys:
    """Builds every key name under one prefix; nothing else in teaagent spells a key."""

    def __init__(self, prefix: str) -> None:
        """Build the key names of one node (or one test) under ``prefix``.

        Raises:
            ValueError: ``prefix`` holds characters other than letters, digits, ``.``, ``_``, ``:``, ``-``.
        """
        if not _PREFIX_PATTERN.fullmatch(prefix):
            raise ValueError(f"key prefix {prefix!r} is not valid (letters, digits, '.', '_', ':', '-')")
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"Keys({self.prefix!r})"

    def request(self, request_id: str) -> RequestKeys:
        """Return the keys of one of this node's own requests.

        Raises:
            ValueError: ``request_id`` is not 32 lowercase hex characters.
        """
        _check_request_id(request_id)
        return self._request_keys(f"{self.prefix}:req:{{{request_id}}}")

    def inbox_item(self, origin: str, request_id: str) -> RequestKeys:
        """Return the keys of a request received from the peer ``origin``.

        The origin is part of the tag, so a peer cannot squat another origin's request id.

        Raises:
            ValueError: ``origin`` is not an agent id, or ``request_id`` is not 32 lowercase hex characters.
        """
        _check_request_id(request_id)
        if not AGENT_ID_PATTERN.fullmatch(origin):
            raise ValueError(f"origin {origin!r} is not a valid agent id")
        return self._request_keys(f"{self.prefix}:in:{{{origin}/{request_id}}}")

    def approver_item(self, origin: str, request_id: str) -> ApproverKeys:
        """Return the approver's keys of a request received from the peer ``origin``.

        Raises:
            ValueError: ``origin`` is not an agent id, or ``request_id`` is not 32 lowercase hex characters.
        """
        _check_request_id(request_id)
        if not AGENT_ID_PATTERN.fullmatch(origin):
            raise ValueError(f"origin {origin!r} is not a valid agent id")
        base = f"{self.prefix}:apr:{{{origin}/{request_id}}}"
        return ApproverKeys(
            decision=f"{base}:decision", signature=f"{base}:signature", notified=f"{base}:notified"
        )

    def request_index(self) -> str:
        """Return the sorted set of this node's own request ids, scored by ``expires_at``."""
        return f"{self.prefix}:req:index"

    def inbox_index(self) -> str:
        """Return the sorted set of received ``<origin>/<request_id>`` refs, scored by ``expires_at``."""
        return f"{self.prefix}:in:index"

    def request_pending(self) -> str:
        """Return the sorted set of this node's own pending request ids, scored by ``expires_at``."""
        return f"{self.prefix}:req:pending"

    def inbox_pending(self) -> str:
        """Return the sorted set of pending received ``<origin>/<request_id>`` refs, by ``expires_at``."""
        return f"{self.prefix}:in:pending"

    def inbox_held(self, origin: str) -> str:
        """Return the sorted set of the peer ``origin``'s pending received refs, scored by ``expires_at``.

        Its own hash tag (the prefix and the origin): the step that counts a new request against
        the origin's cap touches this key alone.

        Raises:
            ValueError: ``origin`` is not an agent id.
        """
        if not AGENT_ID_PATTERN.fullmatch(origin):
            raise ValueError(f"origin {origin!r} is not a valid agent id")
        return f"{self.prefix}:in:held:{{{self.prefix}/{origin}}}"

    def queue(self, name: str) -> QueueKeys:
        """Return the keys of the work queue ``name`` (``deliveries``, ``inbox``).

        Raises:
            ValueError: ``name`` is not a short lowercase word.
        """
        if not _QUEUE_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"queue name {name!r} is not valid (a short lowercase word)")
        base = f"{self.prefix}:q:{{{self.prefix}/{name}}}"
        return QueueKeys(name=name, stream=f"{base}:stream", schedule=f"{base}:schedule", dead=f"{base}:dead")

    def ratelimit(self, scope: str) -> str:
        """Return the key of the rate-limit bucket ``scope`` (a tool name, ``origin:<id>``...).

        Named ``gcra``, not ``rl`` as the sorted-set windows of earlier versions were: a process of
        this version never meets a key of the old type (WRONGTYPE would refuse every call on it).

        Raises:
            ValueError: ``scope`` is empty, too long, or holds a brace.
        """
        if not scope or len(scope) > MAX_SCOPE_LENGTH or "{" in scope or "}" in scope:
            raise ValueError(
                f"rate-limit scope {scope!r} must be 1 to {MAX_SCOPE_LENGTH} characters without braces"
            )
        return f"{self.prefix}:gcra:{{{scope}}}"

    def ratelimit_charged(self, scope: str, ref: str) -> str:
        """Return the key that marks request ``ref`` (``<origin>/<id>``) charged to bucket ``scope``.

        In the bucket's slot, so that one script reads the mark and charges the bucket.

        Raises:
            ValueError: ``scope`` is malformed (as for :meth:`ratelimit`), or ``ref`` is empty or
                holds a brace.
        """
        if not ref or "{" in ref or "}" in ref:
            raise ValueError(f"a charged request's ref must be non-empty and without braces, not {ref!r}")
        return f"{self.ratelimit(scope)}:charged:{ref}"

    def pattern(self) -> str:
        """Return the SCAN pattern matching every key under this prefix."""
        return f"{self.prefix}:*"

    @staticmethod
    def _request_keys(base: str) -> RequestKeys:
        return RequestKeys(
            doc=f"{base}:doc",
            outcome=f"{base}:outcome",
            decisions=f"{base}:decisions",
            events=f"{base}:events",
            deliveries=f"{base}:deliveries",
        )


def _check_request_id(request_id: str) -> None:
    if not REQUEST_ID_PATTERN.fullmatch(request_id):
        raise ValueError(f"request id {request_id!r} is not 32 lowercase hex characters")
