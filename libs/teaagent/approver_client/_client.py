"""HTTP clients of the approver service API (the operators' inbox of one node), sync and asyncio.

Both clients speak the same calls (:class:`_Calls`) and return the same frozen dataclasses
(``_models.py``). Every failure is a :class:`~teaagent.errors.RelayError` (the approving path's
error, as for the relay client, whose base ``teaagent._service_client`` this shares) carrying the
approver's status and stable ``ErrorOut`` code, with one sentence a person reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final
from urllib.parse import quote

from teaagent._service_client import (
    DEFAULT_TIMEOUT,
    HEALTH_CHECK,
    MAX_WAIT_SECONDS,
    AsyncServiceClient,
    Call,
    ServiceClient,
    SyncServiceClient,
    json_object,
    long_poll,
)
from teaagent.approver_client._models import (
    ApprovalItem,
    DecisionKind,
    DecisionResult,
    Expected,
    ListState,
    StatementToSign,
)
from teaagent.errors import RelayError
from teaagent.quorum import stated_kind

__all__ = [
    "DEFAULT_TIMEOUT",
    "MAX_TOOL_PATTERN_CHARS",
    "MAX_WAIT_SECONDS",
    "ApproverClient",
    "AsyncApproverClient",
]

MAX_TOOL_PATTERN_CHARS: Final = 256  # GET /v1/requests?tool=: the approver's bound, its clients' too


def _expected_fields(expected: Expected | None) -> dict[str, str]:
    if expected is None:
        return {}
    return {"expect_tool_name": expected.tool_name, "expect_payload_digest": expected.payload_digest}


def _path_id(request_id: str) -> str:
    # An id typed by a person goes into the path; quoting keeps "../x" or "a?b" one segment.
    return quote(request_id, safe="")


def _items(data: Any) -> list[ApprovalItem]:
    if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
        raise TypeError('it is not {"items": [...]}')
    return [ApprovalItem.from_json(item) for item in data["items"]]


class _Calls:
    """The API's calls, shared by both clients."""

    @staticmethod
    def list_requests(
        state: ListState, origin: str | None, tool: str | None, limit: int, wait: float, timeout: float
    ) -> Call[list[ApprovalItem]]:
        wait, http_timeout = long_poll(wait, timeout)
        params: dict[str, Any] = {"state": state, "limit": limit, "wait": wait}
        if origin is not None:
            params["origin"] = origin
        if tool is not None:
            params["tool"] = tool
        return Call(
            "GET",
            "/v1/requests",
            "the listing of requests",
            _items,
            params=params,
            timeout=http_timeout,
        )

    @staticmethod
    def get_request(request_id: str, origin: str | None) -> Call[ApprovalItem]:
        return Call(
            "GET",
            f"/v1/requests/{_path_id(request_id)}",
            f"request {request_id}",
            lambda data: ApprovalItem.from_json(json_object(data)),
            params=None if origin is None else {"origin": origin},
        )

    @staticmethod
    def statement(
        request_id: str, kind: DecisionKind, reason: str, origin: str | None, expected: Expected | None
    ) -> Call[StatementToSign]:
        params: dict[str, Any] = {"kind": kind, "reason": reason}
        if origin is not None:
            params["origin"] = origin
        params.update(_expected_fields(expected))
        return Call(
            "GET",
            f"/v1/requests/{_path_id(request_id)}/statement",
            f"the {kind} statement of request {request_id}",
            lambda data: StatementToSign.from_json(json_object(data)),
            params=params,
        )

    @staticmethod
    def decide(
        request_id: str, kind: DecisionKind, reason: str, origin: str | None, expected: Expected | None
    ) -> Call[DecisionResult]:
        verb = "approve" if kind == "approval" else "deny"
        return Call(
            "POST",
            f"/v1/requests/{_path_id(request_id)}/{verb}",
            f"the {kind} of request {request_id}",
            lambda data: DecisionResult.from_json(json_object(data)),
            body={"reason": reason, "origin": origin, **_expected_fields(expected)},
        )

    @staticmethod
    def submit_decision(
        request_id: str, statement: Mapping[str, Any], signature: str, expected: Expected | None
    ) -> Call[DecisionResult]:
        kind = stated_kind(statement)
        return Call(
            "POST",
            f"/v1/requests/{_path_id(request_id)}/decision",
            f"the signed {kind} of request {request_id}",
            lambda data: DecisionResult.from_json(json_object(data)),
            body={"statement": dict(statement), "signature": signature, **_expected_fields(expected)},
        )


