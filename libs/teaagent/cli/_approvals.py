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

import contextlib
import getpass
import json
import os
import queue
import stat
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Final, TextIO

import typer

from teaagent._display import INVISIBLE_CATEGORIES as _INVISIBLE
from teaagent._display import long_values as _long_values
from teaagent._display import pretty_arguments, visible
from teaagent._words import moment, plural, time_left
from teaagent.approver_client import (
    ApprovalItem,
    ApproverClient,
    DecisionResult,
    Expected,
    StatementToSign,
    resolve_request,
    signed_by,
)
from teaagent.cli._exit import EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, bad_usage, fail
from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError, RelayError, SignatureError
from teaagent.quorum import (
    APPROVAL_NAMESPACE,
    DENIAL_NAMESPACE,
    request_policy,
    request_problem,
    statement_bytes,
)
from teaagent.signing import (
    AgentSigner,
    Signer,
    SSHPublicKey,
    agent_identities,
    load_private_key,
    signature_to_wire,
    sshsig_sign,
)

app = typer.Typer(
    no_args_is_help=True,
    help="The requests peers ask this node to approve, decided through its approver service.",
)

_CONFIG_HELP = "The node configuration; $TEAAGENT_CONFIG when omitted."
TABLE_ARGUMENTS_CHARS: Final = 60  # a listing's one-line arguments; `show` prints them whole
MAX_STATEMENT_BYTES: Final = 64 * 1024  # a statement copies a request's fields, not its arguments
MAX_SIGNATURE_BYTES: Final = 64 * 1024  # an armored SSHSIG of any supported key is a few KB
_PASSPHRASE_NEEDED: Final = "is protected by a passphrase"  # noqa: S105 - load_private_key's sentence

# What each refusal of the approver means for the exit code; every other failure is 1.
_EXIT_BY_CODE: Final = {
    "not_found": EXIT_USAGE,  # the id names no request that reached this node
    "ambiguous": EXIT_USAGE,  # several origins used the id: --origin names one
    "invalid": EXIT_USAGE,  # a statement that does not match, a malformed call
    "forbidden": EXIT_USAGE,  # a key that may not sign for this node
    "unauthorized": EXIT_USAGE,  # the configuration's token is not the node's
    "expired": EXIT_DENIED,
    "withdrawn": EXIT_DENIED,  # its origin withdrew it: nothing is signed, as for an expired one
    "settled": EXIT_FAILED,  # decided at its origin already: nothing is signed, the call did not fail
}

# watch: how it follows the approver.
LONG_POLL_SECONDS: Final = 25.0  # one long-poll while nothing waits
REFRESH_SECONDS: Final = 1.0  # between listings while something waits (the countdown's step)
RETRY_START_SECONDS: Final = 0.5  # first pause after the approver stopped answering
RETRY_CAP_SECONDS: Final = 5.0  # longest pause between attempts, so a restart is seen quickly
REMIND_SECONDS: Final = 30  # a plain-lines watch reminds once when a request has this little left


# -- connecting ---------------------------------------------------------------------------------


def _connect(config: Path | None) -> tuple[NodeConfig, ApproverClient]:
    node = load_config(config)
    return node, _client(node)


def _client(node: NodeConfig) -> ApproverClient:
    return ApproverClient(
        f"http://127.0.0.1:{node.approver.port}",
        token=node.load_token(),
        start_command=f"teaagent approver serve --config {node.path}",
    )


def _exit_code(exc: RelayError) -> int:
    return _EXIT_BY_CODE.get(exc.code or "", EXIT_FAILED)


def _resolve(client: ApproverClient, typed: str, origin: str | None) -> ApprovalItem:
    """The request a one-shot command names: a full id, or a prefix of one request the approver lists.

    Raises:
        typer.Exit: Exit 2 when ``typed`` is no id, names no request or several (one sentence).
        RelayError: The approver refused or failed.
    """
    try:
        return resolve_request(client, typed, origin=origin, among="listed by this node's approver")
    except ValueError as exc:
        bad_usage(str(exc))


