"""``teaagent approvals`` against approvers that answer what the real one never does.

A stand-in server (Starlette in a thread) gives a wrong statement to sign, a 409 ``changed``, an
undocumented body; the command refuses each in one sentence and signs nothing. The node's files
are ``approvals_support``'s (no service of its runs here).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from approvals_support import (
    Cluster,
    cli,
    config_with_approver_port,
    item_json,
    one_sentence,
    serving,
)
from approvals_support import fixture_cluster as fixture_cluster  # the module's fixture
from relay_support import free_port
from starlette.responses import JSONResponse
from starlette.routing import Route

from teaagent.config import load_config
from teaagent.quorum import approval_statement, statement_bytes

# -- what only a stand-in can do: an approver that answers wrongly ------------------------------


@contextlib.contextmanager
def stand_in(cluster: Cluster, *routes: Route) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on a free port with ``routes``, in a thread; yields a configuration that names it.

    The real approver never answers like these; only a stand-in can show what the command does then.
    """
    port = free_port()
    with serving(port, *routes) as calls:
        yield config_with_approver_port(cluster, port), calls


def test_a_statement_to_sign_that_is_not_this_nodes_is_never_signed(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    request = cluster.request()
    gammas = approval_statement(request, "gamma", int(time.time()))  # another node's statement

    async def item(_: Any) -> JSONResponse:
        return JSONResponse(item_json(request))

    async def statement(_: Any) -> JSONResponse:
        return JSONResponse({"statement": gammas, "bytes": statement_bytes(gammas).decode()})

    path = f"/v1/requests/{request['request_id']}"
    with stand_in(cluster, Route(path, item), Route(f"{path}/statement", statement)) as (config, calls):
        args = ["approve", request["request_id"], "--key", str(cluster.operator.private_path)]

        code, _, err = cli(capsys, *args, "--config", config)

    assert code == 1
    assert one_sentence(err) == (
        f"The approver at http://127.0.0.1:{config_port(config)} gave a statement to sign that is "
        "wrong (its signer is 'gamma', not beta); nothing was signed."
    )
    assert calls == [f"GET {path}", f"GET {path}/statement"]  # nothing was submitted


def test_a_decision_carries_the_tool_and_digest_shown_and_a_changed_request_is_one_sentence(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real approver answers 409 changed only when its relay shows one request and holds another;
    # a stand-in shows what such an approver says, and what the command sent it.
    request = cluster.request()
    bodies: list[dict[str, Any]] = []

    async def item(_: Any) -> JSONResponse:
        return JSONResponse(item_json(request))

    refusal = (
        f"Request {request['request_id']} of alpha is not the request the operator confirmed: its signed "
        "tool differs; this node signs nothing for it."
    )

    async def approve(http: Any) -> JSONResponse:
        bodies.append(await http.json())
        return JSONResponse({"error": "changed", "message": refusal}, status_code=409)

    path = f"/v1/requests/{request['request_id']}"
    routes = (Route(path, item), Route(f"{path}/approve", approve, methods=["POST"]))
    with stand_in(cluster, *routes) as (config, calls):
        code, out, err = cli(capsys, "approve", request["request_id"], "--config", config)

    assert (code, out) == (1, "")
    assert one_sentence(err) == (
        f"The approver at http://127.0.0.1:{config_port(config)} refused the approval of request "
        f"{request['request_id']} (409 changed): {refusal}"
    )
    assert calls == [f"GET {path}", f"POST {path}/approve"]
    assert bodies == [
        {
            "reason": "",
            "origin": "alpha",
            "expect_tool_name": "shell.run",
            "expect_payload_digest": request["payload_digest"],
        }
    ]


def test_an_answer_that_is_not_the_documented_one_is_one_sentence(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    async def listing(_: Any) -> JSONResponse:
        return JSONResponse({"items": [{"request_id": "x"}]})

    with stand_in(cluster, Route("/v1/requests", listing)) as (config, _):
        code, _, err = cli(capsys, "list", "--config", config)

    assert code == 1
    assert one_sentence(err) == (
        f"The approver at http://127.0.0.1:{config_port(config)} answered the listing of requests with "
        "something that is not what its API documents: it has no field 'state'."
    )


def config_port(config: str) -> int:
    return load_config(config).approver.port
