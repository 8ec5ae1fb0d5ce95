"""teaagent.policy: permission modes, approval sources and prompts (the local check).

The path checks are in ``test_policy_paths.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from policy_support import DESTROY, KINDS, READ, WRITE, ScriptedPrompter, authorize, check, exactly

from teaagent._canonical import payload_digest
from teaagent.errors import ApprovalDeniedError, TeaAgentError
from teaagent.policy import (
    ApprovalPolicy,
    ApprovalPresetStore,
    ApprovalSource,
    Authorization,
    JITApprovalState,
    MultiSigQuorumConfig,
    PermissionMode,
    PromptAnswer,
    PromptRequest,
)

# -- the table: mode x kind x approval source -----------------------------------------------------

SOURCES = [
    "none",
    "allow_all_destructive",
    "payload_digest",
    "jit_once",
    "jit_session",
    "preset",
    "prompt_once",
    "prompt_session",
    "prompt_deny",
    "preapproved_call_id",
]
APPROVING = {
    "allow_all_destructive": ApprovalSource.ALLOW_ALL_DESTRUCTIVE,
    "payload_digest": ApprovalSource.PAYLOAD_DIGEST,
    "jit_once": ApprovalSource.JIT_ONCE,
    "jit_session": ApprovalSource.JIT_SESSION,
    "preset": ApprovalSource.PRESET,
    "prompt_once": ApprovalSource.PROMPT_ONCE,
    "prompt_session": ApprovalSource.PROMPT_SESSION,
}
PROMPTS = {"prompt_once", "prompt_session", "prompt_deny"}
MODE = ApprovalSource.PERMISSION_MODE


def expected(mode: PermissionMode, kind: str, source: str) -> ApprovalSource | None:
    """The module docstring's table, cell by cell: the approving source, or None for a denial."""
    if kind == "read-only" or mode is PermissionMode.DANGER_FULL_ACCESS:
        return MODE
    if mode is PermissionMode.READ_ONLY:
        return None
    if kind == "writing" and mode in (PermissionMode.WORKSPACE_WRITE, PermissionMode.ALLOW):
        return MODE
    if source == "allow_all_destructive" and kind != "destructive":
        return None
    if mode is PermissionMode.WORKSPACE_WRITE and source in PROMPTS:
        return None  # workspace-write never asks
    return APPROVING.get(source)


def build(mode: PermissionMode, kind: tuple[str, dict[str, Any], dict[str, bool]], source: str, root: Path):
    tool, arguments, _ = kind
    fields: dict[str, Any] = {}
    jit = JITApprovalState()
    prompter = None
    if source == "allow_all_destructive":
        fields["allow_all_destructive"] = True
    elif source == "payload_digest":
        fields["preapproved_payload_digests"] = frozenset({payload_digest(tool, arguments)})
    elif source == "jit_once":
        jit.approve_once("c1")
    elif source == "jit_session":
        jit.approve_session(tool)
    elif source == "preset":
        store = ApprovalPresetStore(root)
        store.add(tool)
        fields["approval_store"] = store
    elif source in PROMPTS:
        prompter = ScriptedPrompter(PromptAnswer(source.removeprefix("prompt_")))
    elif source == "preapproved_call_id":
        fields["preapproved_call_ids"] = frozenset({"c1"})
    policy = ApprovalPolicy(
        permission_mode=mode,
        agent_id="alpha",
        workspace_root=str(root),
        jit_state=jit,
        prompter=prompter,
        **fields,
    )
    return policy, prompter


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode", list(PermissionMode))
def test_mode_kind_source_table(workspace: Path, mode: PermissionMode, kind: str, source: str) -> None:
    policy, prompter = build(mode, KINDS[kind], source, workspace)
    want = expected(mode, kind, source)
    if want is None:
        with pytest.raises(ApprovalDeniedError, match=rf"^{re.escape(KINDS[kind][0])}"):
            authorize(policy, KINDS[kind])
    else:
        assert authorize(policy, KINDS[kind]).source is want
    asked = len(prompter.asked) if prompter is not None else 0
    should_ask = (
        source in PROMPTS and want is not MODE and mode in (PermissionMode.PROMPT, PermissionMode.ALLOW)
    )
    assert asked == (1 if should_ask else 0)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("mode", list(PermissionMode))
