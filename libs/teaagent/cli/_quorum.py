"""``teaagent quorum``: check quorum certificates offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from teaagent._files import FileSentences, read_limited
from teaagent._json import parse_json
from teaagent.cli._exit import bad_usage
from teaagent.cli._options import ConfigOption
from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError, QuorumError, SignatureError
from teaagent.quorum import policy_mismatch, request_problem, verify_certificate, verify_request_signature
from teaagent.quorum._documents import clause
from teaagent.signing import fingerprint, parse_public_key
from teaagent.trust import MultiSigQuorumConfig, SignerKey

app = typer.Typer(no_args_is_help=True, help="Check quorum certificates.")

MAX_CERTIFICATE_BYTES: Final = 4 * 1024 * 1024  # a request and a few signatures, with generous arguments


def _read_certificate(path: Path) -> Any:
    sentences = FileSentences.of(f"{path}: the certificate file", MAX_CERTIFICATE_BYTES)
    raw = read_limited(path, MAX_CERTIFICATE_BYTES, sentences)
    try:
        return parse_json(raw)
    except ValueError as exc:  # not JSON, not UTF-8, nested too deep, an integer too long to read
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        bad_usage(f"{path}: the certificate is not valid JSON{where}.")


def _signed_by(cert: dict[str, Any], keys: str | tuple[SignerKey, ...]) -> str:
    """The fingerprint of the origin's key that signed the certificate's request (verified already)."""
    if isinstance(keys, str):
        return fingerprint(keys)
    try:
        return verify_request_signature(cert["request"], cert["request_signature"], keys).fingerprint
    except (SignatureError, QuorumError):
        return "(a development signature)"


def _own_key_line(node: NodeConfig) -> str | None:
    try:
        return node.own_public_key().to_line()
    except (ConfigError, SignatureError):
        return None


def _verifier_config(node: NodeConfig, origin: object) -> MultiSigQuorumConfig:
    """The signers this node can check for ``origin``'s request: its peers, and itself unless it is origin.

    A certificate of this node's own request is checked against its own quorum configuration. For
    another origin's certificate, this node's own approval is one of the signatures, so this node's
    key joins the peers (and the origin leaves them); the threshold stays this node's own
    ``required_approvals`` (``verify_certificate`` also never goes below the request's).
    """
    if origin == node.agent_id:
        return node.quorum
    keys = {name: peer.public_key for name, peer in node.peers.items() if name != origin}
    urls = {name: peer.relay_url for name, peer in node.peers.items() if name != origin}
    own = _own_key_line(node)
    if own is not None:
        keys[node.agent_id] = own
        urls[node.agent_id] = node.relay_url
    # Disabled: this view only verifies; the node's own configuration was checked when loaded.
    return MultiSigQuorumConfig(
        enabled=False,
        required_approvals=node.quorum.required_approvals,
        peer_agent_ids=sorted(keys),
        peer_public_keys=keys,
        peer_relay_urls=urls,
        local_relay_base_url=node.relay_url,
        allow_dev_signatures=node.quorum.allow_dev_signatures,
        high_risk_patterns=list(node.quorum.high_risk_patterns),
        timeout_seconds=node.quorum.timeout_seconds,
    )


@app.command("verify")
def verify(
    certificate: Annotated[Path, typer.Argument(metavar="CERT.json", help="The quorum certificate (JSON).")],
    config: ConfigOption = None,
    origin_key: Annotated[
        str | None,
        typer.Option(
            "--origin-key",
            help="The origin's public key line; by default the configured key of the origin, when known.",
        ),
    ] = None,
) -> None:
    """Check that CERT.json proves the quorum with this node's keys; exit 1 with the reason if it does not."""
    if origin_key is not None:
        try:  # a bad option is a usage error (2), not a certificate that fails to verify (1)
            parse_public_key(origin_key)
        except SignatureError as exc:
            bad_usage(f"--origin-key is not an SSH public key line: {clause(exc)}.")
    node = load_config(config)
    cert = _read_certificate(certificate)
    request = cert.get("request") if isinstance(cert, dict) else None
    origin = request.get("origin") if isinstance(request, dict) else None
    origin_keys: str | tuple[SignerKey, ...] | None = origin_key
    if origin_key is None and isinstance(origin, str):
        # Every key configured for the origin, each with its allowed_signers limits.
        peer = node.peers.get(origin)
        origin_keys = _own_key_line(node) if origin == node.agent_id else (peer.keys if peer else None)
    if origin == node.agent_id and isinstance(request, dict) and request_problem(request) is None:
        # PROTOCOL.md "Who decides what the policy is": this node's own rules say what its
        # certificates must prove (another origin's rules are that origin's; its terms are shown).
        mismatch = policy_mismatch(request, node.quorum)
        if mismatch is not None:
            raise QuorumError(mismatch)
    outcome = verify_certificate(cert, _verifier_config(node, origin), origin_public_key=origin_keys)
    typer.echo(f"certificate for request {outcome.request_id}: {outcome.tool_name} from {outcome.origin}")
    typer.echo(outcome.describe())
    if origin_keys is not None:
        typer.echo(f"request signature: verified with {outcome.origin}'s key {_signed_by(cert, origin_keys)}")
    else:
        typer.echo(
            f"request signature: not checked ({outcome.origin}'s key is unknown here; pass --origin-key)"
        )
    if outcome.dev_signers:
        typer.echo(f"warning: development signatures counted for {', '.join(outcome.dev_signers)}", err=True)
