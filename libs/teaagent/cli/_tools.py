"""``teaagent tools``: the node's tools, and one call through the full policy gate.

``tools call`` takes exactly the path of a tool call the agent makes (schema, permission mode,
presets, the peers' quorum for a high-risk call, rate limit, audit log in ``<data_dir>/audit/``)
and prints the tool's result as JSON on stdout and nothing else; progress goes to stderr.
Exit codes: 0 the tool ran; 1 it failed; 2 bad usage, JSON or configuration; 3 the call was denied
or its approval expired.

While a quorum is awaited, stderr says which peers' relays received the request and which could
not be reached, each approval and denial as it arrives, and on expiry who never answered.
``--certificate-out FILE`` saves the verified certificate of an approved high-risk call
(``teaagent quorum verify FILE`` checks it again offline).
"""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from teaagent._files import atomic_write
from teaagent._json import JSONDepthError, parse_json
from teaagent.cli._options import ConfigOption
from teaagent.config import load_config
from teaagent.errors import ConfigError, SchemaValidationError, TeaAgentError, ToolError, ToolNotFoundError
from teaagent.policy import QuorumGate
from teaagent.runner._node import node_gate, node_quorum_gate, node_registry
from teaagent.tools import ToolRegistry
from teaagent.trust import MultiSigQuorumConfig

app = typer.Typer(no_args_is_help=True, help="List the node's tools, or call one through the policy gate.")

MAX_ARGUMENTS_CHARS = 1024 * 1024  # a tool call's arguments, not a file upload
_COLUMNS = ("name", "tier", "read_only", "destructive", "high_risk")


class _Failed(TeaAgentError):
    """The tool ran and failed (exit 1)."""


def _tool_rows(registry: ToolRegistry, quorum: MultiSigQuorumConfig) -> list[dict[str, Any]]:
    return [
        {
            "name": tool.name,
            "tier": tool.get_security_tier(),
            "read_only": tool.annotations.read_only,
            "destructive": tool.annotations.destructive,
            "high_risk": quorum.is_high_risk(tool.name),
            "description": tool.description,
        }
        for tool in registry.list_tools()
    ]


@app.command("list")
def list_tools(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")] = False,
) -> None:
    """List the tools with their security tier, behaviour, and whether a call needs the peers' quorum."""
    node = load_config(config)
    rows = _tool_rows(node_registry(node), node.quorum)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    cells = [list(_COLUMNS)]
    for row in rows:
        cells.append(
            [str(row["name"]), str(row["tier"])] + ["yes" if row[key] else "no" for key in _COLUMNS[2:]]
        )
    widths = [max(len(line[index]) for line in cells) for index in range(len(_COLUMNS))]
    for line in cells:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip())
    if node.quorum.enabled:
        typer.echo(f"\nhigh-risk calls need {node.quorum.describe_quorum()}.")


def parse_arguments(text: str) -> dict[str, Any]:
    """Read a tool call's arguments from the command line: one JSON object.

    Raises:
        ConfigError: The text is not JSON, or not an object.
    """
    if len(text) > MAX_ARGUMENTS_CHARS:
        raise ConfigError(f"The arguments are longer than {MAX_ARGUMENTS_CHARS} characters.")
    try:
        arguments = parse_json(text, what="The arguments object")
    except json.JSONDecodeError as exc:
        raise ConfigError(f"The arguments are not valid JSON: {exc.msg} at column {exc.colno}.") from None
    except JSONDepthError as exc:
        raise ConfigError(str(exc)) from None
    except ValueError:  # json.loads's own: an integer of more digits than Python converts
        raise ConfigError(
            f"The arguments hold an integer of more than {sys.get_int_max_str_digits()} digits."
        ) from None
    if not isinstance(arguments, dict):
        raise ConfigError(
            f'The arguments must be a JSON object such as \'{{"path": "README.md"}}\', not {text!r}.'
        )
    return arguments


class _KeptCertificate:
    """A quorum gate that keeps the last certificate it handed to the policy (``--certificate-out``)."""

    def __init__(self, gate: QuorumGate) -> None:
        self._gate = gate
        self.certificate: dict[str, Any] | None = None

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        certificate = self._gate.obtain(request)
        self.certificate = certificate
        return certificate


