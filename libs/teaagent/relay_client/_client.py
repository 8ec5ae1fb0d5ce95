"""HTTP clients of the relay API (ARCHITECTURE.md "Relay HTTP API"), synchronous and asyncio.

Both clients speak the same calls and return the same frozen dataclasses; every failure is a
:class:`~teaagent.errors.RelayError` carrying the relay's status and stable ``ErrorOut`` code.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import urlencode, urlsplit

import httpx

from teaagent._http import NoAnswer, client_verify, http_pool
from teaagent._json import JSONDepthError, parse_json
from teaagent.errors import RelayError
from teaagent.quorum import describe_outcome
from teaagent.trust import QuorumPolicy

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_WAIT_SECONDS",
    "AsyncRelayClient",
    "DecisionReceipt",
    "InboxDecision",
    "InboxItem",
    "PeerDelivery",
    "RelayClient",
    "RequestStatus",
]

DEFAULT_TIMEOUT: Final = 10.0  # seconds for one call; a relay answers in milliseconds, long-polls excepted
MAX_WAIT_SECONDS: Final = 60.0  # the relay's cap on one long-poll; longer waits are several polls
# The largest answer taken: an inbox listing of 1000 items, each a request under the relay's 64 KiB.
_MAX_ANSWER_BYTES: Final = 1000 * 80 * 1024
_WAIT_MARGIN: Final = 5.0  # a long-poll's HTTP timeout is its wait plus this, so the relay answers first

State = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]
InboxState = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled", "all"]
_INBOX_STATES: Final = frozenset(("pending", "approved", "denied", "expired", "withdrawn", "settled"))
_REQUEST_STATES: Final = ("pending", "approved", "denied", "expired", "withdrawn")
DeliveryStateName = Literal["pending", "delivered", "failing", "given_up"]
_DELIVERY_STATES: Final = ("pending", "delivered", "failing", "given_up")


@dataclass(frozen=True, kw_only=True)
class PeerDelivery:
    """How the relay's delivery of a request to one peer's relay went (the relay's word, for display).

    Attributes:
        state: ``pending`` (not tried yet), ``delivered`` (the peer's relay took it), ``failing``
            (the last attempt failed, another is scheduled) or ``given_up`` (refused for good, or
            no attempt is left before the request expires).
        attempts: Attempts made so far.
        error: The last failure's sentence, or None.
    """

    state: DeliveryStateName
    attempts: int = 0
    error: str | None = None

    @property
    def unreachable(self) -> bool:
        """True when the last attempt failed (``failing`` or ``given_up``)."""
        return self.state in ("failing", "given_up")


def _deliveries(raw: object) -> dict[str, PeerDelivery]:
    """Read ``deliveries`` leniently: an entry this client cannot read is left out (display only)."""
    out: dict[str, PeerDelivery] = {}
    if not isinstance(raw, Mapping):
        return out
    for peer, entry in raw.items():
        if not isinstance(entry, Mapping):
            continue
        state = entry.get("state")
        if state not in _DELIVERY_STATES:
            continue
        error = entry.get("error")
        attempts = entry.get("attempts")
        out[str(peer)] = PeerDelivery(
            state=state,
            attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
            error=str(error) if error is not None else None,
        )
    return out


@dataclass(frozen=True, kw_only=True)
class RequestStatus:
    """One of this node's own requests as its relay counts it.

    Attributes:
        request_id: The request's id.
        state: ``pending``, ``approved``, ``denied`` or ``expired``; once decided it never changes.
        required: Approvals needed.
        peers: The request's peers that the relay counts.
        signers: Peers whose approval was counted.
        denied_by: Peers whose denial was counted.
        denial_reasons: The reason each denier signed.
        expires_at: Unix seconds after which the request is expired.
        accepted_at: Unix seconds when the relay stored it.
        decided_at: Unix seconds when it was decided, or None.
        certificate: The quorum certificate once approved (verify it: the relay is not trusted);
            it carries the denials the relay counted as well (``"denials"``), for rule 6.
        denials: The signed denials ``{"statement", "signature"}`` the relay counted, so that the
            origin can check who really denied (the relay's ``denied_by`` is only its word).
        approvals: The signed approvals ``{"statement", "signature"}`` the relay counted so far
            (empty from a relay that does not send them).
        deliveries: Per peer, how the relay's delivery of the request went: who received it, who
            could not be reached (empty from a relay that does not report it).
        withdrawal: The origin's signed withdrawal ``{"statement", "signature"}`` once withdrawn.
    """

    request_id: str
    state: State
    required: int
    peers: tuple[str, ...]
    signers: tuple[str, ...]
    denied_by: tuple[str, ...]
    denial_reasons: Mapping[str, str] = field(default_factory=dict)
    expires_at: int
    accepted_at: int
    decided_at: int | None
    certificate: dict[str, Any] | None
    denials: tuple[dict[str, Any], ...] = ()
    approvals: tuple[dict[str, Any], ...] = ()
    deliveries: Mapping[str, PeerDelivery] = field(default_factory=dict)
    withdrawal: dict[str, Any] | None = None
    # A version 2 request's policy, set only by the gate from the request it signed (never the
    # relay's word): its terms limited to the peers configured here, named after this node's groups.
    policy: QuorumPolicy | None = None

    @property
    def decided(self) -> bool:
        """Whether the outcome is final."""
        return self.state != "pending"

    def describe(self) -> str:
        """Return the state as one phrase: ``approved by beta (1 approval of the 1 needed)`` and the like."""
        return describe_outcome(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestStatus:
        """Build it from the relay's JSON (``RequestStatusOut``).

        Raises:
            ValueError: The JSON is not a request status (a field is missing or of the wrong kind).
        """
        try:
            state = data["state"]
            if state not in _REQUEST_STATES:
                raise ValueError(f"its state {state!r} is not a request state")
            certificate = data.get("certificate")
            denials = data.get("denials") or ()
            if certificate is not None and not isinstance(certificate, dict):
                raise ValueError("its certificate is not a JSON object")
            if not all(isinstance(denial, dict) for denial in denials):
                raise ValueError("its denials are not JSON objects")
            withdrawal = data.get("withdrawal")
            if withdrawal is not None and not isinstance(withdrawal, dict):
                raise ValueError("its withdrawal is not a JSON object")
            approvals = data.get("approvals") or ()
            if not all(isinstance(approval, dict) for approval in approvals):
                raise ValueError("its approvals are not JSON objects")
            return cls(
                request_id=str(data["request_id"]),
                state=state,
                required=int(data["required"]),
                peers=tuple(data["peers"]),
                signers=tuple(data["signers"]),
                denied_by=tuple(data["denied_by"]),
                denial_reasons=dict(data.get("denial_reasons") or {}),
                expires_at=int(data["expires_at"]),
                accepted_at=int(data["accepted_at"]),
                decided_at=data.get("decided_at"),
                certificate=certificate,
                denials=tuple(denials),
                approvals=tuple(approvals),
                deliveries=_deliveries(data.get("deliveries")),
                withdrawal=withdrawal,
            )
        except KeyError as exc:
            raise ValueError(f"it has no field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"a field has the wrong type ({exc})") from None


@dataclass(frozen=True, kw_only=True)
class InboxItem:
    """A request received from a peer origin, as this node's relay hands it over: not yet trusted.

    The relay is not trusted (PROTOCOL.md "What an approving node decides on"): the request it
    carries counts only once :func:`teaagent.quorum.verify_request` has verified it against the
    origin's keys, and what the relay says of the item beside it (its tool, arguments, digest,
    times...) is kept apart, in ``described``, only to be compared with the verified request
    (:meth:`teaagent.quorum.VerifiedRequest.disagreement`). Nothing here is shown, matched or signed
    as it stands.

    Attributes:
        request_id: The id the relay files it under.
        origin: The origin the relay files it under.
        state: ``pending``, ``approved``/``denied`` (by this node), ``expired``, or ``withdrawn``
            (by its origin: it is never to be signed), as the relay says.
        request: The request document it carries, unverified.
        signature: The origin's signature over it, as carried.
        decision: This node's signed decision ``{"statement", "signature"}``, as the relay holds it.
        described: Every other field of the relay's answer (its own description of the request).
        settlement: The evidence of its outcome at its origin, ``{"certificate"}`` or
            ``{"denials"}``, as the relay holds it: believed only once verified
            (:func:`teaagent.quorum.verify_settlement`).
    """

    request_id: str
    origin: str
    state: State
    request: dict[str, Any]
    signature: str
    decision: dict[str, Any] | None
    described: dict[str, Any] = field(default_factory=dict)
    settlement: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InboxItem:
        """Build it from the relay's JSON (``InboxItemOut``).

        Raises:
            ValueError: The answer is not an inbox item (not an object, or its id, origin, state,
                request, signature or decision has the wrong type); the sentence says which.
        """
        if not isinstance(data, Mapping):
            raise ValueError("an inbox item is not a JSON object")
        request_id, origin, state = data.get("request_id"), data.get("origin"), data.get("state")
        request, signature, decision = data.get("request"), data.get("signature"), data.get("decision")
        if not isinstance(request_id, str) or not isinstance(origin, str):
            raise ValueError("an inbox item has no string request_id and origin")
        if state not in _INBOX_STATES:
            raise ValueError(f"inbox item {request_id} has the state {state!r}, which is not an inbox state")
        if not isinstance(request, dict) or not isinstance(signature, str):
            raise ValueError(f"inbox item {request_id} carries no request object and signature string")
        if decision is not None and not isinstance(decision, dict):
            raise ValueError(f"inbox item {request_id} has a decision that is not a JSON object")
        settlement = data.get("settlement")
        if settlement is not None and not isinstance(settlement, dict):
            raise ValueError(f"inbox item {request_id} has a settlement that is not a JSON object")
        kept = {"request_id", "origin", "state", "request", "signature", "decision", "settlement"}
        return cls(
            request_id=request_id,
            origin=origin,
            state=state,
            request=request,
            signature=signature,
            decision=decision,
            described={name: value for name, value in data.items() if name not in kept},
            settlement=settlement,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the item as the relay's JSON."""
        return {
            **self.described,
            "request_id": self.request_id,
            "origin": self.origin,
            "state": self.state,
            "request": self.request,
            "signature": self.signature,
            "decision": self.decision,
            "settlement": self.settlement,
        }


@dataclass(frozen=True, kw_only=True)
class DecisionReceipt:
    """What a relay did with one signed decision.

    Attributes:
        request_id: The request decided on.
        origin: The request's origin.
        signer: Who signed the decision.
        kind: ``approval`` or ``denial``.
        state: The request's state after it.
        counted: False when the same signer's decision was counted before (a repeat).
        decided: True when this very decision settled the outcome.
        approvals: Approvals counted so far.
        denials: Denials counted so far.
    """

    request_id: str
    origin: str
    signer: str
    kind: Literal["approval", "denial"]
    state: State
    counted: bool
    decided: bool
    approvals: int
    denials: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionReceipt:
        """Build it from the relay's JSON (``DecisionReceiptOut``).

        Raises:
            KeyError: A field is missing.
        """
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True, kw_only=True)
class InboxDecision:
    """This node's own decision on a peer's request, as its relay recorded it (not the outcome).

    Attributes:
        request_id: The request decided on.
        origin: The request's origin, which counts the outcome.
        signer: This node.
        kind: ``approval`` or ``denial``.
        this_node: ``approved`` or ``denied``: this node's vote alone.
        counted: False when the same decision was recorded before (a repeat).
        note: The relay's reminder that the outcome is the origin's to count.
    """

    request_id: str
    origin: str
    signer: str
    kind: Literal["approval", "denial"]
    this_node: Literal["approved", "denied"]
    counted: bool
    note: str = ""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InboxDecision:
        """Build it from the relay's JSON (``InboxDecisionOut``).

        Raises:
            KeyError: A field is missing.
        """
        return cls(
            request_id=data["request_id"],
            origin=data["origin"],
            signer=data["signer"],
            kind=data["kind"],
            this_node=data["this_node"],
            counted=data["counted"],
            note=str(data.get("note", "")),
        )


@dataclass(frozen=True)
class _Call:
    """One HTTP call of the API: what to send, and how to read the answer."""

    method: str
    path: str
    what: str  # for messages: "submitting request ab12..."
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    timeout: float | None = None
    token: bool = True


def _check_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the relay URL {base_url!r} is not an http or https URL")
    return base_url.rstrip("/")


def _json(response: httpx.Response, base_url: str, call: _Call) -> Any:
    return _answer(response.status_code, response.content, response.reason_phrase, base_url, call)


def _answer(status: int, content: bytes, reason: str, base_url: str, call: _Call) -> Any:
    """The JSON of a 2xx answer; any other answer is the relay's refusal, in one sentence."""
    if 200 <= status < 300:
        try:
            return parse_json(content)
        except JSONDepthError as exc:
            raise RelayError(
                f"The relay at {base_url} answered {call.what} with JSON nested more than {exc.limit} "
                "levels deep.",
                status_code=status,
            ) from exc
        except ValueError as exc:
            raise RelayError(
                f"The relay at {base_url} answered {call.what} with something that is not JSON.",
                status_code=status,
            ) from exc
    code: str | None = None
    message = reason or "no reason given"
    try:
        body = parse_json(content)
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            code, message = body["error"], str(body.get("message", message))
    except ValueError:
        pass
    message = message.strip().rstrip(".")
    raise RelayError(
        f"The relay at {base_url} refused {call.what} ({status} {code or 'error'}): {message}.",
        status_code=status,
        code=code,
    )


def _status(data: Any, base_url: str, call: _Call) -> RequestStatus:
    """Read a request status answer; anything else is the relay's failure, in one sentence."""
    try:
        if not isinstance(data, Mapping):
            raise ValueError("it is not a JSON object")
        return RequestStatus.from_json(data)
    except ValueError as exc:
        # It did answer (2xx): a relay that sends nonsense is refused now, not waited out.
        raise RelayError(
            f"The relay at {base_url} answered {call.what} with something that is not a request "
            f"status: {str(exc).rstrip('.')}.",
            status_code=200,
        ) from None


def _inbox_item(data: Any, base_url: str, call: _Call) -> InboxItem:
    """Read one inbox item; anything else is the relay's failure, in one sentence."""
    try:
        return InboxItem.from_json(data)
    except ValueError as exc:
        raise RelayError(
            f"The relay at {base_url} answered {call.what} with something that is not an inbox item: "
            f"{str(exc).rstrip('.')}.",
            status_code=200,
        ) from None


def _inbox_items(data: Any, base_url: str, call: _Call) -> list[InboxItem]:
    """Read an inbox listing; one item that is not an item refuses the whole answer."""
    if not isinstance(data, list):
        raise RelayError(
            f"The relay at {base_url} answered {call.what} with something that is not a list.",
            status_code=200,
        )
    return [_inbox_item(item, base_url, call) for item in data]


def _unreachable(base_url: str, call: _Call, exc: httpx.HTTPError | NoAnswer) -> RelayError:
    detail = str(exc).strip().rstrip(".") or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException) or (isinstance(exc, NoAnswer) and exc.timed_out):
        return RelayError(f"The relay at {base_url} did not answer {call.what} in time: {detail}.")
    return RelayError(f"The relay at {base_url} is unreachable ({call.what}): {detail}.")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class _Calls:
    """The API's calls, shared by both clients; each returns the call and how to parse its answer."""

    @staticmethod
    def health() -> _Call:
        return _Call("GET", "/health", "the health check", token=False)

    @staticmethod
    def submit_request(request: Mapping[str, Any], signature: str, timeout: float | None = None) -> _Call:
        body = {"request": dict(request), "signature": signature}
        return _Call(
            "POST", "/v1/requests", f"request {request.get('request_id')}", body=body, timeout=timeout
        )

    @staticmethod
    def get_request(request_id: str) -> _Call:
        return _Call("GET", f"/v1/requests/{request_id}", f"the status of request {request_id}")

    @staticmethod
    def wait_outcome(
        request_id: str,
        wait: float,
        timeout: float,
        limit: float | None = None,
        counted: tuple[int, int] | None = None,
    ) -> _Call:
        wait = max(0.0, min(wait, MAX_WAIT_SECONDS))
        http_timeout = wait + max(timeout, _WAIT_MARGIN)
        params: dict[str, Any] = {"wait": wait}
        if counted is not None:
            params["approvals"], params["denials"] = counted
        return _Call(
            "GET",
            f"/v1/requests/{request_id}/outcome",
            f"the outcome of request {request_id}",
            params=params,
            timeout=http_timeout if limit is None else max(0.001, min(http_timeout, limit)),
        )

    @staticmethod
    def list_inbox(state: InboxState, limit: int, wait: float, timeout: float) -> _Call:
        wait = max(0.0, min(wait, MAX_WAIT_SECONDS))
        return _Call(
            "GET",
            "/v1/inbox",
            "the inbox listing",
            params={"state": state, "limit": limit, "wait": wait},
            timeout=wait + max(timeout, _WAIT_MARGIN),
        )

    @staticmethod
    def get_inbox_item(request_id: str, origin: str | None) -> _Call:
        params = {"origin": origin} if origin is not None else None
        return _Call("GET", f"/v1/inbox/{request_id}", f"inbox request {request_id}", params=params)

    @staticmethod
    def submit_decision(request_id: str, statement: Mapping[str, Any], signature: str) -> _Call:
        body = {"statement": dict(statement), "signature": signature}
        return _Call(
            "POST", f"/v1/inbox/{request_id}/decision", f"the decision on request {request_id}", body=body
        )

    @staticmethod
    def withdraw(
        request_id: str, statement: Mapping[str, Any], signature: str, timeout: float | None
    ) -> _Call:
        body = {"statement": dict(statement), "signature": signature}
        return _Call(
            "POST",
            f"/v1/requests/{request_id}/withdrawal",
            f"the withdrawal of request {request_id}",
            body=body,
            timeout=timeout,
        )

    @staticmethod
    def deliver_withdrawal(request_id: str, statement: Mapping[str, Any], signature: str) -> _Call:
        body = {"statement": dict(statement), "signature": signature}
        return _Call(
            "POST",
            f"/v1/inbox/{request_id}/withdrawal",
            f"the withdrawal of request {request_id}",
            body=body,
            token=False,
        )

    @staticmethod
    def deliver_request(request: Mapping[str, Any], signature: str) -> _Call:
        body = {"request": dict(request), "signature": signature}
        return _Call("POST", "/v1/inbox", f"request {request.get('request_id')}", body=body, token=False)

    @staticmethod
    def deliver_decision(request_id: str, statement: Mapping[str, Any], signature: str) -> _Call:
        body = {"statement": dict(statement), "signature": signature}
        return _Call(
            "POST",
            f"/v1/requests/{request_id}/decisions",
            f"the decision on request {request_id}",
            body=body,
            token=False,
        )