class _Approver(ServiceClient[Any]):
    """The approver's words in the clients' sentences: who answers nobody, and how to start it."""

    service: ClassVar[str] = "approver"

    def _unreachable(self, call: Call[Any], detail: str) -> RelayError:
        hint = f"; start it with `{self._start_command}`" if self._start_command else ""
        return RelayError(f"No approver answers at {self.shown} ({call.what}: {detail}){hint}.")

    def _not_json(self, status: int, call: Call[Any], exc: ValueError) -> RelayError:
        return RelayError(
            f"The approver at {self.shown} answered {call.what} with something that is not what its API "
            f"documents: {str(exc).rstrip('.')}.",
            status_code=status,
        )


class ApproverClient(_Approver, SyncServiceClient):
    """A synchronous client of one node's approver service (the ``teaagent approvals`` commands).

    Use it as a context manager, or call :meth:`close`. See
    :class:`~teaagent._service_client.ServiceClient` for its arguments (``start_command``: the
    command that starts this approver, named when nobody answers).
    """

    def health(self) -> dict[str, Any]:
        """Return the approver's health document.

        Raises:
            RelayError: The approver is unreachable or unhealthy.
        """
        return self._send(HEALTH_CHECK)

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
        return self._send(_Calls.list_requests(state, origin, tool, limit, wait, self._timeout))

    def get_request(self, request_id: str, *, origin: str | None = None) -> ApprovalItem:
        """Return one request as this node sees it.

        Raises:
            RelayError: Unknown (``not_found``), ambiguous without ``origin`` (``conflict``), or
                the approver is unreachable.
        """
        return self._send(_Calls.get_request(request_id, origin))

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
        return self._send(_Calls.statement(request_id, kind, reason, origin, expected))

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
        return self._send(_Calls.decide(request_id, "approval", reason, origin, expected))

    def deny(
        self, request_id: str, *, reason: str, origin: str | None = None, expected: Expected | None = None
    ) -> DecisionResult:
        """Have the approver deny the request with the node key (see :meth:`approve`).

        Raises:
            RelayError: Unknown, expired, decided otherwise before, not the request confirmed
                (``changed``), or the approver is unreachable.
        """
        return self._send(_Calls.decide(request_id, "denial", reason, origin, expected))

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
        return self._send(_Calls.submit_decision(request_id, statement, signature, expected))


class AsyncApproverClient(_Approver, AsyncServiceClient):
    """The asyncio twin of :class:`ApproverClient` (the TUI); same calls, same errors."""

    async def health(self) -> dict[str, Any]:
        """See :meth:`ApproverClient.health`.

        Raises:
            RelayError: The approver is unreachable or unhealthy.
        """
        return await self._send(HEALTH_CHECK)

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
        return await self._send(_Calls.list_requests(state, origin, tool, limit, wait, self._timeout))

    async def get_request(self, request_id: str, *, origin: str | None = None) -> ApprovalItem:
        """See :meth:`ApproverClient.get_request`.

        Raises:
            RelayError: Unknown, ambiguous, or the approver is unreachable.
        """
        return await self._send(_Calls.get_request(request_id, origin))

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
        return await self._send(_Calls.statement(request_id, kind, reason, origin, expected))

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
        return await self._send(_Calls.decide(request_id, "approval", reason, origin, expected))

    async def deny(
        self, request_id: str, *, reason: str, origin: str | None = None, expected: Expected | None = None
    ) -> DecisionResult:
        """See :meth:`ApproverClient.deny`.

        Raises:
            RelayError: Unknown, expired, decided otherwise, not the request confirmed, or the
                approver is unreachable.
        """
        return await self._send(_Calls.decide(request_id, "denial", reason, origin, expected))

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
        return await self._send(_Calls.submit_decision(request_id, statement, signature, expected))