def test_at_once_settles_what_the_mode_settles_and_leaves_the_rest_untouched(
    workspace: Path, mode: PermissionMode, kind: str, source: str
) -> None:
    policy, prompter = build(mode, KINDS[kind], source, workspace)
    tool, arguments, annotations = KINDS[kind]
    want = expected(mode, kind, source)
    denied_by_mode = mode is PermissionMode.READ_ONLY and kind != "read-only"
    if denied_by_mode:
        with pytest.raises(ApprovalDeniedError, match=rf"^{re.escape(tool)}"):
            policy.authorize_at_once(
                tool, "c1", annotations["destructive"], arguments, read_only=annotations["read_only"]
            )
    else:
        got = policy.authorize_at_once(
            tool, "c1", annotations["destructive"], arguments, read_only=annotations["read_only"]
        )
        # The mode's own allowance is decided here; any other source needs someone (or something used up).
        assert (got.source if got is not None else None) is (MODE if want is MODE else None)
    # Nothing was asked or used up: the full check still decides exactly as the table says.
    assert prompter is None or prompter.asked == []
    if want is None:
        with pytest.raises(ApprovalDeniedError):
            authorize(policy, KINDS[kind])
    else:
        assert authorize(policy, KINDS[kind]).source is want


def test_at_once_leaves_a_high_risk_call_to_the_quorum(workspace: Path) -> None:
    quorum = MultiSigQuorumConfig(
        enabled=True,
        required_approvals=1,
        peer_agent_ids=["beta"],
        peer_public_keys={
            "beta": Ed25519PrivateKey.generate()
            .public_key()
            .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
            .decode()
        },
        peer_relay_urls={"beta": "http://127.0.0.1:9001"},
        local_relay_base_url="http://127.0.0.1:9000",
        high_risk_patterns=["fs.read"],
    )
    policy = ApprovalPolicy.for_workspace(
        workspace, mode=PermissionMode.DANGER_FULL_ACCESS, use_presets=False, multi_sig_config=quorum
    )
    tool, arguments, _ = READ
    assert policy.authorize_at_once(tool, "c1", False, arguments, read_only=True) is None
    assert policy.authorize_at_once("fs.list", "c2", False, {}, read_only=True) is not None


# -- the denial sentences ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "kind", "message"),
    [
        ("read-only", WRITE, "fs.write is not read-only and the permission mode is read-only."),
        ("read-only", DESTROY, "fs.delete is destructive and the permission mode is read-only."),
        ("workspace-write", DESTROY, "fs.delete is destructive and the permission mode is workspace-write."),
        (
            "prompt",
            WRITE,
            "fs.write is not read-only and the permission mode is prompt, "
            "and nobody is available to approve it.",
        ),
        (
            "allow",
            DESTROY,
            "fs.delete is destructive and the permission mode is allow, "
            "and nobody is available to approve it.",
        ),
    ],
)
def test_denial_is_one_sentence_naming_tool_and_reason(
    workspace: Path, mode: str, kind: tuple[str, dict[str, Any], dict[str, bool]], message: str
) -> None:
    policy = ApprovalPolicy(
        permission_mode=PermissionMode(mode), agent_id="alpha", workspace_root=str(workspace)
    )
    with pytest.raises(ApprovalDeniedError, match=exactly(message)):
        check(policy, kind)


def test_shell_run_message_of_the_brief(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly("shell.run is destructive and the permission mode is workspace-write."),
    ):
        policy.assert_allowed("shell.run", "c1", True, {"command": "rm -rf build"})


def test_denial_is_a_teaagent_error_and_the_spec_reexport(workspace: Path) -> None:
    import teaagent.errors
    import teaagent.policy

    assert teaagent.policy.ApprovalDeniedError is teaagent.errors.ApprovalDeniedError
    policy = ApprovalPolicy.for_workspace(workspace, mode="read-only")
    with pytest.raises(TeaAgentError):
        check(policy, WRITE)


# -- fail closed ------------------------------------------------------------------------------------


