"""Every public module imports first in a fresh interpreter, and every name in ``__all__`` exists.

A fresh interpreter per module catches import cycles that a shared one hides (sigstore's
``test_imports.py`` does the same).
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import teaagent

PUBLIC_MODULES = sorted(
    {"teaagent"}
    | {
        info.name
        for info in pkgutil.walk_packages(teaagent.__path__, prefix="teaagent.")
        if not any(part.startswith("_") for part in info.name.split("."))
    }
)
SERVICES = ["teaagent_agent", "teaagent_relay", "teaagent_approver"]


@pytest.mark.parametrize("module", PUBLIC_MODULES + SERVICES)
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("module", PUBLIC_MODULES + SERVICES)
def test_every_name_in_all_exists(module: str) -> None:
    imported = importlib.import_module(module)
    names = getattr(imported, "__all__", [])
    missing = [name for name in names if not hasattr(imported, name)]
    assert missing == []


def test_the_command_line_loads_neither_the_mcp_sdk_nor_fastapi_until_a_command_needs_them() -> None:
    """Every service and CLI call is a process: the MCP SDK (about a second) and FastAPI load only
    in the commands that serve them (``mcp serve``/``gateway``, the services' apps), aiohttp (a
    quarter of a second) only where an asyncio relay client makes its first pool."""
    code = (
        "import sys, teaagent.cli, teaagent.relay_client; "
        "print(sorted(name for name in ('mcp', 'fastapi', 'teaagent.mcp_server', 'aiohttp') "
        "if name in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_node_configuration_and_the_relay_and_approver_load_no_jsonschema() -> None:
    """jsonschema (a tenth of a second) loads when a tool's schema is first checked: the relay and
    the approver load the node's configuration, which imports the tools package, and register none."""
    code = (
        "import sys, teaagent.config, teaagent_relay, teaagent_approver; print('jsonschema' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"


@pytest.mark.parametrize("service", ["relay", "approver"])
def test_the_relays_and_the_approvers_command_and_service_load_no_httpx(service: str) -> None:
    """httpx (a tenth of a second of CPU with the rich and pygments its own command line brings)
    loads where an httpx client, the default SSL context or a webhook is first made: a relay and
    an approver call their peers and their relay through aiohttp's pool, and over plain HTTP,
    without a webhook, make none."""
    code = (
        f"import sys, teaagent.cli._{service}, teaagent_{service}; "
        "print(sorted(name for name in ('httpx', 'rich', 'pygments') if name in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_workspace_registry_and_the_agent_service_load_no_mcp_sdk() -> None:
    """The MCP SDK (about a second of CPU) loads with the MCP server's own names, when first asked
    for: the agent service, which takes its workspace's lock, and a process that only takes one
    never pay for it."""
    code = (
        "import sys, teaagent_agent; from teaagent.mcp_server import WorkspaceRegistry; "
        "print(sorted(name for name in ('mcp', 'teaagent.mcp_server._gated') if name in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_mcp_servers_names_are_there_when_asked_for_and_a_wrong_one_is_an_attribute_error() -> None:
    import teaagent.mcp_server as package
    from teaagent.mcp_server import _gated, _gateway, _transport

    assert package.GatedToolServer is _gated.GatedToolServer
    assert package.Gateway is _gateway.Gateway
    assert (package.MCP_PATH, package.serve_stdio) == (_transport.MCP_PATH, _transport.serve_stdio)
    with pytest.raises(AttributeError, match="has no attribute 'GatedToolServers'"):
        _ = package.GatedToolServers
    for name in package.__all__:
        assert getattr(package, name) is not None, name


def test_the_cli_names_the_mcp_servers_http_path_as_the_server_serves_it() -> None:
    from teaagent.cli import _mcp
    from teaagent.mcp_server._transport import MCP_PATH

    assert _mcp.MCP_PATH == MCP_PATH
    assert MCP_PATH in _mcp._HTTP_HELP
