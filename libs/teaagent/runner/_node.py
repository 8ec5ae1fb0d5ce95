"""What a node's configuration makes of a run: its tools, policy, quorum gate, audit log and runner.

``teaagent tools call`` (:func:`node_gate`), ``teaagent run``, the TUI and the agent service
(:func:`for_node`) build their gate the same way, so a call allowed by one is allowed by the others.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Required, TypedDict, cast

from teaagent.audit import AuditLogger
from teaagent.config import NodeConfig
from teaagent.errors import ConfigError, StoreError
from teaagent.policy import ApprovalPolicy, ApprovalPresetStore, PermissionMode, Prompter, QuorumGate
from teaagent.runner._gate import ToolGate
from teaagent.runner._runner import AgentRunner
from teaagent.tools import (
    WORKSPACE_TOOL_NAMES,
    RateDecision,
    RateLimiter,
    ToolRateLimit,
    ToolRegistry,
    workspace_registry,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from teaagent.budget import RunBudget
    from teaagent.llm import LLMAdapter
    from teaagent.relay_client import RequestStatus, WaitProgress
    from teaagent.runner._ask import AskCallback
    from teaagent.runner._events import EventSink
    from teaagent.runner._types import Validator
    from teaagent.session import ChatSession, SessionStore

__all__ = [
    "AUDIT_DIR_NAME",
    "GateOptions",
    "NodeRunOptions",
    "RunnerOptions",
    "for_node",
    "gated_runner",
    "node_audit_path",
    "node_gate",
    "node_policy",
    "node_quorum_gate",
    "node_rate_limiter",
    "node_registry",
    "open_audit",
]


AUDIT_DIR_NAME: Final = "audit"
"""The folder of ``data_dir`` that holds the node's audit log, ``<agent_id>.jsonl``."""


def node_audit_path(node: NodeConfig) -> Path:
    """Return the node's audit log: ``<data_dir>/audit/<agent_id>.jsonl`` (its key file beside it)."""
    return node.data_dir / AUDIT_DIR_NAME / f"{node.agent_id}.jsonl"


class _NodeRateLimiter:
    """The node's Redis limiter, connected at the first limited call (listing tools needs no Redis)."""

    def __init__(self, node: NodeConfig) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._limiter: RateLimiter | None = None

    def _connect(self) -> RateLimiter:
        from teaagent.store import EMBEDDED_URL, EmbeddedRedis, connect_node_sync

        node = self._node
        if node.redis_url == EMBEDDED_URL and EmbeddedRedis.running_url(node.data_dir) is None:
            # Only the relay owns the node's embedded server: an agent that started it would stop
            # it on exit, under the relay's feet. No server running: no count, no call.
            raise self._no_relay()
        # A cluster's client learns the cluster's layout here: no node answering is a StoreError too.
        return connect_node_sync(self._node).rate_limiter

    def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
        with self._lock:
            if self._limiter is None:
                self._limiter = self._connect()
            limiter = self._limiter
        try:
            return limiter.hit(key, limit)
        except StoreError as exc:
            from teaagent.store import EMBEDDED_URL, EmbeddedRedis

            with self._lock:  # a fresh client next time (a cluster may have moved its slots)
                if self._limiter is limiter:
                    self._limiter = None
            node = self._node
            if node.redis_url == EMBEDDED_URL and EmbeddedRedis.running_url(node.data_dir) is None:
                raise self._no_relay() from exc
            raise

    def _no_relay(self) -> StoreError:
        return StoreError(
            f"{self._node.agent_id}'s rate limits are counted in its embedded Redis, which runs "
            f"with its relay: start it (teaagent relay serve --config {self._node.path})"
        )


def node_rate_limiter(node: NodeConfig) -> RateLimiter:
    """Return the limiter that counts the node's tool calls in its Redis, shared by all its processes.

    It connects at the first call it counts, and again after a failure. With ``redis_url =
    "embedded"`` the node's private server is the one its relay runs (its socket and password are
    the same at every start, so a restarted relay heals this by itself); with ``redis_cluster =
    true``, the windows live on the cluster, each on the node of its slot. A Redis that cannot be
    reached fails that call: no count, no call.
    """
    return _NodeRateLimiter(node)


def node_registry(node: NodeConfig) -> ToolRegistry:
    """Return the node's tools: the built-in workspace tools bound to its workspace.

    The limits of ``[agent.rate_limits]`` are counted in the node's Redis (:func:`node_rate_limiter`),
    so that ``teaagent run``, ``tools call`` and the agent service of one node share each window; a
    node without limits never connects to Redis for them.

    Raises:
        ConfigError: ``[agent.rate_limits]`` names a tool that is not a workspace tool.
        FileNotFoundError: The workspace does not exist.
        NotADirectoryError: The workspace is not a directory.
    """
    limits = dict(node.agent.rate_limits)
    if limits:
        unknown = sorted(set(limits) - set(WORKSPACE_TOOL_NAMES))
        if unknown:
            raise ConfigError(
                f"{node.path}: agent.rate_limits names tools that are not workspace tools: "
                f"{', '.join(unknown)}."
            )
    limiter = node_rate_limiter(node) if limits else None
    return workspace_registry(node.workspace, rate_limiter=limiter, rate_limits=limits)


