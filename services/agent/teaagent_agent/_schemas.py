"""The shapes the agent HTTP API promises (the seed's ``agent-http-api-schemas.py``), at the edge only.

These are the wire types; inside, the service works with the library's own values (runner events,
sessions, the node configuration) and converts them here, so the wire format stays a decision of
this package. Two additions to the seed: ``ResultOut.events`` (the run's frames, when
``keep_events`` asks for them) and ``ResultOut.cancelled``.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "APPROVAL_MODES",
    "PERMISSION_NAMES",
    "AnswerOut",
    "ApprovalAnswer",
    "ApprovalPolicy",
    "CancelledOut",
    "CompactRequest",
    "CompactionOut",
    "ContextOut",
    "ContextShareOut",
    "CurrentSessionOut",
    "DayTotalsOut",
    "DoctorOut",
    "DoctorRequest",
    "FrameOut",
    "HealthOut",
    "HistoryOut",
    "ImageIn",
    "MentionOut",
    "MentionsOut",
    "MessageOut",
    "ModelCheckOut",
    "ModelCreate",
    "ModelOut",
    "ModelTotalsOut",
    "ModelUpdate",
    "ModelsOut",
    "PendingOut",
    "PermissionName",
    "PluginsOut",
    "PromptRequest",
    "QuestionAnswer",
    "RenameRequest",
    "ResolvedOut",
    "ResultOut",
    "ResumableOut",
    "ResumeRequest",
    "RunOptions",
    "RunStateOut",
    "SelfCompactionOut",
    "SelfCompactionUpdate",
    "SessionCreate",
    "SessionOut",
    "SessionStatsListOut",
    "SessionStatsOut",
    "SessionTotalsOut",
    "SessionsOut",
    "SettingsOut",
    "SettingsUpdate",
    "SideQuestionRequest",
    "SteerIn",
    "SteeredOut",
    "ToolOut",
    "TotalsOut",
    "UsageOut",
    "WorkspaceUsageOut",
]

#: The shell permission levels a run starts with (see ``teaagent_agent._catalog`` for the modes).
PermissionName = Literal["deny", "ask", "safe", "auto"]
PERMISSION_NAMES: Final = ("deny", "ask", "safe", "auto")
#: How a run answers the shell commands the model asks to run.
ApprovalMode = Literal["deny", "auto", "commands", "ask"]
APPROVAL_MODES: Final = ("deny", "auto", "commands", "ask")
#: Whether a question the model asks waits for the client.
QuestionMode = Literal["ask", "decline"]
MAX_TEXT_CHARS: Final = 200_000  # a prompt with a pasted file, not a data set
MAX_IMAGES: Final = 8


class _In(BaseModel):
    """A request body; unknown keys are ignored, as the seed's shapes do (``ModelCreate`` excepted)."""


class _Strict(BaseModel):
    """A request body that refuses unknown keys: they would be written into the configuration file."""

    model_config = ConfigDict(extra="forbid")


class ApprovalPolicy(_In):
    """The rule a run answers shell approvals with.

    A run over HTTP is unattended unless the client stays in the conversation: the agent waits
    inside the gate until the request is answered. ``deny`` refuses every command (the default),
    ``auto`` approves every one, and ``commands`` approves only the commands named and refuses the
    rest. ``ask`` leaves each one to the client: it arrives in the stream as ``approval_requested``
    and is answered with ``POST /runs/approvals``, or denied once ``answer_timeout`` runs out.

    Which calls are put to this rule is the permission's decision (``GET /settings``); a high-risk
    call needs the peers' quorum as well, whatever the rule says.

    Attributes:
        mode: Which rule applies.
        commands: The commands ``commands`` approves, such as ``"git status"``. A command matches when
            it is one of them or continues one with arguments; one holding a shell character
            (``;``, ``|``, ``&&``, ``$``, a backquote, a redirection...) never matches.
    """

    mode: ApprovalMode = "deny"
    commands: list[str] = Field(default_factory=list, max_length=100)


class RunOptions(_In):
    """What every run answers with, whether it starts a prompt or continues an interrupted one.

    Attributes:
        approvals: How the calls the permission leaves to a person are answered.
        questions: ``ask`` sends a question the model asks down the stream and waits for
            ``POST /runs/questions``; ``decline`` tells the model the reader is not there.
        timeout: Seconds the whole run may take before it is stopped, or ``None`` for no deadline.
        answer_timeout: Seconds an ``ask`` approval or question waits for the client before the
            safe default is applied (deny, decline), so a client that went away cannot hang the run.
        keep_events: Include every frame in the final result as well.
    """

    approvals: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    questions: QuestionMode = "decline"
    timeout: float | None = Field(default=None, gt=0, le=86_400)
    answer_timeout: float = Field(default=300.0, gt=0, le=3600)
    keep_events: bool = False


