"""``teaagent approvals``: the operators' inbox of this node, the requests its peers ask it to approve.

Every command talks to the node's approver service (``http://127.0.0.1:<approver.port>``, the
node's token), never to its relay. The approver is the node's signing authority: it records each
decision atomically before any signature leaves (so one request never gets two different decisions,
across restarts and approver processes), audits it with the key that signed it, and refuses a
second, different decision; the relay only carries signed documents. A command line that talked to
the relay directly would bypass all three.

Signing: by default the approver signs with the node key. With ``--key PATH`` this command signs
locally with an operator's key file (a passphrase is asked once, without echo), with ``--agent``
through ``ssh-agent`` (``--key-id SHA256:...`` picks one of several keys); ``statement`` writes the
exact bytes for ``ssh-keygen -Y sign -n teaagent-approval`` and ``submit`` brings the signature
back. The approver accepts such a decision only from a key that may sign for this node (the node
key or one of ``[approver] operators``).

Naming a request: its full id, or its first characters (at least four) when no other request the
command has seen starts with them: for the one-shot commands every request the approver lists, in
any state; for ``watch`` every request it has shown, settled ones included
(:func:`~teaagent.approver_client.resolve_request`). What the operator was shown of it (its tool and
payload digest) goes with the decision, and the approver signs nothing for a request that differs
(409 ``changed``): an origin cannot withdraw what an operator read and slip another request in
under the same prefix.

Exit codes (ARCHITECTURE.md): 0 done; 1 the approver or relay failed, this node decided otherwise
before, or the request is not the one shown (``changed``); 2 bad usage or configuration (an unknown
request id, a prefix that names no request or several, a key that may not sign for this node, a
statement that does not match, any local key problem); 3 the request expired.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Final

import typer

from teaagent._display import visible
from teaagent._files import FileSentences, read_limited
from teaagent._json import parse_json
from teaagent._words import time_left
from teaagent.approver_client import (
    Expected,
    check_before_signing,
)
from teaagent.approver_client._client import MAX_TOOL_PATTERN_CHARS
from teaagent.cli._approvals_watch import run_watch
from teaagent.cli._exit import bad_usage
from teaagent.cli._inbox import (
    TABLE_ARGUMENTS_CHARS,
    answers,
    connect,
    decide,
    echo_decision,
    node_key_of,
    one_line,
    resolve,
    settled_phrase,
    show_lines,
    table,
)
from teaagent.cli._operator_keys import local_signer
from teaagent.cli._options import ConfigOption
from teaagent.config import load_config
from teaagent.errors import SignatureError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    statement_bytes,
)
from teaagent.signing import (
    signature_to_wire,
)

app = typer.Typer(
    no_args_is_help=True,
    help="The requests peers ask this node to approve, decided through its approver service.",
)

MAX_STATEMENT_BYTES: Final = 64 * 1024  # a statement copies a request's fields, not its arguments
MAX_SIGNATURE_BYTES: Final = 64 * 1024  # an armored SSHSIG of any supported key is a few KB


def _check_tool_pattern(tool: str | None) -> None:
    """Refuse a --tool the approver would refuse, before anything is sent (or a URL too long made)."""
    if tool is not None and len(tool) > MAX_TOOL_PATTERN_CHARS:
        bad_usage(f"--tool is a pattern of at most {MAX_TOOL_PATTERN_CHARS} characters, not {len(tool)}.")


# -- files --------------------------------------------------------------------------------------


def _read_small(path: Path, what: str, limit: int) -> bytes:
    return read_limited(
        path,
        limit,
        FileSentences(
            missing=f"the {what} {path} does not exist.",
            folder=f"the {what} {path} is a folder, not a file.",
            unreadable=lambda reason: f"cannot read the {what} {path}: {reason}.",
            too_large=f"the {what} {path} is larger than {limit} bytes.",
        ),
    )


# -- commands -----------------------------------------------------------------------------------

OriginOption = Annotated[
    str | None, typer.Option("--origin", help="The origin, when several peers used the same request id.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
KeyOption = Annotated[
    Path | None,
    typer.Option(
        "--key",
        readable=False,  # checked here, to say which problem it is in one sentence
        help="Sign locally with this OpenSSH private key (an operator's key) instead.",
    ),
]
AgentOption = Annotated[
    bool, typer.Option("--agent", help="Sign locally with a key held by ssh-agent ($SSH_AUTH_SOCK) instead.")
]
KeyIdOption = Annotated[
    str | None, typer.Option("--key-id", help="With --agent: the fingerprint (SHA256:...) of the key to use.")
]
RequestIdArgument = Annotated[
    str,
    typer.Argument(
        metavar="ID",
        help="The request's id, or its first characters (at least 4) when no other request starts with them.",
    ),
]


@app.command("list")
def list_requests(
    config: ConfigOption = None,
    state: Annotated[
        str,
        typer.Option(
            "--state",
            help="pending, approved, denied, expired, withdrawn, settled or all (this node's view).",
        ),
    ] = "pending",
    origin: Annotated[str | None, typer.Option("--origin", help="Only this origin's requests.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Only calls of this tool.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List the requests that reached this node from its peers, those waiting for a decision first."""
    if state not in ("pending", "approved", "denied", "expired", "withdrawn", "settled", "all"):
        bad_usage(f"--state is pending, approved, denied, expired, withdrawn, settled or all, not {state!r}.")
    _check_tool_pattern(tool)
    node, client = connect(config)
    with client, answers():
        items = client.list_requests(state, origin=origin, tool=tool, limit=limit)  # type: ignore[arg-type]
    if as_json:
        typer.echo(
            json.dumps([item.to_dict(documents=False) for item in items], indent=2, ensure_ascii=False)
        )
        return
    if not items:
        typer.echo(f"No {'' if state == 'all' else state + ' '}requests for {node.agent_id}.")
        return
    now = time.time()
    rows = [["REQUEST", "ORIGIN", "TOOL", node.agent_id.upper(), "LEFT", "RULE", "ARGUMENTS"]]
    cut = False
    for item in items:
        arguments = one_line(item.arguments, TABLE_ARGUMENTS_CHARS)
        cut = cut or arguments.endswith("…")
        rule = "ask (no rule)" if item.rule is None else f"#{item.rule.index} {item.rule.decision}"
        rows.append(
            [
                item.request_id,
                item.origin,
                visible(item.tool_name),
                settled_phrase(item, now) or item.state,
                time_left(item.expires_at - now),
                rule,
                arguments,
            ]
        )
    for line in table(rows):
        typer.echo(line)
    if cut:
        typer.echo("(arguments cut with …; `teaagent approvals show ID` prints them whole)")


