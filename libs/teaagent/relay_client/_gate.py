"""``RelayQuorumGate``: the policy's quorum gate, by way of the node's own relay."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import httpx

from teaagent.errors import ApprovalDeniedError, RelayError
from teaagent.policy import MultiSigQuorumConfig
from teaagent.quorum import build_request, sign_request
from teaagent.relay_client._client import DEFAULT_TIMEOUT, MAX_WAIT_SECONDS, RelayClient
from teaagent.signing import Signer

__all__ = ["EXPIRY_GRACE_SECONDS", "RelayQuorumGate"]

EXPIRY_GRACE_SECONDS: Final = 5  # past expires_at the relay settles "expired" at once; wait that long more


class RelayQuorumGate:
    """Obtains quorum certificates through the node's relay (``teaagent.policy.QuorumGate``).

    ``obtain`` builds the request of one high-risk call, signs it with the node's key, posts it
    to the node's own relay, long-polls its outcome and returns the certificate. It does not
    verify the certificate: the policy does, with the node's own configuration, because the relay
    is not trusted.
    """

    def __init__(
        self,
        *,
        relay_url: str,
        token: str,
        origin: str,
        private_key_signer: Signer,
        config: MultiSigQuorumConfig,
        timeout: float | None = None,
        on_progress: Callable[[str], None] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """Prepare the gate; nothing is sent until :meth:`obtain`.

        Args:
            relay_url: This node's relay (``relay_url`` of node.toml).
            token: This node's bearer token (``NodeConfig.load_token()``).
            origin: This node's agent id.
            private_key_signer: What signs requests as this node (``NodeConfig.signer()``).
            config: This node's quorum configuration: peers, threshold, timeout.
            timeout: Seconds to wait for the outcome; ``config.timeout_seconds`` plus a grace
                when None (the request expires by then, and the relay says so).
            on_progress: Called with one line per step (submitted, still waiting...), for a
                command line's stderr.
            transport: An httpx transport, for tests.

        Raises:
            ValueError: ``relay_url`` is not an http(s) URL, ``timeout`` is not positive, or the
                origin is among the configured peers.
        """
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        if origin in config.peer_agent_ids:
            raise ValueError(f"the origin {origin} is among the configured peers")
        self._client = RelayClient(relay_url, token=token, timeout=DEFAULT_TIMEOUT, transport=transport)
        self._origin = origin
        self._signer = private_key_signer
        self._config = config
        self._timeout = timeout if timeout is not None else config.timeout_seconds + EXPIRY_GRACE_SECONDS
        self._progress = on_progress or (lambda _line: None)

    def __repr__(self) -> str:
        return f"RelayQuorumGate(origin={self._origin!r}, relay={self._client.base_url!r})"

    def close(self) -> None:
        """Close the relay client's connections."""
        self._client.close()

    def obtain(
        self,
        *,
        tool_name: str,
        arguments: dict[str, Any],
        call_id: str,
        run_id: str | None,
        reason: str,
    ) -> dict[str, Any]:
        """Ask the peers, through the relay, to approve one call; return the quorum certificate.

        Returns:
            The certificate ``{"request", "request_signature", "approvals"}`` (unverified).

        Raises:
            ApprovalDeniedError: The peers denied the call (``... denied by delta: reason``) or
                the request expired before the quorum was reached.
            TimeoutError: The outcome was still pending when ``timeout`` ran out.
            RelayError: The relay refused the request or is unreachable.
            ValueError: The call cannot be put in a request (arguments that are not canonical JSON...).
        """
        request = build_request(
            origin=self._origin,
            run_id=run_id or "",
            call_id=call_id,
            tool_name=tool_name,
            arguments=arguments,
            reason=reason,
            config=self._config,
        )
        request_id = request["request_id"]
        deadline = time.monotonic() + self._timeout
        status = self._client.submit_request(request, sign_request(request, self._signer))
        self._progress(
            f"{tool_name} needs {self._config.describe_quorum()}; request {request_id} sent to the peers."
        )
        while not status.decided:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no quorum was reached for {tool_name} within {self._timeout:g} seconds")
            status = self._client.wait_outcome(request_id, min(remaining, MAX_WAIT_SECONDS))
            if not status.decided:
                self._progress(f"request {request_id}: {status.describe()}.")
        if status.state == "approved":
            if status.certificate is None:
                raise RelayError(f"The relay approved request {request_id} but sent no certificate.")
            self._progress(f"request {request_id}: {status.describe()}.")
            return status.certificate
        if status.state == "denied":
            raise ApprovalDeniedError(f"{tool_name} was {status.describe()}.")
        raise ApprovalDeniedError(f"The request for {tool_name} {status.describe()}.")