class ImageIn(_In):
    """An image sent with a prompt, base64 encoded.

    Attributes:
        data: The file's bytes, base64 encoded (no data-URL prefix).
        media_type: ``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``.
    """

    data: str = Field(min_length=1)
    media_type: str = Field(min_length=1)


class PromptRequest(RunOptions):
    """One prompt, streamed as it runs.

    Attributes:
        text: What to ask the agent; ``@path`` references are resolved when ``mentions`` is on.
        images: Pictures for a model that takes them.
        mentions: Resolve ``@`` references in the text: each names a file of the workspace, whose
            text is sent with the prompt.
    """

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    images: list[ImageIn] = Field(default_factory=list, max_length=MAX_IMAGES)
    mentions: bool = True


class ResumeRequest(RunOptions):
    """Continue the request that was interrupted; nothing is asked, so only the answers are named."""


class HealthOut(BaseModel):
    """What ``/health`` answers: the process is up, and what it has to work with.

    Attributes:
        ready: Whether the current model can run (configured, and its API key known).
        session: The current session, if any.
        models: How many models are configured.
        busy: Whether a run is going.
    """

    status: Literal["ok"] = "ok"
    version: str
    workspace: str
    ready: bool = False
    session: str | None = None
    models: int = 0
    busy: bool


class UsageOut(BaseModel):
    """Token counts, for the session or for one run."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    seconds: float = 0.0
    requests: int = 0
    context_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Return input plus output."""
        return self.input_tokens + self.output_tokens


class ModelOut(BaseModel):
    """One configured model."""

    name: str
    model: str
    context_window: int
    multimodal: bool
    efforts: list[str]
    active: bool = False
    compact_percent: float = 80.0


class ModelsOut(BaseModel):
    """Every configured model, and which one a run would use."""

    models: list[ModelOut]
    current: str | None = None


class SettingsOut(BaseModel):
    """The model, reasoning effort and permission a run starts with.

    Attributes:
        unsaved: Why the settings could not be kept for the next start of the service, when
            they could not (they still apply until it stops).
    """

    model: ModelOut
    effort: str
    efforts: list[str]
    permission: PermissionName
    permissions: list[str]
    unsaved: str | None = None


class SettingsUpdate(_In):
    """A change to what a run starts with; every field left out stays as it is."""

    model: str | None = Field(default=None, min_length=1, max_length=64)
    effort: str | None = Field(default=None, max_length=64)
    permission: PermissionName | None = None
    compact_percent: float | None = Field(default=None, gt=0, le=100)


class ModelCreate(_Strict):
    """One model to write into the configuration file (a ``[models.NAME]`` table).

    The keys are the file's own. The table's name is ``display_model`` when given, else ``model``
    (1 to 64 letters, digits, ``.``, ``_``, ``:`` or ``-``). A token may be left out when the
    environment names one (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``).
    """

    model: str = Field(min_length=1, max_length=200)
    token: str | None = Field(default=None, max_length=1000)
    display_model: str | None = Field(default=None, max_length=64)
    base_url: str | None = Field(default=None, max_length=2000)
    anthropic: bool = False
    responses_api: bool = False
    multimodal: bool = False
    context_window: int | None = Field(default=None, ge=1, le=100_000_000)
    compact_percent: float | None = Field(default=None, gt=0, le=100)
    reasoning_efforts: list[str] = Field(default_factory=list, max_length=20)

    def entry(self) -> dict[str, object]:
        """Return the file keys to write, leaving out what was not given."""
        data = self.model_dump(exclude_none=True)
        for flag in ("anthropic", "responses_api", "multimodal"):
            if not data.get(flag):
                data.pop(flag, None)
        if not data.get("reasoning_efforts"):
            data.pop("reasoning_efforts", None)
        return data


class ModelUpdate(_Strict):
    """Changes to one configured model; a key left out stays as it is, and the token is kept."""

    model: str | None = Field(default=None, min_length=1, max_length=200)
    token: str | None = Field(default=None, max_length=1000)
    display_model: str | None = Field(default=None, max_length=64)
    base_url: str | None = Field(default=None, max_length=2000)
    anthropic: bool | None = None
    responses_api: bool | None = None
    multimodal: bool | None = None
    context_window: int | None = Field(default=None, ge=1, le=100_000_000)
    compact_percent: float | None = Field(default=None, gt=0, le=100)
    reasoning_efforts: list[str] | None = Field(default=None, max_length=20)

    def changes(self) -> dict[str, object]:
        """Return only the keys the request set, as the file writes them."""
        return self.model_dump(exclude_unset=True, exclude_none=True)


