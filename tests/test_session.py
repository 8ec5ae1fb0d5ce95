"""Chat messages, sessions and the focus stack (the store is in test_session_store.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import re
import threading
from datetime import datetime

import pytest

from teaagent.session import (
    FOCUS_KINDS,
    MAX_FOCUS_ENTRIES,
    MAX_FOCUS_NOTE_CHARS,
    MAX_FOCUS_VALUE_CHARS,
    MAX_LABEL_CHARS,
    MESSAGE_ROLES,
    ChatMessage,
    ChatSession,
    ChatToolCall,
    FocusEntry,
    FocusStackManager,
    check_session_id,
    new_session,
)

T0 = "2026-06-05T12:00:00.000000Z"
T1 = "2026-06-05T12:05:00.000000Z"


# -- ChatMessage ------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", MESSAGE_ROLES)
def test_message_accepts_each_role(role: str) -> None:
    message = ChatMessage(role, "hello")
    assert (message.role, message.content) == (role, "hello")


@pytest.mark.parametrize("role", ["function", "User", "", "assistant "])
def test_message_rejects_other_roles(role: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"^message role {re.escape(repr(role))} is not one of user, assistant, system, tool\.$",
    ):
        ChatMessage(role, "hello")


def test_message_content_must_be_text() -> None:
    with pytest.raises(TypeError, match=r"^message content must be a string, not bytes\.$"):
        ChatMessage("user", b"hello")  # type: ignore[arg-type]


def test_message_is_frozen() -> None:
    message = ChatMessage("user", "hello")
    with pytest.raises(dataclasses.FrozenInstanceError):
        message.content = "changed"  # type: ignore[misc]


def test_message_round_trip_and_strict_shape() -> None:
    message = ChatMessage("assistant", "ünïcode ✓\nline two")
    assert ChatMessage.from_dict(message.to_dict()) == message
    with pytest.raises(ValueError, match=r"exactly the keys 'content' and 'role'"):
        ChatMessage.from_dict({"role": "user", "content": "x", "extra": 1})
    with pytest.raises(ValueError, match=r"^message content must be a string, not int\.$"):
        ChatMessage.from_dict({"role": "user", "content": 5})


# -- ChatSession ------------------------------------------------------------------------------------


def test_new_session_is_empty_and_stamped_now() -> None:
    before = datetime.now().astimezone()
    session = new_session("fix the parser")
    after = datetime.now().astimezone()
    assert re.fullmatch(r"[0-9a-f]{32}", session.id)
    assert session.created_at == session.updated_at
    assert session.created_at.endswith("Z")
    assert before <= datetime.fromisoformat(session.created_at) <= after
    assert session.label == "fix the parser"
    assert session.messages == []
    assert len(session.focus_stack) == 0
    assert new_session().id != session.id


def test_new_session_takes_a_chosen_id() -> None:
    assert new_session(session_id="my-session_1").id == "my-session_1"
    with pytest.raises(ValueError, match="must be 1 to 64 letters"):
        new_session(session_id="../escape")


def test_add_message_appends_and_moves_updated_at() -> None:
    session = ChatSession("s1", T0, T0)
    message = session.add_message("user", "hi")
    assert session.messages == [message] == [ChatMessage("user", "hi")]
    assert datetime.fromisoformat(session.updated_at) > datetime.fromisoformat(T0)
    assert session.created_at == T0
    with pytest.raises(ValueError, match="message role 'robot'"):
        session.add_message("robot", "beep")
    assert len(session.messages) == 1


@pytest.mark.parametrize("session_id", ["a", "A-b_9", "x" * 64])
def test_session_ids_that_name_a_file(session_id: str) -> None:
    assert check_session_id(session_id) == session_id
    assert ChatSession(session_id, T0, T0).id == session_id


@pytest.mark.parametrize("session_id", ["", "x" * 65, "../x", "a/b", "a.json", ".", "..", "a b", "é", 7])
def test_session_ids_that_could_escape_or_clash_are_refused(session_id: object) -> None:
    message = rf"^session id {re.escape(repr(session_id))} must be 1 to 64 letters, digits, '_' or '-'\.$"
    with pytest.raises(ValueError, match=message):
        ChatSession(session_id, T0, T0)  # type: ignore[arg-type]


def test_timestamps_must_be_iso_8601_with_a_zone() -> None:
    with pytest.raises(ValueError, match=r"^created_at 'yesterday' is not an ISO 8601 timestamp\.$"):
        ChatSession("s", "yesterday", T0)
    with pytest.raises(ValueError, match=r"^updated_at '2026-06-05T12:00:00' does not name its time zone"):
        ChatSession("s", T0, "2026-06-05T12:00:00")
    assert ChatSession("s", "2026-06-05T14:00:00+02:00", T0).created_at == "2026-06-05T14:00:00+02:00"


def test_label_length_boundary() -> None:
    assert ChatSession("s", T0, T0, label="x" * MAX_LABEL_CHARS).label == "x" * MAX_LABEL_CHARS
    with pytest.raises(ValueError, match=rf"^a session label is limited to {MAX_LABEL_CHARS} characters\.$"):
        ChatSession("s", T0, T0, label="x" * (MAX_LABEL_CHARS + 1))


def test_messages_and_focus_stack_are_type_checked() -> None:
    with pytest.raises(TypeError, match=r"^a session's messages must be a list of ChatMessage\.$"):
        ChatSession("s", T0, T0, messages=[{"role": "user", "content": "x"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^focus_stack must be a FocusStackManager, not list\.$"):
        ChatSession("s", T0, T0, focus_stack=[])  # type: ignore[arg-type]


def test_session_positional_fields_follow_the_spec() -> None:
    stack = FocusStackManager()
    session = ChatSession("s", T0, T1, [ChatMessage("system", "be brief")], "label", stack)
    assert [f.name for f in dataclasses.fields(ChatSession)] == [
        "id",
        "created_at",
        "updated_at",
        "messages",
        "label",
        "focus_stack",
    ]
    assert session.focus_stack is stack


def test_session_round_trip_through_dict() -> None:
    session = ChatSession("s", T0, T1, label="work")
    session.add_message("user", "open parse.py")
    session.focus_stack.push("file", "src/parse.py", "the bug is here")
    session.focus_stack.push("task", "write a failing test")
    data = session.to_dict()
    assert data["version"] == 1
    assert ChatSession.from_dict(data) == session


def test_session_from_dict_refuses_other_shapes() -> None:
    data = ChatSession("s", T0, T1).to_dict()
    with pytest.raises(ValueError, match=r"^session format version 2 is not 1\.$"):
        ChatSession.from_dict({**data, "version": 2})
    with pytest.raises(ValueError, match="a session must be an object with exactly the keys"):
        ChatSession.from_dict({**data, "extra": True})
    with pytest.raises(ValueError, match=r"^a session's messages must be a list\.$"):
        ChatSession.from_dict({**data, "messages": {}})
    with pytest.raises(ValueError, match=r"^a session label must be a string, not int\.$"):
        ChatSession.from_dict({**data, "label": 3})


# -- FocusEntry -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", FOCUS_KINDS)
def test_focus_entry_kinds(kind: str) -> None:
    entry = FocusEntry(kind, "x")
    assert entry.note == ""
    assert datetime.fromisoformat(entry.pushed_at).tzinfo is not None


def test_focus_entry_validation() -> None:
    with pytest.raises(ValueError, match=r"^focus kind 'dir' is not one of file, task\.$"):
        FocusEntry("dir", "src")
    with pytest.raises(ValueError, match=r"^a focus entry needs a non-empty value\.$"):
        FocusEntry("file", "  ")
    assert FocusEntry("file", "v" * MAX_FOCUS_VALUE_CHARS).value == "v" * MAX_FOCUS_VALUE_CHARS
    with pytest.raises(ValueError, match=rf"^a focus value is limited to {MAX_FOCUS_VALUE_CHARS} characters"):
        FocusEntry("file", "v" * (MAX_FOCUS_VALUE_CHARS + 1))
    assert FocusEntry("task", "t", "n" * MAX_FOCUS_NOTE_CHARS).note == "n" * MAX_FOCUS_NOTE_CHARS
    with pytest.raises(ValueError, match=rf"^a focus note is limited to {MAX_FOCUS_NOTE_CHARS} characters"):
        FocusEntry("task", "t", "n" * (MAX_FOCUS_NOTE_CHARS + 1))
    with pytest.raises(ValueError, match="pushed_at 'now' is not an ISO 8601 timestamp"):
        FocusEntry("task", "t", pushed_at="now")


def test_focus_entry_round_trip_and_strict_shape() -> None:
    entry = FocusEntry("file", "a.py", "why", T0)
    assert FocusEntry.from_dict(entry.to_dict()) == entry
    with pytest.raises(ValueError, match="a focus entry must be an object with exactly the keys"):
        FocusEntry.from_dict({"kind": "file", "value": "a.py"})


# -- FocusStackManager ------------------------------------------------------------------------------


def test_push_peek_pop_in_stack_order() -> None:
    stack = FocusStackManager()
    assert stack.peek() is None
    assert stack.pop() is None
    first = stack.push("file", "a.py")
    second = stack.push("task", "fix a")
    assert stack.peek() is second
    assert stack.list() == [first, second]
    assert stack.pop() is second
    assert stack.pop() is first
    assert stack.pop() is None
    assert len(stack) == 0


def test_pushing_what_is_on_top_changes_nothing() -> None:
    stack = FocusStackManager()
    top = stack.push("file", "a.py", "first note")
    again = stack.push("file", "a.py", "second note")
    assert again is top
    assert len(stack) == 1
    assert stack.peek() == top
    assert stack.list()[0].note == "first note"  # the note is not replaced
    stack.push("task", "a.py")  # same value, other kind: a different focus
    stack.push("file", "a.py")  # not on top any more: pushed again
    assert [(e.kind, e.value) for e in stack] == [("file", "a.py"), ("task", "a.py"), ("file", "a.py")]


def test_a_full_stack_drops_its_oldest_entry() -> None:
    stack = FocusStackManager()
    for number in range(MAX_FOCUS_ENTRIES):
        stack.push("file", f"f{number}")
    assert len(stack) == MAX_FOCUS_ENTRIES  # exactly full: nothing dropped yet
    assert stack.list()[0].value == "f0"
    stack.push("file", "one more")
    assert len(stack) == MAX_FOCUS_ENTRIES
    assert stack.list()[0].value == "f1"
    assert stack.peek() == stack.list()[-1]
    assert stack.list()[-1].value == "one more"


def test_max_size_bounds() -> None:
    small = FocusStackManager(max_size=1)
    small.push("file", "a")
    small.push("file", "b")
    assert [e.value for e in small] == ["b"]
    assert FocusStackManager(max_size=MAX_FOCUS_ENTRIES).max_size == MAX_FOCUS_ENTRIES
    for bad in (0, MAX_FOCUS_ENTRIES + 1, True, 2.0):
        with pytest.raises(ValueError, match=rf"^max_size must be an integer from 1 to {MAX_FOCUS_ENTRIES}"):
            FocusStackManager(max_size=bad)  # type: ignore[arg-type]


def test_constructor_checks_entries() -> None:
    a, b = FocusEntry("file", "a"), FocusEntry("file", "b")
    assert FocusStackManager([a, b, a]).list() == [a, b, a]
    with pytest.raises(ValueError, match=r"^a focus stack of max_size 2 cannot hold 3 entries\.$"):
        FocusStackManager([a, b, a], max_size=2)
    with pytest.raises(ValueError, match=r"^the focus file 'a' appears twice in a row\.$"):
        FocusStackManager([a, FocusEntry("file", "a", "other note")])
    with pytest.raises(TypeError, match=r"^a focus stack holds FocusEntry objects, not str\.$"):
        FocusStackManager(["a"])  # type: ignore[list-item]


def test_clear_returns_what_it_removed() -> None:
    stack = FocusStackManager()
    entries = [stack.push("file", "a"), stack.push("task", "b")]
    assert stack.clear() == entries
    assert stack.list() == []
    assert stack.clear() == []


def test_list_is_a_copy() -> None:
    stack = FocusStackManager()
    stack.push("file", "a")
    listed = stack.list()
    listed.clear()
    assert len(stack) == 1


def test_stack_round_trip_keeps_entries_and_size() -> None:
    stack = FocusStackManager(max_size=5)
    stack.push("file", "src/a.py", "bug")
    stack.push("task", "add a test")
    data = stack.to_dict()
    assert data == {"max_size": 5, "entries": [e.to_dict() for e in stack.list()]}
    assert FocusStackManager.from_dict(data) == stack
    assert FocusStackManager.from_dict(data) != FocusStackManager(stack.list(), max_size=6)
    with pytest.raises(ValueError, match="exactly the keys 'entries', 'max_size'"):
        FocusStackManager.from_dict({"entries": []})
    with pytest.raises(ValueError, match=r"^a focus stack's entries must be a list\.$"):
        FocusStackManager.from_dict({"entries": {}, "max_size": 5})


def test_stack_copies_and_pickles_with_a_fresh_lock() -> None:
    session = ChatSession("s", T0, T0)
    session.focus_stack.push("file", "a.py")
    for clone in (copy.deepcopy(session), pickle.loads(pickle.dumps(session))):  # noqa: S301 - our own bytes
        assert clone == session
        clone.focus_stack.push("task", "only in the clone")
        assert len(clone.focus_stack) == 2
        assert len(session.focus_stack) == 1


def test_stack_is_unhashable_since_it_is_mutable() -> None:
    with pytest.raises(TypeError, match="unhashable"):
        hash(FocusStackManager())


def test_concurrent_pushes_keep_the_stack_bounded_and_whole() -> None:
    stack = FocusStackManager()
    barrier = threading.Barrier(4)

    def pusher(name: str) -> None:
        barrier.wait()
        for number in range(500):
            stack.push("task", f"{name}-{number}")
            if number % 7 == 0:
                stack.pop()

    threads = [threading.Thread(target=pusher, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = stack.list()
    assert len(entries) == MAX_FOCUS_ENTRIES
    assert len({e.value for e in entries}) == len(entries)
    assert FocusStackManager.from_dict(stack.to_dict()) == stack  # the invariants still hold


def test_a_runs_tool_calls_round_trip_and_only_the_conversation_is_conversational() -> None:
    calls = (ChatToolCall(call_id="c1", tool_name="fs.read", arguments={"path": "a"}),)
    messages = [
        ChatMessage("user", "read a"),
        ChatMessage("assistant", "Reading.", tool_calls=calls),
        ChatMessage("tool", '{"content": "x"}', tool_call_id="c1", tool_name="fs.read", ok=False),
        ChatMessage("assistant", "It says x."),
    ]
    stored = [message.to_dict() for message in messages]
    assert stored[0] == {"role": "user", "content": "read a"}  # as before: no tool keys
    assert stored[1]["tool_calls"] == [{"call_id": "c1", "tool_name": "fs.read", "arguments": {"path": "a"}}]
    assert stored[2] == {
        "role": "tool",
        "content": '{"content": "x"}',
        "tool_call_id": "c1",
        "tool_name": "fs.read",
        "ok": False,
    }
    assert [ChatMessage.from_dict(json.loads(json.dumps(item))) for item in stored] == messages
    assert [message.conversational for message in messages] == [True, False, False, True]


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "assistant", "content": "x", "tool_calls": {}},
        {"role": "assistant", "content": "x", "tool_calls": [{"call_id": "c"}]},
        {
            "role": "assistant",
            "content": "x",
            "tool_calls": [{"call_id": 1, "tool_name": "t", "arguments": {}}],
        },
        {"role": "tool", "content": "x", "tool_call_id": 3},
        {"role": "tool", "content": "x", "ok": "no"},
    ],
)
def test_a_malformed_tool_field_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"a (message's|tool call)"):
        ChatMessage.from_dict(bad)


def test_a_session_id_and_a_run_id_are_file_ids_refused_in_the_same_words() -> None:
    from teaagent._files import FILE_ID_PATTERN, check_file_id
    from teaagent.cost_tracker import RUN_ID_PATTERN, check_run_id
    from teaagent.session import SESSION_ID_PATTERN, check_session_id

    assert SESSION_ID_PATTERN is RUN_ID_PATTERN is FILE_ID_PATTERN
    assert check_file_id("a-b_1", "thing id") == check_run_id("a-b_1") == check_session_id("a-b_1") == "a-b_1"
    for check, what in ((check_run_id, "run id"), (check_session_id, "session id")):
        with pytest.raises(
            ValueError, match=rf"^{what} '\.\./x' must be 1 to 64 letters, digits, '_' or '-'\.$"
        ):
            check("../x")