@contextlib.contextmanager
def _answers() -> Iterator[None]:
    """Turn the approver's refusals into their exit code and sentence."""
    try:
        yield
    except RelayError as exc:
        raise typer.Exit(fail(str(exc), _exit_code(exc))) from None


# -- showing ------------------------------------------------------------------------------------


def node_key_of(node: NodeConfig) -> str | None:
    """The node key's fingerprint, to tell its signatures from an operator's own key; None if unreadable."""
    try:
        return node.own_public_key().fingerprint
    except ConfigError:
        return None


def _rule_phrase(item: ApprovalItem) -> str:
    rule = item.rule
    if rule is None:
        return "none matches: it waits for an operator"
    patterns = "".join(f" {name}={pattern!r}" for name, pattern in sorted(rule.arguments.items()))
    return f"#{rule.index} tool={rule.tool!r}{patterns} -> {rule.decision}"


def _decision_phrase(item: ApprovalItem, node_key: str | None, now: float) -> str:
    decision = item.decision
    if decision is None:
        return "not decided yet"
    verb = "approved" if decision.kind == "approval" else "denied"
    reason = f": {visible(decision.reason)}" if decision.reason else ""
    who = signed_by(decision.by, decision.key_fingerprint, node_key)
    return f"{verb} {who} at {moment(decision.at, now)}{reason}"


def settled_phrase(item: ApprovalItem, now: float) -> str | None:
    """``approved at alpha by beta, gamma 12s ago``: the outcome at its origin, as the approver
    verified its evidence; None while it has none."""
    return None if item.settled is None else item.settled.phrase(item.origin, now)


def _left_phrase(item: ApprovalItem, now: float) -> str:
    left = item.expires_at - now
    if left <= 0:
        return f"expired at {moment(item.expires_at, now)}"
    return f"{time_left(left)} (expires at {moment(item.expires_at, now).split(',')[0]})"


def show_lines(
    item: ApprovalItem, node_id: str, now: float | None = None, *, node_key: str | None = None
) -> list[str]:
    """What ``show`` prints: everything a careful approver needs, nothing cut without saying so.

    ``node_key`` is the node key's fingerprint: a decision it signed says "the node key".
    """
    now = time.time() if now is None else now
    lines = [
        f"request      {item.request_id}",
        f"origin       {item.origin} (run {visible(item.run_id)}, call {visible(item.call_id)})",
        f"tool         {visible(item.tool_name)}",
        "arguments",
        *("  " + line for line in pretty_arguments(item.arguments).splitlines()),
    ]
    for path, length in _long_values(item.arguments):
        lines.append(f"  note: {visible(path)} is {length} characters long, printed whole above.")
    reason = visible(item.reason, newlines=True).splitlines() or [""]
    lines.append(f"reason       {reason[0]}")
    lines.extend(f"             {line}" for line in reason[1:])
    lines += [
        f"digest       {item.payload_digest}",
        *_quorum_lines(item, node_id),
        f"{node_id:<12} {_decision_phrase(item, node_key, now)} (this node's own decision, "
        "not the request's outcome)",
        f"time left    {_left_phrase(item, now)}",
        f"rule         {_rule_phrase(item)}",
    ]
    settled = settled_phrase(item, now)
    if settled is not None:
        lines.insert(-2, f"settled      {settled} (the outcome at its origin, its evidence verified here)")
    return lines


