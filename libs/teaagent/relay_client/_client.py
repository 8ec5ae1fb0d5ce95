"""HTTP clients of the relay API (ARCHITECTURE.md "Relay HTTP API"), synchronous and asyncio.

Both clients speak the same calls (:class:`_Calls`) and return the same frozen dataclasses
(``_models.py``); every failure is a :class:`~teaagent.errors.RelayError` carrying the relay's
status and stable ``ErrorOut`` code (``teaagent._service_client``, which the approver's client
shares).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from teaagent._service_client import (
    DEFAULT_TIMEOUT,
    HEALTH_CHECK,
    MAX_WAIT_SECONDS,
    AsyncServiceClient,
    Call,
    ServiceClient,
    SyncServiceClient,
    Unexpected,
    json_object,
    long_poll,
)
from teaagent.relay_client._models import (
    DecisionReceipt,
    InboxDecision,
    InboxItem,
    InboxState,
    RequestStatus,
)

__all__ = ["DEFAULT_TIMEOUT", "MAX_WAIT_SECONDS", "AsyncRelayClient", "RelayClient"]

T = TypeVar("T")


def _status(data: Any) -> RequestStatus:
    """Read a request status answer; anything else is the relay's failure, in one sentence."""
    try:
        if not isinstance(data, Mapping):
            raise ValueError("it is not a JSON object")
        return RequestStatus.from_json(data)
    except ValueError as exc:
        # It did answer (2xx): a relay that sends nonsense is refused now, not waited out.
        raise Unexpected(f"something that is not a request status: {str(exc).rstrip('.')}") from None


def _inbox_item(data: Any) -> InboxItem:
    """Read one inbox item; anything else is the relay's failure, in one sentence."""
    try:
        return InboxItem.from_json(data)
    except ValueError as exc:
        raise Unexpected(f"something that is not an inbox item: {str(exc).rstrip('.')}") from None


def _inbox_items(data: Any) -> list[InboxItem]:
    """Read an inbox listing; one item that is not an item refuses the whole answer."""
    if not isinstance(data, list):
        raise Unexpected("something that is not a list")
    return [_inbox_item(item) for item in data]


def _signed(
    path: str,
    what: str,
    parse: Callable[[Any], T],
    statement: Mapping[str, Any],
    signature: str,
    *,
    timeout: float | None = None,
    token: bool = True,
) -> Call[T]:
    """A POST of a signed statement (a decision, a withdrawal) to ``path``."""
    body = {"statement": dict(statement), "signature": signature}
    return Call("POST", path, what, parse, body=body, timeout=timeout, token=token)


class _Calls:
    """The API's calls, shared by both clients: what each sends, and how its answer is read."""

    @staticmethod
    def submit_request(
        request: Mapping[str, Any], signature: str, timeout: float | None = None
    ) -> Call[RequestStatus]:
        body = {"request": dict(request), "signature": signature}
        what = f"request {request.get('request_id')}"
        return Call("POST", "/v1/requests", what, _status, body=body, timeout=timeout)

    @staticmethod
    def get_request(request_id: str) -> Call[RequestStatus]:
        return Call("GET", f"/v1/requests/{request_id}", f"the status of request {request_id}", _status)

    @staticmethod
    def wait_outcome(
        request_id: str,
        wait: float,
        timeout: float,
        limit: float | None = None,
        counted: tuple[int, int] | None = None,
    ) -> Call[RequestStatus]:
        wait, http_timeout = long_poll(wait, timeout)
        params: dict[str, Any] = {"wait": wait}
        if counted is not None:
            params["approvals"], params["denials"] = counted
        return Call(
            "GET",
            f"/v1/requests/{request_id}/outcome",
            f"the outcome of request {request_id}",
            _status,
            params=params,
            timeout=http_timeout if limit is None else max(0.001, min(http_timeout, limit)),
        )

    @staticmethod
    def list_inbox(state: InboxState, limit: int, wait: float, timeout: float) -> Call[list[InboxItem]]:
        wait, http_timeout = long_poll(wait, timeout)
        params = {"state": state, "limit": limit, "wait": wait}
        return Call(
            "GET", "/v1/inbox", "the inbox listing", _inbox_items, params=params, timeout=http_timeout
        )

    @staticmethod
    def get_inbox_item(request_id: str, origin: str | None) -> Call[InboxItem]:
        params = {"origin": origin} if origin is not None else None
        return Call(
            "GET", f"/v1/inbox/{request_id}", f"inbox request {request_id}", _inbox_item, params=params
        )

    @staticmethod
    def submit_decision(request_id: str, statement: Mapping[str, Any], signature: str) -> Call[InboxDecision]:
        path, what = f"/v1/inbox/{request_id}/decision", f"the decision on request {request_id}"
        return _signed(path, what, InboxDecision.from_json, statement, signature)

    @staticmethod
    def withdraw(
        request_id: str, statement: Mapping[str, Any], signature: str, timeout: float | None
    ) -> Call[RequestStatus]:
        path, what = f"/v1/requests/{request_id}/withdrawal", f"the withdrawal of request {request_id}"
        return _signed(path, what, _status, statement, signature, timeout=timeout)

    @staticmethod
    def deliver_withdrawal(
        request_id: str, statement: Mapping[str, Any], signature: str
    ) -> Call[dict[str, Any]]:
        path, what = f"/v1/inbox/{request_id}/withdrawal", f"the withdrawal of request {request_id}"
        return _signed(path, what, json_object, statement, signature, token=False)

    @staticmethod
    def deliver_request(request: Mapping[str, Any], signature: str) -> Call[dict[str, Any]]:
        body = {"request": dict(request), "signature": signature}
        what = f"request {request.get('request_id')}"
        return Call("POST", "/v1/inbox", what, json_object, body=body, token=False)

    @staticmethod
    def deliver_decision(
        request_id: str, statement: Mapping[str, Any], signature: str
    ) -> Call[DecisionReceipt]:
        path, what = f"/v1/requests/{request_id}/decisions", f"the decision on request {request_id}"
        return _signed(path, what, DecisionReceipt.from_json, statement, signature, token=False)


