"""The library's layers: no import cycle among ``libs/teaagent`` packages, nor among its modules.

Every import counts, at module level or inside a function (a function-level import is still a
dependency; it only hides the cycle from the interpreter until the function runs), and so does
the package ``__init__`` that importing a submodule runs first. The graphs are read from the
source with :mod:`ast`, so a cycle fails here even where no test happens to import both ends.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

import teaagent

ROOT = Path(teaagent.__file__).parent


def _module_name(path: Path) -> str:
    parts = ("teaagent", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in ROOT.rglob("*.py")}


def _targets(name: str) -> Iterable[str]:
    """The modules that importing ``name`` runs: it, or the nearest enclosing module, and its packages."""
    while name not in MODULES and "." in name:
        name = name.rpartition(".")[0]
    while name != "teaagent":
        yield name
        name = name.rpartition(".")[0]


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            if name == "teaagent" or name.startswith("teaagent."):
                found.update(_targets(name))
    # A module's own enclosing packages are already being imported when it runs.
    return {target for target in found if target != module and not module.startswith(target + ".")}


MODULE_GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _package(module: str) -> str:
    return module.split(".")[1]


PACKAGE_GRAPH: dict[str, set[str]] = {}
for _module, _edges in MODULE_GRAPH.items():
    if _module == "teaagent":
        continue  # the root re-exports; it is no layer of its own
    PACKAGE_GRAPH.setdefault(_package(_module), set()).update(
        _package(edge) for edge in _edges if _package(edge) != _package(_module)
    )


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for edge in graph.get(node, ()):
            if edge not in index:
                visit(edge)
                low[node] = min(low[node], low[edge])
            elif edge in on_stack:
                low[node] = min(low[node], index[edge])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_a_cycle_and_only_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_the_graphs_see_function_level_imports() -> None:
    # teaagent.runner._node imports the relay client inside a function, to load it lazily.
    assert "teaagent.relay_client" in MODULE_GRAPH["teaagent.runner._node"]


def test_no_cycle_among_the_library_packages() -> None:
    assert cycles(PACKAGE_GRAPH) == []


def test_no_cycle_among_the_library_modules() -> None:
    assert cycles(MODULE_GRAPH) == []


@pytest.mark.parametrize(
    ("low", "high"),
    [
        ("trust", "policy"),
        ("trust", "quorum"),
        ("quorum", "policy"),
        ("signing", "trust"),
        ("errors", "signing"),
    ],
)
def test_the_security_layers_point_one_way(low: str, high: str) -> None:
    # The types both sides of the security argument share sit below both of them.
    assert high not in PACKAGE_GRAPH.get(low, set())


# -- the floors: services, benchmarks ---------------------------------------------------------------

SERVICES = ("teaagent_agent", "teaagent_relay", "teaagent_approver")
BENCHES = "teaagent_bench"  # the checkout's bench/ folder: no package of the library


def _foreign_imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    """The top-level packages outside ``teaagent`` that ``path`` imports (at module level only, if asked)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_foreign_import_reader_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from teaagent_relay import create_app\n")
    assert _foreign_imports(module) == {"os", "teaagent_relay"}
    assert _foreign_imports(module, top_level_only=True) == {"os"}


def test_no_package_of_the_library_imports_a_service_but_the_command_line() -> None:
    # The command line is the top floor: it starts the services (teaagent relay serve...).
    importers = {
        module: sorted(_foreign_imports(path) & set(SERVICES))
        for module, path in MODULES.items()
        if module != "teaagent.cli" and not module.startswith("teaagent.cli.")
    }
    assert {module: found for module, found in importers.items() if found} == {}


def test_no_library_module_is_bench_code() -> None:
    # The benchmarks live in bench/ (teaagent_bench); the one module of that name is the command.
    benches = [
        module for module in MODULES if "_bench" in module.rpartition(".")[2] or module.endswith("bench")
    ]
    assert benches == ["teaagent.cli._bench"]


def test_the_library_imports_the_benches_only_in_the_bench_command() -> None:
    importers = sorted(module for module, path in MODULES.items() if BENCHES in _foreign_imports(path))
    assert importers == ["teaagent.cli._bench"]
    # ...and only when the command runs: importing the command line loads no benchmark.
    assert BENCHES not in _foreign_imports(MODULES["teaagent.cli._bench"], top_level_only=True)


# -- the house: each package on its floor (docs/architecture.md, "The house") ----------------------

ARCHITECTURE = Path(__file__).parent.parent / "docs" / "architecture.md"
FLOOR_ROW = re.compile(r"^\| (\d)\. [^|]+\| ([^|]+)\|")


def _floors_in_the_docs() -> dict[str, int]:
    """The house's table: each package named in a floor's row (`teaagent.x` or `teaagent._x`)."""
    floors: dict[str, int] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        row = FLOOR_ROW.match(line)
        if row:
            for name in re.findall(r"`teaagent\.(\w+)`", row.group(2)):
                floors[name] = int(row.group(1))
    return floors


FLOORS = _floors_in_the_docs()


def test_the_house_puts_every_package_of_the_library_on_one_floor() -> None:
    packages = {name for name in PACKAGE_GRAPH if name != "__main__"}
    assert sorted(packages - FLOORS.keys()) == [], "packages the house's table does not place"
    assert sorted(FLOORS.keys() - packages) == [], "names in the house's table that are no package"


def test_every_import_points_down_or_along_its_floor() -> None:
    upward = sorted(
        f"{package} (floor {FLOORS[package]}) imports {target} (floor {FLOORS[target]})"
        for package, targets in PACKAGE_GRAPH.items()
        if package in FLOORS
        for target in targets
        if target in FLOORS and FLOORS[target] > FLOORS[package]
    )
    assert upward == []


def test_the_floor_check_sees_an_import_that_points_up() -> None:
    # The check above, on a graph where the protocol floor would import the store.
    graph = {"quorum": {"store"}}
    assert any(FLOORS[target] > FLOORS[package] for package, targets in graph.items() for target in targets)
