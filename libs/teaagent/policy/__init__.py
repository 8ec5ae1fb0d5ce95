"""Permission modes, local approvals and the multi-sig quorum: the gate every tool call passes.

:meth:`ApprovalPolicy.assert_allowed` decides in two steps, and both must pass:

1. **The local check**, by permission mode. A call is *read-only* (the tool is annotated
   ``read_only`` and not ``destructive``), *writing* (neither) or *destructive*:

   ======================  =========  =================================  ======================
   mode                    read-only  writing                            destructive
   ======================  =========  =================================  ======================
   ``read-only``           runs       denied                             denied
   ``workspace-write``     runs       runs (paths must be inside)        approved, else denied
   ``prompt``              runs       approved, else asked               approved, else asked
   ``allow``               runs       runs                               approved, else asked
   ``danger-full-access``  runs       runs                               runs
   ======================  =========  =================================  ======================

   *approved* means one of these sources, tried in this order:

   ===============================  ==============================================================
   source                           approves
   ===============================  ==============================================================
   ``JITApprovalState`` once        the call whose id was approved; used up by that call
   ``JITApprovalState`` session     every call to the approved tool (of the approved program, for a
                                    command) for the rest of the session
   ``allow_all_destructive``        every destructive call (a writing call still needs a source)
   ``preapproved_payload_digests``  the call whose ``payload_digest(tool_name, arguments)`` is listed
   ``ApprovalPresetStore``          a matching preset of the workspace (see ``_presets``)
   ===============================  ==============================================================

   *asked* means the call is put to ``prompter`` when ``enable_jit_prompt`` is set; the answer
   ``once`` approves this call only (a once approval used up at once, so nothing is recorded),
   ``session`` records a session approval in ``jit_state`` (for the tool; for a command, for its
   program only, and a compound command is approved once: :func:`remember_key`), ``deny`` denies. With
   no prompter, prompts disabled, a prompter that raises or an answer that is none of these, the
   call is denied (fail closed). ``workspace-write`` never asks: it is the unattended mode.

   The JIT state is consulted first, so that a once approval given for a call is used up by that
   call even when another source would have approved it; call ids must be unique in a session.

   ``read-only`` admits no approval of any kind. ``preapproved_call_ids`` is accepted for
   compatibility and approves nothing. Read-only calls are never checked against paths.

   Path arguments (the top-level keys ``path``, ``paths``, ``cwd``, ``directory``) are resolved
   with symlinks against ``workspace_root``. In ``workspace-write`` a path outside the workspace
   denies the call whatever approves it; in ``workspace-write``, ``prompt`` and ``allow`` a path
   inside ``<workspace_root>/.teaagent`` (where the presets live) is denied, so that an agent cannot
   write itself approvals. This is defence in depth: the tools layer confines every path it opens.

2. **The quorum**. When ``multi_sig_config`` is enabled and the tool name matches one of its
   ``high_risk_patterns``, the call also needs a quorum certificate, whatever the mode
   (``danger-full-access`` included) and whatever the local approvals say. The policy builds the
   request for this very call itself (a fresh random ``request_id``, this run, this call id,
   tool, arguments and reason) and hands it to ``quorum_gate``, which signs it and asks the
   peers. The certificate that comes back counts only when its request is exactly that request
   (PROTOCOL.md "Using a certificate": a certificate from another run or call, or one replayed
   by a relay, never matches), when it is not expired at the moment of use, and when it verifies
   (``teaagent.quorum.verify_certificate``) under this node's configuration. No gate, a gate that
   fails, times out or returns anything else is a denial.

   :class:`MultiSigQuorumConfig` and :class:`PeerSignature` live in :mod:`teaagent.trust`, below
   this package and :mod:`teaagent.quorum`; they are re-exported here, their seed import path.

Every refusal is an :class:`ApprovalDeniedError` whose message is one sentence naming the tool and
the reason, e.g. ``shell.run is destructive and the permission mode is workspace-write.``
"""

from __future__ import annotations

from teaagent.errors import ApprovalDeniedError
from teaagent.policy._jit import JITApprovalState, PromptAnswer, Prompter, PromptRequest, remember_key
from teaagent.policy._modes import PermissionMode
from teaagent.policy._policy import (
    DEFAULT_AGENT_ID,
    PATH_ARGUMENT_KEYS,
    ApprovalPolicy,
    ApprovalSource,
    Authorization,
    QuorumGate,
)
from teaagent.policy._presets import PRESETS_FILE, ApprovalPreset, ApprovalPresetStore
from teaagent.trust import (
    AGENT_ID_PATTERN,
    DEFAULT_QUORUM_TIMEOUT_SECONDS,
    MAX_QUORUM_TIMEOUT_SECONDS,
    MultiSigQuorumConfig,
    PeerSignature,
    check_agent_id,
)

__all__ = [
    "AGENT_ID_PATTERN",
    "DEFAULT_AGENT_ID",
    "DEFAULT_QUORUM_TIMEOUT_SECONDS",
    "MAX_QUORUM_TIMEOUT_SECONDS",
    "PATH_ARGUMENT_KEYS",
    "PRESETS_FILE",
    "ApprovalDeniedError",
    "ApprovalPolicy",
    "ApprovalPreset",
    "ApprovalPresetStore",
    "ApprovalSource",
    "Authorization",
    "JITApprovalState",
    "MultiSigQuorumConfig",
    "PeerSignature",
    "PermissionMode",
    "PromptAnswer",
    "PromptRequest",
    "Prompter",
    "QuorumGate",
    "check_agent_id",
    "remember_key",
]