def test_read_only_must_be_said_explicitly(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="read-only")
    with pytest.raises(
        ApprovalDeniedError, match=exactly("fs.read is not read-only and the permission mode is read-only.")
    ):
        policy.assert_allowed("fs.read", "c1", False, {"path": "notes.txt"})
    policy.assert_allowed("fs.read", "c1", False, {"path": "notes.txt"}, read_only=True)


@pytest.mark.parametrize("read_only", [1, "yes", None])
def test_read_only_truthy_but_not_true_is_not_read_only(workspace: Path, read_only: Any) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="read-only")
    with pytest.raises(ApprovalDeniedError):
        policy.assert_allowed("fs.read", "c1", False, {"path": "notes.txt"}, read_only=read_only)


def test_a_tool_both_read_only_and_destructive_counts_as_destructive(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="read-only")
    with pytest.raises(
        ApprovalDeniedError, match=exactly("fs.read is destructive and the permission mode is read-only.")
    ):
        policy.assert_allowed("fs.read", "c1", True, {"path": "notes.txt"}, read_only=True)


@pytest.mark.parametrize("destructive", [None, 0, "no"])
def test_destructive_anything_but_false_counts_as_destructive(workspace: Path, destructive: Any) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(ApprovalDeniedError, match="is destructive"):
        policy.assert_allowed("fs.delete", "c1", destructive, {"path": "notes.txt"})


@pytest.mark.parametrize("tool", ["", None])
def test_a_call_without_a_tool_name_is_denied(workspace: Path, tool: Any) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="danger-full-access")
    with pytest.raises(
        ApprovalDeniedError, match=exactly(f"a tool call without a tool name ({tool!r}) is denied.")
    ):
        policy.assert_allowed(tool, "c1", False, {}, read_only=True)


