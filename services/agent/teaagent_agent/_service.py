"""The agent service's state and operations, one object per application, used from the event loop only.

The routes (``_routes``) are thin: they validate, call one method of it and shape the answer.
:class:`AgentService` is built in three parts, one concept each: the models and settings
(``_service_models``), the sessions, their context and usage (``_service_sessions``), and here
the runs (starting, driving and stopping them, the workspace they hold).
Everything here runs on the event loop's thread; what blocks for long (a run's tool calls, a
quorum) runs in the runner's worker threads, and the model calls are awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import Any, Final

import teaagent
from teaagent.audit import AuditLogger
from teaagent.config import NodeConfig
from teaagent.errors import ConfigError, MissingAPIKeyError, WorkspaceLockConflictError
from teaagent.mcp_server import WorkspaceRegistry
from teaagent.runner import AgentRunner
from teaagent.runner._node import for_node, node_quorum_gate, node_registry
from teaagent.session import ChatSession, SessionStore, new_session
from teaagent_agent._catalog import (
    ModelEntry,
    make_adapter,
)
from teaagent_agent._errors import ApiError, sentence
from teaagent_agent._mentions import attach_mentions
from teaagent_agent._runs import ActiveRun, RunChannel, new_run_id
from teaagent_agent._schemas import (
    HealthOut,
    ImageIn,
    ResumableOut,
    RunOptions,
    RunStateOut,
)
from teaagent_agent._service_models import _close
from teaagent_agent._service_sessions import CURRENT, ServiceSessions
from teaagent_agent._settings import Settings
from teaagent_agent._state import PreferencesFile

__all__ = ["CURRENT", "AgentService"]

logger = logging.getLogger("teaagent.agent")

SELF_COMPACTION_KEEP: Final = 2  # messages a compaction before a run keeps verbatim
SELF_COMPACTION_SECONDS: Final = 120.0
FIRST_READ_WAIT_SECONDS: Final = 0.05  # a run whose stream nobody reads starts this much later
SHUTDOWN_SECONDS: Final = 10.0  # how long a stopping service waits for its runs to record their end
IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_BASE64: Final = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def _interrupted(session: ChatSession) -> int | None:
    """The index of the last prompt when no answer followed it (its run's tool calls may have)."""
    for index in range(len(session.messages) - 1, -1, -1):
        message = session.messages[index]
        if message.role == "user":
            return index
        if message.conversational:
            return None  # an answer (or a summary) came after the last prompt
    return None


class AgentService(ServiceSessions):
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
            raise ApiError(409, "invalid", self._not_ready(entry))
        if images:
            self._check_images(entry, images)
        chosen = self.session_id(session_id, required=False)
        if chosen is None:
            if text is None:
                raise ApiError(409, "invalid", "There is nothing to resume: no session is current.")
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
                raise ApiError(409, "invalid", f"Session {session.id} has no interrupted prompt to resume.")
            # The prompt runs again: its calls that were made stay in the audit log, not here.
            text = session.messages[interrupted].content
            del session.messages[interrupted:]
        elif mentions:
            text = attach_mentions(self.node.workspace, text)
        try:
            adapter = make_adapter(entry, script_path=self.settings.llm_script)
        except (ConfigError, MissingAPIKeyError, ValueError) as exc:
            raise ApiError(409, "invalid", sentence(str(exc))) from None
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
                    422,
                    "invalid",
                    f"images[{index}].media_type must be one of {', '.join(sorted(IMAGE_TYPES))}.",
                )
            if _BASE64.fullmatch(image.data) is None or len(image.data) % 4:
                raise ApiError(422, "invalid", f"images[{index}].data is not base64.")
        if not entry.multimodal:
            raise ApiError(
                422, "invalid", f"The model {entry.name} does not take images; send the prompt without them."
            )
        raise ApiError(
            422,
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
                raise ApiError(423, "locked", text[:1].upper() + text[1:]) from None
            except (OSError, ConfigError) as exc:
                raise ApiError(
                    423, "locked", sentence(f"the workspace lock cannot be taken: {exc}")
                ) from None
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
