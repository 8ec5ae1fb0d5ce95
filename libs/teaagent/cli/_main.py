"""The root command, its sub-commands, and the one place where errors become exit codes.

A command's module is imported only when the command line names it (:data:`GROUPS`,
:data:`COMMANDS`): ``teaagent relay serve`` loads the relay's code, not the agent's, the demo's or
the TUI's, so that a service or a one-shot command starts in a fraction of the time. The root's
help, and a word that names no command, load them all.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import Annotated, Any, Final

import typer
import typer.core
from typer import _click as click  # typer's own copy of click, whose classes its commands are

from teaagent.cli._exit import EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from teaagent.errors import ApprovalDeniedError, ConfigError, TeaAgentError

__all__ = [
    "COMMANDS",
    "EXAMPLES",
    "EXIT_DENIED",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "GROUPS",
    "SECTIONS",
    "build_app",
    "command",
    "main",
    "run",
]

# The root's commands, by what a user comes to do; `teaagent --help` lists them in these sections.
SECTIONS: Final[dict[str, tuple[str, ...]]] = {
    "Start here": ("demo",),
    "Cluster (nodes, peers, keys)": ("init", "peers", "operators", "keys"),
    "Approving (this node decides its peers' requests)": ("approvals",),
    "Agent (tasks and tool calls)": ("run", "tui", "tools"),
    "Services (each in the foreground, until Ctrl-C)": ("relay", "approver", "agent", "mcp"),
    "Offline checks": ("audit", "quorum", "bench"),
}

_TEA = "~/tea/alpha/node.toml"
_BETA = "~/tea/beta/node.toml"
# One example at least for every command, shown at the end of its --help (a group shows its
# commands' first examples). The test walks every command and requires one.
EXAMPLES: Final[dict[str, tuple[str, ...]]] = {
    "": ("teaagent demo", "teaagent init --cluster alpha,beta,gamma ~/tea", "teaagent COMMAND --help"),
    "demo": ("teaagent demo", "teaagent demo --dir /tmp/tea-demo --keep"),
    "init": (
        "teaagent init --cluster alpha,beta,gamma ~/tea",
        "teaagent init ~/teaagent --name alpha --host alpha.example.net "
        "--tls-cert alpha.crt --tls-key alpha.key",
    ),
    "bench": ("teaagent bench quorum", "teaagent bench signing --json --seconds 1"),
    "run": (f'teaagent run --config {_TEA} "list the files of the workspace"',),
    "tui": (f"teaagent tui --config {_TEA}",),
    "agent serve": (f"teaagent agent serve --config {_TEA}",),
    "approvals list": (f"teaagent approvals list --config {_BETA}",),
    "approvals show": (f"teaagent approvals show 3f2a9c1e --config {_BETA}",),
    "approvals approve": (
        f"teaagent approvals approve 3f2a9c1e --config {_BETA}",
        f"teaagent approvals approve 3f2a9c1e --key ~/.ssh/id_ed25519 --config {_BETA}",
    ),
    "approvals deny": (f"teaagent approvals deny 3f2a9c1e --reason 'not on Fridays' --config {_BETA}",),
    "approvals statement": (
        f"teaagent approvals statement 3f2a9c1e --out request.json --config {_BETA}",
        "ssh-keygen -Y sign -n teaagent-approval -f ~/.ssh/id_ed25519 request.json",
    ),
    "approvals submit": (
        "teaagent approvals submit 3f2a9c1e --statement request.json --signature request.json.sig "
        f"--config {_BETA}",
    ),
    "approvals watch": (f"teaagent approvals watch --config {_BETA}",),
    "approvals web": (f"teaagent approvals web --config {_BETA}",),
    "approver serve": (f"teaagent approver serve --config {_BETA}",),
    "audit verify": ("teaagent audit verify ~/tea/alpha/data/audit.jsonl",),
    "keys fingerprint": (f"teaagent keys fingerprint --config {_TEA}",),
    "mcp serve": (f"teaagent mcp serve --config {_TEA}", f"teaagent mcp serve --config {_TEA} --http 8710"),
    "mcp gateway": (f"teaagent mcp gateway --config {_TEA} --http 8711",),
    "peers add": (
        f"teaagent peers add beta ~/tea/beta/keys/beta.pub http://127.0.0.1:8704 --config {_TEA}",
        f"teaagent peers add beta --replace --operator-key ~/.ssh/id_ed25519.pub --config {_TEA}",
    ),
    "operators add": (f"teaagent operators add ~/.ssh/id_ed25519.pub --config {_BETA}",),
    "quorum verify": (f"teaagent quorum verify certificates/1-shell.run.json --config {_TEA}",),
    "relay serve": (f"teaagent relay serve --config {_TEA}",),
    "tools list": (f"teaagent tools list --config {_TEA}",),
    "tools call": (f'teaagent tools call --config {_TEA} shell.run \'{{"command": "echo hello"}}\'',),
}


# The command groups, in the order of the listing's "Other" section: name -> (module, its typer app,
# modules that add commands to that app: `approvals web` is _web's).
GROUPS: Final[dict[str, tuple[str, str, tuple[str, ...]]]] = {
    "agent": ("teaagent.cli._agent", "app", ()),
    "approvals": ("teaagent.cli._approvals", "app", ("teaagent.cli._web",)),
    "approver": ("teaagent.cli._approver", "app", ()),
    "audit": ("teaagent.cli._audit", "app", ()),
    "keys": ("teaagent.cli._keys", "app", ()),
    "mcp": ("teaagent.cli._mcp", "app", ()),
    "peers": ("teaagent.cli._peers", "app", ()),
    "operators": ("teaagent.cli._peers", "operators_app", ()),
    "quorum": ("teaagent.cli._quorum", "app", ()),
    "relay": ("teaagent.cli._relay", "app", ()),
    "tools": ("teaagent.cli._tools", "app", ()),
}
# The commands of one word: name -> (module, its function).
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "demo": ("teaagent.cli._demo", "demo"),
    "init": ("teaagent.cli._init", "init"),
    "bench": ("teaagent.cli._bench", "bench"),
    "run": ("teaagent.cli._run", "run"),
    "tui": ("teaagent.cli._tui", "tui"),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # only for --version

    try:
        return version("teaagent")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


class _Root(typer.core.TyperGroup):
    """The root command: its commands listed by section (:data:`SECTIONS`), their lines whole."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        placed = {name for names in SECTIONS.values() for name in names}
        sections = [
            *SECTIONS.items(),
            ("Other", tuple(n for n in self.list_commands(ctx) if n not in placed)),
        ]
        for title, names in sections:
            rows = [
                (name, command.get_short_help_str())
                for name in names
                if (command := self.get_command(ctx, name)) is not None and not command.hidden
            ]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"teaagent {_version()}")
        raise typer.Exit(EXIT_OK)