def _quorum_lines(item: ApprovalItem, node_id: str) -> list[str]:
    """What the request needs: N of its peers, or (version 2) its rule, its terms, and this node's term."""
    policy = request_policy(item.request) if request_problem(item.request) is None else None
    if policy is None:
        needed = plural(item.required_approvals, "approval")
        return [f"quorum       {needed} needed from {', '.join(item.peers)}, counted by {item.origin}"]
    terms = [f"{term.required} of {', '.join(term.peers)}" for term in policy.terms]
    mine = [f"term {number}" for number, term in enumerate(policy.terms, 1) if node_id in term.peers]
    counts = (
        f"{node_id}'s decision counts toward {' and '.join(mine)}"
        if mine
        else f"{node_id} is in none of its terms: its decision counts toward nothing"
    )
    every = "all" if policy.mode == "all_of" else "any"
    return [
        f"quorum       rule {policy.rule}: {every} of {plural(len(terms), 'term')}, counted by {item.origin}",
        *(f"  term {number}     {term}" for number, term in enumerate(terms, 1)),
        f"counts for   {counts}",
    ]


def _one_line(arguments: Any, width: int) -> str:
    text = visible(json.dumps(arguments, ensure_ascii=False, sort_keys=True, separators=(", ", ": ")))
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[index]) for row in rows) for index in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]