def node_quorum_gate(
    node: NodeConfig,
    *,
    on_progress: Callable[[str], None] | None = None,
    on_status: Callable[[RequestStatus], None] | None = None,
    on_wait: Callable[[WaitProgress], None] | None = None,
    stop: threading.Event | None = None,
) -> QuorumGate | None:
    """Return the gate that obtains quorum certificates through the node's relay, when the quorum is on.

    The relay client, the node's signing key and its token are loaded at the first high-risk
    call, so that a node whose key needs a passphrase still makes its other calls without one;
    a key or token that cannot be loaded then denies that call (the policy fails closed).

    Args:
        node: The node configuration.
        on_progress: Called with one line per step of a quorum request (sent, still waiting...).
        on_status: Called with each status the relay reports while a request waits (the agent
            service streams each peer's decision from it); see ``RelayQuorumGate``.
        on_wait: Called with the wait as every surface shows it (sent, each change, reminders of
            the time left, decided); see ``RelayQuorumGate`` and ``describe_wait``.
        stop: Set it to stop a wait for a quorum (the call is then denied and its request withdrawn).

    Returns:
        The gate; None when the quorum is disabled.
    """
    if not node.quorum.enabled:
        return None
    from teaagent.relay_client import RelayQuorumGate

    def make() -> QuorumGate:
        return RelayQuorumGate(
            relay_url=node.relay_url,
            token=node.load_token(),
            origin=node.agent_id,
            private_key_signer=node.signer(),
            config=node.quorum,
            on_progress=on_progress,
            on_status=on_status,
            on_wait=on_wait,
            stop=stop,
            verify=node.tls.client_verify(),
        )

    return _LazyGate(make)


class _LazyGate:
    """A quorum gate made at its first use."""

    def __init__(self, make: Callable[[], QuorumGate]) -> None:
        self._make = make
        self._gate: QuorumGate | None = None
        self._lock = threading.Lock()

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._gate is None:
                self._gate = self._make()
            gate = self._gate
        return gate.obtain(request)

    @property
    def last_withdrawal(self) -> str | None:
        """The gate's sentence of its last interrupted (withdrawn) wait, or None (``RelayQuorumGate``)."""
        with self._lock:
            gate = self._gate
        withdrawal = getattr(gate, "last_withdrawal", None)
        return withdrawal if isinstance(withdrawal, str) else None


def node_policy(
    node: NodeConfig,
    *,
    prompter: Prompter | None = None,
    quorum_gate: QuorumGate | None = None,
    mode: PermissionMode | str | None = None,
    approval_origin_run_id: str | None = None,
) -> ApprovalPolicy:
    """Return the approval policy of the node: its permission mode, presets, quorum and identity.

    Args:
        node: The node configuration.
        prompter: Who to ask about calls the mode leaves to a person; None denies them.
        quorum_gate: How to obtain quorum certificates; None denies every high-risk call.
        mode: A permission mode instead of the configuration's ``[agent] permission_mode``.
        approval_origin_run_id: The run whose scoped presets apply.

    Returns:
        The policy.

    Raises:
        ConfigError: The quorum is enabled and the node's own public key cannot be read.
    """
    # With the quorum on, certificates are checked against the node's own key as well: the
    # request they approve must be one this node signed.
    origin_key = node.own_public_key().to_line() if node.quorum.enabled else None
    return ApprovalPolicy(
        permission_mode=PermissionMode(mode if mode is not None else node.agent.permission_mode),
        approval_store=ApprovalPresetStore(node.workspace),
        approval_origin_run_id=approval_origin_run_id,
        multi_sig_config=node.quorum,
        agent_id=node.agent_id,
        workspace_root=str(node.workspace),
        prompter=prompter,
        quorum_gate=quorum_gate,
        origin_public_key=origin_key,
    )


def open_audit(path: Path, run_id: str, *, must_write: bool = True) -> AuditLogger:
    """Open the audit log of one run.

    Args:
        path: The log file.
        run_id: The run its records belong to.
        must_write: Fail closed: refuse a log that cannot be written (a call that cannot be put
            on record is not made). False keeps it open; the runner then fails the run at the
            first record it cannot write.

    Raises:
        ConfigError: ``must_write`` and the log cannot be written.
    """
    audit = AuditLogger(path, run_id=run_id)
    if must_write and audit.disk_error is not None:
        audit.close()
        raise ConfigError(f"The audit log {audit.path} cannot be written: {audit.disk_error}.")
    return audit


