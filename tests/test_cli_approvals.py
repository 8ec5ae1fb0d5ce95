"""``teaagent approvals`` list, show, approve, deny, statement and submit against beta's real approver.

The node and its services are ``approvals_support``'s: beta's relay and approver, real processes
shared by the module, asked by alpha. Signatures made by ``ssh-keygen -Y sign`` go through
``submit``; requests are named by their whole id or its first characters; each refusal is checked
for its exit code and its one sentence on stderr.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import uuid
from pathlib import Path

import pytest
from approvals_support import (
    DEADLINE,
    Approver,
    Cluster,
    approve_with_key,
    cli,
    config_with_approver_port,
    one_sentence,
    sharing,
    statement_signed_by,
    submit,
)
from approvals_support import fixture_approver as fixture_approver  # the module's fixture
from approvals_support import fixture_approver_processes as fixture_approver_processes  # the module's fixture
from approvals_support import fixture_cluster as fixture_cluster  # the module's fixture
from relay_support import free_port, signer
from web_support import fingerprint_of, ssh_keygen_sign

from teaagent.cli._main import run
from teaagent.config import load_config
from teaagent.quorum import sign_request, sign_withdrawal, statement_bytes
from teaagent.relay_client import RelayClient

# -- list and show -----------------------------------------------------------------------------


@pytest.mark.slow
def test_list_json_has_the_documented_fields_pending_first(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    first = approver.deliver(cluster.request(arguments={"command": "rm -rf build"}, call_id="c1"))
    second = approver.deliver(cluster.request(tool_name="fs.delete", arguments={"path": "x"}, call_id="c2"))
    code, out, _ = cli(capsys, "approve", first["request_id"], "--config", cluster.config)
    assert code == 0

    code, out, err = cli(capsys, "list", "--json", "--state", "all", "--config", cluster.config)

    assert (code, err) == (0, "")
    listed = json.loads(out)
    for item in listed:
        assert {"request_id", "origin", "tool_name", "arguments", "reason", "expires_at", "state"} <= set(
            item
        )
    states = [item["state"] for item in listed]
    assert states == sorted(states, key=lambda state: state != "pending")  # the pending first
    mine = {
        item["request_id"]: item
        for item in listed
        if item["request_id"] in (first["request_id"], second["request_id"])
    }
    assert mine[second["request_id"]]["origin"] == "alpha"
    assert mine[second["request_id"]]["tool_name"] == "fs.delete"
    assert mine[second["request_id"]]["arguments"] == {"path": "x"}
    assert mine[second["request_id"]]["reason"] == "clean the build"
    assert mine[second["request_id"]]["expires_at"] == second["expires_at"]
    assert mine[second["request_id"]]["state"] == "pending"
    assert mine[first["request_id"]]["state"] == "approved"  # by this node: its own view


@pytest.mark.slow
def test_list_filters_and_prints_a_table(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    tool = f"test.{uuid.uuid4().hex[:8]}"  # a tool no other test's request calls
    long = approver.deliver(cluster.request(tool_name=tool, arguments={"command": "x" * 300}, call_id="c1"))
    short = approver.deliver(cluster.request(tool_name=tool, arguments={"path": "x"}, call_id="c2"))

    code, out, _ = cli(capsys, "list", "--tool", tool, "--config", cluster.config)

    assert code == 0
    header, *rows, note = out.splitlines()
    assert header.split() == ["REQUEST", "ORIGIN", "TOOL", "BETA", "LEFT", "RULE", "ARGUMENTS"]
    assert sorted(row.split()[:4] for row in rows) == sorted(
        [request["request_id"], "alpha", tool, "pending"] for request in (long, short)
    )
    assert note == "(arguments cut with …; `teaagent approvals show ID` prints them whole)"
    code, out, _ = cli(capsys, "list", "--tool", tool, "--json", "--config", cluster.config)
    assert {item["request_id"] for item in json.loads(out)} == {long["request_id"], short["request_id"]}
    code, out, _ = cli(capsys, "list", "--origin", "gamma", "--config", cluster.config)
    assert (code, out) == (0, "No pending requests for beta.\n")


def test_list_refuses_an_unknown_state(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "list", "--state", "maybe", "--config", cluster.config)

    assert code == 2
    assert (
        one_sentence(err)
        == "--state is pending, approved, denied, expired, withdrawn, settled or all, not 'maybe'."
    )


@pytest.mark.slow
def test_show_prints_the_whole_request_and_what_would_decide_it(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    long_text = "y" * 5000
    request = approver.deliver(
        cluster.request(tool_name="fs.delete", arguments={"path": "build/", "note": long_text})
    )

    code, out, err = cli(capsys, "show", request["request_id"], "--config", cluster.config)

    assert (code, err) == (0, "")
    assert f"request      {request['request_id']}" in out
    assert "origin       alpha" in out
    assert "tool         fs.delete" in out
    assert f'"note": "{long_text}"' in out  # whole, not cut
    assert "note: note is 5000 characters long, printed whole above." in out
    assert '"path": "build/"' in out
    assert "reason       clean the build" in out
    assert f"digest       {request['payload_digest']}" in out
    assert "quorum       2 approvals needed from beta, gamma, counted by alpha" in out
    assert re.search(
        r"^time left    (1m 5\ds|2m 00s) \(expires at \d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\)$", out, re.M
    )
    assert "beta         not decided yet (this node's own decision, not the request's outcome)" in out
    assert "time left    1m 5" in out or "time left    2m 00s" in out
    assert "rule         #2 tool='fs.delete' -> ask" in out


@pytest.mark.slow
def test_show_escapes_what_a_terminal_would_hide(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(
        cluster.request(arguments={"command": "echo safe\u202e\u200b\x1b[2J"}, reason="ok\u202egnp.exe")
    )

    code, out, _ = cli(capsys, "show", request["request_id"], "--config", cluster.config)

    assert code == 0
    for hidden in ("\u202e", "\u200b", "\x1b"):
        assert hidden not in out
    assert "echo safe\\u202e\\u200b\\u001b[2J" in out
    assert "reason       ok\\u202egnp.exe" in out
    assert "rule         #1 tool='shell.run' command='echo *' -> approve" in out


@pytest.mark.slow
def test_show_json_is_the_whole_item(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, out, _ = cli(capsys, "show", request["request_id"], "--json", "--config", cluster.config)

    item = json.loads(out)
    assert code == 0
    assert item["request"] == request
    assert item["decision"] is None
    assert item["rule"] is None
    assert item["state"] == "pending"


# -- deciding with the node key ----------------------------------------------------------------


@pytest.mark.slow
def test_approve_names_this_nodes_decision_not_the_outcome(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, out, err = cli(capsys, "approve", request["request_id"], "--config", cluster.config)

    assert (code, err) == (0, "")
    node_key = load_config(cluster.beta.config_path).own_public_key().fingerprint
    first, _, third = out.splitlines()
    assert (
        first
        == f"beta approved request {request['request_id']} of alpha: signed with the node key {node_key}."
    )
    assert third == "This node's decision; the request's outcome is counted by its origin, alpha."
    assert "state" not in out

    code, out, _ = cli(capsys, "approve", request["request_id"], "--json", "--config", cluster.config)
    decision = json.loads(out)
    assert code == 0
    assert decision["this_node"] == "approved"
    assert "state" not in decision


@pytest.mark.slow
def test_deny_needs_a_reason_and_signs_it(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())

    code, _, err = cli(capsys, "deny", request["request_id"], "--reason", " ", "--config", cluster.config)
    assert code == 2
    assert one_sentence(err) == "a denial needs a reason for the origin's operators: pass --reason TEXT."

    code, out, err = cli(
        capsys, "deny", request["request_id"], "--reason", "not on Fridays", "--config", cluster.config
    )
    assert (code, err) == (0, "")
    assert out.startswith(f"beta denied request {request['request_id']} of alpha (not on Fridays): ")

    code, out, _ = cli(capsys, "show", request["request_id"], "--config", cluster.config)
    node_key = load_config(cluster.beta.config_path).own_public_key().fingerprint
    # Signed with the node key: it says so; the time is a date with how long ago.
    assert re.search(
        rf"^beta         denied with the node key {re.escape(node_key)} at "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ, (now|\d+s ago): not on Fridays",
        out,
        re.M,
    ), out
    assert ": not on Fridays (this node's own decision" in out


# -- statement, ssh-keygen -Y sign, submit -----------------------------------------------------


@pytest.mark.slow
def test_statement_signed_by_ssh_keygen_is_submitted(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    path = tmp_path / "approval.json"

    code, out, err = cli(
        capsys, "statement", request["request_id"], "--out", str(path), "--config", cluster.config
    )

    assert (code, out) == (0, "")
    assert f"ssh-keygen -Y sign -n teaagent-approval -f KEY {path}" in err
    data = path.read_bytes()
    statement = json.loads(data)
    assert data == statement_bytes(statement)  # the canonical bytes, no trailing newline
    assert statement["signer"] == "beta"
    assert statement["type"] == "teaagent.approval"
    assert statement["request_id"] == request["request_id"]

    signature = ssh_keygen_sign(cluster.operator, path)
    code, out, err = submit(capsys, cluster, request["request_id"], path, signature)

    assert (code, err) == (0, "")
    assert f"with an operator's own key {fingerprint_of(cluster.operator)}." in out.splitlines()[0]
    assert out.startswith(f"beta approved request {request['request_id']} of alpha")


@pytest.mark.slow
def test_statement_goes_to_stdout_without_a_newline(
    cluster: Cluster, approver: Approver, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    request = approver.deliver(cluster.request())

    code = run(["approvals", "statement", request["request_id"], "--config", cluster.config])

    data = capsysbinary.readouterr().out
    assert code == 0
    assert data == statement_bytes(json.loads(data))
    assert not data.endswith(b"\n")


@pytest.mark.slow
def test_a_denial_statement_signed_by_ssh_keygen_is_submitted(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    path = tmp_path / "denial.json"

    code, _, err = cli(
        capsys, "statement", request["request_id"], "--reason", "no", "--config", cluster.config
    )
    assert code == 2
    assert one_sentence(err) == "--reason goes with --deny: an approval statement carries no reason."

    args = ["statement", request["request_id"], "--deny", "--reason", "not today", "--out", str(path)]
    code, _, _ = cli(capsys, *args, "--config", cluster.config)
    assert code == 0
    assert json.loads(path.read_bytes())["reason"] == "not today"
    signature = ssh_keygen_sign(cluster.second_operator, path, "teaagent-denial")
    code, out, err = submit(capsys, cluster, request["request_id"], path, signature)

    assert (code, err) == (0, "")
    assert out.startswith(f"beta denied request {request['request_id']} of alpha (not today): ")


# -- naming a request by the first characters of its id ------------------------------------------


@pytest.mark.slow
def test_show_approve_deny_statement_and_submit_take_a_unique_prefix(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shown, approved, denied, signed, keyed = (
        approver.deliver(cluster.request(call_id=f"prefix-{n}")) for n in range(5)
    )
    config = ["--config", cluster.config]

    code, out, err = cli(capsys, "show", shown["request_id"][:8], *config)
    assert (code, err) == (0, "")
    assert out.startswith(f"request      {shown['request_id']}\n")
    assert f"digest       {shown['payload_digest']}" in out

    code, out, err = cli(capsys, "approve", approved["request_id"][:8], *config)
    assert (code, err) == (0, "")
    assert out.startswith(
        f"beta approved request {approved['request_id']} of alpha: signed with the node key "
    )

    code, out, err = cli(capsys, "deny", denied["request_id"][:8], "--reason", "not now", *config)
    assert (code, err) == (0, "")
    assert out.startswith(f"beta denied request {denied['request_id']} of alpha (not now): ")

    path = tmp_path / "approval.json"
    code, out, err = cli(capsys, "statement", signed["request_id"][:8], "--out", str(path), *config)
    assert (code, out) == (0, "")
    assert f"wrote the approval statement of request {signed['request_id']} to {path}" in err
    assert f"`teaagent approvals submit {signed['request_id']} --statement {path}" in err
    assert json.loads(path.read_bytes())["request_id"] == signed["request_id"]
    signature = ssh_keygen_sign(cluster.operator, path)
    code, out, err = submit(capsys, cluster, signed["request_id"][:8], path, signature)
    assert (code, err) == (0, "")
    assert out.startswith(
        f"beta approved request {signed['request_id']} of alpha: signed with an operator's own key "
        f"{fingerprint_of(cluster.operator)}."
    )

    key = ["--key", str(cluster.operator.private_path)]
    code, out, err = cli(capsys, "approve", keyed["request_id"][:8], *key, *config)
    assert (code, err) == (0, "")
    assert out.startswith(f"beta approved request {keyed['request_id']} of alpha: ")

    decisions = {
        request["request_id"]: approver.decision(request["request_id"])
        for request in (shown, approved, denied, signed, keyed)
    }
    assert [None if d is None else d.kind for d in decisions.values()] == [
        None,
        "approval",
        "denial",
        "approval",
        "approval",
    ]

    code, _, err = cli(capsys, "show", shown["request_id"][:3], *config)
    assert code == 2
    assert one_sentence(err) == (
        f"'{shown['request_id'][:3]}' is not a request id: type its 32 hexadecimal characters, or at "
        "least its first 4."
    )


@pytest.mark.slow
def test_a_prefix_of_a_settled_and_a_pending_request_is_refused_and_nothing_is_signed(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prefix = secrets.token_hex(4)
    settled = approver.deliver(
        cluster.request(tool_name="fs.delete", arguments={"path": "old.log"}, request_id=sharing(prefix, "0"))
    )
    config = ["--config", cluster.config]
    assert cli(capsys, "approve", settled["request_id"], *config)[0] == 0
    pending = approver.deliver(
        cluster.request(arguments={"command": "rm -rf /"}, request_id=sharing(prefix, "f"), call_id="c2")
    )
    path = tmp_path / "approval.json"
    signature = statement_signed_by(capsys, cluster, pending["request_id"], path, cluster.operator)

    refusal = (
        f"{prefix} starts the ids of 2 requests listed by this node's approver ({settled['request_id']} "
        f"of alpha, {pending['request_id']} of alpha), so it names none of them; type more of the id."
    )
    for command in (
        ["show"],
        ["approve"],
        ["approve", "--key", str(cluster.operator.private_path)],
        ["deny", "--reason", "no"],
        ["statement", "--out", str(tmp_path / "other.json")],
        ["submit", "--statement", str(path), "--signature", str(signature)],
    ):
        code, out, err = cli(capsys, command[0], prefix, *command[1:], *config)
        assert (code, out) == (2, ""), command
        assert one_sentence(err) == refusal, command
    assert approver.decision(pending["request_id"]) is None
    assert not (tmp_path / "other.json").exists()

    code, out, _ = cli(capsys, "show", f"{prefix}f", *config)  # one more character names one
    assert code == 0
    assert out.startswith(f"request      {pending['request_id']}\n")
    code, _, err = cli(capsys, "show", "0123", "--origin", "gamma", *config)
    assert code == 2
    assert one_sentence(err) == "no request listed by this node's approver has an id starting with 0123."


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_unknown_request_id_is_a_usage_error(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["show"], ["approve"], ["deny", "--reason", "no"], ["statement"]):
        code, _, err = cli(capsys, command[0], "f" * 32, *command[1:], "--config", cluster.config)
        assert code == 2, command
        sentence = one_sentence(err)
        assert sentence.startswith(f"The approver at http://127.0.0.1:{cluster.approver_port} refused "), (
            sentence
        )
        assert "(404 not_found)" in sentence
        assert "f" * 32 in sentence


@pytest.mark.slow
def test_an_id_two_origins_sent_is_a_usage_error_until_origin_names_one(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request_id = secrets.token_hex(16)
    ours = approver.deliver(cluster.request(arguments={"command": "rm -rf dist"}, request_id=request_id))
    theirs = cluster.nodes["gamma"].request(arguments={"command": "rm -rf dist"}, request_id=request_id)
    with RelayClient(cluster.beta.url) as relay:
        relay.deliver_request(theirs, sign_request(theirs, signer("gamma")))

    results = [
        cli(capsys, command, request_id, "--config", cluster.config) for command in ("show", "approve")
    ]
    code, out, err = cli(
        capsys, "show", request_id, "--origin", "alpha", "--json", "--config", cluster.config
    )

    for refused_code, _out, refused_err in results:
        assert refused_code == 2
        sentence = one_sentence(refused_err)
        assert "(409 ambiguous)" in sentence
        assert "--origin" in sentence
    assert (code, err) == (0, "")
    assert json.loads(out)["origin"] == "alpha"
    assert json.loads(out)["request_id"] == ours["request_id"]
    assert json.loads(out)["state"] == "pending"  # the refused approve decided nothing


@pytest.mark.slow
def test_an_expired_request_is_refused_with_exit_3(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request(now=time.time() - 119))
    deadline = time.monotonic() + DEADLINE
    while time.time() < request["expires_at"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    for command in (
        ["approve"],
        ["deny", "--reason", "late"],
        ["statement"],
        ["approve", "--key", str(cluster.operator.private_path)],
    ):
        code, _, err = cli(
            capsys, command[0], request["request_id"], *command[1:], "--config", cluster.config
        )
        assert code == 3, (command, err)
        assert "(409 expired)" in one_sentence(err)


@pytest.mark.slow
def test_a_withdrawn_request_is_listed_as_withdrawn_and_refused_with_exit_3(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    # fs.delete is an ask item: nothing signs it before its origin withdraws it.
    request = approver.deliver(cluster.request(tool_name="fs.delete", arguments={"path": "gone"}))
    request_id = request["request_id"]
    withdrawal = sign_withdrawal(request, signer("alpha"))
    with RelayClient(cluster.beta.url) as relay:
        assert relay.deliver_withdrawal(request_id, withdrawal["statement"], withdrawal["signature"])[
            "withdrawn"
        ]

    code, out, _ = cli(capsys, "list", "--json", "--config", cluster.config)
    assert code == 0
    assert request_id not in [item["request_id"] for item in json.loads(out)]
    code, out, _ = cli(capsys, "list", "--state", "withdrawn", "--json", "--config", cluster.config)
    assert code == 0
    assert [(item["request_id"], item["state"]) for item in json.loads(out)] == [(request_id, "withdrawn")]
    code, out, _ = cli(capsys, "list", "--state", "withdrawn", "--config", cluster.config)
    assert code == 0
    assert re.search(rf"^{request_id[:12]}.* withdrawn ", out, re.M), out
    for command in (["approve"], ["deny", "--reason", "late"], ["statement"]):
        code, _, err = cli(capsys, command[0], request_id, *command[1:], "--config", cluster.config)
        assert code == 3, (command, err)
        assert one_sentence(err).endswith(
            f"(409 withdrawn): Request {request_id} was withdrawn by its origin alpha; this node signs "
            "nothing for it."
        )


@pytest.mark.slow
def test_a_key_that_may_not_sign_for_this_node_is_refused(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())

    code, _, err = approve_with_key(capsys, cluster, request["request_id"], cluster.stranger)
    assert code == 2
    sentence = one_sentence(err)
    assert "(403 forbidden)" in sentence
    assert fingerprint_of(cluster.stranger) in sentence

    path = tmp_path / "statement.json"
    signature = statement_signed_by(capsys, cluster, request["request_id"], path, cluster.stranger)
    code, _, err = submit(capsys, cluster, request["request_id"], path, signature)
    assert code == 2
    assert "(403 forbidden)" in one_sentence(err)


@pytest.mark.slow
def test_a_statement_that_does_not_match_the_request_is_refused(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    path = tmp_path / "statement.json"
    cli(capsys, "statement", request["request_id"], "--out", str(path), "--config", cluster.config)
    statement = json.loads(path.read_bytes())
    statement["tool_name"] = "fs.read"  # canonical and signed, but not the request's statement
    path.write_bytes(statement_bytes(statement))
    signature = ssh_keygen_sign(cluster.operator, path)

    code, _, err = submit(capsys, cluster, request["request_id"], path, signature)

    assert code == 2
    assert "(422 invalid)" in one_sentence(err)


@pytest.mark.slow
def test_a_statement_file_that_is_not_the_signed_bytes_is_refused_here(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = approver.deliver(cluster.request())
    other = approver.deliver(cluster.request(call_id="other"))
    path = tmp_path / "statement.json"
    signature = statement_signed_by(capsys, cluster, request["request_id"], path, cluster.operator)
    submit = ["--statement", str(path), "--signature", str(signature), "--config", cluster.config]

    code, _, err = cli(capsys, "submit", other["request_id"], *submit)
    assert code == 2
    assert one_sentence(err) == (
        f"the statement file {path} is about request '{request['request_id']}', not {other['request_id']}."
    )

    path.write_bytes(path.read_bytes() + b"\n")
    code, _, err = cli(capsys, "submit", request["request_id"], *submit)
    assert code == 2
    assert "is not exactly what `teaagent approvals statement` writes" in one_sentence(err)

    signature.write_text("not a signature")
    path.write_bytes(path.read_bytes()[:-1])
    code, _, err = cli(capsys, "submit", request["request_id"], *submit)
    assert code == 2
    assert one_sentence(err).startswith(f"the signature file {signature} is not an SSH signature: ")
    assert approver.decision(request["request_id"]) is None


@pytest.mark.slow
def test_a_second_different_decision_is_refused(
    cluster: Cluster, approver: Approver, capsys: pytest.CaptureFixture[str]
) -> None:
    request = approver.deliver(cluster.request())
    assert cli(capsys, "approve", request["request_id"], "--config", cluster.config)[0] == 0

    code, _, err = cli(
        capsys, "deny", request["request_id"], "--reason", "changed my mind", "--config", cluster.config
    )

    assert code == 1
    assert "(409 conflict)" in one_sentence(err)


def test_an_approver_nobody_runs_is_named_with_the_command_that_starts_it(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    config = config_with_approver_port(cluster, port)
    # (watch waits for it instead: test_watch_prints_new_requests_decides_them_and_outlives_restarts)
    for command in (["list"], ["show", "0" * 32], ["approve", "0" * 32], ["statement", "0" * 32]):
        code, _, err = cli(capsys, *command, "--config", config)
        assert code == 1, command
        sentence = one_sentence(err)
        assert sentence.startswith(f"No approver answers at http://127.0.0.1:{port} ("), sentence
        assert sentence.endswith(f"; start it with `teaagent approver serve --config {config}`."), sentence


@pytest.mark.parametrize("typed", ["", "  ", "xyz!", "abc"])
@pytest.mark.parametrize("command", ["approve", "deny", "show", "statement"])
def test_an_id_that_names_nothing_is_refused_before_the_approver_is_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, typed: str
) -> None:
    """``approvals approve ''`` is refused here, in one sentence: no approver runs for this node."""
    assert run(["init", str(tmp_path / "node"), "--name", "solo"]) == 0
    capsys.readouterr()
    extra = ["--reason", "no"] if command == "deny" else []
    code, out, err = cli(capsys, command, typed, *extra, "--config", str(tmp_path / "node" / "node.toml"))
    assert (code, out) == (2, "")
    assert one_sentence(err) == (
        f"{typed!r} is not a request id: type its 32 hexadecimal characters, or at least its first 4."
    )
