"""``/model``, ``/permission``, ``/approvals``: which model runs, and what runs without asking."""

from __future__ import annotations

from typing import Final

from teaagent._words import moment, needed_from
from teaagent.errors import ConfigError
from teaagent.llm import PROVIDER_CONFIGS
from teaagent.policy import PermissionMode
from teaagent.tui._base import TUIBase
from teaagent.tui._common import ModelChoice

_MODE_NOTES: Final = {
    PermissionMode.READ_ONLY: "reads only; nothing is written or run",
    PermissionMode.WORKSPACE_WRITE: "writes inside the workspace; destructive calls are refused, never asked",
    PermissionMode.PROMPT: "reads freely; asks before anything that writes or runs",
    PermissionMode.ALLOW: "writes freely; asks before anything destructive",
    PermissionMode.DANGER_FULL_ACCESS: "does anything without asking (high-risk calls still need the quorum)",
}


def model_names(tui: TUIBase) -> list[str]:
    names = list(tui.node.models) if tui.node is not None else []
    return names + [f"{provider}/{PROVIDER_CONFIGS[provider].default_model}" for provider in PROVIDER_CONFIGS]


def parse_model(tui: TUIBase, text: str) -> ModelChoice:
    node = tui.node
    if node is not None and text in node.models:
        settings = node.models[text]
        return ModelChoice(settings.provider, settings.model, text)
    provider, slash, rest = text.partition("/")
    if slash and provider in PROVIDER_CONFIGS and rest:
        return ModelChoice(provider, rest)
    if text in PROVIDER_CONFIGS:
        # A provider alone: the node's model when it is the node's provider, else its default.
        if node is not None and node.agent.provider == text and node.agent.model:
            return ModelChoice(text, node.agent.model)
        return ModelChoice(text, PROVIDER_CONFIGS[text].default_model)
    return ModelChoice(tui._choice.provider, text)


def cmd_model(tui: TUIBase, argument: str) -> None:
    if argument:
        tui._choice = parse_model(tui, argument)
        tui._save_tui_state()
        tui._screen.say(
            f"Model: {tui._choice.label}"
            + (f" ([models.{tui._choice.name}])" if tui._choice.name else "")
            + "."
        )
        return
    tui._screen.say(
        f"Model: {tui._choice.label}" + (f" ([models.{tui._choice.name}])" if tui._choice.name else "")
    )
    if tui.node is not None and tui.node.models:
        tui._screen.say("Configured in [models]:")
        for name, settings in tui.node.models.items():
            mark = " (current)" if tui._choice.name == name else ""
            tui._screen.say(f"  {name}: {settings.provider}/{settings.model}{mark}")
    tui._screen.say(
        f"Providers: {', '.join(PROVIDER_CONFIGS)}. Switch with /model NAME or /model PROVIDER/MODEL.",
        "dim",
    )


def cmd_permission(tui: TUIBase, argument: str) -> None:
    if argument:
        try:
            tui._mode = PermissionMode(argument)
        except ValueError:
            known = ", ".join(mode.value for mode in PermissionMode)
            tui._screen.say(f"{argument!r} is not a permission mode; choose one of {known}.", "yellow")
            return
        tui._save_tui_state()
        tui._screen.say(f"Permission mode: {tui._mode.value} ({_MODE_NOTES[tui._mode]}).")
        return
    for mode in PermissionMode:
        mark = "*" if mode is tui._mode else " "
        tui._screen.say(f" {mark} {mode.value.ljust(18)} {_MODE_NOTES[mode]}")
    tui._screen.say("Set it with /permission MODE.", "dim")


def cmd_approvals(tui: TUIBase, _argument: str) -> None:
    say = tui._screen.say
    say(f"Permission mode: {tui._mode.value} ({_MODE_NOTES[tui._mode]}).")
    say(
        "Destructive calls: approved without asking (allow_destructive)."
        if tui.allow_destructive
        else "Destructive calls: "
        + (
            "refused."
            if tui._mode in (PermissionMode.READ_ONLY, PermissionMode.WORKSPACE_WRITE)
            else "asked about, unless approved below."
        )
    )
    tools = sorted(tui._jit.session_approved_tools)
    say(f"Approved for this session: {', '.join(tools) if tools else 'nothing yet'}.")
    from teaagent.policy import ApprovalPresetStore

    try:
        presets = ApprovalPresetStore(tui.root).list()
    except ConfigError as exc:
        say(f"Workspace presets: unusable ({exc}).", "red")
        presets = []
    if presets:
        say(f"Workspace presets ({ApprovalPresetStore(tui.root).path}):")
        for preset in presets:
            scope = f", run {preset.origin_run_id}" if preset.origin_run_id else ""
            until = f", until {moment(preset.expires_at)}" if preset.expires_at else ""
            digest = f", only {preset.payload_digest[:19]}…" if preset.payload_digest else ""
            say(f"  {preset.preset_id}  {preset.tool_pattern}{digest}{scope}{until}")
    else:
        say("Workspace presets: none.")
    if tui.node is not None and tui.node.quorum.enabled:
        quorum = tui.node.quorum
        say(
            f"High-risk calls ({', '.join(quorum.high_risk_patterns)}) also need "
            f"{needed_from(quorum.required_approvals, len(quorum.peer_agent_ids))} "
            f"({', '.join(quorum.peer_agent_ids)}): no local approval replaces the quorum."
        )