class GateOptions(TypedDict, total=False):
    """The keywords of :func:`node_gate` beside the node; :func:`for_node` takes them too.

    Attributes:
        run_id: The run the calls belong to.
        prompter: Who to ask about calls the mode leaves to a person; None denies them.
        quorum_gate: How to obtain quorum certificates (:func:`node_quorum_gate`); None denies
            every high-risk call.
        mode: A permission mode instead of the configuration's.
        registry: The tools, when not :func:`node_registry`'s (made once by a long-lived caller).
        policy_changes: Fields of :class:`~teaagent.policy.ApprovalPolicy` to set on the node's
            policy (the TUI's session approvals, for one).
        audit_must_write: See :func:`open_audit` (True when left out).
    """

    run_id: Required[str]
    prompter: Prompter | None
    quorum_gate: QuorumGate | None
    mode: PermissionMode | str | None
    registry: ToolRegistry | None
    policy_changes: Mapping[str, Any] | None
    audit_must_write: bool


def node_gate(node: NodeConfig, **options: Unpack[GateOptions]) -> ToolGate:
    """Return the gate of one run of the node: its tools, its policy and its audit log.

    Args:
        node: The node configuration.
        options: See :class:`GateOptions` (``run_id`` is required).

    Raises:
        ConfigError: The tools, the policy or the audit log cannot be made (see :func:`node_registry`,
            :func:`node_policy`, :func:`open_audit`).
    """
    run_id, registry, changes = options["run_id"], options.get("registry"), options.get("policy_changes")
    tools = node_registry(node) if registry is None else registry
    policy = node_policy(
        node,
        prompter=options.get("prompter"),
        quorum_gate=options.get("quorum_gate"),
        mode=options.get("mode"),
    )
    if changes:
        policy = dataclasses.replace(policy, **changes)
    audit = open_audit(node_audit_path(node), run_id, must_write=options.get("audit_must_write", True))
    return ToolGate(registry=tools, policy=policy, audit=audit, run_id=run_id)


class RunnerOptions(TypedDict, total=False):
    """The keywords of :class:`~teaagent.runner.AgentRunner` that :func:`gated_runner` passes on.

    All of them but what the gate gives (``registry``, ``policy``, ``audit``, ``run_id``) and
    ``root``; each means what it means there. mypy checks them against ``AgentRunner`` where
    :func:`gated_runner` passes them on.
    """

    adapter: Required[LLMAdapter]
    budget: RunBudget | None
    provider: str | None
    model: str | None
    system_prompt: str
    max_output_tokens: int
    temperature: float
    event_sink: EventSink | Iterable[EventSink] | None
    ask: AskCallback | None
    session_store: SessionStore | None
    session: ChatSession | None
    label: str
    stream: bool
    run_log: bool
    validator: Validator | None


class NodeRunOptions(GateOptions, RunnerOptions, total=False):
    """The keywords of :func:`for_node`: :class:`GateOptions` and :class:`RunnerOptions`."""


_GATE_KEYS: Final = frozenset(GateOptions.__annotations__)


def gated_runner(
    gate: ToolGate, *, root: str | os.PathLike[str] | None = None, **options: Unpack[RunnerOptions]
) -> AgentRunner:
    """Return the runner of ``gate``'s tools, policy, audit log and run; its audit log closed if it fails.

    Args:
        gate: What :func:`node_gate` made (or a node-less caller's own gate).
        root: The workspace root of the run log (see :class:`~teaagent.runner.AgentRunner`).
        options: The other arguments of :class:`~teaagent.runner.AgentRunner` (:class:`RunnerOptions`:
            ``adapter``, ``budget``...).
    """
    try:
        return AgentRunner(
            registry=gate.registry,
            policy=gate.policy,
            audit=gate.audit,
            run_id=gate.run_id,
            root=root,
            **options,
        )
    except BaseException:
        gate.audit.close()
        raise


def for_node(node: NodeConfig, **options: Unpack[NodeRunOptions]) -> AgentRunner:
    """Return the runner of one run of the node, in its workspace, through its gate (:func:`node_gate`).

    Args:
        node: The node configuration.
        options: The gate's keywords (:class:`GateOptions`: ``run_id``, ``quorum_gate``...) and
            the runner's (:class:`RunnerOptions`: ``adapter``, ``budget``, ``event_sink``...).

    Raises:
        ConfigError: See :func:`node_gate`.
    """
    gate = {key: value for key, value in options.items() if key in _GATE_KEYS}
    runner = {key: value for key, value in options.items() if key not in _GATE_KEYS}
    return gated_runner(
        node_gate(node, **cast(GateOptions, gate)), root=node.workspace, **cast(RunnerOptions, runner)
    )
