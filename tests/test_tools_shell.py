"""shell.run: a real /bin/sh, its deadline, its output bounds, and the process group it leaves nothing of."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from teaagent.tools import (
    MAX_SHELL_OUTPUT_BYTES,
    MAX_SHELL_TIMEOUT,
    TIMEOUT_EXIT_CODE,
    SchemaValidationError,
    ToolRegistry,
    workspace_registry,
)
from teaagent.tools._shell import run_shell

pytestmark = pytest.mark.slow  # every test here starts processes


@pytest.fixture
def tools(workspace: Path) -> ToolRegistry:
    return workspace_registry(workspace)


def is_gone(pid: int, *, within: float = 5.0) -> bool:
    """Whether ``pid`` has ended (or is a zombie waiting for init to reap it) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                state = handle.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


def test_exit_code_stdout_and_stderr(tools: ToolRegistry) -> None:
    result = tools.call("shell.run", {"command": "echo out; echo err >&2; exit 3"})
    assert result == {
        "exit_code": 3,
        "stdout": "out\n",
        "stderr": "err\n",
        "timed_out": False,
        "truncated": False,
    }


def test_runs_in_the_workspace_root_with_empty_stdin(tools: ToolRegistry, workspace: Path) -> None:
    result = tools.call("shell.run", {"command": "pwd; cat; echo done"})
    assert result["stdout"] == f"{os.path.realpath(workspace)}\ndone\n"
    assert result["exit_code"] == 0


def test_the_nodes_secrets_stay_out_of_the_environment(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEAAGENT_TEST_API_KEY", "sk-secret")
    tools = workspace_registry(workspace)
    result = tools.call("shell.run", {"command": 'echo "${TEAAGENT_TEST_API_KEY:-unset} $PATH"'})
    assert result["stdout"].startswith("unset /")
    chosen = workspace_registry(workspace, shell_env={"GREETING": "hi"})
    assert chosen.call("shell.run", {"command": 'echo "$GREETING"'})["stdout"] == "hi\n"


def test_a_timeout_kills_the_whole_process_group(tools: ToolRegistry, workspace: Path) -> None:
    started = time.monotonic()
    result = tools.call(
        "shell.run", {"command": "sleep 30 & echo $! > bg.pid; echo started; sleep 30", "timeout": 0.5}
    )
    elapsed = time.monotonic() - started
    assert result == {
        "exit_code": TIMEOUT_EXIT_CODE,
        "stdout": "started\n",
        "stderr": "",
        "timed_out": True,
        "truncated": False,
    }
    assert TIMEOUT_EXIT_CODE == -9
    assert elapsed < 10  # it did not wait for either sleep
    assert is_gone(int((workspace / "bg.pid").read_text()))


def test_background_jobs_do_not_outlive_the_call(tools: ToolRegistry) -> None:
    result = tools.call("shell.run", {"command": "sleep 30 & echo $!"})
    assert (result["exit_code"], result["timed_out"]) == (0, False)
    assert is_gone(int(result["stdout"]))


def test_a_command_killed_by_a_signal_reports_it_negative(tools: ToolRegistry) -> None:
    result = tools.call("shell.run", {"command": "kill -TERM $$"})
    assert (result["exit_code"], result["timed_out"]) == (-15, False)


@pytest.mark.parametrize(("size", "truncated"), [(1000, False), (1001, True)])
def test_output_boundary(workspace: Path, size: int, truncated: bool) -> None:
    result = run_shell(
        f"head -c {size} /dev/zero | tr '\\0' a; head -c {size} /dev/zero | tr '\\0' b >&2",
        cwd=workspace,
        timeout=10,
        env=None,
        max_output_bytes=1000,
    )
    assert (result.stdout, result.stderr, result.truncated) == ("a" * 1000, "b" * 1000, truncated)


def test_output_keeps_the_head_and_does_not_block_the_writer(tools: ToolRegistry) -> None:
    result = tools.call("shell.run", {"command": "yes | head -c 20000000; echo tail >&2"})
    assert result["exit_code"] == 0
    assert result["truncated"] is True
    assert result["stdout"] == "y\n" * (MAX_SHELL_OUTPUT_BYTES // 2)
    assert result["stderr"] == "tail\n"


def test_a_character_cut_at_the_bound_is_dropped(workspace: Path) -> None:
    result = run_shell("printf 'a\\303\\251'", cwd=workspace, timeout=10, env=None, max_output_bytes=2)
    assert (result.stdout, result.truncated) == ("a", True)


@pytest.mark.parametrize("timeout", [0, -1, MAX_SHELL_TIMEOUT + 0.001])
def test_the_timeout_is_bounded_by_the_schema(tools: ToolRegistry, timeout: float) -> None:
    with pytest.raises(SchemaValidationError, match=r"^shell.run: arguments are invalid at \$.timeout: "):
        tools.call("shell.run", {"command": "true", "timeout": timeout})


def test_the_largest_timeout_is_accepted(tools: ToolRegistry) -> None:
    definition = tools.validate_arguments("shell.run", {"command": "true", "timeout": MAX_SHELL_TIMEOUT})
    assert definition.name == "shell.run"


def test_an_empty_command_is_refused(tools: ToolRegistry) -> None:
    with pytest.raises(
        SchemaValidationError,
        match=r"^shell.run: arguments are invalid at \$.command: '' should be non-empty$",
    ):
        tools.call("shell.run", {"command": ""})