def test_prompt_once_with_an_empty_call_id_still_works(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(
        workspace, mode="prompt", prompter=ScriptedPrompter(PromptAnswer.ONCE)
    )
    assert policy.authorize("fs.write", "", False, {"path": "a"}).source is ApprovalSource.PROMPT_ONCE


def test_arguments_that_are_not_an_object_are_denied(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="danger-full-access")
    with pytest.raises(
        ApprovalDeniedError, match=exactly("fs.write was called with arguments that are not an object.")
    ):
        policy.assert_allowed("fs.write", "c1", False, ["notes.txt"])  # type: ignore[arg-type]


def test_read_only_mode_admits_no_approval_of_any_kind(workspace: Path) -> None:
    store = ApprovalPresetStore(workspace)
    store.add("*")
    jit = JITApprovalState()
    jit.approve_once("c1")
    jit.approve_session("fs.delete")
    prompter = ScriptedPrompter(PromptAnswer.SESSION)
    policy = ApprovalPolicy(
        permission_mode=PermissionMode.READ_ONLY,
        allow_all_destructive=True,
        preapproved_payload_digests=frozenset({payload_digest(*DESTROY[:2])}),
        approval_store=store,
        jit_state=jit,
        prompter=prompter,
        agent_id="alpha",
        workspace_root=str(workspace),
    )
    with pytest.raises(
        ApprovalDeniedError, match=exactly("fs.delete is destructive and the permission mode is read-only.")
    ):
        check(policy, DESTROY)
    assert prompter.asked == []
    assert jit.is_call_approved("c1")  # not consumed either: nothing was even looked at


# -- stories, one per approval source ---------------------------------------------------------------


def test_payload_digest_approves_exactly_that_call(workspace: Path) -> None:
    approved = {"command": "make clean"}
    policy = dataclasses.replace(
        ApprovalPolicy.for_workspace(workspace),
        preapproved_payload_digests=frozenset({payload_digest("shell.run", approved)}),
    )
    assert policy.authorize("shell.run", "c1", True, approved).source is ApprovalSource.PAYLOAD_DIGEST
    with pytest.raises(ApprovalDeniedError):  # other arguments
        policy.assert_allowed("shell.run", "c2", True, {"command": "make clean; rm -rf ~"})
    with pytest.raises(ApprovalDeniedError):  # same arguments, other tool
        policy.assert_allowed("shell.exec", "c3", True, approved)


def test_arguments_without_a_digest_match_no_digest(workspace: Path) -> None:
    policy = dataclasses.replace(
        ApprovalPolicy.for_workspace(workspace),
        preapproved_payload_digests=frozenset({"sha256:" + "0" * 64}),
    )
    with pytest.raises(ApprovalDeniedError, match="is destructive"):
        policy.assert_allowed("shell.run", "c1", True, {"command": float("nan")})


def test_preapproved_call_ids_are_inert_and_warned_about(
    workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="teaagent.policy"):
        policy = dataclasses.replace(
            ApprovalPolicy.for_workspace(workspace), preapproved_call_ids=frozenset({"c1"})
        )
    assert "preapproved_call_ids is inert" in caplog.text
    with pytest.raises(ApprovalDeniedError, match="is destructive"):
        policy.assert_allowed("shell.run", "c1", True, {"command": "ls"})


def test_jit_once_approves_one_call_and_is_used_up(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(ApprovalDeniedError):
        policy.assert_allowed("shell.run", "c1", True, {"command": "ls"})
    policy.jit_state.approve_once("c1")
    with pytest.raises(ApprovalDeniedError):  # another call id
        policy.assert_allowed("shell.run", "c2", True, {"command": "ls"})
    assert policy.authorize("shell.run", "c1", True, {"command": "ls"}).source is ApprovalSource.JIT_ONCE
    assert not policy.jit_state.is_call_approved("c1")
    with pytest.raises(ApprovalDeniedError):  # the same id again: used up
        policy.assert_allowed("shell.run", "c1", True, {"command": "ls"})


def test_jit_session_approves_every_call_to_that_tool_only(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    policy.jit_state.approve_session("shell.run")
    for number in range(3):
        result = policy.authorize("shell.run", f"c{number}", True, {"command": f"echo {number}"})
        assert result.source is ApprovalSource.JIT_SESSION
    with pytest.raises(ApprovalDeniedError, match=r"fs\.delete is destructive"):
        policy.assert_allowed("fs.delete", "c9", True, {"path": "notes.txt"})


def test_allow_all_destructive_approves_destructive_calls_only(workspace: Path) -> None:
    policy = ApprovalPolicy(
        permission_mode=PermissionMode.PROMPT,
        allow_all_destructive=True,
        agent_id="alpha",
        workspace_root=str(workspace),
    )
    assert authorize(policy, DESTROY).source is ApprovalSource.ALLOW_ALL_DESTRUCTIVE
    with pytest.raises(
        ApprovalDeniedError, match=r"fs\.write is not read-only and the permission mode is prompt"
    ):
        check(policy, WRITE)


def test_preset_approves_until_removed(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    assert policy.approval_store is not None
    preset = policy.approval_store.add("shell.*")
    result = policy.authorize("shell.run", "c1", True, {"command": "ls"})
    assert result == Authorization(source=ApprovalSource.PRESET, preset=preset)
    assert policy.approval_store.remove(preset.preset_id)
    with pytest.raises(ApprovalDeniedError):
        policy.assert_allowed("shell.run", "c2", True, {"command": "ls"})


def test_presets_are_scoped_by_approval_origin_run_id(workspace: Path) -> None:
    store = ApprovalPresetStore(workspace)
    store.add("fs.delete", origin_run_id="run-1")
    scoped = ApprovalPolicy.for_workspace(workspace, approval_origin_run_id="run-1")
    # The policy's origin run id wins over the call's own run id (a resumed run keeps its approvals).
    assert (
        scoped.authorize("fs.delete", "c1", True, {"path": "a"}, run_id="run-2").source
        is ApprovalSource.PRESET
    )
    other = ApprovalPolicy.for_workspace(workspace, approval_origin_run_id="run-2")
    with pytest.raises(ApprovalDeniedError):
        other.assert_allowed("fs.delete", "c1", True, {"path": "a"}, run_id="run-1")
    unscoped_policy = ApprovalPolicy.for_workspace(workspace)
    assert unscoped_policy.authorize("fs.delete", "c1", True, {"path": "a"}, run_id="run-1").source is (
        ApprovalSource.PRESET
    )
    with pytest.raises(ApprovalDeniedError):
        unscoped_policy.assert_allowed("fs.delete", "c1", True, {"path": "a"})


def test_a_corrupt_preset_file_fails_closed(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    assert policy.approval_store is not None
    policy.approval_store.add("*")
    policy.assert_allowed("shell.run", "c1", True, {"command": "ls"})
    policy.approval_store.path.write_text('{"version": 1, "presets": [')
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly("shell.run is destructive and the permission mode is workspace-write."),
    ):
        policy.assert_allowed("shell.run", "c2", True, {"command": "ls"})


# -- prompts ----------------------------------------------------------------------------------------


def test_prompt_once_asks_every_time_and_records_nothing_lasting(workspace: Path) -> None:
    prompter = ScriptedPrompter(PromptAnswer.ONCE, PromptAnswer.ONCE)
    policy = ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=prompter)
    assert authorize(policy, WRITE, "c1").source is ApprovalSource.PROMPT_ONCE
    assert authorize(policy, WRITE, "c2").source is ApprovalSource.PROMPT_ONCE
    assert len(prompter.asked) == 2
    assert policy.jit_state.approved_call_ids == set()
    assert policy.jit_state.session_approved_tools == set()


def test_prompt_session_is_remembered_for_that_tool(workspace: Path) -> None:
    prompter = ScriptedPrompter(PromptAnswer.SESSION)
    policy = ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=prompter)
    assert authorize(policy, WRITE, "c1").source is ApprovalSource.PROMPT_SESSION
    assert authorize(policy, WRITE, "c2").source is ApprovalSource.JIT_SESSION
    assert len(prompter.asked) == 1
    assert policy.jit_state.session_approved_tools == {"fs.write"}
    # The seed's is_call_approved(call_id): the session approval covers both calls of that tool.
    assert policy.jit_state.is_call_approved("c1")
    assert policy.jit_state.is_call_approved("c2")
    with pytest.raises(ApprovalDeniedError, match="asking for approval failed"):  # the script is empty
        check(policy, DESTROY, "c3")
    assert len(prompter.asked) == 2  # another tool is asked about again
    assert not policy.jit_state.is_call_approved("c3")


def test_prompt_deny(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(
        workspace, mode="allow", prompter=ScriptedPrompter(PromptAnswer.DENY)
    )
    with pytest.raises(ApprovalDeniedError, match=exactly("fs.delete was denied at the approval prompt.")):
        check(policy, DESTROY)


def test_prompt_sees_the_call(workspace: Path) -> None:
    prompter = ScriptedPrompter(PromptAnswer.ONCE)
    policy = ApprovalPolicy.for_workspace(workspace, mode="allow", prompter=prompter)
    policy.assert_allowed("fs.delete", "c7", True, {"path": "old.txt"}, reason="tidy up", run_id="run-3")
    assert prompter.asked == [
        PromptRequest(
            call_id="c7",
            tool_name="fs.delete",
            arguments={"path": "old.txt"},
            reason="tidy up",
            annotations={"read_only": False, "destructive": True},
            run_id="run-3",
        )
    ]


def test_plain_string_answers_are_understood(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=ScriptedPrompter("session"))
    assert authorize(policy, WRITE).source is ApprovalSource.PROMPT_SESSION


@pytest.mark.parametrize("answer", ["yes", None, True, ["once"]])
def test_an_answer_that_is_not_one_of_the_three_denies(workspace: Path, answer: Any) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=ScriptedPrompter(answer))
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(f"fs.write was denied because the approval prompt gave no valid answer ({answer!r})."),
    ):
        check(policy, WRITE)


def test_a_prompter_that_raises_denies(workspace: Path) -> None:
    prompter = ScriptedPrompter(EOFError("stdin is closed."))
    policy = ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=prompter)
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(
            "fs.write is not read-only and the permission mode is prompt, "
            "and asking for approval failed: stdin is closed."
        ),
    ):
        check(policy, WRITE)


