"""The root command, its sub-commands, and the one place where errors become exit codes."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence

import typer

from teaagent.cli import (
    _agent,
    _approvals,
    _approver,
    _audit,
    _bench,
    _demo,
    _init,
    _keys,
    _mcp,
    _peers,
    _quorum,
    _relay,
    _run,
    _tools,
    _tui,
)
from teaagent.cli._exit import EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from teaagent.errors import ApprovalDeniedError, ConfigError, TeaAgentError

__all__ = ["EXIT_DENIED", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "app", "main", "run"]

app = typer.Typer(
    name="teaagent",
    help="Run AI coding agents whose high-risk tool calls need N of M peers' SSH signatures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(_agent.app, name="agent")
app.add_typer(_approvals.app, name="approvals")
app.add_typer(_approver.app, name="approver")
app.add_typer(_audit.app, name="audit")
app.add_typer(_keys.app, name="keys")
app.add_typer(_mcp.app, name="mcp")
app.add_typer(_peers.app, name="peers")
app.add_typer(_peers.operators_app, name="operators")
app.add_typer(_quorum.app, name="quorum")
app.add_typer(_relay.app, name="relay")
app.add_typer(_tools.app, name="tools")
app.command("demo")(_demo.demo)
app.command("init")(_init.init)
app.command("bench")(_bench.bench)
app.command("run")(_run.run)
app.command("tui")(_tui.tui)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` and return its exit code instead of exiting.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code of the convention above.
    """
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = command.main(args=args, prog_name="teaagent", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return fail("aborted.", EXIT_FAILED)
    except typer.TyperException as exc:
        # Usage errors (a missing argument, an unknown option). typer vendors its own click, whose
        # exceptions all derive from TyperException; "no arguments" shows the help.
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(
                command.get_help(command.make_context("teaagent", [], resilient_parsing=True)) + "\n"
            )
            return EXIT_USAGE
        format_message = getattr(exc, "format_message", None)
        return fail(format_message() if callable(format_message) else str(exc), EXIT_USAGE)
    except ApprovalDeniedError as exc:
        return fail(str(exc), EXIT_DENIED)
    except (ConfigError, FileNotFoundError, IsADirectoryError) as exc:
        return fail(str(exc), EXIT_USAGE)
    except TeaAgentError as exc:
        return fail(str(exc), EXIT_FAILED)
    except KeyboardInterrupt:
        return fail("interrupted.", 130)
    except Exception as exc:  # the last resort: one sentence, the traceback only on request
        if os.environ.get("TEAAGENT_DEBUG"):
            traceback.print_exc()
        return fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_FAILED)
    return result if isinstance(result, int) else EXIT_OK


def main() -> None:
    """Entry point of the ``teaagent`` console script."""
    sys.exit(run())
