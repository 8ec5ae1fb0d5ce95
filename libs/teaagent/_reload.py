"""The trust a running relay or approver verifies with, and reloading it without a restart.

A service verifies with its node's trust: the ``[peers]`` tables (each peer's keys, its
``allowed_signers`` file included), the ``[quorum]`` table built from them, and the keys that may
sign for the node itself (its node key and ``[approver] operators``). :class:`TrustReloader` holds
the current :class:`Trust`, one frozen snapshot, and :meth:`TrustReloader.reload` reads
``node.toml`` and those files again (as nginx and sshd do on ``SIGHUP``; ``teaagent ... serve``
calls it on ``SIGHUP``, and both services on an authenticated ``POST /v1/reload``).

Fail closed: a reload that does not load (a file that does not parse, a key that is not one, a
peer removed while the quorum still needs it...) changes nothing. The service keeps its old
trust, logs one sentence, and counts it (``outcome="failed"``). A reload that changes the node's
own identity (``agent_id``, its node key) is refused alike: that is another node, so a restart.
Other settings changed in the file (ports, rules, Redis...) apply at the next restart; the
reload says which.

Verification in flight keeps the snapshot it started with: a verifier reads
:attr:`TrustReloader.trust` once, then uses only that object (its peers, its keys, its quorum), so
a reload between two of its awaits never mixes an old peer list with new keys. Listeners
(:meth:`TrustReloader.subscribe`) drop what they cached under the old trust, on the event loop,
in the same step as the swap.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from teaagent.config import ConfigError, NodeConfig, load_config
from teaagent.trust import SignerKey

__all__ = ["RELOAD_SIGNAL_NAME", "ReloadOut", "ReloadOutcome", "Trust", "TrustReloader", "trust_reloader"]

RELOAD_SIGNAL_NAME: Final = "SIGHUP"

logger = logging.getLogger("teaagent.reload")

ReloadResult = Literal["reloaded", "unchanged", "failed"]


@dataclass(frozen=True, kw_only=True)
class Trust:
    """One consistent snapshot of what a service verifies with.

    Attributes:
        config: The node configuration, its trust as loaded at ``generation`` and every other
            setting as the service started with it.
        peer_keys: Every key of each peer, with its ``allowed_signers`` limits.
        own_keys: The keys that may sign for this node: its node key, then its operators' keys.
        generation: 1 at start, one more at each reload that changed the trust.
    """

    config: NodeConfig
    peer_keys: Mapping[str, tuple[SignerKey, ...]]
    own_keys: tuple[SignerKey, ...]
    generation: int

    @classmethod
    def of(cls, config: NodeConfig, generation: int = 1) -> Trust:
        """The trust of ``config``.

        Raises:
            ConfigError: The node's own public key cannot be read.
        """
        return cls(
            config=config,
            peer_keys={name: peer.keys for name, peer in config.peers.items()},
            own_keys=config.own_keys(),
            generation=generation,
        )

    def fingerprint_set(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """What a reload compares: each peer with its key fingerprints and URL, then this node's keys."""
        peers = tuple(
            (f"{name} {self.config.peers[name].relay_url}", tuple(_describe(key) for key in keys))
            for name, keys in self.peer_keys.items()
        )
        quorum = self.config.quorum
        settings = f"quorum {quorum.enabled} {quorum.required_approvals} {quorum.high_risk_patterns}"
        return (*peers, (settings, ()), ("self", tuple(_describe(key) for key in self.own_keys)))


def _describe(key: SignerKey) -> str:
    return f"{key.key.fingerprint} {sorted(key.namespaces or ())} {key.valid_after} {key.valid_before}"


@dataclass(frozen=True, kw_only=True)
class ReloadOutcome:
    """What one reload did.

    Attributes:
        result: ``reloaded`` (the trust changed), ``unchanged`` (read again, the same), ``failed``
            (the old trust is kept; ``problem`` says why).
        generation: The generation of the trust in use after it.
        peers: The peers of the trust in use after it.
        operators: How many keys besides the node key may sign for this node after it.
        problem: Why it failed, one sentence; None otherwise.
        restart: Other settings that differ in the file and apply only at a restart.
    """

    result: ReloadResult
    generation: int
    peers: tuple[str, ...]
    operators: int
    problem: str | None = None
    restart: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"peers": list(self.peers), "restart": list(self.restart)}


class ReloadOut(BaseModel):
    """``POST /v1/reload``: the trust was read again (a reload that fails is 422 ``reload_failed``)."""

    result: Literal["reloaded", "unchanged"] = Field(
        description="`reloaded`: the trust changed and is in use; `unchanged`: read again, the same."
    )
    generation: int = Field(description="The trust in use: 1 at start, one more per reload that changed it.")
    peers: list[str] = Field(description="The peers this service now knows.")
    operators: int = Field(description="Keys besides the node key that may sign for this node.")
    restart: list[str] = Field(
        description="Other settings that differ in node.toml: they apply at the next restart."
    )


_TRUST_FIELDS: Final = ("peers", "quorum")