class SessionOut(BaseModel):
    """One stored session, as a list shows it."""

    id: str
    title: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    current: bool = False


class SessionsOut(BaseModel):
    """The stored sessions, most recently active first."""

    sessions: list[SessionOut]


class CurrentSessionOut(BaseModel):
    """The conversation the next prompt continues.

    Attributes:
        locked: Whether another process holds the workspace, so that no run can start.
    """

    id: str
    title: str | None = None
    locked: bool = False
    usage: UsageOut


class SessionCreate(_In):
    """The body of a new session: a name for it, or none until one is written."""

    title: str | None = Field(default=None, max_length=500)


class RenameRequest(_In):
    """A new name for a session."""

    title: str = Field(min_length=1, max_length=500)


class ToolOut(BaseModel):
    """One tool call and how it ended."""

    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: str = ""
    ok: bool = True
    skipped: bool = False


class MessageOut(BaseModel):
    """One message of a stored conversation."""

    role: str
    text: str
    tool_calls: list[ToolOut] = Field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    ok: bool = True
    images: int = 0
    usage: UsageOut | None = None
    seconds: float = 0.0


class HistoryOut(BaseModel):
    """A stored conversation, oldest message first."""

    messages: list[MessageOut]


class CompactRequest(_In):
    """How much of the conversation a compaction keeps as it is.

    Attributes:
        keep: The newest messages kept verbatim; the older ones are folded into a summary.
        timeout: Seconds the model may take to write the summary.
    """

    keep: int = Field(default=4, ge=0, le=1000)
    timeout: float = Field(default=120.0, gt=0, le=600)


class CompactionOut(BaseModel):
    """A compaction: how much was folded into the summary, and how much was kept."""

    applied: bool
    summary: str = ""
    compressed: int = 0
    kept: int = 0


class ContextShareOut(BaseModel):
    """One source filling the context window."""

    name: str
    tokens: int
    items: int = 0


class ContextOut(BaseModel):
    """How full the context window is, and what is filling it."""

    window: int
    used: int
    measured_by: str
    shares: list[ContextShareOut] = Field(default_factory=list)
    partial: bool = False
    from_provider: bool = False


class FrameOut(BaseModel):
    """One frame of a run's stream, as ``keep_events`` keeps it."""

    id: int
    event: str
    data: dict[str, Any]


class ResultOut(BaseModel):
    """What a finished run came to.

    Attributes:
        stop: How it ended: the runner's status (``completed``, ``failed``, ``approval_denied``,
            ``limit_exceeded``, ``cost_exceeded``), or ``cancelled`` or ``timeout``.
        stop_message: The sentence that says why it did not complete.
        questions: The questions the model asked.
        events: Every frame before this one, with ``keep_events``.
    """

    text: str
    session_id: str
    usage: UsageOut
    tools: list[ToolOut] = Field(default_factory=list)
    stop: str | None = None
    stop_message: str | None = None
    questions: list[str] = Field(default_factory=list)
    run_id: str | None = None
    events: list[FrameOut] | None = None


class CancelledOut(BaseModel):
    """Whether there was a run to stop."""

    cancelled: bool


class ApprovalAnswer(_In):
    """The client's answer to one approval the run is waiting on.

    Attributes:
        call_id: The ``call_id`` of the ``approval_requested`` frame.
        approve: Run the call, or refuse it.
        remember: Let the same kind of call run unasked for the rest of the run: a command of the
            same program (``echo hi`` lets ``echo bye`` run, not ``touch x``), another tool's
            calls of that tool. A compound or unparsable command (a pipe, ``;``, ``&&``, a
            subshell...) or one run through a launcher (``env``, ``sudo``, ``sh``...) is
            approved once only: its ``remember_supported`` is false.
    """

    call_id: str = Field(min_length=1, max_length=200)
    approve: bool = Field(strict=True)
    remember: bool = Field(strict=True, default=False)


class QuestionAnswer(_In):
    """The client's answer to one question the model asked.

    Attributes:
        call_id: The ``call_id`` of the ``question_asked`` frame.
        answer: The text to send the model; ``null`` declines the question.
    """

    call_id: str = Field(min_length=1, max_length=200)
    answer: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)


