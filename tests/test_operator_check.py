"""The operator's check before signing: one function, and each of its callers refuses what it refused.

An operator who signs with their own key checks the statement the approver hands over
(``check_before_signing``): ``teaagent approvals approve --key``, the TUI's ``/approve`` with an
operator key, and the library's ``decide`` that both use. The approver compares what is signed with
what the operator confirmed (``unconfirmed``, its 409 ``changed``). A stand-in approver on a real
socket hands over the wrong statements: the real one never does.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from approvals_support import item_json, serving
from relay_support import Node, signer, write_cluster
from starlette.responses import JSONResponse
from starlette.routing import Route
from test_tui import Terminal, scripted

from teaagent.approver_client import (
    ApprovalItem,
    ApproverClient,
    StatementToSign,
    check_before_signing,
    decide,
    unconfirmed,
)
from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.errors import RelayError
from teaagent.quorum import approval_statement, statement_bytes
from teaagent.tui import TeaAgentTUI


def _wrong_signer(request: dict[str, Any]) -> dict[str, Any]:
    return approval_statement(request, "gamma", int(time.time()))


def _wrong_tool(request: dict[str, Any]) -> dict[str, Any]:
    return {**approval_statement(request, "alpha", int(time.time())), "tool_name": "fs.read"}


def _wrong_request(request: dict[str, Any]) -> dict[str, Any]:
    return {**approval_statement(request, "alpha", int(time.time())), "request_id": "f" * 32}


# Each wrong statement, and the problem the check names (the sentences of before).
WRONG: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = {
    "signer": (_wrong_signer, "its signer is 'gamma', not alpha"),
    "tool": (_wrong_tool, "its tool or payload digest is not the one shown"),
    "request": (_wrong_request, f"it is the statement of request {'f' * 32!r}"),
    "bytes": (
        lambda request: approval_statement(request, "alpha", int(time.time())),
        "its bytes are not the statement's canonical JSON",
    ),
}


def _to_sign(request: dict[str, Any], wrong: str) -> dict[str, Any]:
    make, _ = WRONG[wrong]
    statement = make(request)
    text = json.dumps(statement) if wrong == "bytes" else statement_bytes(statement).decode()
    return {"statement": statement, "bytes": text}


@pytest.fixture
def nodes(tmp_path: Path) -> dict[str, Node]:
    # No Redis is reached: alpha's approver is a stand-in, and nothing else is asked.
    return write_cluster(
        tmp_path, ["alpha", "beta"], redis_url="redis://127.0.0.1:9", prefix="unused", required=1
    )


@pytest.fixture
def request_doc(nodes: dict[str, Node]) -> dict[str, Any]:
    return nodes["beta"].request(arguments={"command": "make docs"})


@contextlib.contextmanager
def stand_in(node: Node, request: dict[str, Any], to_sign: dict[str, Any]) -> Iterator[list[str]]:
    """alpha's approver, as a stand-in that shows ``request`` and hands over ``to_sign``; yields its calls."""
    path = f"/v1/requests/{request['request_id']}"

    async def item(_: Any) -> JSONResponse:
        return JSONResponse(item_json(request))

    async def statement(_: Any) -> JSONResponse:
        return JSONResponse(to_sign)

    with serving(node.approver_port, Route(path, item), Route(f"{path}/statement", statement)) as calls:
        yield calls


def _refusal(node: Node, problem: str) -> str:
    return (
        f"The approver at http://127.0.0.1:{node.approver_port} gave a statement to sign that is wrong "
        f"({problem}); nothing was signed."
    )


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_the_check_refuses_each_wrong_statement_and_passes_the_right_one(
    request_doc: dict[str, Any], wrong: str
) -> None:
    item = ApprovalItem.from_json(item_json(request_doc))
    bad = StatementToSign.from_json(_to_sign(request_doc, wrong))
    with pytest.raises(RelayError) as refused:
        check_before_signing(bad, item, signer="alpha", base_url="http://approver")
    assert str(refused.value) == (
        f"The approver at http://approver gave a statement to sign that is wrong ({WRONG[wrong][1]}); "
        "nothing was signed."
    )
    right = approval_statement(request_doc, "alpha", int(time.time()))
    good = StatementToSign(statement=right, text=statement_bytes(right).decode())
    check_before_signing(good, item, signer="alpha", base_url="http://approver")


def test_unconfirmed_names_the_fields_that_differ_and_skips_those_not_confirmed() -> None:
    signed = {"tool_name": "shell.run", "payload_digest": "sha256:aa"}
    assert unconfirmed(signed, tool_name="shell.run", payload_digest="sha256:aa") == []
    assert unconfirmed(signed, tool_name="fs.read", payload_digest="sha256:aa") == ["tool"]
    assert unconfirmed(signed, tool_name="fs.read", payload_digest="sha256:bb") == ["tool", "payload digest"]
    assert unconfirmed(signed, tool_name=None, payload_digest="sha256:bb") == ["payload digest"]
    assert unconfirmed(signed, tool_name=None, payload_digest=None) == []


@pytest.mark.parametrize("wrong", sorted(WRONG))
def test_decide_with_an_operator_key_signs_nothing_for_a_wrong_statement(
    nodes: dict[str, Node], request_doc: dict[str, Any], wrong: str
) -> None:
    alpha = nodes["alpha"]
    with (
        stand_in(alpha, request_doc, _to_sign(request_doc, wrong)) as calls,
        ApproverClient(alpha.approver_url, token=alpha.token) as client,
    ):
        item = client.get_request(request_doc["request_id"])
        with pytest.raises(RelayError) as refused:
            decide(client, item, agent_id="alpha", deny=False, reason="", signer=signer("alpha-operator"))
    assert str(refused.value) == _refusal(alpha, WRONG[wrong][1])
    path = f"/v1/requests/{request_doc['request_id']}"
    assert calls == [f"GET {path}", f"GET {path}/statement"]  # nothing was submitted


def test_the_tui_signs_nothing_for_a_wrong_statement(
    nodes: dict[str, Node], request_doc: dict[str, Any]
) -> None:
    alpha = nodes["alpha"]
    (alpha.config_path.parent / "workspace-alpha").mkdir(exist_ok=True)
    terminal = Terminal([f"/approve {request_doc['request_id']}"])
    adapter = scripted([])
    with stand_in(alpha, request_doc, _to_sign(request_doc, "signer")) as calls:
        tui = TeaAgentTUI(
            node=load_config(alpha.config_path),
            input_fn=terminal.input,
            output_fn=terminal.print,
            adapter_factory=lambda provider, model: adapter,
            operator_signer=signer("alpha-operator"),
        )
        assert tui.run_repl() == 0
    assert _refusal(alpha, WRONG["signer"][1]) in terminal.text
    assert not any(call.endswith("/decision") or call.startswith("POST") for call in calls)


def test_the_cli_signs_nothing_for_a_wrong_statement(
    nodes: dict[str, Node],
    request_doc: dict[str, Any],
    ssh_key_factory: Callable[..., Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    alpha = nodes["alpha"]
    key = ssh_key_factory("alpha-operator")
    with stand_in(alpha, request_doc, _to_sign(request_doc, "tool")) as calls:
        code = run(
            [
                "approvals",
                "approve",
                request_doc["request_id"],
                "--key",
                str(key.private_path),
                "--config",
                str(alpha.config_path),
            ]
        )
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1
    assert _refusal(alpha, WRONG["tool"][1]) in err
    assert not any(call.startswith("POST") for call in calls)