def test_disabled_prompts_deny_without_asking(workspace: Path) -> None:
    prompter = ScriptedPrompter(PromptAnswer.SESSION)
    policy = dataclasses.replace(
        ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=prompter), enable_jit_prompt=False
    )
    with pytest.raises(
        ApprovalDeniedError,
        match=exactly(
            "fs.write is not read-only and the permission mode is prompt, and approval prompts are disabled."
        ),
    ):
        check(policy, WRITE)
    assert prompter.asked == []


def test_workspace_write_never_asks(workspace: Path) -> None:
    prompter = ScriptedPrompter(PromptAnswer.SESSION)
    policy = ApprovalPolicy.for_workspace(workspace, prompter=prompter)
    with pytest.raises(ApprovalDeniedError, match="permission mode is workspace-write"):
        check(policy, DESTROY)
    assert prompter.asked == []


def test_an_approval_source_spares_the_prompt(workspace: Path) -> None:
    prompter = ScriptedPrompter()
    policy = ApprovalPolicy.for_workspace(workspace, mode="prompt", prompter=prompter)
    policy.jit_state.approve_session("fs.write")
    check(policy, WRITE)
    assert prompter.asked == []


# -- construction -----------------------------------------------------------------------------------


def test_defaults_fail_closed(workspace: Path) -> None:
    policy = ApprovalPolicy(agent_id="alpha", workspace_root=str(workspace))
    assert policy.permission_mode is PermissionMode.READ_ONLY
    assert policy.preapproved_call_ids == frozenset()
    assert policy.preapproved_payload_digests == frozenset()
    assert policy.allow_all_destructive is False
    assert policy.approval_store is None
    assert policy.multi_sig_config.enabled is False
    assert policy.prompter is None
    assert policy.quorum_gate is None
    with pytest.raises(ApprovalDeniedError):
        check(policy, WRITE)