def _echo_decision(result: DecisionResult, node: NodeConfig, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
        return
    reason = f" ({visible(result.reason)})" if result.reason else ""
    typer.echo(
        f"{node.agent_id} {result.this_node} request {result.request_id} of {result.origin}{reason}: "
        f"signed {signed_by(result.by, result.key_fingerprint, node_key_of(node))}."
    )
    typer.echo(
        f"Forwarded to {result.origin} through this node's relay."
        if result.forwarded
        else f"Not forwarded to {result.origin} yet: the approver sends it again until the relay takes it."
    )
    typer.echo(
        result.note
        or f"This node's decision; the request's outcome is counted by its origin, {result.origin}."
    )


# -- local signing ------------------------------------------------------------------------------


def _terminal_available() -> bool:
    """Whether a passphrase can be asked without echo: ``getpass`` reads the controlling terminal."""
    try:
        descriptor = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(descriptor)
    return True


def _warn_if_exposed(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # loading names the problem
    if stat.S_ISREG(mode) and mode & 0o077:
        sys.stderr.write(
            f"teaagent: warning: the private key file {path} is accessible by others (mode "
            f"{stat.S_IMODE(mode):04o}; OpenSSH refuses such a key): run chmod 600 {path}.\n"
        )


def key_file_signer(path: Path) -> Signer:
    """Load an operator's private key file, asking its passphrase once without echo when it has one.

    Raises:
        typer.Exit: Exit 2 with the sentence naming the problem: a folder, a missing or unreadable
            file, not a key, a passphrase needed with no terminal to ask it, a wrong passphrase.
    """
    path = path.expanduser()
    if path.is_dir():
        bad_usage(f"the private key {path} is a folder, not a key file.")
    try:
        key = load_private_key(path)
    except ConfigError as exc:
        if _PASSPHRASE_NEEDED not in str(exc):
            bad_usage(str(exc))  # a .pub file among them: only that sentence, no warning about its mode
    else:
        _warn_if_exposed(path)
        return key
    _warn_if_exposed(path)
    if not _terminal_available():
        bad_usage(
            f"the private key {path} is protected by a passphrase, and there is no terminal to ask "
            "for it; run the command in a terminal, or add the key to ssh-agent and use --agent."
        )
    passphrase = getpass.getpass(f"Passphrase for {path}: ")
    try:
        return load_private_key(path, passphrase)
    except ConfigError as exc:
        bad_usage(str(exc))


def _fingerprint_arg(text: str) -> str:
    return text if text.startswith("SHA256:") else f"SHA256:{text}"


def agent_signer(node: NodeConfig, key_id: str | None) -> Signer:
    """Choose the ssh-agent's key to sign with: ``key_id``, its only key, or its only key of this node.

    Raises:
        typer.Exit: Exit 2 when there is no agent, it holds no (such) key, or several keys fit.
    """
    try:
        keys = agent_identities()
    except SignatureError as exc:
        bad_usage(str(exc))
    socket_path = os.environ.get("SSH_AUTH_SOCK", "")  # agent_identities found the agent there
    if not keys:
        bad_usage(f"the ssh-agent at {socket_path} holds no key; add one with ssh-add.")
    held = ", ".join(key.fingerprint for key in keys)
    chosen: SSHPublicKey
    if key_id is not None:
        wanted = _fingerprint_arg(key_id)
        matching = [key for key in keys if key.fingerprint == wanted]
        if not matching:
            bad_usage(f"the ssh-agent at {socket_path} holds no key {wanted}; it holds {held}.")
        chosen = matching[0]
    elif len(keys) == 1:
        chosen = keys[0]
    else:
        try:
            own = {key.key.identity for key in node.own_keys()}
        except ConfigError:
            own = set()
        mine = [key for key in keys if key.identity in own]
        if len(mine) != 1:
            bad_usage(
                f"the ssh-agent at {socket_path} holds {len(keys)} keys"
                + (f", {len(mine)} of them keys of {node.agent_id}" if mine else "")
                + f"; choose one with --key-id: {held}."
            )
        chosen = mine[0]
    return AgentSigner(chosen, socket_path)


def _local_signer(node: NodeConfig, key: Path | None, agent: bool, key_id: str | None) -> Signer | None:
    if key is not None and agent:
        bad_usage("--key and --agent are two ways to sign; give one of them.")
    if key_id is not None and not agent:
        bad_usage("--key-id chooses a key held by ssh-agent; give it with --agent.")
    if key is not None:
        return key_file_signer(key)
    if agent:
        return agent_signer(node, key_id)
    return None


def _check_statement(
    client: ApproverClient, node: NodeConfig, to_sign: StatementToSign, item: ApprovalItem
) -> None:
    """Refuse to sign a statement that is not this node's, for the request shown, in canonical form.

    Raises:
        RelayError: The approver's statement is not one this node may sign for the request.
    """
    request_id = item.request_id
    statement = to_sign.statement
    problem = None
    try:
        if statement_bytes(statement) != to_sign.data:
            problem = "its bytes are not the statement's canonical JSON"
    except ValueError as exc:
        problem = str(exc)
    if problem is None and statement.get("signer") != node.agent_id:
        problem = f"its signer is {statement.get('signer')!r}, not {node.agent_id}"
    if problem is None and statement.get("request_id") != request_id:
        problem = f"it is the statement of request {statement.get('request_id')!r}"
    if problem is None and (statement.get("tool_name"), statement.get("payload_digest")) != (
        item.tool_name,
        item.payload_digest,
    ):
        problem = "its tool or payload digest is not the one shown"
    if problem is not None:
        raise RelayError(
            f"The approver at {client.base_url} gave a statement to sign that is wrong ({problem}); "
            "nothing was signed."
        )


def sign_and_submit(
    client: ApproverClient,
    node: NodeConfig,
    item: ApprovalItem,
    signer: Signer,
    *,
    deny: bool,
    reason: str,
) -> DecisionResult:
    """Sign this node's decision on the request shown locally (an operator's key) and hand it over.

    Raises:
        RelayError: The approver refused, or gave a statement this node may not sign.
        ConfigError: The local key could not sign (an ssh-agent that refuses, a token not touched).
    """
    expected = Expected.of(item)
    to_sign = client.statement(
        item.request_id,
        kind="denial" if deny else "approval",
        reason=reason,
        origin=item.origin,
        expected=expected,
    )
    _check_statement(client, node, to_sign, item)
    try:
        signature = sshsig_sign(to_sign.data, signer, DENIAL_NAMESPACE if deny else APPROVAL_NAMESPACE)
    except SignatureError as exc:
        raise ConfigError(str(exc)) from None
    return client.submit_decision(
        item.request_id, to_sign.statement, signature_to_wire(signature), expected=expected
    )


def decide(
    client: ApproverClient,
    node: NodeConfig,
    item: ApprovalItem,
    *,
    deny: bool,
    reason: str,
    signer: Signer | None,
) -> DecisionResult:
    """This node's decision on the request shown: signed by the approver (node key) or by ``signer``.

    The tool and payload digest shown go with it: the approver signs nothing for a request that
    differs (409 ``changed``).

    Raises:
        RelayError: The approver refused (its code says why) or is unreachable.
        ConfigError: The local key could not sign.
    """
    settled = settled_phrase(item, time.time())
    if settled is not None:
        # Refused before anything is signed, a local key's signature included.
        raise RelayError(
            f"Request {item.request_id} was already {settled}; this node signs nothing for it.",
            status_code=409,
            code="settled",
        )
    if signer is not None:
        return sign_and_submit(client, node, item, signer, deny=deny, reason=reason)
    expected = Expected.of(item)
    if deny:
        return client.deny(item.request_id, reason=reason, origin=item.origin, expected=expected)
    return client.approve(item.request_id, reason=reason, origin=item.origin, expected=expected)


# -- files --------------------------------------------------------------------------------------


def _read_small(path: Path, what: str, limit: int) -> bytes:
    if path.is_dir():
        bad_usage(f"the {what} {path} is a folder, not a file.")
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        bad_usage(f"the {what} {path} does not exist.")
    except OSError as exc:
        bad_usage(f"cannot read the {what} {path}: {exc.strerror or exc}.")
    if len(data) > limit:
        bad_usage(f"the {what} {path} is larger than {limit} bytes.")
    return data


# -- commands -----------------------------------------------------------------------------------

ConfigOption = Annotated[Path | None, typer.Option("--config", help=_CONFIG_HELP)]
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
    node, client = _connect(config)
    with client, _answers():
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
        arguments = _one_line(item.arguments, TABLE_ARGUMENTS_CHARS)
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
    for line in _table(rows):
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
    node, client = _connect(config)
    with client, _answers():
        item = _resolve(client, request_id, origin)
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
    node, client = _connect(config)
    signer = _local_signer(node, key, agent, key_id)
    with client, _answers():
        item = _resolve(client, request_id, origin)
        result = decide(client, node, item, deny=False, reason=reason, signer=signer)
    _echo_decision(result, node, as_json)


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
    node, client = _connect(config)
    signer = _local_signer(node, key, agent, key_id)
    with client, _answers():
        item = _resolve(client, request_id, origin)
        result = decide(client, node, item, deny=True, reason=reason, signer=signer)
    _echo_decision(result, node, as_json)


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
    node, client = _connect(config)
    with client, _answers():
        item = _resolve(client, request_id, origin)
        to_sign = client.statement(
            item.request_id,
            kind="denial" if deny else "approval",
            reason=reason or "",
            origin=item.origin,
            expected=Expected.of(item),
        )
        _check_statement(client, node, to_sign, item)
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
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
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
    node, client = _connect(config)
    with client, _answers():
        item = _resolve(client, request_id, origin if isinstance(origin, str) else None)
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
    _echo_decision(result, node, as_json)


# -- watch --------------------------------------------------------------------------------------

WATCH_HELP: Final = (
    "commands: a ID [REASON] approve, d ID REASON deny, s ID show, l list, q quit "
    "(ID may be the first characters of a request's id, if no other request shown starts with them)"
)


class Watch:
    """``approvals watch``: follow the approver's pending requests and decide from the keyboard.

    A poller thread lists the pending requests (a long-poll while none waits, a listing a second
    while some do, so their countdown moves) and reports each new one, and each that leaves the
    queue; the caller's thread runs the commands typed. When the approver stops answering the
    poller says so once, retries with a growing pause, and says when it answers again.

    A typed id names a request this watch has shown (its first characters will do when no other
    request shown, pending or settled, starts with them), and the decision carries what was shown
    of it: a request that replaced it under the same prefix is never what gets signed.
    """

    def __init__(
        self,
        node: NodeConfig,
        *,
        signer: Signer | None,
        origin: str | None,
        tool: str | None,
        emit: Callable[[str], None],
    ) -> None:
        """Prepare it; nothing runs before :meth:`start`."""
        self.node = node
        self.signer = signer
        self.origin = origin
        self.tool = tool
        self.emit = emit
        self.stop_event = threading.Event()
        self.failure: RelayError | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, ApprovalItem] = {}  # "origin/request_id" -> item, as last listed
        self._shown: dict[str, ApprovalItem] = {}  # every request announced, as it was announced
        self._reminded: set[str] = set()
        self._thread = threading.Thread(target=self._poll, name="approvals-watch", daemon=True)

    # -- the poller --------------------------------------------------------------------------

    def start(self) -> None:
        """Start following the approver."""
        self._thread.start()

    def pending(self) -> list[ApprovalItem]:
        """The pending requests as last listed, soonest to expire first."""
        with self._lock:
            return sorted(self._pending.values(), key=lambda item: (item.expires_at, item.request_id))

    def _poll(self) -> None:
        client = _client(self.node)
        pause = RETRY_START_SECONDS
        down = False
        try:
            while not self.stop_event.is_set():
                waiting = bool(self._pending)
                try:
                    items = client.list_requests(
                        "pending",
                        origin=self.origin,
                        tool=self.tool,
                        limit=1000,
                        wait=0.0 if waiting or down else LONG_POLL_SECONDS,  # back: say so at once
                    )
                except RelayError as exc:
                    if exc.status_code is not None and exc.status_code < 500:
                        self.failure = exc  # a wrong token or the like: retrying changes nothing
                        self.stop_event.set()
                        return
                    if not down:
                        self.emit(f"{exc.args[0].rstrip('.')}; retrying until it answers.")
                        down = True
                    self.stop_event.wait(pause)
                    pause = min(pause * 2, RETRY_CAP_SECONDS)
                    continue
                if down:
                    self.emit(f"the approver at {client.base_url} answers again.")
                    down, pause = False, RETRY_START_SECONDS
                self._update(client, items)
                if waiting or self._pending:
                    self.stop_event.wait(REFRESH_SECONDS)
        finally:
            client.close()

    def _update(self, client: ApproverClient, items: Sequence[ApprovalItem]) -> None:
        now = time.time()
        listed = {f"{item.origin}/{item.request_id}": item for item in items}
        with self._lock:
            gone = [self._pending[key] for key in self._pending if key not in listed]
            new = [item for key, item in listed.items() if key not in self._pending]
            self._pending = listed
            for key, item in listed.items():
                self._shown.setdefault(key, item)  # before it is announced: a prefix then fits it too
        for item in sorted(new, key=lambda item: item.expires_at):
            for line in self.new_request_lines(item, now):
                self.emit(line)
            if item.expires_at - now <= REMIND_SECONDS:
                self._reminded.add(f"{item.origin}/{item.request_id}")  # its countdown was just shown
        for item in gone:
            self.emit(self._fate(client, item))
        for key, item in listed.items():
            left = item.expires_at - now
            if left <= REMIND_SECONDS and key not in self._reminded:
                self._reminded.add(key)
                self.emit(f"request {item.request_id} of {item.origin} expires in {time_left(left)}.")

    def new_request_lines(self, item: ApprovalItem, now: float) -> list[str]:
        """The lines that announce a new pending request."""
        lines = [
            f"new request {item.request_id} from {item.origin}: {visible(item.tool_name)} "
            f"{_one_line(item.arguments, 120)}",
            f"  reason: {visible(item.reason)}" if item.reason else "  reason: (none given)",
            f"  rule: {_rule_phrase(item)}",
            f"  expires in {_left_phrase(item, now)}; a {item.request_id[:8]} to approve, "
            f"d {item.request_id[:8]} REASON to deny, s {item.request_id[:8]} to see it whole",
        ]
        if any(True for _ in _long_values(item.arguments)) or len(_one_line(item.arguments, 120)) >= 120:
            lines.insert(1, f"  (arguments cut; s {item.request_id[:8]} prints them whole)")
        return lines

    def _fate(self, client: ApproverClient, item: ApprovalItem) -> str:
        try:
            now_item = client.get_request(item.request_id, origin=item.origin)
        except RelayError:
            return f"request {item.request_id} of {item.origin} left the queue."
        if now_item.state == "withdrawn" and now_item.decision is None:
            return f"request {item.request_id} of {item.origin} was withdrawn by its origin."
        settled = settled_phrase(now_item, time.time())
        if settled is not None and now_item.decision is None:
            return f"request {item.request_id} of {item.origin} was {settled}."
        if now_item.state == "expired" or now_item.decision is None:
            return f"request {item.request_id} of {item.origin} expired undecided."
        return (
            f"request {item.request_id} of {item.origin}: {self.node.agent_id} "
            f"{_decision_phrase(now_item, node_key_of(self.node), time.time())}."
        )

    # -- the commands ------------------------------------------------------------------------

    def shown(self) -> list[ApprovalItem]:
        """Every request this watch has announced, pending or not, as it was announced."""
        with self._lock:
            return list(self._shown.values())

    def resolve(self, client: ApproverClient, text: str) -> ApprovalItem:
        """The request ``text`` names: a full id, or a prefix of one request this watch has shown.

        Raises:
            ValueError: ``text`` is no id, or names no request shown or several.
            RelayError: A full id the approver does not know, or the approver failed.
        """
        return resolve_request(
            client, text, seen=self.shown(), origin=self.origin, among="shown by this watch"
        )

    def command(self, line: str) -> bool:
        """Run one typed command; return False when it is ``q``."""
        words = line.split()
        if not words:
            return True
        verb, rest = words[0].lower(), words[1:]
        if verb in ("q", "quit", "exit"):
            return False
        if verb in ("h", "help", "?"):
            self.emit(WATCH_HELP)
            return True
        if verb in ("l", "list"):
            pending = self.pending()
            now = time.time()
            if not pending:
                self.emit("nothing waits for a decision.")
            for item in pending:
                self.emit(
                    f"{item.request_id} {item.origin} {visible(item.tool_name)} "
                    f"{time_left(item.expires_at - now)} left  {_one_line(item.arguments, 60)}"
                )
            return True
        if verb not in ("a", "approve", "d", "deny", "s", "show") or not rest:
            self.emit(f"not a command: {visible(line.strip())!r}; {WATCH_HELP}")
            return True
        reason = " ".join(rest[1:])
        with contextlib.closing(_client(self.node)) as client:
            try:
                shown = self.resolve(client, rest[0])
            except (ValueError, RelayError) as exc:
                self.emit(str(exc))
                return True
            if verb in ("s", "show"):
                try:
                    item = client.get_request(shown.request_id, origin=shown.origin)
                except RelayError as exc:
                    self.emit(str(exc))
                    return True
                for text in show_lines(item, self.node.agent_id, node_key=node_key_of(self.node)):
                    self.emit(text)
                return True
            deny = verb in ("d", "deny")
            if deny and not reason:
                self.emit("a denial needs a reason: d ID REASON")
                return True
            try:
                result = decide(client, self.node, shown, deny=deny, reason=reason, signer=self.signer)
            except (RelayError, ConfigError) as exc:
                # The one-shot commands end on a refusal; here it is a line, and the watch goes on.
                self.emit(str(exc))
                return True
        by = signed_by(result.by, result.key_fingerprint, node_key_of(self.node))
        self.emit(
            f"{self.node.agent_id} {result.this_node} request {result.request_id} of {result.origin}, "
            f"signed {by}; "
            f"{'forwarded' if result.forwarded else 'not forwarded yet'}; "
            f"its outcome is counted by {result.origin}."
        )
        return True


def _plain_watch(watch: Watch, stdin: TextIO) -> int:
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stdin:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="approvals-watch-input", daemon=True).start()
    watch.start()
    stdin_open = True
    while not watch.stop_event.is_set():
        try:
            line = lines.get(timeout=0.2) if stdin_open else None
        except queue.Empty:
            continue
        if line is None:
            # No more commands (a pipe or /dev/null): keep following until interrupted.
            stdin_open = False
            watch.stop_event.wait(0.2)
            continue
        if not watch.command(line):
            watch.stop_event.set()
    if watch.failure is not None:
        return fail(str(watch.failure), _exit_code(watch.failure))
    return EXIT_OK


