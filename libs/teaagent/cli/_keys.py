"""``teaagent keys``: this node's key and its peers' keys."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from teaagent.cli._options import ConfigOption
from teaagent.config import load_config
from teaagent.signing import parse_public_key

app = typer.Typer(no_args_is_help=True, help="Show this node's key and its peers' keys.")

_COLUMNS = ("agent_id", "role", "key_type", "fingerprint")


@app.command("fingerprint")
def fingerprint(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array instead of a table.")] = False,
) -> None:
    """Print the SHA256 fingerprint of this node's key and of every configured peer's key.

    The fingerprints are those ``ssh-keygen -lf`` prints, so operators can compare them out of band.
    """
    node = load_config(config)
    own = node.own_public_key()
    rows = [
        {"agent_id": node.agent_id, "role": "self", "key_type": own.key_type, "fingerprint": own.fingerprint}
    ]
    for name, peer in node.peers.items():
        key = parse_public_key(peer.public_key)  # checked when the file was loaded
        rows.append(
            {"agent_id": name, "role": "peer", "key_type": key.key_type, "fingerprint": key.fingerprint}
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    widths = [max(len(column), *(len(row[column]) for row in rows)) for column in _COLUMNS]
    for cells in [list(_COLUMNS), *([row[column] for column in _COLUMNS] for row in rows)]:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip())
