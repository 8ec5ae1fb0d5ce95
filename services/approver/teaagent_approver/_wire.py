"""Signed decisions to the node's relay: ``POST /v1/inbox/{id}/decision`` over kept-alive HTTP/1.1.

The engine sends one decision per request it decides, so this call is the approver's hot path:
it goes out on :func:`teaagent._http.http_pool` (one aiohttp session whose connector keeps
every connection it may use alive). Everything else (listings, look-ups) uses
:class:`teaagent.relay_client.AsyncRelayClient`. Failures are :class:`~teaagent.errors.RelayError`
exactly as that client raises them: the relay's status and ``ErrorOut`` code, or no status when it
did not answer. A connection the relay closed while idle is replaced and the call sent once more
(a decision sent twice is counted once: the relay answers the repeat ``counted: false``).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from typing import Any, Final

from teaagent._batch import Coalescer
from teaagent._http import NoAnswer, http_pool
from teaagent._json import parse_json
from teaagent._urls import shown_url
from teaagent.errors import RelayError

__all__ = ["DecisionPoster"]

MAX_BATCH: Final = 64  # decisions per POST /v1/inbox/decisions: the relay's own bound
MAX_BATCH_BYTES: Final = 60 * 1024  # under the relay's 64 KiB body limit, with room for the wrapping


class DecisionPoster:
    """Posts this node's signed decisions to its relay over at most ``connections`` connections."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        connections: int = 32,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Connect nothing yet.

        ``ssl_context`` verifies an ``https://`` relay (``NodeConfig.tls.client_verify()``); the
        public CAs when None.

        Raises:
            ValueError: ``base_url`` is not an http or https URL with a host, or a limit is not positive.
        """
        self._http = http_pool(
            base_url,
            headers={"Authorization": f"Bearer {token}"},
            connections=connections,
            timeout=timeout,
            verify=ssl_context or True,
        )
        self.base_url = self._http.base_url
        self.shown = shown_url(self.base_url, path=True)  # what messages name: no credential
        self._batches: Coalescer[tuple[str, bytes], Any] = Coalescer(
            # Two batches out at once: the relay verifies one while the other waits on Redis
            # (bench approver: 1,000 decisions handled in 540-570 ms, against 650-700 with one).
            self._post_many,
            "teaagent-approver-decisions",
            max_batch=MAX_BATCH,
            in_flight=2,
        )

    async def post(self, request_id: str, statement: Mapping[str, Any], signature: str) -> Any:
        """Hand one signed decision to the relay; return its JSON answer (``InboxDecisionOut``).

        Concurrent calls go out together (``POST /v1/inbox/decisions``, up to ``MAX_BATCH`` and
        ``MAX_BATCH_BYTES`` a request); each is answered as its own ``POST
        /v1/inbox/{id}/decision`` would have been.

        Raises:
            RelayError: The relay refused it (its status and code) or did not answer (no status).
        """
        body = json.dumps(
            {"statement": dict(statement), "signature": signature}, separators=(",", ":")
        ).encode()
        return await self._batches.call((request_id, body))

    async def _post_many(self, items: list[tuple[str, bytes]]) -> list[Any]:
        """The coalescer's send: the batch in as few requests as the body limit allows, at once."""
        chunks: list[list[tuple[str, bytes]]] = [[]]
        size = 0
        for item in items:
            if chunks[-1] and size + len(item[1]) + 1 > MAX_BATCH_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(item)
            size += len(item[1]) + 1
        answers = await asyncio.gather(*(self._post_chunk(chunk) for chunk in chunks))
        return [answer for chunk in answers for answer in chunk]

    async def _post_chunk(self, chunk: list[tuple[str, bytes]]) -> list[Any]:
        if len(chunk) == 1:
            request_id, body = chunk[0]
            what = f"the decision on request {request_id}"
            try:
                status, answer = await self._send(f"/v1/inbox/{request_id}/decision", body, what)
                return [_answer(status, answer, self.base_url, what)]
            except RelayError as exc:
                return [exc]
        what = f"{len(chunk)} decisions"
        body = b'{"decisions":[' + b",".join(item[1] for item in chunk) + b"]}"
        try:
            status, answer = await self._send("/v1/inbox/decisions", body, what)
            data = _answer(status, answer, self.base_url, what)
        except RelayError as exc:
            return [exc] * len(chunk)
        results = data.get("results") if isinstance(data, dict) else None
        if not isinstance(results, list) or len(results) != len(chunk):
            count = len(results) if isinstance(results, list) else "no"
            error = RelayError(f"The relay at {self.shown} answered {what} with {count} results.")
            return [error] * len(chunk)
        return [
            _result(result, request_id, self.base_url)
            for (request_id, _body), result in zip(chunk, results, strict=True)
        ]

    async def _send(self, path: str, body: bytes, what: str) -> tuple[int, bytes]:
        """One POST over a kept-alive connection; the status and the body of the answer.

        Raises:
            RelayError: The relay did not answer (no status).
        """
        try:
            return await self._http.post(path, body)
        except NoAnswer as exc:
            if exc.timed_out:
                raise RelayError(f"The relay at {self.shown} did not answer {what} in time.") from exc
            raise RelayError(f"The relay at {self.shown} is unreachable ({what}): {exc.detail}.") from exc

    async def aclose(self) -> None:
        """Close the idle connections."""
        await self._http.aclose()


def _answer(status: int, body: bytes, base_url: str, what: str) -> Any:
    """The JSON of a 2xx answer; a RelayError with the relay's code and sentence otherwise."""
    try:
        data = parse_json(body) if body else None
    except ValueError:  # not JSON, or nested deeper than MAX_JSON_DEPTH: no answer of a relay
        data = None
    if 200 <= status < 300:
        if data is None:
            raise RelayError(
                f"The relay at {base_url} answered {what} with something that is not JSON.",
                status_code=status,
            )
        return data
    code: str | None = None
    message = "no reason given"
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        code, message = data["error"], str(data.get("message", message))
    message = message.strip().rstrip(".")
    raise RelayError(
        f"The relay at {base_url} refused {what} ({status} {code or 'error'}): {message}.",
        status_code=status,
        code=code,
    )


def _result(result: Any, request_id: str, base_url: str) -> Any:
    """One decision's answer within a batch: its ``InboxDecisionOut``, or its refusal as a RelayError."""
    what = f"the decision on request {request_id}"
    if not isinstance(result, dict) or not isinstance(result.get("status"), int):
        return RelayError(f"The relay at {base_url} answered {what} with something that is not a result.")
    status = result["status"]
    if status == 200 and isinstance(result.get("decision"), dict):
        return result["decision"]
    code = result.get("error") if isinstance(result.get("error"), str) else None
    message = str(result.get("message") or "no reason given").strip().rstrip(".")
    return RelayError(
        f"The relay at {base_url} refused {what} ({status} {code or 'error'}): {message}.",
        status_code=status,
        code=code,
    )