def _live_watch(watch: Watch, node: NodeConfig) -> int:  # pragma: no cover - exercised through a pty
    import termios
    import tty

    from rich.console import Console, Group
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    console = Console()
    typed: list[str] = []

    def render() -> Group:
        table = Table(title=f"waiting for {node.agent_id}", expand=False)
        for column in ("request", "origin", "tool", "left", "rule", "arguments"):
            table.add_column(column, overflow="fold" if column == "request" else "ellipsis")
        now = time.time()
        for item in watch.pending():
            rule = "ask (no rule)" if item.rule is None else f"#{item.rule.index} {item.rule.decision}"
            table.add_row(
                item.request_id,
                item.origin,
                visible(item.tool_name),
                time_left(item.expires_at - now),
                rule,
                _one_line(item.arguments, 50),
            )
        return Group(table, Text(WATCH_HELP, style="dim"), Text("> " + "".join(typed)))

    descriptor = sys.stdin.fileno()
    saved = termios.tcgetattr(descriptor)
    with Live(get_renderable=render, console=console, refresh_per_second=4, transient=True) as live:
        watch.emit = lambda line: live.console.print(Text(line))
        watch.start()
        tty.setcbreak(descriptor)
        try:
            while not watch.stop_event.is_set():
                chunk = os.read(descriptor, 1024).decode("utf-8", "replace")
                if not chunk:
                    break
                for char in chunk:
                    if char in ("\r", "\n"):
                        line, typed[:] = "".join(typed), []
                        live.console.print(Text("> " + line, style="bold"))
                        if not watch.command(line):
                            watch.stop_event.set()
                            break
                    elif char in ("\x7f", "\b"):
                        del typed[-1:]
                    elif char == "\x15":  # ctrl-U: clear the line
                        typed.clear()
                    elif unicodedata.category(char) not in _INVISIBLE:
                        typed.append(char)
        finally:
            termios.tcsetattr(descriptor, termios.TCSADRAIN, saved)
    if watch.failure is not None:
        return fail(str(watch.failure), _exit_code(watch.failure))
    return EXIT_OK


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
    node = load_config(config)
    node.load_token()  # a token problem is a usage error now, not a retry loop later
    signer = _local_signer(node, key, agent, key_id)

    lock = threading.Lock()  # the poller and the commands print from two threads

    def emit(line: str) -> None:
        with lock:
            typer.echo(line)
            sys.stdout.flush()

    follower = Watch(node, signer=signer, origin=origin, tool=tool, emit=emit)
    live = not plain and sys.stdin.isatty() and sys.stdout.isatty()
    signed_by = (
        "the node key (through the approver)" if signer is None else f"key {signer.public_key.fingerprint}"
    )
    emit(
        f"watching the requests waiting for {node.agent_id} at http://127.0.0.1:{node.approver.port}; "
        f"decisions are signed with {signed_by}."
    )
    if not live:
        emit(WATCH_HELP)
    try:
        code = _live_watch(follower, node) if live else _plain_watch(follower, sys.stdin)
    except KeyboardInterrupt:
        code = EXIT_OK  # ctrl-C is how a watch ends
    finally:
        follower.stop_event.set()
    raise typer.Exit(code)
