"""The agent service's state and operations, one object per application, used from the event loop only.

The routes (``_routes``) are thin: they validate, call one method here and shape the answer.
Everything here runs on the event loop's thread; what blocks for long (a run's tool calls, a
quorum) runs in the runner's worker threads, and the model calls are awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import teaagent
from teaagent.audit import AuditLogger
from teaagent.config import MODEL_NAME_PATTERN, NodeConfig
from teaagent.errors import ConfigError, LLMError, MissingAPIKeyError, WorkspaceLockConflictError
from teaagent.llm import LLMMessage, LLMRequest
from teaagent.mcp_server import WorkspaceRegistry
from teaagent.policy import PermissionMode
from teaagent.runner import DEFAULT_SYSTEM_PROMPT, AgentRunner
from teaagent.runner._node import for_node, node_quorum_gate, node_registry
from teaagent.session import ChatMessage, ChatSession, SessionStore, new_session
from teaagent_agent._catalog import (
    MODES_BY_PERMISSION,
    ModelEntry,
    make_adapter,
    models_of,
    permission_of,
)
from teaagent_agent._config_file import ModelsFileError, write_model_tables
from teaagent_agent._errors import ApiError, sentence
from teaagent_agent._mentions import attach_mentions, list_mentions
from teaagent_agent._runs import MAX_TOOL_OUTPUT_CHARS, ActiveRun, RunChannel, new_run_id
from teaagent_agent._schemas import (
    PERMISSION_NAMES,
    CompactionOut,
    ContextOut,
    ContextShareOut,
    CurrentSessionOut,
    DayTotalsOut,
    DoctorOut,
    HealthOut,
    HistoryOut,
    ImageIn,
    MentionsOut,
    MessageOut,
    ModelCheckOut,
    ModelCreate,
    ModelOut,
    ModelsOut,
    ModelTotalsOut,
    ModelUpdate,
    ResumableOut,
    RunOptions,
    RunStateOut,
    SelfCompactionOut,
    SessionOut,
    SessionsOut,
    SessionStatsListOut,
    SessionStatsOut,
    SessionTotalsOut,
    SettingsOut,
    SettingsUpdate,
    ToolOut,
    TotalsOut,
    UsageOut,
    WorkspaceUsageOut,
)
from teaagent_agent._settings import Settings
from teaagent_agent._state import PreferencesFile
from teaagent_agent._usage import Totals, scan_usage

__all__ = ["CURRENT", "AgentService"]

logger = logging.getLogger("teaagent.agent")

CURRENT: Final = "current"  # stands for the current session in a path
CHARS_PER_TOKEN: Final = 4  # the estimate teaagent.budget makes too
DOCTOR_PROMPT: Final = "Reply with the single word: ok"
SUMMARY_PROMPT: Final = (
    "Summarise the conversation below for your own later use: the task, what was decided and done, "
    "the files involved and what is left to do. Be complete but brief; answer with the summary only."
)
SUMMARY_PREFIX: Final = "Summary of the earlier conversation:\n"
MAX_SUMMARY_TOKENS: Final = 2048
SELF_COMPACTION_KEEP: Final = 2  # messages a compaction before a run keeps verbatim
SELF_COMPACTION_SECONDS: Final = 120.0
FIRST_READ_WAIT_SECONDS: Final = 0.05  # a run whose stream nobody reads starts this much later
SHUTDOWN_SECONDS: Final = 10.0  # how long a stopping service waits for its runs to record their end
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_BASE64: Final = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def _parse_time(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _interrupted(session: ChatSession) -> int | None:
    """The index of the last prompt when no answer followed it (its run's tool calls may have)."""
    for index in range(len(session.messages) - 1, -1, -1):
        message = session.messages[index]
        if message.role == "user":
            return index
        if message.conversational:
            return None  # an answer (or a summary) came after the last prompt
    return None


def _tokens(chars: int) -> int:
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def _totals(totals: Totals | None) -> TotalsOut:
    return TotalsOut(**(totals or Totals()).out())


class AgentService:
    """The service behind the routes.

    Args:
        settings: The service's settings.
        node: The node configuration.

    Raises:
        ConfigError: The token cannot be read, or the workspace is missing.
    """

    def __init__(self, *, settings: Settings, node: NodeConfig) -> None:
        self.settings = settings
        self.node = node
        self.token = node.load_token()
        try:
            self.registry = node_registry(node)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise ConfigError(
                f"{node.path}: the workspace {node.workspace} is not a folder ({exc})."
            ) from None
        self.store = SessionStore(node.workspace)
        self.preferences = PreferencesFile(node.data_dir)
        self.workspaces = WorkspaceRegistry()
        self._holders = 0
        self.runs: dict[str, ActiveRun] = {}  # by session: the one going, or the last one

    # -- health ----------------------------------------------------------------------------------

    def health(self) -> HealthOut:
        entry = self.current_model()
        return HealthOut(
            version=teaagent.__version__,
            workspace=str(self.node.workspace),
            ready=entry is not None and entry.ready(),
            session=self.preferences.value.current_session,
            models=len(self.models()),
            busy=any(run.running for run in self.runs.values()),
        )

    # -- models and settings ---------------------------------------------------------------------

    def models(self) -> list[ModelEntry]:
        overrides = self.preferences.value.compact_percent
        entries = models_of(self.node)
        return [
            entry
            if entry.name not in overrides
            else ModelEntry(**{**entry.__dict__, "compact_percent": overrides[entry.name]})
            for entry in entries
        ]

    def model(self, name: str) -> ModelEntry:
        for entry in self.models():
            if entry.name == name:
                return entry
        raise ApiError("not_found", f"No model is named {name!r}; GET /models lists them.")

    def current_model(self) -> ModelEntry | None:
        entries = self.models()
        chosen = self.preferences.value.model
        for entry in entries:
            if entry.name == chosen:
                return entry
        return entries[0] if entries else None

    def model_out(self, entry: ModelEntry) -> ModelOut:
        current = self.current_model()
        return ModelOut(
            name=entry.name,
            model=entry.model,
            context_window=entry.context_window,
            multimodal=entry.multimodal,
            efforts=list(entry.efforts),
            active=current is not None and current.name == entry.name,
            compact_percent=entry.compact_percent,
        )

    def models_out(self) -> ModelsOut:
        current = self.current_model()
        return ModelsOut(
            models=[self.model_out(entry) for entry in self.models()],
            current=None if current is None else current.name,
        )

    def _write_models(self, change: Any) -> None:
        try:
            self.node = write_model_tables(self.node.path, change, label=str(self.node.path))
        except ModelsFileError as exc:
            raise ApiError("invalid", sentence(str(exc)), status=409) from None
        except ConfigError as exc:
            raise ApiError("invalid", sentence(f"the model was not written: {exc}")) from None
        except OSError as exc:
            raise ApiError(
                "internal", sentence(f"{self.node.path} cannot be written: {exc.strerror or exc}")
            ) from None

    def add_model(self, body: ModelCreate) -> ModelOut:
        name = body.display_model or body.model
        if MODEL_NAME_PATTERN.fullmatch(name) is None:
            raise ApiError(
                "invalid",
                f"{name!r} cannot name a model: give display_model, 1 to 64 letters, digits, "
                "'.', '_', ':' or '-'.",
            )

        def change(tables: dict[str, dict[str, Any]]) -> None:
            if name in tables:
                raise ModelsFileError(
                    f"a model named {name!r} is configured already; PATCH /models/{name} changes it."
                )
            tables[name] = body.entry()

        self._write_models(change)
        return self.model_out(self.model(name))

    def update_model(self, name: str, body: ModelUpdate) -> ModelOut:
        entry = self.model(name)
        if entry.builtin:
            raise ApiError(
                "invalid",
                f"The model {name!r} is node.toml's [agent] provider, not a [models] table; "
                "add a model instead.",
                status=409,
            )
        changes = body.changes()

        def change(tables: dict[str, dict[str, Any]]) -> None:
            if name not in tables:
                raise ModelsFileError(f"no [models] table is named {name!r} any more.")
            table = tables[name]
            for key, value in changes.items():
                flag_off = key in ("anthropic", "responses_api", "multimodal") and value is False
                if flag_off or (key == "reasoning_efforts" and not value):
                    table.pop(key, None)
                else:
                    table[key] = value

        self._write_models(change)
        return self.model_out(self.model(name))

    def remove_model(self, name: str) -> None:
        entry = self.model(name)
        if entry.builtin:
            raise ApiError(
                "invalid",
                f"The model {name!r} is node.toml's [agent] provider; it cannot be removed here.",
                status=409,
            )

        def change(tables: dict[str, dict[str, Any]]) -> None:
            if tables.pop(name, None) is None:
                raise ModelsFileError(f"no [models] table is named {name!r} any more.")

        self._write_models(change)
        if self.preferences.value.model == name:
            self.preferences.update(model=None, effort=None)

    def permission_mode(self) -> PermissionMode:
        chosen = self.preferences.value.permission
        if chosen in MODES_BY_PERMISSION:
            return MODES_BY_PERMISSION[chosen]
        return self.node.agent.permission_mode

    def effort(self, entry: ModelEntry) -> str:
        chosen = self.preferences.value.effort
        if chosen is not None and chosen in entry.efforts:
            return chosen
        return entry.efforts[0] if entry.efforts else "default"

    def settings_out(self) -> SettingsOut:
        entry = self.current_model()
        if entry is None:  # pragma: no cover - the [agent] provider is always a model
            raise ApiError("invalid", "No model is configured; POST /models adds one.", status=409)
        return SettingsOut(
            model=self.model_out(entry),
            effort=self.effort(entry),
            efforts=list(entry.efforts),
            permission=permission_of(self.permission_mode()),  # type: ignore[arg-type]
            permissions=list(PERMISSION_NAMES),
            unsaved=self.preferences.unsaved,
        )

    def update_settings(self, body: SettingsUpdate) -> SettingsOut:
        changes: dict[str, Any] = {}
        entry = self.current_model()
        if body.model is not None:
            entry = self.model(body.model)
            changes["model"] = entry.name
            if self.preferences.value.effort not in entry.efforts:
                changes["effort"] = None
        assert entry is not None
        if body.effort is not None:
            if body.effort not in entry.efforts and not (body.effort == "default" and not entry.efforts):
                offered = ", ".join(entry.efforts) or "only default"
                raise ApiError(
                    "invalid", f"The model {entry.name} offers no effort {body.effort!r} ({offered})."
                )
            changes["effort"] = None if body.effort == "default" else body.effort
        if body.permission is not None:
            changes["permission"] = body.permission
        if body.compact_percent is not None:
            changes["compact_percent"] = {
                **self.preferences.value.compact_percent,
                entry.name: body.compact_percent,
            }
        if changes:
            self.preferences.update(**changes)
        return self.settings_out()

    async def doctor(self, timeout: float) -> DoctorOut:
        checks = await asyncio.gather(*(self._check(entry, timeout) for entry in self.models()))
        return DoctorOut(checks=list(checks))

    async def _check(self, entry: ModelEntry, timeout: float) -> ModelCheckOut:
        started = time.monotonic()

        def done(ok: bool, detail: str, **tokens: int) -> ModelCheckOut:
            return ModelCheckOut(
                model=entry.name,
                model_id=entry.model,
                ok=ok,
                seconds=round(time.monotonic() - started, 3),
                detail=detail,
                **tokens,
            )

        try:
            adapter = make_adapter(entry, script_path=self.settings.llm_script)
        except MissingAPIKeyError as exc:
            return done(False, str(exc))
        except (ConfigError, ValueError) as exc:
            return done(False, sentence(str(exc)))
        if entry.provider == "scripted":
            return done(True, "The offline scripted model answers without a network.")
        request = LLMRequest(messages=[LLMMessage("user", DOCTOR_PROMPT)], model=entry.model, max_tokens=16)
        try:
            response = await asyncio.wait_for(adapter.complete(request), timeout)
        except TimeoutError:
            return done(False, f"No answer within {timeout:g} seconds.")
        except Exception as exc:  # every failure of a model is its check's answer, not the service's
            return done(False, sentence(str(exc) or type(exc).__name__))
        finally:
            await _close(adapter)
        return done(
            True,
            sentence(response.content.strip()[:80] or "it answered"),
            input_tokens=response.input_tokens,
            output_tokens=response.output_tokens,
        )

    # -- sessions --------------------------------------------------------------------------------

    def session_id(self, given: str | None, *, required: bool = True) -> str | None:
        """Resolve ``current`` (or nothing) to the current session; check the id's form."""
        if given is None or given == CURRENT:
            current = self.preferences.value.current_session
            if current is None and required:
                raise ApiError("not_found", "No session is current; POST /sessions or POST /runs starts one.")
            return current
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", given):
            raise ApiError("not_found", f"No session is named {given[:80]!r}.")
        return given

    def load_session(self, session_id: str) -> ChatSession:
        try:
            session = self.store.load(session_id)
        except ConfigError as exc:
            raise ApiError("invalid", sentence(str(exc)), status=409) from None
        except ValueError:
            session = None
        if session is None:
            raise ApiError("not_found", f"No session is named {session_id!r}.")
        return session

    def _running(self, session_id: str) -> ActiveRun | None:
        run = self.runs.get(session_id)
        return run if run is not None and run.running else None

    def _not_busy(self, session_id: str) -> None:
        if self._running(session_id) is not None:
            raise ApiError(
                "busy", f"Session {session_id} has a run going; wait for it, or POST /runs/cancel."
            )

    def session_out(self, summary: Mapping[str, Any]) -> SessionOut:
        return SessionOut(
            id=summary["id"],
            title=summary["label"] or None,
            created_at=_parse_time(summary["created_at"]),
            updated_at=_parse_time(summary["updated_at"]),
            current=summary["id"] == self.preferences.value.current_session,
        )

    def list_sessions(self) -> SessionsOut:
        return SessionsOut(sessions=[self.session_out(summary) for summary in self.store.list_sessions()])

    def create_session(self, title: str | None) -> SessionOut:
        session = new_session(label=title or "")
        self._save(session)
        self.preferences.update(current_session=session.id)
        return self.session_out(self._summary(session))

    @staticmethod
    def _summary(session: ChatSession) -> dict[str, Any]:
        return {
            "id": session.id,
            "label": session.label,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
        }

    def _save(self, session: ChatSession) -> None:
        try:
            self.store.save(session)
        except (OSError, ValueError) as exc:
            raise ApiError("internal", sentence(f"the session cannot be saved: {exc}")) from None

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
        return self.session_out(self._summary(session))

    def delete_session(self, session_id: str) -> None:
        chosen = self.session_id(session_id)
        assert chosen is not None
        self._not_busy(chosen)
        self.load_session(chosen)
        try:
            self.store.delete(chosen)
        except OSError as exc:
            raise ApiError(
                "internal", sentence(f"the session cannot be removed: {exc.strerror or exc}")
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

    # -- context and compaction ------------------------------------------------------------------

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

    async def _ask_model(self, messages: list[LLMMessage], timeout: float | None, max_tokens: int) -> str:
        entry = self.current_model()
        if entry is None or not entry.ready():
            raise ApiError("invalid", self._not_ready(entry), status=409)
        try:
            adapter = make_adapter(entry, script_path=self.settings.llm_script)
        except (ConfigError, MissingAPIKeyError, ValueError) as exc:
            raise ApiError("invalid", sentence(str(exc)), status=409) from None
        request = LLMRequest(messages=messages, model=entry.model, max_tokens=max_tokens)
        try:
            response = await asyncio.wait_for(adapter.complete(request), timeout)
        except TimeoutError:
            raise ApiError(
                "timeout", f"The model {entry.name} did not answer within {timeout:g} seconds."
            ) from None
        except LLMError as exc:
            raise ApiError("run", sentence(f"the model {entry.name} failed: {exc}")) from None
        finally:
            await _close(adapter)
        return response.content.strip()

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

    # -- usage -----------------------------------------------------------------------------------

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

    # -- runs ------------------------------------------------------------------------------------

    @staticmethod
    def _not_ready(entry: ModelEntry | None) -> str:
        if entry is None:
            return "No model is configured; POST /models adds one."
        variable = teaagent.llm.PROVIDER_CONFIGS[entry.provider].api_key_env
        return (
            f"The model {entry.name} has no API key: set {variable} or PATCH /models/{entry.name} "
            "with a token."
        )

    def run_of(self, session_id: str | None) -> ActiveRun | None:
        chosen = self.session_id(session_id, required=False)
        return None if chosen is None else self.runs.get(chosen)

    def state(self, session_id: str | None) -> RunStateOut:
        run = self.run_of(session_id)
        if run is None:
            return RunStateOut(running=False, session_id=self.session_id(session_id, required=False))
        return RunStateOut(
            running=run.running,
            pending=run.pending() if run.running else None,
            session_id=run.session_id,
            run_id=run.run_id,
            last_event_id=len(run.channel.frames),
        )

    def resumable(self, session_id: str | None) -> ResumableOut:
        chosen = self.session_id(session_id, required=False)
        if chosen is None:
            return ResumableOut(resumable=False)
        if self._running(chosen) is not None:
            return ResumableOut(
                resumable=False, kind="running", description="A run is going in this session."
            )
        session = self.load_session(chosen)
        interrupted = _interrupted(session)
        if interrupted is not None:
            text = " ".join(session.messages[interrupted].content.split())
            shown = text if len(text) <= 200 else text[:199] + "…"
            return ResumableOut(
                resumable=True,
                kind="prompt",
                description=f"The last prompt got no answer; resuming runs it again: {shown}",
            )
        return ResumableOut(resumable=False)

    async def start_run(
        self,
        session_id: str | None,
        options: RunOptions,
        *,
        text: str | None,
        images: list[ImageIn] | None = None,
        mentions: bool = False,
    ) -> ActiveRun:
        """Start a run (``text``) or resume the interrupted one (``text=None``); return it once started.

        Raises:
            ApiError: ``invalid`` (no model can run, images, nothing to resume), ``not_found``,
                ``busy`` or ``locked``.
        """
        entry = self.current_model()
        if entry is None or not entry.ready():
            raise ApiError("invalid", self._not_ready(entry), status=409)
        if images:
            self._check_images(entry, images)
        chosen = self.session_id(session_id, required=False)
        if chosen is None:
            if text is None:
                raise ApiError("invalid", "There is nothing to resume: no session is current.", status=409)
            session = new_session(label=" ".join(text.split())[:80])
            self._save(session)
            self.preferences.update(current_session=session.id)
        else:
            self._not_busy(chosen)
            session = self.load_session(chosen)
        resumed = text is None
        if text is None:
            interrupted = _interrupted(session)
            if interrupted is None:
                raise ApiError(
                    "invalid", f"Session {session.id} has no interrupted prompt to resume.", status=409
                )
            # The prompt runs again: its calls that were made stay in the audit log, not here.
            text = session.messages[interrupted].content
            del session.messages[interrupted:]
        elif mentions:
            text = attach_mentions(self.node.workspace, text)
        try:
            adapter = make_adapter(entry, script_path=self.settings.llm_script)
        except (ConfigError, MissingAPIKeyError, ValueError) as exc:
            raise ApiError("invalid", sentence(str(exc)), status=409) from None
        self._hold_workspace()
        run = ActiveRun(
            session_id=session.id,
            run_id=new_run_id(),
            options=options,
            channel=RunChannel(asyncio.get_running_loop()),
        )
        # The first frame, at once: the run is the service's from here on (its runner is built
        # in its task, so that the stream starts before the audit log and run log are opened).
        run.channel.publish(
            "run_accepted",
            {"run_id": run.run_id, "session_id": session.id, "model": entry.name, "resumed": resumed},
        )
        self.runs[session.id] = run
        run.task = asyncio.create_task(self._drive(run, text, session, entry, adapter))
        return run

    def _runner(
        self, run: ActiveRun, session: ChatSession, entry: ModelEntry, adapter: Any
    ) -> tuple[AgentRunner, AuditLogger]:
        gate = node_quorum_gate(
            self.node, on_status=run.quorum_status, on_wait=run.quorum_wait, stop=run.stop_event
        )
        runner = for_node(
            self.node,
            run_id=run.run_id,
            registry=self.registry,
            prompter=run.prompter,
            quorum_gate=gate,
            mode=self.permission_mode(),
            audit_must_write=False,
            adapter=adapter,
            provider=entry.provider,
            model=entry.model,
            event_sink=run.sink,
            ask=run.ask if run.options.questions == "ask" else None,
            session_store=self.store,
            session=session,
            label=session.id,
            stream=True,
        )
        return runner, runner.audit

    def _check_images(self, entry: ModelEntry, images: list[ImageIn]) -> None:
        for index, image in enumerate(images):
            if image.media_type not in IMAGE_TYPES:
                raise ApiError(
                    "invalid", f"images[{index}].media_type must be one of {', '.join(sorted(IMAGE_TYPES))}."
                )
            if _BASE64.fullmatch(image.data) is None or len(image.data) % 4:
                raise ApiError("invalid", f"images[{index}].data is not base64.")
        if not entry.multimodal:
            raise ApiError(
                "invalid", f"The model {entry.name} does not take images; send the prompt without them."
            )
        raise ApiError(
            "invalid",
            "This node's model adapters send text only, so images cannot be sent yet; "
            "send the prompt without them.",
        )

    def _hold_workspace(self) -> None:
        if self._holders == 0:
            try:
                self.workspaces.acquire_lock(self.node.workspace)
            except WorkspaceLockConflictError as exc:
                # Whole, not cut to a sentence's length: it ends naming the holder's command line.
                text = str(exc)
                raise ApiError("locked", text[:1].upper() + text[1:]) from None
            except (OSError, ConfigError) as exc:
                raise ApiError("locked", sentence(f"the workspace lock cannot be taken: {exc}")) from None
        self._holders += 1

    def _release_workspace(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            try:
                self.workspaces.release_lock(self.node.workspace)
            except OSError as exc:
                logger.warning("the workspace lock of %s was not removed: %s", self.node.workspace, exc)

    async def _drive(
        self, run: ActiveRun, text: str, session: ChatSession, entry: ModelEntry, adapter: Any
    ) -> None:
        result = None
        error: str | None = None
        audit: AuditLogger | None = None
        try:
            # Let the response send run_accepted first: building the runner and opening its logs
            # take milliseconds of this thread, which the client need not wait for.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.channel.first_read.wait(), FIRST_READ_WAIT_SECONDS)
            await self._maybe_compact(run, session, entry)
            runner, audit = self._runner(run, session, entry, adapter)
            run.attach(runner)
            task = asyncio.create_task(runner.arun(text))
            try:
                done, _pending = await asyncio.wait({task}, timeout=run.options.timeout)
                if not done:
                    run.stop(why="timeout")
                result = await task
            except asyncio.CancelledError:
                run.stop(why="cancel")
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(task), SHUTDOWN_SECONDS)
                raise
        except asyncio.CancelledError:
            error = "The agent service stopped during the run."
            raise
        except Exception as exc:  # a bug, or a node that cannot run: the stream still ends, with a sentence
            logger.exception("the run %s failed", run.run_id)
            error = sentence(f"the run failed inside the agent service: {exc}")
        finally:
            if audit is not None:
                audit.close()
            self._release_workspace()
            await _close(adapter)
            loop = asyncio.get_running_loop()
            # Queued after every frame the run sent: the result is the last frame, whatever happened.
            loop.call_soon(self._finish, run, result, error)

    async def _maybe_compact(self, run: ActiveRun, session: ChatSession, entry: ModelEntry) -> None:
        choice = self.preferences.value.self_compaction.get(session.id)
        if not (self.settings.self_compaction if choice is None else choice):
            return
        used = self.context(session.id).used
        if used * 100 <= entry.compact_percent * entry.context_window:
            return
        try:
            # The last exchange stays when there is more; a short overfull one is folded whole.
            keep = SELF_COMPACTION_KEEP if len(session.messages) > SELF_COMPACTION_KEEP else 0
            compaction = await self._compact(session, keep, SELF_COMPACTION_SECONDS)
        except ApiError as exc:
            run.send("error", {"error": exc.code, "message": exc.message})
            return
        run.send("compacted", compaction.model_dump())

    def _finish(self, run: ActiveRun, result: Any, error: str | None) -> None:
        if run.timed_out:
            run.channel.publish(
                "error",
                {
                    "error": "timeout",
                    "message": f"The run was stopped after {run.options.timeout:g} seconds.",
                },
            )
        elif error is not None:
            run.channel.publish("error", {"error": "internal", "message": error})
        out = run.finish(result, error)
        run.channel.publish("result", out.model_dump(mode="json"))
        run.channel.close()

    async def aclose(self) -> None:
        """Stop every run and wait (a while) for each to record its end."""
        tasks = []
        for run in list(self.runs.values()):
            if run.running:
                run.stop(why="cancel")
                if run.task is not None:
                    tasks.append(run.task)
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_SECONDS)


async def _close(adapter: Any) -> None:
    """Close an adapter's HTTP client when it has one (the HTTP adapters own theirs)."""
    closer = getattr(adapter, "aclose", None)
    if callable(closer):
        with contextlib.suppress(Exception):
            await closer()