def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version of teaagent and exit.",
        ),
    ] = False,
) -> None:
    """Run AI coding agents whose high-risk tool calls need N of M peers' SSH signatures."""


def build_app(only: str | None = None) -> typer.Typer:
    """The ``teaagent`` typer app: every command, or only the one named ``only`` (its module alone
    is imported).
    """
    root = typer.Typer(
        name="teaagent",
        help="Run AI coding agents whose high-risk tool calls need N of M peers' SSH signatures.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        cls=_Root,
    )
    root.callback()(_root)
    for name, (module, attribute, extras) in GROUPS.items():
        if only in (None, name):
            group = getattr(import_module(module), attribute)
            for extra in extras:
                import_module(extra)
            root.add_typer(group, name=name)
    for name, (module, attribute) in COMMANDS.items():
        if only in (None, name):
            function: Callable[..., Any] = getattr(import_module(module), attribute)
            root.command(name)(function)
    return root


_MARKUP = re.compile(r"``([^`]+)``")  # docstring markup: ``[tls] cert`` reads [tls] cert


def _plain(text: str | None) -> str | None:
    return None if text is None else _MARKUP.sub(r"\1", text)


def _first_paragraph(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _examples(lines: Sequence[str]) -> str:
    # \b keeps click from joining the lines into one paragraph.
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


def _polish(command: click.Command, path: str) -> tuple[str, ...]:
    """Give ``command`` and those below it plain help, whole one-line descriptions and examples.

    Returns:
        The command's examples (a group's are its commands' first ones).
    """
    command.help = _plain(command.help)
    for param in command.params:
        if isinstance(getattr(param, "help", None), str):
            param.help = _plain(param.help)  # type: ignore[attr-defined]
    examples = EXAMPLES.get(path, ())
    if isinstance(command, typer.core.TyperGroup):
        context = click.Context(command)
        below = [
            _polish(sub, f"{path} {name}".strip())
            for name in command.list_commands(context)
            if (sub := command.get_command(context, name)) is not None
        ]
        if not examples:
            examples = tuple(found[0] for found in below if found)
    # The listing of a group shows each command's first paragraph whole, wrapped, not cut at ~45
    # characters as click does by default.
    command.short_help = _first_paragraph(command.help)
    if examples:
        command.epilog = _examples(examples)
    return examples


def command(only: str | None = None) -> click.Command:
    """The ``teaagent`` command as click runs it: the typer app, its help polished (:func:`_polish`).

    Args:
        only: The one command to build (``relay``), its module alone imported; every command when
            None.
    """
    built = typer.main.get_command(build_app(only))
    _polish(built, "")
    return built


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` and return its exit code instead of exiting.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code of the convention above.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    # The command named first is the only one loaded; anything else (no word, an option, a word
    # that names no command) loads them all, for the listing or the refusal with its suggestions.
    named = args[0] if args and (args[0] in GROUPS or args[0] in COMMANDS) else None
    root = command(named)
    try:
        result = root.main(args=args, prog_name="teaagent", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return fail("aborted.", EXIT_FAILED)
    except typer.TyperException as exc:
        # Usage errors (a missing argument, an unknown option). typer vendors its own click, whose
        # exceptions all derive from TyperException; "no arguments" shows the help.
        if type(exc).__name__ == "NoArgsIsHelpError":
            # The help of the command that was given no arguments: `teaagent approvals` shows approvals'.
            context = getattr(exc, "ctx", None)
            if context is None:
                context = root.make_context("teaagent", [], resilient_parsing=True)
            sys.stdout.write(context.get_help() + "\n")
            return EXIT_USAGE
        format_message = getattr(exc, "format_message", None)
        return fail(format_message() if callable(format_message) else str(exc), EXIT_USAGE)
    except ApprovalDeniedError as exc:
        return fail(str(exc), EXIT_DENIED)
    except (ConfigError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
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