class _Relay(ServiceClient[Any]):
    """The relay's words in the clients' sentences."""

    service: ClassVar[str] = "relay"


class RelayClient(_Relay, SyncServiceClient):
    """A synchronous client of one relay (the agent's quorum gate, the CLI).

    Calls of the node itself send ``token``; the peer calls (``deliver_*``) send none.
    Use it as a context manager, or call :meth:`close`. See
    :class:`~teaagent._service_client.ServiceClient` for its arguments.
    """

    def health(self) -> dict[str, Any]:
        """Return the relay's health document.

        Raises:
            RelayError: The relay is unreachable or unhealthy (503 when its Redis is down).
        """
        return self._send(HEALTH_CHECK)

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
        return self._send(_Calls.submit_request(request, signature, timeout))

    def get_request(self, request_id: str) -> RequestStatus:
        """Return the counting state of one of this node's requests.

        Raises:
            RelayError: The relay does not know it (``not_found``), is unreachable, or answered
                with something that is not a request status.
        """
        return self._send(_Calls.get_request(request_id))

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
        return self._send(_Calls.wait_outcome(request_id, wait, self._timeout, limit, counted))

    def list_inbox(
        self, state: InboxState = "pending", *, limit: int = 100, wait: float = 0.0
    ) -> list[InboxItem]:
        """List requests received from peers; with ``wait``, block until there is one.

        Raises:
            RelayError: The relay refused the call or is unreachable.
        """
        return self._send(_Calls.list_inbox(state, limit, wait, self._timeout))

    def get_inbox_item(self, request_id: str, *, origin: str | None = None) -> InboxItem:
        """Return one received request.

        Raises:
            RelayError: Unknown (``not_found``), ambiguous without ``origin`` (``conflict``), or
                the relay is unreachable.
        """
        return self._send(_Calls.get_inbox_item(request_id, origin))

    def submit_decision(self, request_id: str, statement: Mapping[str, Any], signature: str) -> InboxDecision:
        """Hand this node's signed approval or denial to its relay, which forwards it to the origin.

        Returns:
            This node's decision as recorded (the outcome is the origin's to count).

        Raises:
            RelayError: The relay refused it (not signed by one of this node's keys, bad
                signature, decided otherwise before, expired) or is unreachable.
        """
        return self._send(_Calls.submit_decision(request_id, statement, signature))

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
        return self._send(_Calls.withdraw(request_id, statement, signature, timeout))

    def deliver_withdrawal(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> dict[str, Any]:
        """As a peer relay: deliver an origin's signed withdrawal of a request in this relay's inbox.

        Raises:
            RelayError: Refused (unknown origin or request, bad signature...) or unreachable.
        """
        return self._send(_Calls.deliver_withdrawal(request_id, statement, signature))

    def deliver_request(self, request: Mapping[str, Any], signature: str) -> dict[str, Any]:
        """As a peer relay: deliver a signed request to this relay's inbox.

        Raises:
            RelayError: Refused (unknown origin, bad signature, rate limited...) or unreachable.
        """
        return self._send(_Calls.deliver_request(request, signature))

    def deliver_decision(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> DecisionReceipt:
        """As a peer relay: deliver a signed decision on one of this relay's requests.

        Raises:
            RelayError: Refused (not countable, bad signature...) or unreachable.
        """
        return self._send(_Calls.deliver_decision(request_id, statement, signature))


class AsyncRelayClient(_Relay, AsyncServiceClient):
    """The asyncio twin of :class:`RelayClient` (the approver service, benchmarks); same calls.

    Its calls go out through one pool of kept-alive connections (aiohttp's client, or httpx's
    with a ``transport``), as many as ``limits`` allows (100 by default: a client shared by many
    callers never closes and reopens one); see :class:`~teaagent._service_client.AsyncServiceClient`.
    """

    async def health(self) -> dict[str, Any]:
        """See :meth:`RelayClient.health`.

        Raises:
            RelayError: The relay is unreachable or unhealthy.
        """
        return await self._send(HEALTH_CHECK)

    async def submit_request(self, request: Mapping[str, Any], signature: str) -> RequestStatus:
        """See :meth:`RelayClient.submit_request`.

        Raises:
            RelayError: The relay refused it or is unreachable.
        """
        return await self._send(_Calls.submit_request(request, signature))

    async def get_request(self, request_id: str) -> RequestStatus:
        """See :meth:`RelayClient.get_request`.

        Raises:
            RelayError: The relay does not know it or is unreachable.
        """
        return await self._send(_Calls.get_request(request_id))

    async def wait_outcome(self, request_id: str, wait: float) -> RequestStatus:
        """See :meth:`RelayClient.wait_outcome`.

        Raises:
            RelayError: The relay does not know the request, or is unreachable.
        """
        return await self._send(_Calls.wait_outcome(request_id, wait, self._timeout))

    async def list_inbox(
        self, state: InboxState = "pending", *, limit: int = 100, wait: float = 0.0
    ) -> list[InboxItem]:
        """See :meth:`RelayClient.list_inbox`.

        Raises:
            RelayError: The relay refused the call or is unreachable.
        """
        return await self._send(_Calls.list_inbox(state, limit, wait, self._timeout))

    async def get_inbox_item(self, request_id: str, *, origin: str | None = None) -> InboxItem:
        """See :meth:`RelayClient.get_inbox_item`.

        Raises:
            RelayError: Unknown, ambiguous, or the relay is unreachable.
        """
        return await self._send(_Calls.get_inbox_item(request_id, origin))

    async def submit_decision(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> InboxDecision:
        """See :meth:`RelayClient.submit_decision`.

        Raises:
            RelayError: The relay refused it or is unreachable.
        """
        return await self._send(_Calls.submit_decision(request_id, statement, signature))

    async def withdraw(
        self, request_id: str, statement: Mapping[str, Any], signature: str, *, timeout: float | None = None
    ) -> RequestStatus:
        """See :meth:`RelayClient.withdraw`.

        Raises:
            RelayError: The relay refused it or is unreachable.
        """
        return await self._send(_Calls.withdraw(request_id, statement, signature, timeout))

    async def deliver_withdrawal(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> dict[str, Any]:
        """See :meth:`RelayClient.deliver_withdrawal`.

        Raises:
            RelayError: Refused or unreachable.
        """
        return await self._send(_Calls.deliver_withdrawal(request_id, statement, signature))

    async def deliver_request(self, request: Mapping[str, Any], signature: str) -> dict[str, Any]:
        """See :meth:`RelayClient.deliver_request`.

        Raises:
            RelayError: Refused or unreachable.
        """
        return await self._send(_Calls.deliver_request(request, signature))

    async def deliver_decision(
        self, request_id: str, statement: Mapping[str, Any], signature: str
    ) -> DecisionReceipt:
        """See :meth:`RelayClient.deliver_decision`.

        Raises:
            RelayError: Refused or unreachable.
        """
        return await self._send(_Calls.deliver_decision(request_id, statement, signature))