@app.command("show")
def show(
    request_id: RequestIdArgument,
    config: ConfigOption = None,
    origin: OriginOption = None,
    as_json: JsonOption = False,
) -> None:
    """Print one request whole: tool, full arguments, reason, digest, this node's decision, rule."""
    node, client = connect(config)
    with client, answers():
        item = resolve(client, request_id, origin)
    if as_json:
        typer.echo(json.dumps(item.to_dict(), indent=2, ensure_ascii=False))
        return
    for line in show_lines(item, node.agent_id, node_key=node_key_of(node)):
        typer.echo(line)


@app.command("approve")
def approve(
    request_id: RequestIdArgument,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option("--reason", help="Why, recorded in this node's audit log.")] = "",
    origin: OriginOption = None,
    key: KeyOption = None,
    agent: AgentOption = False,
    key_id: KeyIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Approve a request as this node (the node key, or an operator's key with --key or --agent)."""
    _decide(request_id, config, origin, (key, agent, key_id), deny=False, reason=reason, as_json=as_json)


@app.command("deny")
def deny(
    request_id: RequestIdArgument,
    reason: Annotated[str, typer.Option("--reason", help="Why; signed with the denial, read by the origin.")],
    config: ConfigOption = None,
    origin: OriginOption = None,
    key: KeyOption = None,
    agent: AgentOption = False,
    key_id: KeyIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Deny a request as this node, with a reason (the node key, or an operator's key)."""
    if not reason.strip():
        bad_usage("a denial needs a reason for the origin's operators: pass --reason TEXT.")
    _decide(request_id, config, origin, (key, agent, key_id), deny=True, reason=reason, as_json=as_json)


def _decide(
    request_id: str,
    config: Path | None,
    origin: str | None,
    signing: tuple[Path | None, bool, str | None],
    *,
    deny: bool,
    reason: str,
    as_json: bool,
) -> None:
    """``approve`` and ``deny``: this node's decision, signed by ``--key``, ``--agent`` or the node key."""
    node, client = connect(config)
    signer = local_signer(node, *signing)
    with client, answers():
        item = resolve(client, request_id, origin)
        result = decide(client, node, item, deny=deny, reason=reason, signer=signer)
    echo_decision(result, node, as_json)


@app.command("statement")
def statement(
    request_id: RequestIdArgument,
    config: ConfigOption = None,
    deny: Annotated[bool, typer.Option("--deny", help="A denial statement instead of an approval.")] = False,
    reason: Annotated[str | None, typer.Option("--reason", help="With --deny: the denial's reason.")] = None,
    origin: OriginOption = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the bytes to this file instead of stdout.")
    ] = None,
) -> None:
    """Write the exact bytes to sign (no trailing newline) for ssh-keygen -Y sign -n teaagent-approval."""
    if reason is not None and not deny:
        bad_usage("--reason goes with --deny: an approval statement carries no reason.")
    if deny and not (reason or "").strip():
        bad_usage("a denial statement needs a reason: pass --reason TEXT with --deny.")
    node, client = connect(config)
    with client, answers():
        item = resolve(client, request_id, origin)
        to_sign = client.statement(
            item.request_id,
            kind="denial" if deny else "approval",
            reason=reason or "",
            origin=item.origin,
            expected=Expected.of(item),
        )
        check_before_signing(to_sign, item, signer=node.agent_id, base_url=client.base_url)
    request_id = item.request_id
    if out is None:
        sys.stdout.flush()
        sys.stdout.buffer.write(to_sign.data)
        sys.stdout.buffer.flush()
        return
    try:
        out.write_bytes(to_sign.data)
    except OSError as exc:
        bad_usage(f"cannot write the statement to {out}: {exc.strerror or exc}.")
    namespace = DENIAL_NAMESPACE if deny else APPROVAL_NAMESPACE
    expires_at = to_sign.statement.get("expires_at")
    left = (
        f" (the request expires in {time_left(expires_at - time.time())})"
        if isinstance(expires_at, int)
        else ""
    )
    kind = "denial" if deny else "approval"
    sys.stderr.write(
        f"teaagent: wrote the {kind} statement of request {request_id} to {out}{left}; "
        f"sign it with `ssh-keygen -Y sign -n {namespace} -f KEY {out}`, then run `teaagent approvals "
        f"submit {request_id} --statement {out} --signature {out}.sig --config {node.path}`.\n"
    )


@app.command("submit")
def submit(
    request_id: RequestIdArgument,
    statement_file: Annotated[
        Path,
        typer.Option(
            "--statement", metavar="FILE", readable=False, help="The statement file that was signed."
        ),
    ],
    signature_file: Annotated[
        Path,
        typer.Option(
            "--signature", metavar="FILE.sig", readable=False, help="Its signature (ssh-keygen -Y sign)."
        ),
    ],
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Hand the approver a decision signed elsewhere: a statement and its SSH signature."""
    raw = _read_small(statement_file, "statement file", MAX_STATEMENT_BYTES)
    try:
        document = parse_json(raw.decode("utf-8"))
    except ValueError:  # not UTF-8, not JSON, nested too deep, an integer too long to read
        bad_usage(f"the statement file {statement_file} is not JSON.")
    if not isinstance(document, dict):
        bad_usage(f"the statement file {statement_file} does not hold a JSON object.")
    try:
        canonical = statement_bytes(document)
    except ValueError as exc:
        bad_usage(f"the statement file {statement_file} cannot be a statement: {exc}.")
    if canonical != raw:
        # The signature covers the file's bytes; the approver checks it over the canonical ones.
        bad_usage(
            f"the statement file {statement_file} is not exactly what `teaagent approvals statement` "
            "writes (was it edited, or given a trailing newline?); write it again and sign that."
        )
    named = document.get("request_id")
    if not isinstance(named, str) or not named.startswith(request_id.strip().lower()):
        bad_usage(
            f"the statement file {statement_file} is about request {document.get('request_id')!r}, "
            f"not {request_id}."
        )
    armored = _read_small(signature_file, "signature file", MAX_SIGNATURE_BYTES)
    try:
        signature = signature_to_wire(armored.decode("ascii"))
    except (UnicodeDecodeError, SignatureError) as exc:
        detail = "it is not ASCII" if isinstance(exc, UnicodeDecodeError) else str(exc).rstrip(".")
        bad_usage(f"the signature file {signature_file} is not an SSH signature: {detail}.")
    origin = document.get("origin")
    node, client = connect(config)
    with client, answers():
        item = resolve(client, request_id, origin if isinstance(origin, str) else None)
        if item.request_id != named:
            bad_usage(
                f"the statement file {statement_file} is about request {named!r}, not {item.request_id}."
            )
        # What the operator signed is what they confirmed: the statement names the tool and digest.
        tool_name, digest = document.get("tool_name"), document.get("payload_digest")
        expected = (
            Expected(tool_name=tool_name, payload_digest=digest)
            if isinstance(tool_name, str) and isinstance(digest, str)
            else None
        )
        result = client.submit_decision(item.request_id, document, signature, expected=expected)
    echo_decision(result, node, as_json)


@app.command("watch")
def watch(
    config: ConfigOption = None,
    origin: Annotated[str | None, typer.Option("--origin", help="Only this origin's requests.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="Only calls of this tool.")] = None,
    key: KeyOption = None,
    agent: AgentOption = False,
    key_id: KeyIdOption = None,
    plain: Annotated[bool, typer.Option("--plain", help="Plain lines even on a terminal.")] = False,
) -> None:
    """Follow the requests waiting for this node live, and approve or deny them from the keyboard."""
    _check_tool_pattern(tool)
    node = load_config(config)
    node.load_token()  # a token problem is a usage error now, not a retry loop later
    signer = local_signer(node, key, agent, key_id)
    raise typer.Exit(run_watch(node, signer=signer, origin=origin, tool=tool, plain=plain))