def _check_certificate_out(path: Path, tool: str, quorum: MultiSigQuorumConfig) -> None:
    """Refuse ``--certificate-out`` before anything is asked when no certificate could be saved.

    Raises:
        ConfigError: The call needs no quorum, or the file's folder does not exist.
    """
    if not quorum.enabled or not quorum.is_high_risk(tool):
        raise ConfigError(
            f"--certificate-out: {tool} needs no quorum on this node, so there is no certificate to save."
        )
    if path.is_dir():
        raise ConfigError(f"--certificate-out: {path} is a folder, not a file.")
    if not path.parent.is_dir():
        raise ConfigError(f"--certificate-out: the folder {path.parent} does not exist.")


def _save_certificate(path: Path, certificate: dict[str, Any]) -> None:
    """Write the certificate as JSON, atomically (a reader never sees half of it).

    Raises:
        _Failed: The file could not be written (the call ran already).
    """
    data = (json.dumps(certificate, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode()
    try:
        atomic_write(path, data, mode=0o644)  # signed public documents, nothing secret
    except OSError as exc:
        raise _Failed(
            f"The call ran, but its certificate could not be saved to {path}: {exc.strerror or exc}."
        ) from None
    _progress(f"the quorum certificate is saved in {path}.")


def _progress(line: str) -> None:
    # stdout carries the result alone; what the call waits for goes to stderr.
    sys.stderr.write(f"teaagent: {line}\n")
    sys.stderr.flush()


@app.command("call")
def call_tool(
    tool: Annotated[str, typer.Argument(help="The tool's name, such as fs.read.")],
    arguments: Annotated[str, typer.Argument(help="Its arguments as one JSON object.")] = "{}",
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option("--reason", help="Why the call is made; shown to approvers.")] = "",
    certificate_out: Annotated[
        Path | None,
        typer.Option(
            "--certificate-out",
            metavar="FILE",
            help="Save the approved call's quorum certificate here (JSON, for teaagent quorum verify).",
        ),
    ] = None,
) -> None:
    """Make one tool call through the full policy gate and print its result as JSON."""
    parsed = parse_arguments(arguments)
    node = load_config(config)
    if certificate_out is not None:
        _check_certificate_out(certificate_out, tool, node.quorum)
    registry = node_registry(node)
    try:
        # A mistake in the command line (an unknown tool, arguments its schema refuses) is a usage
        # error; it is refused before anything is asked of an approver.
        registry.validate_arguments(tool, parsed)
    except (ToolNotFoundError, SchemaValidationError) as exc:
        raise ConfigError(str(exc)) from None
    from teaagent.cli._run import terminal_prompter
    from teaagent.cli._watch import QuorumWatch

    quorum_gate = node_quorum_gate(node, on_progress=_progress, on_wait=QuorumWatch(_progress))
    kept = _KeptCertificate(quorum_gate) if quorum_gate is not None else None
    run_id = f"cli-{secrets.token_hex(8)}"
    gate = node_gate(
        node, run_id=run_id, registry=registry, prompter=terminal_prompter(), quorum_gate=kept or quorum_gate
    )
    try:
        result = gate.call(tool, parsed, call_id=f"{run_id}-1", reason=reason or "teaagent tools call")
    except ToolError as exc:
        _keep(certificate_out, kept)
        raise _Failed(str(exc)) from None
    except TeaAgentError:
        raise  # a denial (a certificate the policy refused included): nothing is saved
    except KeyboardInterrupt:
        from teaagent.cli._interrupt import interrupted

        interrupted(quorum_gate)  # Ctrl-C in a quorum wait: the gate withdrew it; exit 130, one line
        raise
    except Exception as exc:  # the tool's own failure: exit 1 with its sentence, not an internal error
        _keep(certificate_out, kept)
        raise _Failed(f"{tool} failed: {type(exc).__name__}: {exc}") from None
    finally:
        gate.audit.close()
    typer.echo(json.dumps(result, ensure_ascii=False))
    _keep(certificate_out, kept)


def _keep(path: Path | None, kept: _KeptCertificate | None) -> None:
    """Save the certificate of a call the policy let through (it verified it before the tool ran).

    Called only once the gate passed the policy: the tool ran, or failed after it was approved.
    """
    if path is None:
        return
    if kept is None or kept.certificate is None:
        _progress(f"no quorum certificate was issued for this call; {path} is not written.")
        return
    _save_certificate(path, kept.certificate)
