"""The approval policy: the local permission check, then the peers' quorum for high-risk calls."""

from __future__ import annotations

import copy
import logging
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NoReturn, Protocol

from teaagent._canonical import canonical, payload_digest
from teaagent._words import moment
from teaagent.errors import ApprovalDeniedError
from teaagent.policy._jit import JITApprovalState, PromptAnswer, Prompter, PromptRequest, remember_key
from teaagent.policy._modes import PermissionMode
from teaagent.policy._presets import CONTROL_DIR, ApprovalPreset, ApprovalPresetStore
from teaagent.quorum import build_request, policy_mismatch, verify_certificate
from teaagent.trust import MultiSigQuorumConfig, check_agent_id

__all__ = [
    "DEFAULT_AGENT_ID",
    "PATH_ARGUMENT_KEYS",
    "ApprovalPolicy",
    "ApprovalSource",
    "Authorization",
    "QuorumGate",
]

logger = logging.getLogger("teaagent.policy")

DEFAULT_AGENT_ID = "local"
# The argument names the policy reads as paths; the tools layer confines every path it opens itself.
PATH_ARGUMENT_KEYS = ("path", "paths", "cwd", "directory")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# The fields PROTOCOL.md "Using a certificate" names: what binds a certificate to one call.
_BINDING_FIELDS = ("request_id", "origin", "run_id", "call_id", "tool_name", "payload_digest")


class QuorumGate(Protocol):
    """Obtains the peers' quorum certificate for one request of this node (the relay client implements it).

    The policy builds the request document itself (:func:`teaagent.quorum.build_request`, with a
    fresh random ``request_id``) and hands it to ``obtain``, which signs it with the node's key,
    sends it to the node's relay and waits for the outcome. ``obtain`` blocks until the quorum is
    decided or ``MultiSigQuorumConfig.timeout_seconds`` have passed; the gate owns that timeout.
    It returns the certificate of PROTOCOL.md ("Quorum certificate") as the relay handed it back,
    unverified, with every signed denial the relay sent (``"denials"``, so that the policy applies
    rule 6: a signer that denied is no approver), or raises:
    :class:`~teaagent.errors.ApprovalDeniedError` with its own sentence (denied by whom, expired),
    or any other exception, which the policy turns into a denial.

    Whatever comes back is checked by the policy against the very request it built ("Using a
    certificate"), because relays are not trusted.
    """

    def obtain(self, request: dict[str, Any]) -> dict[str, Any]: ...


class ApprovalSource(StrEnum):
    """What let a call pass the local check (for the audit log's ``approval_granted``)."""

    PERMISSION_MODE = "permission-mode"
    ALLOW_ALL_DESTRUCTIVE = "allow-all-destructive"
    PAYLOAD_DIGEST = "payload-digest"
    JIT_ONCE = "jit-once"
    JIT_SESSION = "jit-session"
    PRESET = "preset"
    PROMPT_ONCE = "prompt-once"
    PROMPT_SESSION = "prompt-session"


@dataclass(frozen=True, kw_only=True)
class Authorization:
    """Why a call may run.

    Attributes:
        source: What passed the local check.
        preset: The preset that approved it, when ``source`` is ``preset``.
        certificate: The verified quorum certificate of a high-risk call, else None; the runner
            writes it to the audit log before it runs the tool.
    """

    source: ApprovalSource
    preset: ApprovalPreset | None = None
    certificate: dict[str, Any] | None = None


_BY_MODE = Authorization(source=ApprovalSource.PERMISSION_MODE)


def _clause(error: BaseException) -> str:
    """An exception as a clause to end a sentence with."""
    text = str(error).strip().rstrip(".")
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]  # "The certificate ..." continues our sentence
    return text or type(error).__name__


def _why(tool_name: str, destructive: bool, mode: PermissionMode) -> str:
    what = "destructive" if destructive else "not read-only"
    return f"{tool_name} is {what} and the permission mode is {mode.value}"


