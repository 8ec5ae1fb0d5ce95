"""The base every client of a node's services stands on (``teaagent._service_client``): one sentence
per failure, whichever client and whichever way (sync or asyncio) the call went.

A real HTTP server on a real socket answers what each test puts in its mouth: a service that lies
or breaks is what these sentences are for.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from relay_support import free_port

from teaagent.approver_client import ApproverClient, AsyncApproverClient
from teaagent.errors import RelayError
from teaagent.relay_client import AsyncRelayClient, RelayClient

STATEMENT = {"type": "teaagent.approval", "request_id": "r1", "signer": "beta"}


class Canned:
    """A server at ``url`` answering every call with ``status`` and ``body``; ``seen`` its calls."""

    def __init__(self) -> None:
        self.status, self.body = 200, b"{}"
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                canned.seen.append((self.command, self.path, dict(self.headers)))
                self.send_response(canned.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)

            do_GET = do_POST = answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def says(self, status: int, body: object) -> None:
        self.status = status
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture
def canned() -> Iterator[Canned]:
    server = Canned()
    thread = threading.Thread(target=server.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_an_answer_without_a_documented_field_is_a_relay_error_not_a_key_error(canned: Canned) -> None:
    canned.says(200, {"request_id": "r1"})
    expected = (
        f"The relay at {canned.url} answered the decision on request r1 with something that is not what "
        "its API documents: it has no field 'origin'."
    )
    with RelayClient(canned.url) as client, pytest.raises(RelayError) as refused:
        client.deliver_decision("r1", STATEMENT, "sig")
    assert (str(refused.value), refused.value.status_code) == (expected, 200)


@pytest.mark.anyio
async def test_the_asyncio_clients_read_answers_as_the_sync_ones_do(canned: Canned) -> None:
    canned.says(200, [1])
    async with AsyncRelayClient(canned.url) as relay, AsyncApproverClient(canned.url) as approver:
        with pytest.raises(
            RelayError, match=r"answered the health check with something that is not what its API "
        ):
            await relay.health()
        with pytest.raises(RelayError, match=r"^The approver at .* answered the health check with something"):
            await approver.health()
        canned.says(409, {"error": "conflict", "message": "Already\n  approved  otherwise."})
        with pytest.raises(RelayError) as refused:
            await approver.approve("r1")
    assert str(refused.value) == (
        f"The approver at {canned.url} refused the approval of request r1 (409 conflict): Already approved "
        "otherwise."
    )
    assert (refused.value.status_code, refused.value.code) == (409, "conflict")


def test_each_service_keeps_its_words_for_an_answer_that_is_not_json(canned: Canned) -> None:
    canned.says(200, b"<html>")
    with RelayClient(canned.url) as relay, pytest.raises(RelayError) as by_relay:
        relay.health()
    with ApproverClient(canned.url) as approver, pytest.raises(RelayError) as by_approver:
        approver.health()
    assert (
        str(by_relay.value)
        == f"The relay at {canned.url} answered the health check with something that is not JSON."
    )
    assert str(by_approver.value).startswith(
        f"The approver at {canned.url} answered the health check with something that is not what its API "
        "documents: "
    )


@pytest.mark.anyio
async def test_nobody_answering_names_the_command_that_starts_the_service() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    start = "teaagent approver serve --config node.toml"
    async with AsyncApproverClient(url, start_command=start) as approver:
        with pytest.raises(RelayError) as unanswered:
            await approver.list_requests()
    with RelayClient(url, start_command="teaagent relay serve") as relay, pytest.raises(RelayError) as away:
        relay.get_request("r1")
    assert str(unanswered.value).startswith(f"No approver answers at {url} (the listing of requests: ")
    assert str(unanswered.value).endswith(f"; start it with `{start}`.")
    assert str(away.value).startswith(f"The relay at {url} is unreachable (the status of request r1): ")
    assert str(away.value).endswith("; start it with `teaagent relay serve`.")
    assert unanswered.value.status_code is None


def test_the_token_goes_with_the_nodes_own_calls_only(canned: Canned) -> None:
    canned.says(200, {"ok": True})
    with RelayClient(canned.url, token="secret") as client:
        client.deliver_withdrawal("r1", STATEMENT, "sig")  # a peer's call
        client.health()
    canned.says(200, {"items": []})
    with ApproverClient(canned.url, token="secret") as approver:
        assert approver.list_requests(origin="alpha") == []
    tokens = [headers.get("Authorization") for _method, _path, headers in canned.seen]
    assert tokens == [None, None, "Bearer secret"]
    assert canned.seen[-1][1] == "/v1/requests?state=pending&limit=100&wait=0.0&origin=alpha"
