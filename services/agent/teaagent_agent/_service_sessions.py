"""The agent service's sessions: listing, switching, renaming and removing them, their history,
context and compaction, a question on the side, and the workspace's usage."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from teaagent.errors import ConfigError
from teaagent.llm import LLMMessage
from teaagent.mcp_server import WorkspaceRegistry
from teaagent.runner import DEFAULT_SYSTEM_PROMPT
from teaagent.session import ChatMessage, ChatSession, SessionStore, new_session
from teaagent.tools import ToolRegistry
from teaagent_agent._errors import ApiError, sentence
from teaagent_agent._mentions import list_mentions
from teaagent_agent._runs import MAX_TOOL_OUTPUT_CHARS, ActiveRun
from teaagent_agent._schemas import (
    CompactionOut,
    ContextOut,
    ContextShareOut,
    CurrentSessionOut,
    DayTotalsOut,
    HistoryOut,
    MentionsOut,
    MessageOut,
    ModelTotalsOut,
    SelfCompactionOut,
    SessionOut,
    SessionsOut,
    SessionStatsListOut,
    SessionStatsOut,
    SessionTotalsOut,
    ToolOut,
    TotalsOut,
    UsageOut,
    WorkspaceUsageOut,
)
from teaagent_agent._service_models import ServiceModels
from teaagent_agent._usage import Totals, scan_usage

__all__ = ["CURRENT", "ServiceSessions"]

CURRENT: Final = "current"  # stands for the current session in a path
CHARS_PER_TOKEN: Final = 4  # the estimate teaagent.budget makes too
SUMMARY_PROMPT: Final = (
    "Summarise the conversation below for your own later use: the task, what was decided and done, "
    "the files involved and what is left to do. Be complete but brief; answer with the summary only."
)
SUMMARY_PREFIX: Final = "Summary of the earlier conversation:\n"
MAX_SUMMARY_TOKENS: Final = 2048


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _tokens(chars: int) -> int:
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def _totals(totals: Totals | None) -> TotalsOut:
    return TotalsOut(**(totals or Totals()).out())


class ServiceSessions(ServiceModels):
    """The sessions of the agent service (a part of ``AgentService``)."""

    store: SessionStore
    workspaces: WorkspaceRegistry
    registry: ToolRegistry
    runs: dict[str, ActiveRun]

    def session_id(self, given: str | None, *, required: bool = True) -> str | None:
        """Resolve ``current`` (or nothing) to the current session; check the id's form."""
        if given is None or given == CURRENT:
            current = self.preferences.value.current_session
            if current is None and required:
                raise ApiError(
                    404, "not_found", "No session is current; POST /sessions or POST /runs starts one."
                )
            return current
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", given):
            raise ApiError(404, "not_found", f"No session is named {given[:80]!r}.")
        return given

    def load_session(self, session_id: str) -> ChatSession:
        try:
            session = self.store.load(session_id)
        except ConfigError as exc:
            raise ApiError(409, "invalid", sentence(str(exc))) from None
        except ValueError:
            session = None
        if session is None:
            raise ApiError(404, "not_found", f"No session is named {session_id!r}.")
        return session

    def _running(self, session_id: str) -> ActiveRun | None:
        run = self.runs.get(session_id)
        return run if run is not None and run.running else None

    def _not_busy(self, session_id: str) -> None:
        if self._running(session_id) is not None:
            raise ApiError(
                409, "busy", f"Session {session_id} has a run going; wait for it, or POST /runs/cancel."
            )

    def session_out(self, summary: Mapping[str, Any]) -> SessionOut:
        """A session as the API shows it, from the store's listing of it."""
        return self._out(summary["id"], summary["label"], summary["created_at"], summary["updated_at"])

    def _out(self, session_id: str, label: str, created_at: str, updated_at: str) -> SessionOut:
        return SessionOut(
            id=session_id,
            title=label or None,
            created_at=_parse_time(created_at),
            updated_at=_parse_time(updated_at),
            current=session_id == self.preferences.value.current_session,
        )

    def list_sessions(self) -> SessionsOut:
        return SessionsOut(sessions=[self.session_out(summary) for summary in self.store.list_sessions()])

    def create_session(self, title: str | None) -> SessionOut:
        session = new_session(label=title or "")
        self._save(session)
        self.preferences.update(current_session=session.id)
        return self._out(session.id, session.label, session.created_at, session.updated_at)

    def _save(self, session: ChatSession) -> None:
        try:
            self.store.save(session)
        except (OSError, ValueError) as exc:
            raise ApiError(500, "internal", sentence(f"the session cannot be saved: {exc}")) from None

    def _session_usage(self, session_id: str) -> UsageOut:
        totals = scan_usage(self.node.workspace, {session_id}).by_session.get(session_id)
        if totals is None:
            return UsageOut()
        return UsageOut(
            input_tokens=totals.input_tokens,
            output_tokens=totals.output_tokens,
            requests=totals.requests,
            seconds=round(totals.seconds, 3),
        )

    def workspace_locked(self) -> bool:
        """Whether another process holds the workspace."""
        try:
            holder = self.workspaces.holder(self.node.workspace)
        except OSError:
            return False
        return holder is not None and holder.owner_pid != os.getpid()

    def current_out(self, session_id: str | None = None) -> CurrentSessionOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        session = self.load_session(chosen)
        usage = self._session_usage(session.id)
        usage.context_tokens = self.context(session.id).used
        return CurrentSessionOut(
            id=session.id, title=session.label or None, locked=self.workspace_locked(), usage=usage
        )

    def switch(self, session_id: str) -> CurrentSessionOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self.load_session(chosen)
        self.preferences.update(current_session=chosen)
        return self.current_out(chosen)

    def rename(self, session_id: str, title: str) -> SessionOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self._not_busy(chosen)
        session = self.load_session(chosen)
        session.label = title
        self._save(session)
        return self._out(session.id, session.label, session.created_at, session.updated_at)

    def delete_session(self, session_id: str) -> None:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self._not_busy(chosen)
        self.load_session(chosen)
        try:
            self.store.delete(chosen)
        except OSError as exc:
            raise ApiError(
                500, "internal", sentence(f"the session cannot be removed: {exc.strerror or exc}")
            ) from None
        self.runs.pop(chosen, None)
        prefs = self.preferences.value
        changes: dict[str, Any] = {}
        if prefs.current_session == chosen:
            changes["current_session"] = None
        if chosen in prefs.self_compaction:
            changes["self_compaction"] = {k: v for k, v in prefs.self_compaction.items() if k != chosen}
        if changes:
            self.preferences.update(**changes)

    def history(self, session_id: str) -> HistoryOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        session = self.load_session(chosen)
        results = {m.tool_call_id: m for m in session.messages if m.role == "tool" and m.tool_call_id}
        messages = []
        for m in session.messages:
            tools = []
            for call in m.tool_calls:
                done = results.get(call.call_id)
                tools.append(
                    ToolOut(
                        call_id=call.call_id,
                        name=call.tool_name,
                        arguments=call.arguments,
                        output="" if done is None else done.content[:MAX_TOOL_OUTPUT_CHARS],
                        ok=done is not None and done.ok,
                        skipped=done is None,
                    )
                )
            messages.append(
                MessageOut(
                    role=m.role,
                    text=m.content,
                    tool_calls=tools,
                    tool_call_id=m.tool_call_id,
                    tool_name=m.tool_name,
                    ok=m.ok,
                )
            )
        return HistoryOut(messages=messages)

    def context(self, session_id: str | None) -> ContextOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        session = self.load_session(chosen)
        entry = self.current_model()
        window = entry.context_window if entry is not None else 0
        tools = sum(
            len(tool.name) + len(tool.description) + len(str(tool.input_schema))
            for tool in self.registry.list_tools()
        )
        shares = [
            ContextShareOut(name="system prompt", tokens=_tokens(len(DEFAULT_SYSTEM_PROMPT)), items=1),
            ContextShareOut(name="tools", tokens=_tokens(tools), items=len(self.registry.list_tools()) + 1),
        ]
        for role, name in (
            ("system", "summaries"),
            ("user", "user messages"),
            ("assistant", "assistant messages"),
        ):
            messages = [m for m in session.messages if m.role == role and m.conversational]
            if messages:
                chars = sum(len(m.content) for m in messages)
                shares.append(ContextShareOut(name=name, tokens=_tokens(chars), items=len(messages)))
        return ContextOut(
            window=window,
            used=sum(share.tokens for share in shares),
            measured_by=f"estimate: {CHARS_PER_TOKEN} characters per token",
            shares=shares,
        )

    def self_compaction(self, session_id: str) -> SelfCompactionOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self.load_session(chosen)
        choice = self.preferences.value.self_compaction.get(chosen)
        return SelfCompactionOut(
            choice=choice, effective=self.settings.self_compaction if choice is None else choice
        )

    def set_self_compaction(self, session_id: str, choice: bool | None) -> SelfCompactionOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self.load_session(chosen)
        choices = dict(self.preferences.value.self_compaction)
        if choice is None:
            choices.pop(chosen, None)
        else:
            choices[chosen] = choice
        self.preferences.update(self_compaction=choices)
        return self.self_compaction(chosen)

    async def compact(self, session_id: str, keep: int, timeout: float) -> CompactionOut:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self._not_busy(chosen)
        session = self.load_session(chosen)
        return await self._compact(session, keep, timeout)

    async def _compact(self, session: ChatSession, keep: int, timeout: float) -> CompactionOut:
        messages = session.messages
        if len(messages) <= keep or not messages:
            return CompactionOut(applied=False, kept=len(messages))
        older, kept = (messages[:-keep], messages[-keep:]) if keep else (messages, [])
        transcript = "\n\n".join(f"{m.role}: {m.content}" for m in older if m.conversational)
        summary = await self._ask_model(
            [LLMMessage("system", SUMMARY_PROMPT), LLMMessage("user", transcript)],
            timeout,
            MAX_SUMMARY_TOKENS,
        )
        session.messages = [ChatMessage("system", SUMMARY_PREFIX + summary), *kept]
        session.updated_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self._save(session)
        return CompactionOut(applied=True, summary=summary, compressed=len(older), kept=len(kept))

    async def side_question(self, question: str, timeout: float | None) -> str:
        chosen = self.session_id(None, required=False)
        history: list[LLMMessage] = [LLMMessage("system", DEFAULT_SYSTEM_PROMPT)]
        if chosen is not None:
            with contextlib.suppress(ApiError):
                history.extend(
                    LLMMessage(m.role, m.content)
                    for m in self.load_session(chosen).messages
                    if m.conversational
                )
        history.append(
            LLMMessage("user", f"A question on the side (answer it; no tool can be called): {question}")
        )
        return await self._ask_model(history, timeout, 1024)

    def usage(self) -> WorkspaceUsageOut:
        summaries = {s["id"]: s for s in self.store.list_sessions()}
        scan = scan_usage(self.node.workspace, set(summaries))
        sessions = []
        for session_id, totals in sorted(
            scan.by_session.items(),
            key=lambda item: item[1].last or datetime.min.replace(tzinfo=UTC),
            reverse=True,
        ):
            summary = summaries[session_id]
            started = _parse_time(summary["created_at"]) or totals.first
            updated = totals.last or started
            assert started is not None
            assert updated is not None
            sessions.append(
                SessionTotalsOut(
                    id=session_id,
                    title=summary["label"] or None,
                    started=started,
                    updated=max(updated, _parse_time(summary["updated_at"]) or updated),
                    tokens=_totals(totals),
                    models=sorted(totals.models),
                    entries=int(summary["message_count"]),
                )
            )
        return WorkspaceUsageOut(
            sessions=sessions,
            models=[
                ModelTotalsOut(model=name, tokens=_totals(t)) for name, t in sorted(scan.by_model.items())
            ],
            days=[DayTotalsOut(day=day, tokens=_totals(t)) for day, t in sorted(scan.by_day.items())],
            total=_totals(scan.total),
        )

    def stats(self, ids: list[str]) -> SessionStatsListOut:
        summaries = {s["id"]: s for s in self.store.list_sessions()}
        wanted = [self.session_id(given) for given in ids] if ids else list(summaries)
        known = [session_id for session_id in wanted if session_id is not None and session_id in summaries]
        scan = scan_usage(self.node.workspace, set(known))
        stats = []
        for session_id in dict.fromkeys(known):
            totals = _totals(scan.by_session.get(session_id)).model_dump()
            totals.pop("cost_cents")
            stats.append(
                SessionStatsOut(id=session_id, entries=int(summaries[session_id]["message_count"]), **totals)
            )
        return SessionStatsListOut(stats=stats)

    def mentions(self, prefix: str, limit: int) -> MentionsOut:
        return MentionsOut(mentions=list_mentions(self.node.workspace, prefix, limit))