def test_for_workspace(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace, agent_id="beta")
    assert policy.permission_mode is PermissionMode.WORKSPACE_WRITE
    assert policy.agent_id == "beta"
    assert policy.workspace_root == str(workspace)
    assert isinstance(policy.approval_store, ApprovalPresetStore)
    assert policy.approval_store.path == workspace / ".teaagent" / "approval_presets.json"
    assert ApprovalPolicy.for_workspace(workspace, use_presets=False).approval_store is None


def test_the_seed_fields_can_be_given_by_position_in_the_seed_order(workspace: Path) -> None:
    store = ApprovalPresetStore(workspace)
    digest = payload_digest("shell.run", {"command": "make"})
    policy = ApprovalPolicy(
        frozenset({"c0"}),
        frozenset({digest}),
        True,
        PermissionMode.ALLOW,
        store,
        "run-1",
        False,
        MultiSigQuorumConfig.disabled(),
        "alpha",
        str(workspace),
    )
    seed_order = [
        "preapproved_call_ids",
        "preapproved_payload_digests",
        "allow_all_destructive",
        "permission_mode",
        "approval_store",
        "approval_origin_run_id",
        "enable_jit_prompt",
        "multi_sig_config",
        "agent_id",
        "workspace_root",
    ]
    positional = [f.name for f in dataclasses.fields(ApprovalPolicy) if f.init and not f.kw_only]
    assert positional == seed_order
    assert (policy.preapproved_payload_digests, policy.allow_all_destructive) == (frozenset({digest}), True)
    assert (policy.permission_mode, policy.approval_store, policy.approval_origin_run_id) == (
        PermissionMode.ALLOW,
        store,
        "run-1",
    )
    assert (policy.enable_jit_prompt, policy.agent_id, policy.workspace_root) == (
        False,
        "alpha",
        str(workspace),
    )
    assert policy == dataclasses.replace(policy)


def test_the_fields_beyond_the_seed_are_keyword_only(workspace: Path) -> None:
    fields = list(ApprovalPolicy.__dataclass_fields__)
    beyond = ("jit_state", "prompter", "quorum_gate", "origin_public_key")
    assert all(ApprovalPolicy.__dataclass_fields__[name].kw_only for name in beyond)
    assert fields.index("workspace_root") < min(fields.index(name) for name in beyond)
    seed = (frozenset(), frozenset(), False, PermissionMode.ALLOW, None, None, True)
    with pytest.raises(TypeError):
        ApprovalPolicy(*seed, MultiSigQuorumConfig.disabled(), "alpha", str(workspace), JITApprovalState())  # type: ignore[misc]


@pytest.mark.parametrize("missing", ["agent_id", "workspace_root"])
def test_agent_id_and_workspace_root_are_still_required(workspace: Path, missing: str) -> None:
    arguments: dict[str, Any] = {"agent_id": "alpha", "workspace_root": str(workspace)}
    del arguments[missing]
    with pytest.raises(TypeError, match=exactly(f"ApprovalPolicy needs {missing}.")):
        ApprovalPolicy(**arguments)