def _deny(message: str) -> NoReturn:
    raise ApprovalDeniedError(message)


class _Required(str):
    """The default of a field the seed lists without one: leaving it out is refused, as before."""

    __slots__ = ()


# "" with an identity of its own: agent_id="" is a bad value, no agent_id at all a missing one.
_REQUIRED: Final = _Required()


def _string_set(name: str, value: object) -> frozenset[str]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{name} must be a set of strings, not {type(value).__name__}.")
    items = frozenset(value)
    if not all(isinstance(item, str) for item in items):
        raise TypeError(f"{name} must hold only strings.")
    return items


@dataclass(frozen=True)
class ApprovalPolicy:
    """Immutable policy object. Constructed once per run; shared across tool calls.

    See :mod:`teaagent.policy` for the table of modes and approval sources. The specification's
    ten fields may be given by position, in its order (``preapproved_call_ids`` to
    ``workspace_root``), or by name; ``agent_id`` and ``workspace_root`` are required either way.
    Fields beyond the specification (``jit_state``, ``prompter``, ``quorum_gate``,
    ``origin_public_key``) are keyword-only with defaults.

    Attributes:
        preapproved_call_ids: Deprecated and inert: a call id here approves nothing.
        preapproved_payload_digests: Payload digests (``sha256:<hex>``) of calls approved before the run.
        allow_all_destructive: Approve every destructive call that the mode would ask about or deny.
        permission_mode: How much runs without asking (default read-only: fail closed).
        approval_store: The workspace's presets, or None for no presets.
        approval_origin_run_id: The run whose scoped presets apply (None: the call's own run id).
        enable_jit_prompt: Whether a call that needs asking may be put to ``prompter``.
        multi_sig_config: Which calls need the peers' quorum.
        agent_id: This node's name (the origin of its quorum requests).
        workspace_root: The workspace directory; relative paths in arguments resolve against it.
        jit_state: This session's once and session approvals (shared with whoever answers prompts).
        prompter: Asks a person about a call; None means nobody can be asked.
        quorum_gate: Obtains quorum certificates; None means no high-risk call can run.
        origin_public_key: This node's public key line; when set, the origin's signature over the
            certificate's request is verified too.
    """

    preapproved_call_ids: frozenset[str] = frozenset()
    preapproved_payload_digests: frozenset[str] = frozenset()
    allow_all_destructive: bool = False
    permission_mode: PermissionMode = PermissionMode.READ_ONLY
    approval_store: ApprovalPresetStore | None = None
    approval_origin_run_id: str | None = None
    enable_jit_prompt: bool = True
    multi_sig_config: MultiSigQuorumConfig = field(default_factory=MultiSigQuorumConfig.disabled)
    agent_id: str = _REQUIRED
    workspace_root: str = _REQUIRED
    jit_state: JITApprovalState = field(default_factory=JITApprovalState, compare=False, kw_only=True)
    prompter: Prompter | None = field(default=None, compare=False, repr=False, kw_only=True)
    quorum_gate: QuorumGate | None = field(default=None, compare=False, repr=False, kw_only=True)
    origin_public_key: str | None = field(default=None, kw_only=True)
    _root_real: str = field(init=False, repr=False, compare=False, default="")
    _root_prefix: str = field(init=False, repr=False, compare=False, default="")
    _control_real: str = field(init=False, repr=False, compare=False, default="")
    _control_prefix: str = field(init=False, repr=False, compare=False, default="")

    def __post_init__(self) -> None:
        """Check and normalise the fields, and precompute what every call needs.

        Raises:
            TypeError: ``agent_id`` or ``workspace_root`` is missing, or a field has the wrong type.
            ValueError: A field has a wrong value (unknown mode, malformed digest, invalid agent id,
                empty workspace root, or a multi-sig configuration that lists this node as a peer).
        """
        for required in ("agent_id", "workspace_root"):
            if getattr(self, required) is _REQUIRED:
                raise TypeError(f"ApprovalPolicy needs {required}.")
        mode: object = self.permission_mode
        if not isinstance(mode, PermissionMode):
            if not isinstance(mode, str):
                raise TypeError(f"permission_mode must be a PermissionMode, not {type(mode).__name__}.")
            try:
                mode = PermissionMode(mode)
            except ValueError:
                known = ", ".join(member.value for member in PermissionMode)
                raise ValueError(f"permission mode {mode!r} is not one of {known}.") from None
            object.__setattr__(self, "permission_mode", mode)
        for flag in ("allow_all_destructive", "enable_jit_prompt"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be true or false.")
        call_ids = _string_set("preapproved_call_ids", self.preapproved_call_ids)
        digests = _string_set("preapproved_payload_digests", self.preapproved_payload_digests)
        for digest in digests:
            if _DIGEST.fullmatch(digest) is None:
                raise ValueError(
                    f"preapproved payload digest {digest!r} is not 'sha256:' followed by 64 hex digits."
                )
        object.__setattr__(self, "preapproved_call_ids", call_ids)
        object.__setattr__(self, "preapproved_payload_digests", digests)
        if call_ids:
            logger.warning(
                "preapproved_call_ids is inert and approves nothing; use preapproved_payload_digests"
            )
        check_agent_id(self.agent_id)
        if self.approval_store is not None and not isinstance(self.approval_store, ApprovalPresetStore):
            raise TypeError("approval_store must be an ApprovalPresetStore or None.")
        run_id = self.approval_origin_run_id
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError("approval_origin_run_id must be a non-empty string or None.")
        if not isinstance(self.multi_sig_config, MultiSigQuorumConfig):
            raise TypeError("multi_sig_config must be a MultiSigQuorumConfig.")
        self.multi_sig_config.check_origin(self.agent_id)
        if not isinstance(self.jit_state, JITApprovalState):
            raise TypeError("jit_state must be a JITApprovalState.")
        if self.prompter is not None and not callable(self.prompter):
            raise TypeError("prompter must be callable or None.")
        if self.origin_public_key is not None and not isinstance(self.origin_public_key, str):
            raise TypeError("origin_public_key must be an OpenSSH public key line or None.")
        if self.quorum_gate is not None and not callable(getattr(self.quorum_gate, "obtain", None)):
            raise TypeError("quorum_gate must have an obtain() method, or be None.")
        root = self.workspace_root
        if not isinstance(root, str | os.PathLike):
            raise TypeError("workspace_root must be a path.")
        root = os.fspath(root)
        if not isinstance(root, str) or not root:
            raise ValueError("workspace_root must name the workspace directory.")
        object.__setattr__(self, "workspace_root", root)
        # Resolved once: every path check compares resolved paths against these strings.
        real = os.path.realpath(root)
        control = os.path.join(real, CONTROL_DIR)
        object.__setattr__(self, "_root_real", real)
        object.__setattr__(self, "_root_prefix", real if real.endswith(os.sep) else real + os.sep)
        object.__setattr__(self, "_control_real", control)
        object.__setattr__(self, "_control_prefix", control + os.sep)

    @classmethod
    def for_workspace(
        cls,
        root: str | os.PathLike[str],
        *,
        mode: PermissionMode | str = PermissionMode.WORKSPACE_WRITE,
        agent_id: str = DEFAULT_AGENT_ID,
        multi_sig_config: MultiSigQuorumConfig | None = None,
        prompter: Prompter | None = None,
        quorum_gate: QuorumGate | None = None,
        use_presets: bool = True,
        approval_origin_run_id: str | None = None,
    ) -> ApprovalPolicy:
        """Build the common policy of one workspace, with its preset store.

        Args:
            root: The workspace directory.
            mode: The permission mode (default workspace-write, the node configuration's default).
            agent_id: This node's name.
            multi_sig_config: The quorum configuration; None for multi-sig disabled.
            prompter: Who to ask about calls that need approval.
            quorum_gate: How to obtain quorum certificates.
            use_presets: Attach the workspace's :class:`ApprovalPresetStore`.
            approval_origin_run_id: The run whose scoped presets apply.

        Returns:
            The policy.

        Raises:
            TypeError: An argument has the wrong type.
            ValueError: An argument has a wrong value (see the constructor).
        """
        return cls(
            permission_mode=PermissionMode(mode),
            approval_store=ApprovalPresetStore(root) if use_presets else None,
            approval_origin_run_id=approval_origin_run_id,
            multi_sig_config=multi_sig_config
            if multi_sig_config is not None
            else MultiSigQuorumConfig.disabled(),
            agent_id=agent_id,
            workspace_root=os.fspath(root),
            prompter=prompter,
            quorum_gate=quorum_gate,
        )

    # -- the check ------------------------------------------------------------------------------

    def assert_allowed(
        self,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: dict[str, Any],
        *,
        read_only: bool = False,
        reason: str = "",
        run_id: str | None = None,
    ) -> None:
        """Assert that a tool call is permitted under this policy.

        The local check runs first (it may ask ``prompter``); a high-risk call then needs a
        verified quorum certificate as well. See :meth:`authorize`, which this wraps.

        Args:
            tool_name: The tool's registered name.
            call_id: The call's id (unique within the session).
            destructive: The tool's ``destructive`` annotation.
            arguments: The call's arguments.
            read_only: The tool's ``read_only`` annotation; unknown means False (fail closed). A
                tool marked both read-only and destructive is treated as destructive.
            reason: The model's reasoning, shown to whoever is asked.
            run_id: The run the call belongs to.

        Raises:
            ApprovalDeniedError: If the call is not allowed.
        """
        self.authorize(
            tool_name, call_id, destructive, arguments, read_only=read_only, reason=reason, run_id=run_id
        )

    def authorize(
        self,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: dict[str, Any],
        *,
        read_only: bool = False,
        reason: str = "",
        run_id: str | None = None,
    ) -> Authorization:
        """Check a call as :meth:`assert_allowed` does (the same arguments) and say what allowed it.

        Returns:
            What passed the local check, and the verified certificate of a high-risk call.

        Raises:
            ApprovalDeniedError: The permission mode refuses the call; a path argument leaves the
                workspace or enters its ``.teaagent`` directory; the call needs an approval that no
                source gives and nobody can be asked; the person asked denied it; or it is high
                risk and no verified quorum certificate for exactly this call was obtained.
        """
        authorization = self._authorize(
            tool_name, call_id, destructive, arguments, read_only, reason, run_id, wait=True
        )
        assert authorization is not None  # with wait=True it decides or raises
        return authorization

    def authorize_at_once(
        self,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: dict[str, Any],
        *,
        read_only: bool = False,
        reason: str = "",
        run_id: str | None = None,
    ) -> Authorization | None:
        """Decide a call as :meth:`authorize` does where nobody needs to be asked, or return None.

        None means the decision needs someone else: a local approval (the JIT state, presets,
        the prompt) or, for a high-risk call, the peers' quorum. Nothing is consumed or asked
        then, so the caller goes on with :meth:`authorize` (in a thread: it may wait). A call
        the permission mode settles alone is allowed or denied here exactly as there.

        Raises:
            ApprovalDeniedError: The permission mode or a path argument refuses the call.
        """
        return self._authorize(
            tool_name, call_id, destructive, arguments, read_only, reason, run_id, wait=False
        )

    def _authorize(
        self,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: Mapping[str, Any],
        read_only: bool,
        reason: str,
        run_id: str | None,
        *,
        wait: bool,
    ) -> Authorization | None:
        # Anything but an explicit False is destructive, and only an explicit True is read-only.
        destructive = destructive is not False
        if not isinstance(tool_name, str) or not tool_name:
            _deny(f"a tool call without a tool name ({tool_name!r}) is denied.")
        if not isinstance(arguments, Mapping):
            _deny(f"{tool_name} was called with arguments that are not an object.")
        local: Authorization | None
        if read_only is True and not destructive:
            local = _BY_MODE
        else:
            local = self._check_local(tool_name, call_id, destructive, arguments, reason, run_id, wait=wait)
        if local is None:
            return None
        if not self.multi_sig_config.is_high_risk(tool_name):
            return local
        if not wait:
            return None
        certificate = self._obtain_quorum(tool_name, call_id, arguments, reason, run_id)
        return Authorization(source=local.source, preset=local.preset, certificate=certificate)

    # -- local ----------------------------------------------------------------------------------

    def _check_local(
        self,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: Mapping[str, Any],
        reason: str,
        run_id: str | None,
        *,
        wait: bool = True,
    ) -> Authorization | None:
        mode = self.permission_mode
        if mode is PermissionMode.DANGER_FULL_ACCESS:
            return _BY_MODE
        if mode is PermissionMode.READ_ONLY:
            _deny(f"{_why(tool_name, destructive, mode)}.")
        self._check_paths(tool_name, arguments, confine=mode is PermissionMode.WORKSPACE_WRITE)
        if not destructive and mode in (PermissionMode.WORKSPACE_WRITE, PermissionMode.ALLOW):
            return _BY_MODE
        if not wait:
            return None  # the approvals below may be used up, and the prompt waits for a person
        approved = self._approved(tool_name, call_id, destructive, arguments, run_id)
        if approved is not None:
            return approved
        if mode is PermissionMode.WORKSPACE_WRITE:
            # workspace-write is the unattended mode: it never asks.
            _deny(f"{_why(tool_name, destructive, mode)}.")
        return self._ask(
            _why(tool_name, destructive, mode), tool_name, call_id, destructive, arguments, reason, run_id
        )

    def _approved(
        self,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: Mapping[str, Any],
        run_id: str | None,
    ) -> Authorization | None:
        # The JIT state comes first so that a once approval given for this call is used up by it.
        used = self.jit_state.consume(call_id, tool_name=tool_name, key=remember_key(tool_name, arguments))
        if used == "once":
            return Authorization(source=ApprovalSource.JIT_ONCE)
        if used == "session":
            return Authorization(source=ApprovalSource.JIT_SESSION)
        if destructive and self.allow_all_destructive:
            return Authorization(source=ApprovalSource.ALLOW_ALL_DESTRUCTIVE)
        if self.preapproved_payload_digests:
            try:
                digest = payload_digest(tool_name, dict(arguments))
            except ValueError:
                digest = ""
            if digest in self.preapproved_payload_digests:
                return Authorization(source=ApprovalSource.PAYLOAD_DIGEST)
        if self.approval_store is not None:
            scope = self.approval_origin_run_id if self.approval_origin_run_id is not None else run_id
            preset = self.approval_store.matches(tool_name, dict(arguments), scope)
            if preset is not None:
                return Authorization(source=ApprovalSource.PRESET, preset=preset)
        return None

    def _ask(
        self,
        why: str,
        tool_name: str,
        call_id: str,
        destructive: bool,
        arguments: Mapping[str, Any],
        reason: str,
        run_id: str | None,
    ) -> Authorization:
        prompter = self.prompter
        if not self.enable_jit_prompt:
            _deny(f"{why}, and approval prompts are disabled.")
        if prompter is None:
            _deny(f"{why}, and nobody is available to approve it.")
        request = PromptRequest(
            call_id=call_id,
            tool_name=tool_name,
            arguments=dict(arguments),
            reason=reason,
            annotations={"read_only": False, "destructive": destructive},
            run_id=run_id,
        )
        try:
            raw = prompter(request)
        except Exception as exc:  # a broken prompt is a denial, never an approval
            _deny(f"{why}, and asking for approval failed: {_clause(exc)}.")
        try:
            answer = PromptAnswer(raw)
        except (ValueError, TypeError):
            _deny(f"{tool_name} was denied because the approval prompt gave no valid answer ({raw!r}).")
        if answer is PromptAnswer.SESSION:
            key = remember_key(tool_name, arguments)
            if key is None:
                # A compound or unparsable command: no "same program" to remember; this call only.
                logger.info("%s approved once at the prompt: its command cannot be remembered", tool_name)
                return Authorization(source=ApprovalSource.PROMPT_ONCE)
            self.jit_state.approve_session(key)
            logger.info("%s approved for the session at the prompt", key)
            return Authorization(source=ApprovalSource.PROMPT_SESSION)
        if answer is PromptAnswer.ONCE:
            # A once approval that this call uses up at once: nothing is left in the JIT state.
            return Authorization(source=ApprovalSource.PROMPT_ONCE)
        _deny(f"{tool_name} was denied at the approval prompt.")

    def _check_paths(self, tool_name: str, arguments: Mapping[str, Any], *, confine: bool) -> None:
        """Check path-like arguments: inside the workspace (when ``confine``), never in ``.teaagent``.

        Defence in depth: the tools layer confines the paths it opens itself. This check resolves
        symlinks (``os.path.realpath``) so that a link inside the workspace pointing out of it is
        caught here too, and it only reads the top-level keys of :data:`PATH_ARGUMENT_KEYS`.
        """
        for key in PATH_ARGUMENT_KEYS:
            value = arguments.get(key)
            if value is None:
                continue
            if isinstance(value, str):
                values: Iterable[object] = (value,)
            elif isinstance(value, list | tuple):
                values = value
            else:
                _deny(
                    f"{tool_name}'s {key} argument is not a path, "
                    "so it cannot be checked against the workspace."
                )
            for item in values:
                if not isinstance(item, str):
                    _deny(f"{tool_name}'s {key} argument holds something that is not a path.")
                try:
                    real = self._resolve(item)
                except (ValueError, OSError):
                    _deny(f"{tool_name}'s {key} {item!r} is not a valid path.")
                inside = real == self._root_real or real.startswith(self._root_prefix)
                if confine and not inside:
                    _deny(
                        f"{tool_name}'s {key} {item!r} is outside the workspace and the permission mode is "
                        f"{self.permission_mode.value}."
                    )
                if real == self._control_real or real.startswith(self._control_prefix):
                    _deny(
                        f"{tool_name}'s {key} {item!r} is inside the workspace's {CONTROL_DIR} directory, "
                        "whose approval state agents may not change."
                    )

    def _resolve(self, item: str) -> str:
        """Return the real path of ``item`` (relative to the workspace), as ``os.path.realpath`` would.

        ``realpath`` costs one ``lstat`` per component from ``/``; the root is resolved already,
        so the common case (a relative path without ``..``) only looks at the components below
        it, and stops at the first one that does not exist: nothing below it can be a symlink.

        Raises:
            ValueError: The path holds a NUL character.
        """
        if "\0" in item:
            raise ValueError("embedded NUL character")
        root, prefix = self._root_real, self._root_prefix
        joined = item if item.startswith(os.sep) else prefix + item
        if ".." in item.split(os.sep) or not (joined.startswith(prefix) or joined == root):
            # A ".." after a symlink climbs from the link's target, which only realpath knows.
            return os.path.realpath(joined)
        normal = os.path.normpath(joined)
        if normal == root:
            return normal
        end = len(prefix)
        for part in normal[end:].split(os.sep):
            end += len(part)
            try:
                mode = os.lstat(normal[:end]).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return normal
            except OSError:
                return os.path.realpath(joined)
            if stat.S_ISLNK(mode):
                return os.path.realpath(joined)
            end += 1
        return normal

    # -- quorum ---------------------------------------------------------------------------------

    def _obtain_quorum(
        self,
        tool_name: str,
        call_id: str,
        arguments: Mapping[str, Any],
        reason: str,
        run_id: str | None,
    ) -> dict[str, Any]:
        config = self.multi_sig_config
        policy = config.policy_for(tool_name)
        # Version 2: the rule and its terms (``git.push needs rule 'git.push*' (all of: ...)``).
        needs = config.describe_quorum() if policy is None else f"rule {policy.rule!r} ({policy.summary()})"
        lead = f"{tool_name} needs {needs}"
        try:
            payload_digest(tool_name, dict(arguments))
        except ValueError:
            _deny(
                f"{lead} but its arguments cannot be written as canonical JSON, "
                "so no quorum can approve them."
            )
        gate = self.quorum_gate
        if gate is None:
            _deny(f"{lead} but no quorum could be obtained: no quorum gate is configured.")
        try:
            # The request is built here, not by the gate, so that what the certificate must prove
            # is fixed before anything leaves this node.
            request = build_request(
                origin=self.agent_id,
                run_id=run_id or "",
                call_id=call_id,
                tool_name=tool_name,
                arguments=arguments,
                reason=reason if isinstance(reason, str) else "",
                config=config,
            )
        except ValueError as exc:
            _deny(f"{lead} but no request can be made for it: {_clause(exc)}.")
        try:
            certificate = gate.obtain(copy.deepcopy(request))
        except ApprovalDeniedError:
            raise  # the gate's own sentence: denied by whom, or expired
        except TimeoutError:
            _deny(f"{lead} but no quorum was reached within {config.timeout_for(tool_name)} seconds.")
        except Exception as exc:
            _deny(f"{lead} but no quorum could be obtained: {_clause(exc)}.")
        self._check_certificate(lead, request, certificate)
        return certificate

    def _check_certificate(self, lead: str, request: Mapping[str, Any], certificate: object) -> None:
        """Refuse a certificate that is not for ``request``, is expired now, or does not verify.

        PROTOCOL.md "Using a certificate", in its order: the certificate's request is the one this
        node built and signed for this very call; it is not expired at the moment of use; and its
        signatures prove the quorum under this node's own configuration.
        """
        if not isinstance(certificate, dict):
            _deny(f"{lead} but the quorum gate returned no certificate.")
        carried = certificate.get("request")
        if not isinstance(carried, dict):
            _deny(f"{lead} but the quorum certificate holds no request.")
        # 1. The same request: its id, origin, run, call, tool and digest first (they name what
        # went wrong), then every other field, compared as signed bytes (1 == True == 1.0 in Python).
        for name in (*_BINDING_FIELDS, *sorted(set(request) | set(carried))):
            if name not in carried or name not in request or not _same(carried[name], request[name]):
                _deny(
                    f"{lead} but the quorum certificate's {name} does not match the request "
                    "this node signed for this call."
                )
        # 2. Not expired at the moment of use: an offline check may accept an old certificate,
        # the call itself never runs on one.
        now = time.time()
        if now > request["expires_at"]:
            _deny(
                f"{lead} but its quorum certificate expired at {moment(request['expires_at'], now)}, "
                "before it was to be used."
            )
        # 3. The policy is the one this node's own rules give the tool (PROTOCOL.md, "Who decides
        # what the policy is"): nobody lowers the bar, not even a request this node once signed.
        mismatch = policy_mismatch(carried, self.multi_sig_config)
        if mismatch is not None:
            _deny(f"{lead} but its quorum certificate is refused: {_clause(ValueError(mismatch))}.")
        # 4. The signatures, counted under this node's own configuration.
        try:
            verify_certificate(
                certificate, self.multi_sig_config, origin_public_key=self.origin_public_key, now=now
            )
        except Exception as exc:
            _deny(f"{lead} but its quorum certificate does not verify: {_clause(exc)}.")


def _same(left: object, right: object) -> bool:
    """Equal as signed documents are: the same type and the same canonical bytes.

    ``1``, ``True`` and ``1.0`` are equal in Python; in a signed document only the first is an
    integer field (and RFC 8785 writes ``2.0`` as ``2``, hence the type check as well).
    """
    if type(left) is not type(right):
        return False
    try:
        return canonical(left) == canonical(right)
    except (TypeError, ValueError):
        return False