class RelayClient:
    """A synchronous client of one relay (the agent's quorum gate, the CLI).

    Calls of the node itself send ``token``; the peer calls (``deliver_*``) send none.
    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Connect nothing yet; calls open pooled connections as needed.

        ``verify`` checks an ``https://`` relay's certificate: True for the public CAs, or a
        context trusting a private CA (``NodeConfig.tls.client_verify()``).

        Raises:
            ValueError: ``base_url`` is not an http or https URL, or ``timeout`` is not positive.
        """
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        self.base_url = _check_base_url(base_url)
        self._token = token
        self._timeout = timeout
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, verify=client_verify(verify)
        )

    def __repr__(self) -> str:
        return f"RelayClient({self.base_url!r})"

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def __enter__(self) -> RelayClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, call: _Call) -> Any:
        headers = {"Authorization": f"Bearer {self._token}"} if call.token and self._token else None
        try:
            response = self._client.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params,
                headers=headers,
                timeout=call.timeout if call.timeout is not None else self._timeout,
            )
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, call, exc) from exc
        return _json(response, self.base_url, call)

    def health(self) -> dict[str, Any]:
        """Return the relay's health document.

        Raises:
            RelayError: The relay is unreachable or unhealthy (503 when its Redis is down).
        """
        return dict(self._send(_Calls.health()))

    def submit_request(
        self, request: Mapping[str, Any], signature: str, *, timeout: float | None = None
    ) -> RequestStatus:
        """Submit this node's signed request; the relay fans it out to the peers (idempotent).

        Args:
            request: The request document.
            signature: The origin's signature over it.
            timeout: Seconds for this call instead of the client's timeout.

        Raises:
            RelayError: The relay refused it (bad signature, not this node's, malformed...), is
                unreachable, or answered with something that is not a request status.
        """
        call = _Calls.submit_request(request, signature, timeout)
        return _status(self._send(call), self.base_url, call)

    def get_request(self, request_id: str) -> RequestStatus:
        """Return the counting state of one of this node's requests.

        Raises:
            RelayError: The relay does not know it (``not_found``), is unreachable, or answered
                with something that is not a request status.
        """
        call = _Calls.get_request(request_id)
        return _status(self._send(call), self.base_url, call)

    def wait_outcome(
        self,
        request_id: str,
        wait: float,
        *,
        limit: float | None = None,
        counted: tuple[int, int] | None = None,
    ) -> RequestStatus:
        """Long-poll until the request is decided or ``wait`` seconds (at most 60) pass.

        Args:
            request_id: The request.
            wait: Seconds the relay may hold the answer back.
            limit: Seconds this call may take at most, however the relay behaves (a caller's
                deadline); the wait plus the client's timeout when None.
            counted: The approvals and denials last seen: the relay also answers as soon as a
                decision changes them (one long-poll per change, for a caller showing progress).

        Raises:
            RelayError: The relay does not know the request, is unreachable, did not answer
                within the limit, or answered with something that is not a request status.
        """
        call = _Calls.wait_outcome(request_id, wait, self._timeout, limit, counted)
        return _status(self._send(call), self.base_url, call)

    def list_inbox(
        self, state: InboxState = "pending", *, limit: int = 100, wait: float = 0.0
    ) -> list[InboxItem]:
        """List requests received from peers; with ``wait``, block until there is one.

        Raises:
            RelayError: The relay refused the call or is unreachable.
        """
        call = _Calls.list_inbox(state, limit, wait, self._timeout)
        return _inbox_items(self._send(call), self.base_url, call)

    def get_inbox_item(self, request_id: str, *, origin: str | None = None) -> InboxItem:
        """Return one received request.

        Raises:
            RelayError: Unknown (``not_found``), ambiguous without ``origin`` (``conflict``), or
                the relay is unreachable.
        """
        call = _Calls.get_inbox_item(request_id, origin)
        return _inbox_item(self._send(call), self.base_url, call)

    def submit_decision(self, request_id: str, statement: Mapping[str, Any], signature: str) -> InboxDecision:
        """Hand this node's signed approval or denial to its relay, which forwards it to the origin.

        Returns:
            This node's decision as recorded (the outcome is the origin's to count).

        Raises:
            RelayError: The relay refused it (not signed by one of this node's keys, bad
                signature, decided otherwise before, expired) or is unreachable.
        """
        return InboxDecision.from_json(self._send(_Calls.submit_decision(request_id, statement, signature)))

    def withdraw(
        self, request_id: str, statement: Mapping[str, Any], signature: str, *, timeout: float | None = None
    ) -> RequestStatus:
        """Withdraw one of this node's requests (signed by this node's key); the relay tells every peer.

        Args:
            request_id: The request.
            statement: The withdrawal (:func:`teaagent.quorum.withdrawal_statement`).
            signature: This node's signature over it (:func:`teaagent.quorum.sign_withdrawal`).
            timeout: Seconds for this call instead of the client's timeout.

        Returns:
            The request's status, ``withdrawn`` (also for a repeat).

        Raises:
            RelayError: The relay refused it (``already_decided`` when approved, denied or expired
                first; ``bad_signature``; ``not_found``) or is unreachable.
        """
        call = _Calls.withdraw(request_id, statement, signature, timeout)
        return _status(self._send(call), self.base_url, call)

    def deliver_withdrawal(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> dict[str, Any]:
        """As a peer relay: deliver an origin's signed withdrawal of a request in this relay's inbox.

        Raises:
            RelayError: Refused (unknown origin or request, bad signature...) or unreachable.
        """
        return dict(self._send(_Calls.deliver_withdrawal(request_id, statement, signature)))

    def deliver_request(self, request: Mapping[str, Any], signature: str) -> dict[str, Any]:
        """As a peer relay: deliver a signed request to this relay's inbox.

        Raises:
            RelayError: Refused (unknown origin, bad signature, rate limited...) or unreachable.
        """
        return dict(self._send(_Calls.deliver_request(request, signature)))

    def deliver_decision(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> DecisionReceipt:
        """As a peer relay: deliver a signed decision on one of this relay's requests.

        Raises:
            RelayError: Refused (not countable, bad signature...) or unreachable.
        """
        return DecisionReceipt.from_json(
            self._send(_Calls.deliver_decision(request_id, statement, signature))
        )


class AsyncRelayClient:
    """The asyncio twin of :class:`RelayClient` (the approver service, benchmarks); same calls.

    Its calls go out through one pool of kept-alive connections (aiohttp's client, or httpx's
    with a ``transport``), as many as ``limits`` allows (100 by default: a client shared by many
    callers never closes and reopens one); see :func:`teaagent._http.http_pool`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Connect nothing yet; calls open pooled connections as needed (``verify`` as for ``RelayClient``).

        ``limits``: its ``max_connections`` sizes the pool (every connection kept alive).

        Raises:
            ValueError: ``base_url`` is not an http or https URL, or ``timeout`` is not positive.
        """
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        self.base_url = _check_base_url(base_url)
        self._token = token
        self._timeout = timeout
        connections = (limits.max_connections if limits is not None else None) or 100
        self._http = http_pool(
            self.base_url,
            connections=connections,
            timeout=timeout,
            verify=verify,
            transport=transport,
            max_response_bytes=_MAX_ANSWER_BYTES,
        )

    def __repr__(self) -> str:
        return f"AsyncRelayClient({self.base_url!r})"

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRelayClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: _Call) -> Any:
        headers = {"Authorization": f"Bearer {self._token}"} if call.token and self._token else None
        path = f"{call.path}?{urlencode(call.params)}" if call.params else call.path
        body = json.dumps(call.body).encode() if call.body is not None else None
        try:
            status, content = await self._http.request(
                call.method,
                path,
                body,
                headers=headers,
                timeout=call.timeout if call.timeout is not None else self._timeout,
            )
        except NoAnswer as exc:
            raise _unreachable(self.base_url, call, exc) from exc
        except ValueError as exc:  # a token with CR or LF: never sent
            raise RelayError(f"The call to the relay at {self.base_url} was not sent: {exc}.") from exc
        return _answer(status, content, _reason(status), self.base_url, call)

    async def health(self) -> dict[str, Any]:
        """See :meth:`RelayClient.health`.

        Raises:
            RelayError: The relay is unreachable or unhealthy.
        """
        return dict(await self._send(_Calls.health()))

    async def submit_request(self, request: Mapping[str, Any], signature: str) -> RequestStatus:
        """See :meth:`RelayClient.submit_request`.

        Raises:
            RelayError: The relay refused it or is unreachable.
        """
        call = _Calls.submit_request(request, signature)
        return _status(await self._send(call), self.base_url, call)

    async def get_request(self, request_id: str) -> RequestStatus:
        """See :meth:`RelayClient.get_request`.

        Raises:
            RelayError: The relay does not know it or is unreachable.
        """
        call = _Calls.get_request(request_id)
        return _status(await self._send(call), self.base_url, call)

    async def wait_outcome(self, request_id: str, wait: float) -> RequestStatus:
        """See :meth:`RelayClient.wait_outcome`.

        Raises:
            RelayError: The relay does not know the request, or is unreachable.
        """
        call = _Calls.wait_outcome(request_id, wait, self._timeout)
        return _status(await self._send(call), self.base_url, call)

    async def list_inbox(
        self, state: InboxState = "pending", *, limit: int = 100, wait: float = 0.0
    ) -> list[InboxItem]:
        """See :meth:`RelayClient.list_inbox`.

        Raises:
            RelayError: The relay refused the call or is unreachable.
        """
        call = _Calls.list_inbox(state, limit, wait, self._timeout)
        return _inbox_items(await self._send(call), self.base_url, call)

    async def get_inbox_item(self, request_id: str, *, origin: str | None = None) -> InboxItem:
        """See :meth:`RelayClient.get_inbox_item`.

        Raises:
            RelayError: Unknown, ambiguous, or the relay is unreachable.
        """
        call = _Calls.get_inbox_item(request_id, origin)
        return _inbox_item(await self._send(call), self.base_url, call)

    async def submit_decision(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> InboxDecision:
        """See :meth:`RelayClient.submit_decision`.

        Raises:
            RelayError: The relay refused it or is unreachable.
        """
        return InboxDecision.from_json(
            await self._send(_Calls.submit_decision(request_id, statement, signature))
        )

    async def withdraw(
        self, request_id: str, statement: Mapping[str, Any], signature: str, *, timeout: float | None = None
    ) -> RequestStatus:
        """See :meth:`RelayClient.withdraw`.

        Raises:
            RelayError: The relay refused it or is unreachable.
        """
        call = _Calls.withdraw(request_id, statement, signature, timeout)
        return _status(await self._send(call), self.base_url, call)

    async def deliver_withdrawal(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> dict[str, Any]:
        """See :meth:`RelayClient.deliver_withdrawal`.

        Raises:
            RelayError: Refused or unreachable.
        """
        return dict(await self._send(_Calls.deliver_withdrawal(request_id, statement, signature)))

    async def deliver_request(self, request: Mapping[str, Any], signature: str) -> dict[str, Any]:
        """See :meth:`RelayClient.deliver_request`.

        Raises:
            RelayError: Refused or unreachable.
        """
        return dict(await self._send(_Calls.deliver_request(request, signature)))

    async def deliver_decision(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> DecisionReceipt:
        """See :meth:`RelayClient.deliver_decision`.

        Raises:
            RelayError: Refused or unreachable.
        """
        return DecisionReceipt.from_json(
            await self._send(_Calls.deliver_decision(request_id, statement, signature))
        )
