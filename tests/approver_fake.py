"""A stand-in for the approver service's HTTP API (ISSUE 10's documented shape), on a real socket.

Only for what the real service (``teaagent approver serve``) cannot be made to do in a test. It
keeps its requests in memory, signs with the node key, and checks submitted decisions with
``verify_decision`` against the node's own keys, as the documented API says the real one does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from teaagent.config import NodeConfig
from teaagent.errors import SignatureError
from teaagent.quorum import (
    approval_statement,
    denial_statement,
    sign_approval,
    sign_denial,
    statement_bytes,
    verify_decision,
)
from teaagent.signing import parse_sshsig

NOTE = "This node's decision; the request's outcome is counted by its origin, {origin}."


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FakeApprover:
    """The documented API over an in-memory inbox, served by uvicorn in a thread."""

    def __init__(self, node: NodeConfig, port: int | None = None) -> None:
        self.node = node
        self.port = port or node.approver.port
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.app = Starlette(
            routes=[
                Route("/health", self.health),
                Route("/v1/requests", self.list_requests),
                Route("/v1/requests/{request_id}", self.get_request),
                Route("/v1/requests/{request_id}/statement", self.statement),
                Route("/v1/requests/{request_id}/approve", self.approve, methods=["POST"]),
                Route("/v1/requests/{request_id}/deny", self.deny, methods=["POST"]),
                Route("/v1/requests/{request_id}/decision", self.decision, methods=["POST"]),
            ]
        )

    # -- the test's side ---------------------------------------------------------------------

    def add(self, request: Mapping[str, Any], signature: str) -> None:
        self.items[(request["origin"], request["request_id"])] = {
            "request": dict(request),
            "signature": signature,
            "decision": None,
        }

    def start(self) -> FakeApprover:
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake approver did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)
            self._server = self._thread = None

    def __enter__(self) -> FakeApprover:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API -----------------------------------------------------------------------------

    async def _guard(self, request: Request) -> None:
        self.calls.append(f"{request.method} {request.url.path}")
        if request.headers.get("authorization") != f"Bearer {self.node.load_token()}":
            raise _Refusal(401, "unauthorized", "A bearer token of this node is required.")

    def _state(self, entry: dict[str, Any]) -> str:
        if entry["decision"] is not None:
            return "approved" if entry["decision"]["kind"] == "approval" else "denied"
        return "expired" if time.time() >= entry["request"]["expires_at"] else "pending"

    def _item(self, entry: dict[str, Any]) -> dict[str, Any]:
        request = entry["request"]
        rule = None
        for index, candidate in enumerate(self.node.approver.rules, start=1):
            if candidate.matches(request["tool_name"], request["arguments"]):
                rule = {
                    "index": index,
                    "tool": candidate.tool,
                    "arguments": dict(candidate.arguments),
                    "decision": candidate.decision,
                }
                break
        fields = ("request_id", "origin", "tool_name", "arguments", "reason", "payload_digest", "run_id")
        return {
            **{name: request[name] for name in fields},
            "call_id": request["call_id"],
            "required_approvals": request["required_approvals"],
            "peers": request["peers"],
            "created_at": request["created_at"],
            "expires_at": request["expires_at"],
            "seconds_left": max(0, int(request["expires_at"] - time.time())),
            "state": self._state(entry),
            "decision": None if entry["decision"] is None else entry["decision"]["record"],
            "rule": rule,
            "request": request,
            "signature": entry["signature"],
        }

    def _find(self, request_id: str, origin: str | None) -> dict[str, Any]:
        found = [
            entry for (who, rid), entry in self.items.items() if rid == request_id and origin in (None, who)
        ]
        if not found:
            raise _Refusal(404, "not_found", f"No request {request_id} reached {self.node.agent_id}.")
        if len(found) > 1:
            raise _Refusal(
                409, "conflict", f"Several origins used the id {request_id}; name one with origin."
            )
        return found[0]

    def _live(self, entry: dict[str, Any]) -> None:
        expires_at = entry["request"]["expires_at"]
        if time.time() >= expires_at:
            raise _Refusal(
                409,
                "expired",
                f"Request {entry['request']['request_id']} expired at {expires_at}; nothing was signed.",
            )

    def _record(
        self, entry: dict[str, Any], kind: str, reason: str, by: str, fingerprint: str
    ) -> dict[str, Any]:
        request = entry["request"]
        if entry["decision"] is not None and entry["decision"]["kind"] != kind:
            raise _Refusal(
                409,
                "conflict",
                f"{self.node.agent_id} already decided request {request['request_id']} otherwise.",
            )
        record = {
            "kind": kind,
            "reason": reason,
            "by": by,
            "key_fingerprint": fingerprint,
            "at": int(time.time()),
        }
        if entry["decision"] is None:
            entry["decision"] = {"kind": kind, "record": record}
        return {
            "request_id": request["request_id"],
            "origin": request["origin"],
            "decision": kind,
            "reason": reason,
            "this_node": "approved" if kind == "approval" else "denied",
            "by": by,
            "key_fingerprint": fingerprint,
            "forwarded": False,
            "note": NOTE.format(origin=request["origin"]),
        }

    @staticmethod
    async def _answer(handler: Any) -> JSONResponse:
        try:
            return JSONResponse(await handler())
        except _Refusal as exc:
            return JSONResponse({"error": exc.code, "message": exc.message}, status_code=exc.status)

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "approver"})

    async def list_requests(self, request: Request) -> JSONResponse:
        async def run() -> Any:
            await self._guard(request)
            state = request.query_params.get("state", "pending")
            origin, tool = request.query_params.get("origin"), request.query_params.get("tool")
            items = [self._item(entry) for entry in self.items.values()]
            items = [
                item
                for item in items
                if (state == "all" or item["state"] == state)
                and origin in (None, item["origin"])
                and tool in (None, item["tool_name"])
            ]
            items.sort(key=lambda item: (item["state"] != "pending", item["expires_at"]))
            return {"items": items[: int(request.query_params.get("limit", 100))]}

        return await self._answer(run)

    async def get_request(self, request: Request) -> JSONResponse:
        async def run() -> Any:
            await self._guard(request)
            return self._item(
                self._find(request.path_params["request_id"], request.query_params.get("origin"))
            )

        return await self._answer(run)

    async def statement(self, request: Request) -> JSONResponse:
        async def run() -> Any:
            await self._guard(request)
            entry = self._find(request.path_params["request_id"], request.query_params.get("origin"))
            self._live(entry)
            now = int(time.time())
            if request.query_params.get("kind", "approval") == "denial":
                statement = denial_statement(
                    entry["request"], self.node.agent_id, now, request.query_params.get("reason", "")
                )
            else:
                statement = approval_statement(entry["request"], self.node.agent_id, now)
            return {"statement": statement, "bytes": statement_bytes(statement).decode()}

        return await self._answer(run)

    async def _decide(self, request: Request, kind: str) -> JSONResponse:
        async def run() -> Any:
            await self._guard(request)
            body = await request.json()
            entry = self._find(request.path_params["request_id"], body.get("origin"))
            self._live(entry)
            signer = self.node.signer()
            reason = body.get("reason") or ""
            if kind == "approval":
                sign_approval(entry["request"], self.node.agent_id, signer)
            else:
                sign_denial(entry["request"], self.node.agent_id, signer, reason)
            return self._record(entry, kind, reason, "operator", signer.public_key.fingerprint)

        return await self._answer(run)

    async def approve(self, request: Request) -> JSONResponse:
        return await self._decide(request, "approval")

    async def deny(self, request: Request) -> JSONResponse:
        return await self._decide(request, "denial")

    async def decision(self, request: Request) -> JSONResponse:
        async def run() -> Any:
            await self._guard(request)
            body = await request.json()
            statement, signature = body["statement"], body["signature"]
            entry = self._find(request.path_params["request_id"], statement.get("origin"))
            self._live(entry)
            kind = "denial" if statement.get("type") == "teaagent.denial" else "approval"
            signed_at = statement.get("signed_at")
            rebuilt = (
                denial_statement(entry["request"], self.node.agent_id, signed_at, statement.get("reason", ""))
                if kind == "denial"
                else approval_statement(entry["request"], self.node.agent_id, signed_at)
            )
            if rebuilt != statement:
                raise _Refusal(
                    422,
                    "invalid",
                    f"The statement does not match request {entry['request']['request_id']} as "
                    f"{self.node.agent_id} would sign it.",
                )
            keys = self.node.own_keys()
            embedded = parse_sshsig(signature).public_key_blob
            if all(key.key.blob != embedded for key in keys):
                raise _Refusal(
                    403,
                    "forbidden",
                    f"The key {parse_sshsig(signature).signer_fingerprint} may not sign for "
                    f"{self.node.agent_id}.",
                )
            try:
                key = verify_decision(statement, signature, keys)
            except SignatureError as exc:
                raise _Refusal(422, "invalid", f"The signature does not verify: {exc}") from None
            return self._record(entry, kind, statement.get("reason", ""), "operator", key.fingerprint)

        return await self._answer(run)
