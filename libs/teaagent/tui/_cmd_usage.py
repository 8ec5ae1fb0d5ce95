"""``/cost``, ``/usage``, ``/context``, ``/compact``: what the session's runs cost and carry."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

from teaagent.cost_tracker import CostTracker, RunLogWriter
from teaagent.errors import ConfigError, TeaAgentError
from teaagent.llm import LLMMessage, LLMRequest
from teaagent.runner import DEFAULT_SYSTEM_PROMPT
from teaagent.tui._base import TUIBase
from teaagent.tui._common import RUN_LABEL, USAGE_COUNTERS, Usage, count, sentence
from teaagent.tui._context import (
    COMPACT_KEEP_MESSAGES,
    COMPACT_MAX_TOKENS,
    COMPACT_SYSTEM_PROMPT,
    compacted,
    context_size,
    transcript,
)


def cmd_cost(tui: TUIBase, _argument: str) -> None:
    say = tui._screen.say
    total = Usage()
    for usage in tui._usage.values():
        total.cost_cents += usage.cost_cents
        total.runs += usage.runs
    say(f"This session: {total.cost_cents:.4f} cents over {count(total.runs, 'run')}.")
    for label, usage in sorted(tui._usage.items()):
        say(f"  {label}: {usage.cost_cents:.4f} cents")
    try:
        tracker = CostTracker(tui.root)
        by_model = tracker.get_summary_by_model()
        by_day = tracker.get_summary_by_day()
    except (OSError, ConfigError) as exc:
        say(f"The workspace's run logs cannot be read: {exc}", "red")
        return
    if not by_model:
        say("The workspace has no run logs yet.")
        return
    spent = sum(float(row["cost_cents"]) for row in by_model.values())
    today = time.strftime("%Y-%m-%d", time.gmtime())
    today_cents = float(by_day.get(today, {}).get("cost_cents", 0.0))
    say(f"This workspace: {spent:.4f} cents in all, {today_cents:.4f} today (UTC).")
    for model_name, row in sorted(by_model.items()):
        say(f"  {model_name}: {float(row['cost_cents']):.4f} cents over {count(int(row['runs']), 'run')}")


def cmd_usage(tui: TUIBase, _argument: str) -> None:
    if not tui._usage:
        tui._screen.say("No runs in this session yet.")
        return
    rows = []
    for label, usage in sorted(tui._usage.items()):
        rows.append([label, str(usage.runs), *(str(usage.counts[name]) for name in USAGE_COUNTERS)])
    tui._screen.table(["MODEL", "RUNS", "TURNS", "TOOL CALLS", "TOKENS IN", "TOKENS OUT"], rows)


def _window(tui: TUIBase) -> int | None:
    if tui.node is not None and tui._choice.name is not None:
        settings = tui.node.models.get(tui._choice.name)
        if settings is not None:
            return settings.context_window
    return None


def _tool_chars(tui: TUIBase) -> int:
    try:
        registry = tui._tools()
    except (OSError, ValueError, ConfigError):
        return 0
    specs = [
        {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
        for tool in registry.list_tools()
    ]
    return len(json.dumps(specs))


def cmd_context(tui: TUIBase, _argument: str) -> None:
    size = context_size(tui._session.messages, DEFAULT_SYSTEM_PROMPT, _tool_chars(tui), _window(tui))
    say = tui._screen.say
    say(
        f"Session {tui._session.id[:12]}: {count(size.messages, 'message')}; the next call "
        f"carries about {size.tokens} tokens of {tui._choice.label}'s {size.window} "
        f"({size.percent:.1f}%)."
    )
    say(
        f"  messages {size.message_chars // 4} tokens · system prompt {size.system_chars // 4} · "
        f"tool descriptions {size.tool_chars // 4}",
        "dim",
    )
    focus = tui._session.focus_stack.list()
    if focus:
        say("Focus: " + ", ".join(f"{entry.kind} {entry.value}" for entry in focus))
    if size.messages > COMPACT_KEEP_MESSAGES:
        say("/compact summarises the older messages.", "dim")


def cmd_compact(tui: TUIBase, argument: str) -> None:
    messages = list(tui._session.messages)
    if len(messages) <= COMPACT_KEEP_MESSAGES:
        tui._screen.say(f"Nothing to compact: the session has {count(len(messages), 'message')}.")
        return
    older = messages[:-COMPACT_KEEP_MESSAGES]
    choice = tui._choice
    try:
        adapter = tui._adapter(choice)
    except (ConfigError, ValueError, TeaAgentError) as exc:
        tui._screen.say(f"Cannot compact: {exc}", "red")
        return
    system = COMPACT_SYSTEM_PROMPT + (f" Keep in particular: {argument}" if argument else "")
    request = LLMRequest(
        messages=[LLMMessage("system", system), LLMMessage("user", transcript(older))],
        model=choice.model,
        max_tokens=COMPACT_MAX_TOKENS,
    )
    before = context_size(messages, "", 0, None).tokens
    tui._screen.status("compacting…", key="compact")
    try:
        response = asyncio.run(adapter.complete(request))
    except Exception as exc:  # the provider's error, as one sentence; the session is unchanged
        tui._screen.status(None)
        tui._screen.say(f"The session was not compacted: {sentence(exc)}", "red")
        return
    tui._screen.status(None)
    if not response.content.strip():
        tui._screen.say("The session was not compacted: the model wrote no summary.", "red")
        return
    try:
        with RunLogWriter(
            tui.root,
            secrets.token_hex(16),
            label=f"{RUN_LABEL}-compact",
            provider=choice.provider,
            model=choice.model,
        ) as writer:
            writer.record_model_call(
                choice.model, response.input_tokens, response.output_tokens, float(response.cost_cents)
            )
            writer.finish("completed")
    except OSError as exc:
        tui._screen.say(f"The compaction's cost could not be recorded: {exc}", "yellow")
    tui._usage.setdefault(choice.label, Usage()).add(
        {
            "input_tokens": response.input_tokens,
            "output_tokens": response.output_tokens,
            "cost_cents": response.cost_cents,
        }
    )
    replaced = compacted(messages, response.content)
    tui._session.messages = replaced[:-1]
    last = replaced[-1]
    tui._session.add_message(last.role, last.content)  # moves updated_at too
    try:
        tui._store.save(tui._session)
    except (OSError, ValueError) as exc:
        tui._screen.say(f"The compacted session could not be saved: {exc}", "red")
        return
    after = context_size(tui._session.messages, "", 0, None).tokens
    tui._screen.say(
        f"Compacted {count(len(older), 'message')} into a summary: about {before} → {after} tokens."
    )