class SteerIn(_In):
    """A message for the run in progress."""

    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


class SteeredOut(BaseModel):
    """Whether a running request took the message; ``false`` when nothing was running."""

    steered: bool


class PendingOut(BaseModel):
    """The approval or question a run is waiting on, so a reconnecting client can answer it.

    ``kind`` is ``quorum`` while a high-risk call waits for the peers' signatures (nothing for the
    client to answer: ``request_id``, ``signers`` and ``denied_by`` say how it stands).
    """

    kind: Literal["approval", "question", "quorum"]
    call_id: str
    command: str | None = None
    timeout_seconds: int | None = None
    remember_supported: bool = False
    question: str | None = None
    options: list[str] = Field(default_factory=list)
    allow_multiple: bool = False
    tool_name: str | None = None
    request_id: str | None = None
    required: int | None = None
    signers: list[str] = Field(default_factory=list)
    denied_by: list[str] = Field(default_factory=list)


class RunStateOut(BaseModel):
    """Whether a run is going, and what it waits on if it is.

    Attributes:
        last_event_id: The id of the newest frame, for ``GET /runs/events`` with ``Last-Event-ID``.
    """

    running: bool
    pending: PendingOut | None = None
    session_id: str | None = None
    run_id: str | None = None
    last_event_id: int = 0


class ResolvedOut(BaseModel):
    """Whether an answer reached the request it named."""

    resolved: bool


class ResumableOut(BaseModel):
    """Where the conversation was interrupted, and what continuing would do."""

    resumable: bool
    kind: str | None = None
    description: str | None = None


class SideQuestionRequest(_In):
    """A question answered on the side: it never joins the conversation.

    Attributes:
        question: What to ask.
        timeout: Seconds to wait for the answer, or ``None`` for no deadline.
    """

    question: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    timeout: float | None = Field(default=None, gt=0, le=3600)


class AnswerOut(BaseModel):
    """The answer to a side question."""

    answer: str


class PluginsOut(BaseModel):
    """The plugins this server loaded, and the ones that refused to load."""

    loaded: list[str]
    failures: list[str]


class MentionOut(BaseModel):
    """One ``@`` resource a prompt can carry, as a completion menu lists it."""

    token: str
    kind: str
    name: str
    description: str


class MentionsOut(BaseModel):
    """The ``@`` resources matching what was typed."""

    mentions: list[MentionOut]


class TotalsOut(BaseModel):
    """Token counters added up over some replies, as the run logs record them."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0
    cache_share: float | None = None
    cost_cents: float = 0.0


class SessionTotalsOut(BaseModel):
    """One session in the workspace's usage."""

    id: str
    title: str | None = None
    started: datetime
    updated: datetime
    tokens: TotalsOut
    models: list[str] = Field(default_factory=list)
    entries: int = 0


class ModelTotalsOut(BaseModel):
    """What one model was charged across the workspace."""

    model: str
    tokens: TotalsOut


class DayTotalsOut(BaseModel):
    """What one day spent across the workspace."""

    day: date
    tokens: TotalsOut


class WorkspaceUsageOut(BaseModel):
    """What the workspace's runs have spent: by session, by model, by UTC day, and in all."""

    sessions: list[SessionTotalsOut]
    models: list[ModelTotalsOut]
    days: list[DayTotalsOut]
    total: TotalsOut


class SessionStatsOut(BaseModel):
    """The totals of one session."""

    id: str
    entries: int = 0
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0
    cache_share: float | None = None


class SessionStatsListOut(BaseModel):
    """The stored totals of the sessions asked for."""

    stats: list[SessionStatsOut]


class SelfCompactionOut(BaseModel):
    """Whether the session is compacted before a run that would overfill the window, and its own choice."""

    choice: bool | None = None
    effective: bool


class SelfCompactionUpdate(_In):
    """A choice about self-compaction: ``true``, ``false``, or ``null`` to follow the default."""

    choice: bool | None = Field(default=None, strict=True)


class ModelCheckOut(BaseModel):
    """One model asked one short question by ``/doctor``."""

    model: str
    model_id: str
    ok: bool
    seconds: float
    detail: str = ""
    input_tokens: int | None = None
    output_tokens: int | None = None


class DoctorOut(BaseModel):
    """Every configured model, and whether it answers."""

    checks: list[ModelCheckOut]


class DoctorRequest(_In):
    """How long each model may take to answer."""

    timeout: float = Field(default=30.0, gt=0, le=300)