def _merged(old: NodeConfig, new: NodeConfig) -> tuple[NodeConfig, tuple[str, ...]]:
    """``old`` with the trust of ``new``; and the other top-level settings that differ (restart).

    Raises:
        ConfigError: ``new`` is another node (its ``agent_id`` or its node key differs).
    """
    if new.agent_id != old.agent_id:
        raise ConfigError(
            f"{old.path}: agent_id is now {new.agent_id!r}, not {old.agent_id!r}; "
            "another node takes a restart."
        )
    if new.own_public_key().identity != old.own_public_key().identity:
        raise ConfigError(f"{old.path}: the node key changed; a new node key takes a restart.")
    if new.quorum.allow_dev_signatures != old.quorum.allow_dev_signatures:
        # Read once at start by the checks that take it: half of them changed would be worse than none.
        raise ConfigError(f"{old.path}: quorum.allow_dev_signatures changed; that takes a restart.")
    approver = dataclasses.replace(
        old.approver, operators=new.approver.operators, operator_keys=new.approver.operator_keys
    )
    merged = dataclasses.replace(old, peers=new.peers, quorum=new.quorum, approver=approver)
    restart = [
        field.name
        for field in dataclasses.fields(NodeConfig)
        if field.name not in (*_TRUST_FIELDS, "approver")
        and getattr(merged, field.name) != getattr(new, field.name)
    ]
    if dataclasses.replace(new.approver, operators=None, operator_keys=()) != dataclasses.replace(
        merged.approver, operators=None, operator_keys=()
    ):
        restart.append("approver")
    return merged, tuple(restart)


class TrustReloader:
    """The current :class:`Trust` of a service, and its reload (module docstring).

    Args:
        config: The configuration the service started with.
        what: The service, for the log: ``"the relay of alpha"``.
        count: Called with each reload's result (``reloaded``, ``unchanged``, ``failed``): a metric.
    """

    def __init__(
        self, config: NodeConfig, *, what: str, count: Callable[[ReloadResult], None] | None = None
    ) -> None:
        self._trust = Trust.of(config)
        self.what = what
        self._count = count
        self._listeners: list[Callable[[Trust], None]] = []
        self._lock: asyncio.Lock | None = None  # made on first use, in the service's own loop

    @property
    def trust(self) -> Trust:
        """The trust in use now: read it once per verification and keep that object."""
        return self._trust

    def subscribe(self, listener: Callable[[Trust], None]) -> None:
        """Call ``listener`` with the new trust right after each swap (to drop caches of the old)."""
        self._listeners.append(listener)

    def _outcome(
        self, result: ReloadResult, problem: str | None = None, restart: tuple[str, ...] = ()
    ) -> ReloadOutcome:
        trust = self._trust
        return ReloadOutcome(
            result=result,
            generation=trust.generation,
            peers=tuple(trust.config.peers),
            operators=len(trust.config.approver.operator_keys),
            problem=problem,
            restart=restart,
        )

    async def reload(self, why: str) -> ReloadOutcome:
        """Read node.toml and its trust files again; swap the trust in, or keep the old one.

        Reloads run one at a time; each reads the files after the previous one swapped.

        Args:
            why: What asked for it, for the log (``SIGHUP``, ``POST /v1/reload``).

        Returns:
            What happened; ``failed`` keeps the old trust, with the sentence that says why.
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            old = self._trust
            try:
                new = await asyncio.to_thread(load_config, old.config.path)
                merged, restart = _merged(old.config, new)
                trust = Trust.of(merged, old.generation + 1)
            except ConfigError as exc:
                problem = str(exc).strip()
                logger.error("%s kept its trust: the reload (%s) failed: %s", self.what, why, problem)
                if self._count is not None:
                    self._count("failed")
                return self._outcome("failed", problem)
            if restart:
                logger.warning(
                    "%s: %s changed in %s; that applies at the next restart",
                    self.what,
                    ", ".join(restart),
                    old.config.path.name,
                )
            if trust.fingerprint_set() == old.fingerprint_set():
                if self._count is not None:
                    self._count("unchanged")
                return self._outcome("unchanged", restart=restart)
            self._trust = trust  # one assignment: a verifier sees the old snapshot or the new one
            for listener in self._listeners:
                listener(trust)
            logger.info(
                "%s reloaded its trust (%s): peers %s; %d operator key%s",
                self.what,
                why,
                ", ".join(trust.config.peers) or "none",
                len(trust.config.approver.operator_keys),
                "" if len(trust.config.approver.operator_keys) == 1 else "s",
            )
            if self._count is not None:
                self._count("reloaded")
            return self._outcome("reloaded", restart=restart)


def trust_reloader(config: NodeConfig, what: str, reloads: Any, generation: Any) -> TrustReloader:
    """A service's reloader, counted in its metrics: ``reloads`` by result, ``generation`` in use.

    Args:
        config: The configuration the service started with.
        what: The service, for the log.
        reloads: A Prometheus counter with the label ``result``.
        generation: A Prometheus gauge.
    """
    holder: list[TrustReloader] = []

    def count(result: ReloadResult) -> None:
        reloads.labels(result).inc()
        generation.set(holder[0].trust.generation)

    reloader = TrustReloader(config, what=what, count=count)
    holder.append(reloader)
    return reloader
