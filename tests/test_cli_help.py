"""``teaagent --help`` as a newcomer reads it: sections, whole descriptions, an example everywhere."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.core

from teaagent.cli._demo import demo as demo_command
from teaagent.cli._main import COMMANDS, GROUPS, SECTIONS, command, run


def commands() -> Iterator[list[str]]:
    """The path of every command and group under the root, walked from the command itself."""

    def walk(node: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        if isinstance(node, typer.core.TyperGroup):
            for name, sub in node.commands.items():
                yield from walk(sub, [*path, name])

    yield from walk(command(), [])


ALL = list(commands())


def helped(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert run([*argv, "--help"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return captured.out


def test_the_walk_reaches_every_command() -> None:
    names = {" ".join(path) for path in ALL}
    assert {"", "demo", "approvals approve", "mcp gateway", "agent serve", "tui", "tools call"} <= names
    assert len(names) > 30


def test_the_root_lists_its_commands_in_sections(capsys: pytest.CaptureFixture[str]) -> None:
    text = helped(capsys)
    assert "\nCommands:" not in text  # every command has its section
    assert "\nOther:" not in text
    for title, names in SECTIONS.items():
        body = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
        listed = re.findall(r"^  (\S+)  ", body, flags=re.MULTILINE)
        assert listed == list(names), title
    assert {"Cluster", "Approving", "Agent", "Services", "Offline checks"} <= {
        title.split(" (")[0] for title in SECTIONS
    }


DEMO_DOC = inspect.getdoc(demo_command) or ""


@pytest.mark.parametrize("path", [path for path in ALL if len(path) < 2], ids=lambda p: " ".join(p) or "root")
def test_a_listing_shows_each_description_whole(capsys: pytest.CaptureFixture[str], path: list[str]) -> None:
    text = helped(capsys, *path)
    listing = text.split("\n", 1)[1]  # below the usage line and its [ARGS]...
    assert "..." not in listing.replace("SHA256:...", "")
    flat = " ".join(text.split())
    if not path:  # the demo's description is longer than 60 characters: on several lines, whole
        description = " ".join(DEMO_DOC.split("\n\n")[0].split())
        assert len(description) > 60
        assert description in flat


@pytest.mark.parametrize("path", ALL, ids=lambda p: " ".join(p) or "root")
def test_every_help_ends_with_an_example_and_shows_no_markup(
    capsys: pytest.CaptureFixture[str], path: list[str]
) -> None:
    text = helped(capsys, *path)
    assert "``" not in text
    examples = text.split("\n  Examples:\n\n", 1)[1]
    lines = [line.strip() for line in examples.splitlines() if line.strip()]
    assert lines
    assert all(line.startswith(("teaagent ", "ssh-keygen ")) for line in lines)
    if path:  # a command's example runs that command
        assert any(line.startswith("teaagent " + " ".join(path)) for line in lines)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert run(["--version"]) == 0
    assert capsys.readouterr().out == f"teaagent {version('teaagent')}\n"
    assert "--version" in helped(capsys)


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_commands() -> set[str]:
    """The commands the README's command list names: ``teaagent approvals list|show`` names two."""
    text = README.read_text()
    block = text.split("\n## Command line\n", 1)[1].split("\n```\n", 1)[1].split("\n```", 1)[0]
    found: set[str] = set()
    for line in block.splitlines():
        words = line.split()[1:3]
        paths = [""]
        for word in words:
            if not re.fullmatch(r"[a-z|]+", word):
                break
            paths = [f"{path} {choice}".strip() for path in paths for choice in word.split("|")]
            found.update(paths)  # `teaagent bench core|signing` names `bench` (its argument follows)
    return found


def test_the_readme_command_list_names_every_command() -> None:
    leaves = {
        " ".join(path)
        for path in ALL
        if path and not any(other[: len(path)] == path and other != path for other in ALL)
    }
    assert "mcp gateway" in leaves
    assert leaves - readme_commands() == set()


def test_the_readme_lists_every_route_of_the_agent_http_api() -> None:
    from fastapi.routing import APIRoute

    from teaagent_agent import _routes

    routers = [value for value in vars(_routes).values() if type(value).__name__ == "APIRouter"]
    served = {
        (method, route.path)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    text = README.read_text().split("\n### The agent HTTP API\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| ([A-Z]+) \| `([^`]+)` \|", text, flags=re.MULTILINE))
    assert len(served) > 30
    assert listed == served


@pytest.mark.parametrize("path", [["approvals"], ["mcp"], []], ids=lambda p: " ".join(p) or "root")
def test_a_group_without_a_command_shows_its_own_help(
    capsys: pytest.CaptureFixture[str], path: list[str]
) -> None:
    assert run(path) == 2
    text = capsys.readouterr().out
    assert text.startswith(f"Usage: teaagent {' '.join([*path, ''])}[OPTIONS] COMMAND [ARGS]...\n")
    assert "Examples:" in text


# Run in a fresh interpreter: which of the command line's modules one command loads.
_LOADED = (
    "import sys; from teaagent.cli._main import run; code = run(sys.argv[1:]); "
    "print(sorted(m for m in sys.modules if m.startswith('teaagent.cli._')))"
)
_COMMAND_MODULES = {module for module, *_rest in (*GROUPS.values(), *COMMANDS.values())} | {
    extra for _module, _app, extras in GROUPS.values() for extra in extras
}


def _loaded(*argv: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *argv], capture_output=True, text=True, timeout=120, check=True
    )
    return set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["keys", "fingerprint", "--help"], "teaagent.cli._keys"),
        (["relay", "serve", "--help"], "teaagent.cli._relay"),
        (["demo", "--help"], "teaagent.cli._demo"),
        (["approvals", "web", "--help"], "teaagent.cli._approvals"),
    ],
)
def test_a_command_loads_its_own_module_and_no_other_commands(argv: list[str], module: str) -> None:
    loaded = _loaded(*argv) & _COMMAND_MODULES
    # `approvals web` is a command of _web's on the approvals group: the group's module and that one.
    assert loaded == ({module, "teaagent.cli._web"} if argv[0] == "approvals" else {module}), loaded


def test_the_root_help_and_a_word_that_names_no_command_load_every_command() -> None:
    assert _loaded("--help") >= _COMMAND_MODULES
    assert _loaded("relya") >= _COMMAND_MODULES  # the refusal suggests `relay`: it knows every name


def test_the_packages_app_is_every_command_and_one_object() -> None:
    import teaagent.cli

    app = teaagent.cli.app
    assert app is teaagent.cli.app  # built once, kept: a caller that adds to it finds it again
    assert {info.name for info in app.registered_groups} == set(GROUPS)
    assert {info.name for info in app.registered_commands} == set(COMMANDS)
