"""HTTP clients of the approver service API (the operators' inbox of one node), sync and asyncio.

Both clients speak the same calls and return the same frozen dataclasses. Every failure is a
:class:`~teaagent.errors.RelayError` (the approving path's error, as for the relay client) carrying
the approver's status and stable ``ErrorOut`` code, with one sentence a person reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import quote, urlsplit

import httpx

from teaagent._http import client_verify
from teaagent._json import parse_json
from teaagent.errors import RelayError

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_WAIT_SECONDS",
    "ApprovalItem",
    "ApproverClient",
    "AsyncApproverClient",
    "DecisionResult",
    "Expected",
    "MatchingRule",
    "OwnDecision",
    "StatementToSign",
    "signed_by",
]

DEFAULT_TIMEOUT: Final = (
    10.0  # seconds for one call; the approver answers in milliseconds, long-polls excepted
)
MAX_WAIT_SECONDS: Final = 60.0  # the longest single long-poll asked for; longer waits are several polls
_WAIT_MARGIN: Final = 5.0  # a long-poll's HTTP timeout is its wait plus this, so the approver answers first

ItemState = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled"]
ListState = Literal["pending", "approved", "denied", "expired", "withdrawn", "settled", "all"]
DecisionKind = Literal["approval", "denial"]
ITEM_STATES: Final = ("pending", "approved", "denied", "expired", "withdrawn", "settled")
LIST_STATES: Final = (*ITEM_STATES, "all")


def _text(data: Mapping[str, Any], name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    return value


def _integer(data: Mapping[str, Any], name: str) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} is not a number")
    return int(value)


def _object(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = data[name]
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} is not a JSON object")
    return dict(value)


def signed_by(by: str, key_fingerprint: str, node_key: str | None) -> str:
    """Who signed a decision and with which key, as a person reads it.

    ``with the node key SHA256:...`` (an operator's command the approver signed with the node
    key), ``by rule 1 with the node key SHA256:...``, ``with an operator's own key SHA256:...``.
    """
    own = node_key is not None and key_fingerprint == node_key
    key = f"the node key {key_fingerprint}" if own else f"key {key_fingerprint}"
    if by == "operator":
        return f"with {key}" if own else f"with an operator's own key {key_fingerprint}"
    if by:
        return f"by {by} with {key}"
    return f"with {key}"


@dataclass(frozen=True, kw_only=True)
class OwnDecision:
    """This node's own decision on a request, as its approver recorded it.

    Attributes:
        kind: ``approval`` or ``denial``.
        reason: The reason signed with it (a denial's; may be empty).
        by: Who decided: a rule (``rule 1``) or an operator.
        key_fingerprint: The fingerprint of the key that signed it.
        at: Unix seconds when it was decided.
    """

    kind: DecisionKind
    reason: str
    by: str
    key_fingerprint: str
    at: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OwnDecision:
        """Build it from the approver's JSON.

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: ``kind`` is neither approval nor denial.
        """
        kind = data["kind"]
        if kind not in ("approval", "denial"):
            raise ValueError(f"the decision kind {kind!r} is neither approval nor denial")
        return cls(
            kind=kind,
            reason=str(data.get("reason") or ""),
            by=str(data.get("by") or ""),
            key_fingerprint=str(data.get("key_fingerprint") or ""),
            at=_integer(data, "at"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return it as the approver's JSON."""
        return {
            "kind": self.kind,
            "reason": self.reason,
            "by": self.by,
            "key_fingerprint": self.key_fingerprint,
            "at": self.at,
        }


@dataclass(frozen=True, kw_only=True)
class MatchingRule:
    """The first ``[[approver.rules]]`` entry that matches a request.

    Attributes:
        index: Its position among the rules, as the approver numbers it.
        tool: Its fnmatch pattern on the tool name.
        arguments: Its fnmatch patterns on string arguments.
        decision: ``approve``, ``deny`` or ``ask``.
    """

    index: int
    tool: str
    arguments: dict[str, str]
    decision: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MatchingRule:
        """Build it from the approver's JSON.

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
        """
        arguments = data.get("arguments") or {}
        if not isinstance(arguments, Mapping):
            raise TypeError("the rule's arguments are not a JSON object")
        return cls(
            index=_integer(data, "index"),
            tool=_text(data, "tool"),
            arguments={str(name): str(pattern) for name, pattern in arguments.items()},
            decision=_text(data, "decision"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return it as the approver's JSON."""
        return {
            "index": self.index,
            "tool": self.tool,
            "arguments": self.arguments,
            "decision": self.decision,
        }


@dataclass(frozen=True, kw_only=True)
class Settled:
    """A request's outcome at its origin, as the approver verified its evidence.

    Attributes:
        outcome: ``approved`` or ``denied``.
        decided_by: The counted approvers, or deniers.
        at: The latest ``signed_at`` of those decisions, Unix seconds.
    """

    outcome: str
    decided_by: tuple[str, ...]
    at: int

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Settled:
        """Build it from the approver's JSON (``Item.settled``).

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: The outcome is unknown.
        """
        outcome, decided_by = _text(data, "outcome"), data["decided_by"]
        if outcome not in ("approved", "denied"):
            raise ValueError(f"the settled outcome {outcome!r} is not approved or denied")
        if not isinstance(decided_by, list) or not all(isinstance(peer, str) for peer in decided_by):
            raise TypeError("decided_by is not a list of agent ids")
        return cls(outcome=outcome, decided_by=tuple(decided_by), at=_integer(data, "at"))

    def to_dict(self) -> dict[str, Any]:
        """The approver's JSON form."""
        return {"outcome": self.outcome, "decided_by": list(self.decided_by), "at": self.at}

    def phrase(self, origin: str, now: float) -> str:
        """``approved at alpha by beta, gamma 12s ago``: what operators' screens print."""
        ago = max(0, int(now - self.at))
        if ago >= 3600:
            when = f"{ago // 3600}h {ago % 3600 // 60:02d}m ago"
        elif ago >= 60:
            when = f"{ago // 60}m {ago % 60:02d}s ago"
        else:
            when = f"{ago}s ago"
        return f"{self.outcome} at {origin} by {', '.join(self.decided_by)} {when}"


@dataclass(frozen=True, kw_only=True)
class ApprovalItem:
    """A request that reached this node from a peer origin, as its approver sees it.

    Attributes:
        request_id: The request's id.
        origin: The peer that asks.
        tool_name: The tool it wants to call.
        arguments: The call's arguments, whole.
        reason: The origin model's reasoning.
        payload_digest: ``sha256:...`` of the call.
        run_id: The origin's run.
        call_id: The call's id in that run.
        required_approvals: Approvals the origin needs.
        peers: Every peer asked.
        created_at: Unix seconds.
        expires_at: Unix seconds.
        seconds_left: Seconds until it expires, when the approver answered.
        state: This node's view: ``pending``, ``approved``/``denied`` (by this node), ``expired``,
            ``withdrawn`` (by its origin: never to be signed) or ``settled`` (decided at its
            origin first, on evidence the approver verified: never to be signed).
        settled: The outcome at its origin, once the approver verified its evidence, or None.
        decision: This node's own decision, or None.
        rule: The first rule that matches it, or None (an operator decides).
        request: The request document.
        signature: The origin's signature over it.
    """

    request_id: str
    origin: str
    tool_name: str
    arguments: dict[str, Any]
    reason: str
    payload_digest: str
    run_id: str
    call_id: str
    required_approvals: int
    peers: tuple[str, ...]
    created_at: int
    expires_at: int
    seconds_left: int
    state: ItemState
    decision: OwnDecision | None
    rule: MatchingRule | None
    request: dict[str, Any]
    signature: str
    settled: Settled | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ApprovalItem:
        """Build it from the approver's JSON (``Item``).

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: The state or the decision kind is unknown.
        """
        state = data["state"]
        if state not in ITEM_STATES:
            raise ValueError(f"the state {state!r} is not one of {', '.join(ITEM_STATES)}")
        decision, rule, peers = data.get("decision"), data.get("rule"), data["peers"]
        if not isinstance(peers, list) or not all(isinstance(peer, str) for peer in peers):
            raise TypeError("peers is not a list of agent ids")
        if decision is not None and not isinstance(decision, Mapping):
            raise TypeError("decision is not a JSON object")
        if rule is not None and not isinstance(rule, Mapping):
            raise TypeError("rule is not a JSON object")
        settled = data.get("settled")
        if settled is not None and not isinstance(settled, Mapping):
            raise TypeError("settled is not a JSON object")
        return cls(
            request_id=_text(data, "request_id"),
            origin=_text(data, "origin"),
            tool_name=_text(data, "tool_name"),
            arguments=_object(data, "arguments"),
            reason=_text(data, "reason"),
            payload_digest=_text(data, "payload_digest"),
            run_id=_text(data, "run_id"),
            call_id=_text(data, "call_id"),
            required_approvals=_integer(data, "required_approvals"),
            peers=tuple(peers),
            created_at=_integer(data, "created_at"),
            expires_at=_integer(data, "expires_at"),
            seconds_left=_integer(data, "seconds_left"),
            state=state,
            decision=None if decision is None else OwnDecision.from_json(decision),
            rule=None if rule is None else MatchingRule.from_json(rule),
            request=_object(data, "request"),
            signature=_text(data, "signature"),
            settled=None if settled is None else Settled.from_json(settled),
        )

    def to_dict(self, *, documents: bool = True) -> dict[str, Any]:
        """Return the item as JSON-ready data (``approvals list --json``, ``approvals show --json``).

        Args:
            documents: Include the signed request document and the origin's signature.
        """
        data: dict[str, Any] = {
            "request_id": self.request_id,
            "origin": self.origin,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "reason": self.reason,
            "payload_digest": self.payload_digest,
            "run_id": self.run_id,
            "call_id": self.call_id,
            "required_approvals": self.required_approvals,
            "peers": list(self.peers),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "seconds_left": self.seconds_left,
            "state": self.state,
            "decision": None if self.decision is None else self.decision.to_dict(),
            "rule": None if self.rule is None else self.rule.to_dict(),
            "settled": None if self.settled is None else self.settled.to_dict(),
        }
        if documents:
            data["request"] = self.request
            data["signature"] = self.signature
        return data


@dataclass(frozen=True, kw_only=True)
class StatementToSign:
    """The statement an operator signs elsewhere, and its canonical text.

    Attributes:
        statement: The approval or denial statement (signer = this node, ``signed_at`` = now).
        text: Its canonical JSON: the exact bytes to sign, as text (``data`` encodes them).
    """

    statement: dict[str, Any]
    text: str

    @property
    def data(self) -> bytes:
        """The exact bytes to sign (UTF-8 of :attr:`text`, no trailing newline)."""
        return self.text.encode("utf-8")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StatementToSign:
        """Build it from the approver's JSON ``{"statement", "bytes"}``.

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
        """
        return cls(statement=_object(data, "statement"), text=_text(data, "bytes"))


@dataclass(frozen=True, kw_only=True)
class DecisionResult:
    """What the approver did with this node's decision on one request.

    It names this node's own decision (``this_node``), never the request's outcome: that is counted
    by the origin from every peer's decision.

    Attributes:
        request_id: The request decided on.
        origin: The request's origin.
        decision: ``approval`` or ``denial``.
        reason: The reason signed with it.
        this_node: ``approved`` or ``denied``: this node's decision, not the quorum's outcome.
        by: Who decided.
        key_fingerprint: The fingerprint of the key that signed it.
        forwarded: Whether the node's relay has taken it on its way to the origin.
        note: The approver's own reminder of what this is.
    """

    request_id: str
    origin: str
    decision: DecisionKind
    reason: str
    this_node: Literal["approved", "denied"]
    by: str
    key_fingerprint: str
    forwarded: bool
    note: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecisionResult:
        """Build it from the approver's JSON (``Decision``).

        Raises:
            KeyError: A field is missing.
            TypeError: A field has the wrong type.
            ValueError: ``decision`` or ``this_node`` is of an unknown kind.
        """
        decision, this_node = data["decision"], data["this_node"]
        if decision not in ("approval", "denial"):
            raise ValueError(f"the decision {decision!r} is neither approval nor denial")
        if this_node not in ("approved", "denied"):
            raise ValueError(f"this_node {this_node!r} is neither approved nor denied")
        return cls(
            request_id=_text(data, "request_id"),
            origin=_text(data, "origin"),
            decision=decision,
            reason=str(data.get("reason") or ""),
            this_node=this_node,
            by=str(data.get("by") or ""),
            key_fingerprint=str(data.get("key_fingerprint") or ""),
            forwarded=bool(data.get("forwarded")),
            note=str(data.get("note") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return it as the approver's JSON."""
        return {
            "request_id": self.request_id,
            "origin": self.origin,
            "decision": self.decision,
            "reason": self.reason,
            "this_node": self.this_node,
            "by": self.by,
            "key_fingerprint": self.key_fingerprint,
            "forwarded": self.forwarded,
            "note": self.note,
        }


@dataclass(frozen=True, kw_only=True)
class Expected:
    """What an operator confirmed of a request: the approver signs nothing for a request that differs.

    Sent with a decision (``expect_tool_name``, ``expect_payload_digest``); the approver compares them
    with the request its origin signed and refuses with 409 ``changed`` when either differs, so a
    request swapped in under the id or prefix the operator typed is never signed.

    Attributes:
        tool_name: The tool the operator was shown.
        payload_digest: The payload digest (``sha256:...``) the operator was shown.
    """

    tool_name: str
    payload_digest: str

    @classmethod
    def of(cls, item: ApprovalItem) -> Expected:
        """What ``item`` shows: the tool and digest an operator reads in ``show`` and ``watch``."""
        return cls(tool_name=item.tool_name, payload_digest=item.payload_digest)


def _expected_fields(expected: Expected | None) -> dict[str, str]:
    if expected is None:
        return {}
    return {"expect_tool_name": expected.tool_name, "expect_payload_digest": expected.payload_digest}


@dataclass(frozen=True)
class _Call:
    """One HTTP call of the API: what to send, how to name it in a message, how to read the answer."""

    method: str
    path: str
    what: str  # for messages: "the approval of request ab12..."
    parse: Any  # a function of the answer's JSON
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    timeout: float | None = None
    token: bool = True


def _check_base_url(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the approver URL {base_url!r} is not an http or https URL")
    return base_url.rstrip("/")


def _path_id(request_id: str) -> str:
    # An id typed by a person goes into the path; quoting keeps "../x" or "a?b" one segment.
    return quote(request_id, safe="")


def _items(data: Any) -> list[ApprovalItem]:
    if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
        raise TypeError('it is not {"items": [...]}')
    return [ApprovalItem.from_json(item) for item in data["items"]]


def _mapping(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise TypeError("it is not a JSON object")
    return data


class _Calls:
    """The API's calls, shared by both clients."""

    @staticmethod
    def health() -> _Call:
        return _Call("GET", "/health", "the health check", lambda data: dict(_mapping(data)), token=False)

    @staticmethod
    def list_requests(
        state: ListState, origin: str | None, tool: str | None, limit: int, wait: float, timeout: float
    ) -> _Call:
        wait = max(0.0, min(wait, MAX_WAIT_SECONDS))
        params: dict[str, Any] = {"state": state, "limit": limit, "wait": wait}
        if origin is not None:
            params["origin"] = origin
        if tool is not None:
            params["tool"] = tool
        return _Call(
            "GET",
            "/v1/requests",
            "the listing of requests",
            _items,
            params=params,
            timeout=wait + max(timeout, _WAIT_MARGIN),
        )

    @staticmethod
    def get_request(request_id: str, origin: str | None) -> _Call:
        return _Call(
            "GET",
            f"/v1/requests/{_path_id(request_id)}",
            f"request {request_id}",
            lambda data: ApprovalItem.from_json(_mapping(data)),
            params=None if origin is None else {"origin": origin},
        )

    @staticmethod
    def statement(
        request_id: str, kind: DecisionKind, reason: str, origin: str | None, expected: Expected | None
    ) -> _Call:
        params: dict[str, Any] = {"kind": kind, "reason": reason}
        if origin is not None:
            params["origin"] = origin
        params.update(_expected_fields(expected))
        return _Call(
            "GET",
            f"/v1/requests/{_path_id(request_id)}/statement",
            f"the {kind} statement of request {request_id}",
            lambda data: StatementToSign.from_json(_mapping(data)),
            params=params,
        )

    @staticmethod
    def decide(
        request_id: str, kind: DecisionKind, reason: str, origin: str | None, expected: Expected | None
    ) -> _Call:
        verb = "approve" if kind == "approval" else "deny"
        return _Call(
            "POST",
            f"/v1/requests/{_path_id(request_id)}/{verb}",
            f"the {kind} of request {request_id}",
            lambda data: DecisionResult.from_json(_mapping(data)),
            body={"reason": reason, "origin": origin, **_expected_fields(expected)},
        )

    @staticmethod
    def submit_decision(
        request_id: str, statement: Mapping[str, Any], signature: str, expected: Expected | None
    ) -> _Call:
        kind = "denial" if statement.get("type") == "teaagent.denial" else "approval"
        return _Call(
            "POST",
            f"/v1/requests/{_path_id(request_id)}/decision",
            f"the signed {kind} of request {request_id}",
            lambda data: DecisionResult.from_json(_mapping(data)),
            body={"statement": dict(statement), "signature": signature, **_expected_fields(expected)},
        )


class _Base:
    def __init__(
        self, base_url: str, *, token: str | None, timeout: float, start_command: str | None
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        self.base_url = _check_base_url(base_url)
        self._token = token
        self._timeout = timeout
        self._start_command = start_command

    def _headers(self, call: _Call) -> dict[str, str] | None:
        return {"Authorization": f"Bearer {self._token}"} if call.token and self._token else None

    def _unreachable(self, call: _Call, exc: httpx.HTTPError) -> RelayError:
        detail = str(exc).strip().rstrip(".") or type(exc).__name__
        hint = f"; start it with `{self._start_command}`" if self._start_command else ""
        if isinstance(exc, httpx.TimeoutException):
            return RelayError(
                f"The approver at {self.base_url} did not answer {call.what} in time: {detail}."
            )
        return RelayError(f"No approver answers at {self.base_url} ({call.what}: {detail}){hint}.")

    def _read(self, response: httpx.Response, call: _Call) -> Any:
        """The parsed answer of a 2xx; a refusal, or an answer that is not the documented one, raises."""
        if not response.is_success:
            code: str | None = None
            message = response.reason_phrase or "no reason given"
            try:
                body = parse_json(response.content)
                if isinstance(body, dict) and isinstance(body.get("error"), str):
                    code, message = body["error"], str(body.get("message", message))
            except ValueError:
                pass
            message = " ".join(message.split()).rstrip(".")
            raise RelayError(
                f"The approver at {self.base_url} refused {call.what} ({response.status_code} "
                f"{code or 'error'}): {message}.",
                status_code=response.status_code,
                code=code,
            )
        try:
            return call.parse(parse_json(response.content))
        except (ValueError, KeyError, TypeError) as exc:
            detail = f"it has no field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc).rstrip(".")
            raise RelayError(
                f"The approver at {self.base_url} answered {call.what} with something that is not what "
                f"its API documents: {detail}.",
                status_code=response.status_code,
            ) from None


class ApproverClient(_Base):
    """A synchronous client of one node's approver service (the ``teaagent approvals`` commands).

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        start_command: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """Connect nothing yet; calls open pooled connections as needed.

        Args:
            base_url: The approver's base URL, ``http://127.0.0.1:<approver.port>``.
            token: The node's bearer token.
            timeout: Seconds for one call (a long-poll adds its wait).
            start_command: The command that starts this approver, named when nobody answers.
            transport: An httpx transport instead of the network (tests of the client alone).

        Raises:
            ValueError: ``base_url`` is not an http or https URL, or ``timeout`` is not positive.
        """
        super().__init__(base_url, token=token, timeout=timeout, start_command=start_command)
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, verify=client_verify()
        )

    def __repr__(self) -> str:
        return f"ApproverClient({self.base_url!r})"

    def close(self) -> None:
        """Close the pooled connections."""
        self._client.close()

    def __enter__(self) -> ApproverClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _send(self, call: _Call) -> Any:
        try:
            response = self._client.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params,
                headers=self._headers(call),
                timeout=call.timeout if call.timeout is not None else self._timeout,
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(call, exc) from exc
        return self._read(response, call)

    def health(self) -> dict[str, Any]:
        """Return the approver's health document.

        Raises:
            RelayError: The approver is unreachable or unhealthy.
        """
        result: dict[str, Any] = self._send(_Calls.health())
        return result

    def list_requests(
        self,
        state: ListState = "pending",
        *,
        origin: str | None = None,
        tool: str | None = None,
        limit: int = 100,
        wait: float = 0.0,
    ) -> list[ApprovalItem]:
        """List the requests that reached this node, pending first; with ``wait``, a long-poll.

        Args:
            state: ``pending``, ``approved``, ``denied``, ``expired`` or ``all``.
            origin: Only this origin's requests.
            tool: Only calls of this tool.
            limit: At most this many items.
            wait: Seconds the approver may hold the answer back for a new request (at most 60).

        Raises:
            RelayError: The approver refused the call, is unreachable, or answered nonsense.
        """
        result: list[ApprovalItem] = self._send(
            _Calls.list_requests(state, origin, tool, limit, wait, self._timeout)
        )
        return result

    def get_request(self, request_id: str, *, origin: str | None = None) -> ApprovalItem:
        """Return one request as this node sees it.

        Raises:
            RelayError: Unknown (``not_found``), ambiguous without ``origin`` (``conflict``), or
                the approver is unreachable.
        """
        result: ApprovalItem = self._send(_Calls.get_request(request_id, origin))
        return result

    def statement(
        self,
        request_id: str,
        *,
        kind: DecisionKind = "approval",
        reason: str = "",
        origin: str | None = None,
        expected: Expected | None = None,
    ) -> StatementToSign:
        """Return the statement to sign elsewhere for this node's decision, ``signed_at`` = now.

        Args:
            request_id: The request.
            kind: ``approval`` or ``denial``.
            reason: A denial's reason.
            origin: The origin, when several sent a request of this id.
            expected: What the operator confirmed of the request; None checks nothing.

        Raises:
            RelayError: Unknown, expired (``expired``), ambiguous, not the request confirmed
                (``changed``), or the approver is unreachable.
        """
        result: StatementToSign = self._send(_Calls.statement(request_id, kind, reason, origin, expected))
        return result

    def approve(
        self,
        request_id: str,
        *,
        reason: str = "",
        origin: str | None = None,
        expected: Expected | None = None,
    ) -> DecisionResult:
        """Have the approver approve the request with the node key.

        Args:
            request_id: The request.
            reason: Why, kept in the audit log.
            origin: The origin, when several sent a request of this id.
            expected: What the operator confirmed of the request; None checks nothing.

        Raises:
            RelayError: Unknown, expired, decided otherwise before (``conflict``), not the request
                confirmed (``changed``), or the approver is unreachable.
        """
        result: DecisionResult = self._send(_Calls.decide(request_id, "approval", reason, origin, expected))
        return result

    def deny(
        self, request_id: str, *, reason: str, origin: str | None = None, expected: Expected | None = None
    ) -> DecisionResult:
        """Have the approver deny the request with the node key (see :meth:`approve`).

        Raises:
            RelayError: Unknown, expired, decided otherwise before, not the request confirmed
                (``changed``), or the approver is unreachable.
        """
        result: DecisionResult = self._send(_Calls.decide(request_id, "denial", reason, origin, expected))
        return result

    def submit_decision(
        self,
        request_id: str,
        statement: Mapping[str, Any],
        signature: str,
        *,
        expected: Expected | None = None,
    ) -> DecisionResult:
        """Hand the approver a decision signed elsewhere (an operator's key).

        Args:
            request_id: The request decided on.
            statement: The approval or denial statement that was signed.
            signature: The SSHSIG, armored or bare base64.
            expected: What the operator confirmed of the request; None checks nothing.

        Raises:
            RelayError: The statement does not match the request (``invalid``), the key may not
                sign for this node (``forbidden``), the request is not the one confirmed
                (``changed``), unknown or expired, or the approver is unreachable.
        """
        result: DecisionResult = self._send(
            _Calls.submit_decision(request_id, statement, signature, expected)
        )
        return result


class AsyncApproverClient(_Base):
    """The asyncio twin of :class:`ApproverClient` (the TUI); same calls, same errors."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        start_command: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Connect nothing yet; see :class:`ApproverClient`.

        Raises:
            ValueError: ``base_url`` is not an http or https URL, or ``timeout`` is not positive.
        """
        super().__init__(base_url, token=token, timeout=timeout, start_command=start_command)
        self._client = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, transport=transport, verify=client_verify()
        )

    def __repr__(self) -> str:
        return f"AsyncApproverClient({self.base_url!r})"

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._client.aclose()

    async def __aenter__(self) -> AsyncApproverClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _send(self, call: _Call) -> Any:
        try:
            response = await self._client.request(
                call.method,
                call.path,
                json=call.body,
                params=call.params,
                headers=self._headers(call),
                timeout=call.timeout if call.timeout is not None else self._timeout,
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(call, exc) from exc
        return self._read(response, call)

    async def health(self) -> dict[str, Any]:
        """See :meth:`ApproverClient.health`.

        Raises:
            RelayError: The approver is unreachable or unhealthy.
        """
        result: dict[str, Any] = await self._send(_Calls.health())
        return result

    async def list_requests(
        self,
        state: ListState = "pending",
        *,
        origin: str | None = None,
        tool: str | None = None,
        limit: int = 100,
        wait: float = 0.0,
    ) -> list[ApprovalItem]:
        """See :meth:`ApproverClient.list_requests`.

        Raises:
            RelayError: The approver refused the call, is unreachable, or answered nonsense.
        """
        result: list[ApprovalItem] = await self._send(
            _Calls.list_requests(state, origin, tool, limit, wait, self._timeout)
        )
        return result

    async def get_request(self, request_id: str, *, origin: str | None = None) -> ApprovalItem:
        """See :meth:`ApproverClient.get_request`.

        Raises:
            RelayError: Unknown, ambiguous, or the approver is unreachable.
        """
        result: ApprovalItem = await self._send(_Calls.get_request(request_id, origin))
        return result

    async def statement(
        self,
        request_id: str,
        *,
        kind: DecisionKind = "approval",
        reason: str = "",
        origin: str | None = None,
        expected: Expected | None = None,
    ) -> StatementToSign:
        """See :meth:`ApproverClient.statement`.

        Raises:
            RelayError: Unknown, expired, ambiguous, not the request confirmed, or the approver is
                unreachable.
        """
        result: StatementToSign = await self._send(
            _Calls.statement(request_id, kind, reason, origin, expected)
        )
        return result

    async def approve(
        self,
        request_id: str,
        *,
        reason: str = "",
        origin: str | None = None,
        expected: Expected | None = None,
    ) -> DecisionResult:
        """See :meth:`ApproverClient.approve`.

        Raises:
            RelayError: Unknown, expired, decided otherwise, not the request confirmed, or the
                approver is unreachable.
        """
        result: DecisionResult = await self._send(
            _Calls.decide(request_id, "approval", reason, origin, expected)
        )
        return result

    async def deny(
        self, request_id: str, *, reason: str, origin: str | None = None, expected: Expected | None = None
    ) -> DecisionResult:
        """See :meth:`ApproverClient.deny`.

        Raises:
            RelayError: Unknown, expired, decided otherwise, not the request confirmed, or the
                approver is unreachable.
        """
        result: DecisionResult = await self._send(
            _Calls.decide(request_id, "denial", reason, origin, expected)
        )
        return result

    async def submit_decision(
        self,
        request_id: str,
        statement: Mapping[str, Any],
        signature: str,
        *,
        expected: Expected | None = None,
    ) -> DecisionResult:
        """See :meth:`ApproverClient.submit_decision`.

        Raises:
            RelayError: Refused (invalid, forbidden, changed, unknown, expired) or unreachable.
        """
        result: DecisionResult = await self._send(
            _Calls.submit_decision(request_id, statement, signature, expected)
        )
        return result
