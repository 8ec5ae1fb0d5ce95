"""``teaagent audit``: check audit logs offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from teaagent.audit import verify_log
from teaagent.cli._exit import EXIT_FAILED
from teaagent.errors import AuditVerificationError

app = typer.Typer(no_args_is_help=True, help="Check audit logs: their hash chain and HMACs.")


@app.command("verify")
def verify(
    file: Annotated[Path, typer.Argument(help="The JSONL audit log.", show_default=False)],
    key_file: Annotated[
        Path | None,
        typer.Option(
            "--key-file",
            help="The chain key file (hex). Default: the log's path followed by .key, if it exists;"
            " without one only the hash chain is checked.",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as a JSON object.")] = False,
) -> None:
    """Check an audit log's hash chain and HMACs; exit 1 naming the first bad line."""
    report = verify_log(file, key_file=key_file)
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
        if not report.ok:
            raise typer.Exit(EXIT_FAILED)
        return
    if not report.ok:
        raise AuditVerificationError(report.message)
    typer.echo(report.message)