def test_the_policy_is_immutable(workspace: Path) -> None:
    policy = ApprovalPolicy.for_workspace(workspace)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.permission_mode = PermissionMode.DANGER_FULL_ACCESS  # type: ignore[misc]


def test_collections_are_frozen_copies(workspace: Path) -> None:
    digests = {payload_digest("shell.run", {"command": "ls"})}
    policy = ApprovalPolicy(
        preapproved_payload_digests=digests, agent_id="alpha", workspace_root=str(workspace)
    )  # type: ignore[arg-type]
    digests.add("sha256:" + "1" * 64)
    assert isinstance(policy.preapproved_payload_digests, frozenset)
    assert len(policy.preapproved_payload_digests) == 1


def test_permission_mode_values_and_text() -> None:
    assert [mode.value for mode in PermissionMode] == [
        "read-only",
        "workspace-write",
        "prompt",
        "allow",
        "danger-full-access",
    ]
    assert PermissionMode("prompt") is PermissionMode.PROMPT
    assert str(PermissionMode.ALLOW) == "allow"
    assert isinstance(PermissionMode.ALLOW, str)


def test_a_mode_given_as_text_is_accepted(workspace: Path) -> None:
    policy = ApprovalPolicy(permission_mode="allow", agent_id="alpha", workspace_root=str(workspace))  # type: ignore[arg-type]
    assert policy.permission_mode is PermissionMode.ALLOW


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        (
            {"permission_mode": "yolo"},
            ValueError,
            "permission mode 'yolo' is not one of "
            "read-only, workspace-write, prompt, allow, danger-full-access.",
        ),
        ({"permission_mode": 3}, TypeError, "permission_mode must be a PermissionMode, not int."),
        (
            {"preapproved_payload_digests": frozenset({"sha256:abc"})},
            ValueError,
            "preapproved payload digest 'sha256:abc' is not 'sha256:' followed by 64 hex digits.",
        ),
        (
            {"preapproved_payload_digests": "sha256:" + "0" * 64},
            TypeError,
            "preapproved_payload_digests must be a set of strings, not str.",
        ),
        ({"preapproved_call_ids": frozenset({1})}, TypeError, "preapproved_call_ids must hold only strings."),
        ({"allow_all_destructive": 1}, TypeError, "allow_all_destructive must be true or false."),
        ({"enable_jit_prompt": None}, TypeError, "enable_jit_prompt must be true or false."),
        (
            {"agent_id": "Alpha"},
            ValueError,
            "agent id 'Alpha' is not valid: use 1 to 64 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit.",
        ),
        ({"workspace_root": ""}, ValueError, "workspace_root must name the workspace directory."),
        ({"workspace_root": 5}, TypeError, "workspace_root must be a path."),
        (
            {"approval_store": "presets.json"},
            TypeError,
            "approval_store must be an ApprovalPresetStore or None.",
        ),
        (
            {"approval_origin_run_id": ""},
            ValueError,
            "approval_origin_run_id must be a non-empty string or None.",
        ),
        ({"multi_sig_config": None}, TypeError, "multi_sig_config must be a MultiSigQuorumConfig."),
        ({"jit_state": set()}, TypeError, "jit_state must be a JITApprovalState."),
        ({"prompter": "ask"}, TypeError, "prompter must be callable or None."),
        ({"quorum_gate": object()}, TypeError, "quorum_gate must have an obtain() method, or be None."),
        (
            {"origin_public_key": b"ssh"},
            TypeError,
            "origin_public_key must be an OpenSSH public key line or None.",
        ),
    ],
)
def test_bad_fields_are_refused(
    workspace: Path, fields: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments: dict[str, Any] = {"agent_id": "alpha", "workspace_root": str(workspace), **fields}
    with pytest.raises(error, match=exactly(message)):
        ApprovalPolicy(**arguments)


def test_workspace_root_accepts_a_path_object(workspace: Path) -> None:
    policy = ApprovalPolicy(agent_id="alpha", workspace_root=workspace)  # type: ignore[arg-type]
    assert policy.workspace_root == str(workspace)
    policy.assert_allowed("fs.write", "c1", False, {"path": os.path.join(workspace, "a")}, read_only=True)
