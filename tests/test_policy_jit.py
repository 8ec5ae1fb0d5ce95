"""teaagent.policy.JITApprovalState: once and session approvals, shared between threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from teaagent.policy import JITApprovalState, PromptAnswer, remember_key
from teaagent.policy._jit import MAX_TRACKED_CALLS


def test_starts_empty() -> None:
    state = JITApprovalState()
    assert state.approved_call_ids == set()
    assert state.session_approved_tools == set()
    assert not state.is_call_approved("c1")


def test_once_is_looked_at_without_being_used() -> None:
    state = JITApprovalState()
    state.approve_once("c1")
    assert state.is_call_approved("c1")
    assert state.is_call_approved("c1")
    assert not state.is_call_approved("c2")


def test_once_is_used_up_by_consume() -> None:
    state = JITApprovalState()
    state.approve_once("c1")
    assert state.consume("c1", tool_name="shell.run") == "once"
    assert state.consume("c1", tool_name="shell.run") is None
    assert not state.is_call_approved("c1")


def test_session_lasts_and_is_tied_to_the_tool() -> None:
    state = JITApprovalState()
    state.approve_session("shell.run")
    assert state.is_call_approved("c1", tool_name="shell.run")
    assert not state.is_call_approved("c1")  # a call id alone names no tool
    assert not state.is_call_approved("c1", tool_name="fs.delete")
    for _ in range(3):
        assert state.consume("c1", tool_name="shell.run") == "session"
    assert state.consume("c1", tool_name="fs.delete") is None


def test_a_call_id_alone_sees_the_session_approval_of_the_tool_it_was_checked_with() -> None:
    state = JITApprovalState()
    assert state.consume("c1", tool_name="shell.run") is None  # the policy looks the call up
    assert not state.is_call_approved("c1")
    state.approve_session("shell.run")  # a person answered "session" about it
    assert state.is_call_approved("c1")
    assert not state.is_call_approved("c2")  # never checked: its tool is unknown
    state.consume("c3", tool_name="fs.delete")
    assert not state.is_call_approved("c3")  # another tool's session approval is not its own
    state.clear()
    state.approve_session("shell.run")
    assert not state.is_call_approved("c1")  # a new session forgets the calls of the old one


def test_only_the_latest_calls_are_remembered() -> None:
    state = JITApprovalState()
    state.approve_session("shell.run")
    for number in range(MAX_TRACKED_CALLS + 1):
        state.consume(f"c{number}", tool_name="shell.run")
    assert not state.is_call_approved("c0")
    assert state.is_call_approved("c1")
    assert state.is_call_approved(f"c{MAX_TRACKED_CALLS}")


def test_a_once_approval_is_used_even_when_the_session_covers_the_tool() -> None:
    state = JITApprovalState()
    state.approve_session("shell.run")
    state.approve_once("c1")
    assert state.consume("c1", tool_name="shell.run") == "once"
    assert state.approved_call_ids == set()
    assert state.consume("c1", tool_name="shell.run") == "session"


def test_clear_forgets_everything() -> None:
    state = JITApprovalState()
    state.approve_once("c1")
    state.approve_session("shell.run")
    state.clear()
    assert not state.is_call_approved("c1", tool_name="shell.run")


@pytest.mark.parametrize("value", ["", None, 3])
def test_empty_or_non_string_names_are_refused(value: object) -> None:
    state = JITApprovalState()
    with pytest.raises(ValueError, match=r"^call_id must be a non-empty string\.$"):
        state.approve_once(value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^tool_name must be a non-empty string\.$"):
        state.approve_session(value)  # type: ignore[arg-type]


def test_the_spec_fields_can_be_given() -> None:
    state = JITApprovalState(approved_call_ids={"c1"}, session_approved_tools={"fs.write"})
    assert state.is_call_approved("c1")
    assert state.is_call_approved("c9", tool_name="fs.write")


def test_prompt_answers() -> None:
    assert [answer.value for answer in PromptAnswer] == ["once", "session", "deny"]
    assert str(PromptAnswer.SESSION) == "session"


def test_each_once_approval_is_consumed_by_exactly_one_of_many_racing_threads() -> None:
    state = JITApprovalState()
    calls = [f"c{number}" for number in range(200)]
    for call_id in calls:
        state.approve_once(call_id)
    threads = 16
    barrier = threading.Barrier(threads)

    def race(_: int) -> list[str]:
        barrier.wait()
        return [call_id for call_id in calls if state.consume(call_id, tool_name="shell.run") == "once"]

    with ThreadPoolExecutor(max_workers=threads) as pool:
        won = [call_id for result in pool.map(race, range(threads)) for call_id in result]
    assert sorted(won) == sorted(calls)  # each id once: no double use, no loss
    assert state.approved_call_ids == set()


def test_concurrent_approvals_are_all_kept() -> None:
    state = JITApprovalState()
    threads = 8
    barrier = threading.Barrier(threads)

    def approve(worker: int) -> None:
        barrier.wait()
        for number in range(500):
            state.approve_once(f"w{worker}-c{number}")
            state.approve_session(f"tool.{worker}.{number % 7}")
            state.is_call_approved(f"w{worker}-c{number}", tool_name="tool.0.0")

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(approve, range(threads)))
    assert len(state.approved_call_ids) == threads * 500
    assert len(state.session_approved_tools) == threads * 7


@pytest.mark.parametrize(
    ("command", "key"),
    [
        ("echo hi", "shell.run echo"),
        ('"echo" "a b"', "shell.run echo"),
        ("rm -rf /", "shell.run rm"),
        ("./build.sh --fast", "shell.run ./build.sh"),
        ("echo hi; rm x", None),
        ("echo a | sh", None),
        ("true && rm x", None),
        ("rm x &", None),
        ("echo $(rm x)", None),
        ("echo `rm x`", None),
        ("(rm x)", None),
        ("{ rm x; }", None),
        ("echo > f", None),
        ("echo hi\nrm x", None),
        ("echo 'unterminated", None),
        ("FOO=1 rm x", None),
        ("env rm x", None),
        ("/usr/bin/env rm x", None),
        ("sudo rm x", None),
        ("bash -c 'rm x'", None),
        ("xargs rm", None),
        ("*", None),
        ("", None),
        ("   ", None),
    ],
)
def test_a_command_is_remembered_by_its_program_and_a_compound_one_not_at_all(
    command: str, key: str | None
) -> None:
    assert remember_key("shell.run", {"command": command}) == key


def test_a_call_without_a_command_is_remembered_by_its_tool() -> None:
    assert remember_key("fs.write", {"path": "a", "content": "b"}) == "fs.write"
    assert remember_key("shell.run", {"command": ["rm", "x"]}) is None  # not a string: nothing


def test_a_program_approved_for_the_session_lets_that_program_only() -> None:
    state = JITApprovalState()
    state.approve_session("shell.run echo")
    assert state.consume("c1", tool_name="shell.run", key="shell.run echo") == "session"
    assert state.consume("c2", tool_name="shell.run", key="shell.run touch") is None
    assert state.consume("c3", tool_name="shell.run", key=None) is None
    assert state.is_call_approved("c1")
    assert not state.is_call_approved("c2")
    state.approve_session("shell.run")  # the whole tool, as the seed's approve_session names it
    assert state.consume("c4", tool_name="shell.run", key=None) == "session"
