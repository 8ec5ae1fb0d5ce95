"""Every exception the library raises on purpose, under one root.

The tree::

    TeaAgentError
    ├── ConfigError                      a node configuration or setting is wrong (CLI exit 2)
    ├── ApprovalDeniedError              a tool call is blocked by policy or quorum (CLI exit 3)
    ├── BudgetExceededError              a run budget limit was reached
    │   ├── RunLimitError                iteration or tool-call limit
    │   └── CostCapError                 estimated cost above the cap
    ├── ToolError                        a tool could not be called
    │   ├── ToolNotFoundError            no tool of that name
    │   ├── ToolRateLimitError           the tool's rate-limit window is full
    │   ├── SchemaValidationError        a schema, an argument or a result is invalid
    │   └── WorkspaceEscapeError         a path leaves the workspace root
    ├── SignatureError                   an SSH signature or key is malformed or does not verify
    ├── QuorumError                      a quorum certificate does not prove the quorum
    │   └── StatementError               a signed statement is not one of its request
    │       ├── StatementMismatchError   its fields are not the statement rebuilt from the request
    │       └── StatementTimeError       it was signed outside the request's life
    ├── AuditVerificationError           an audit log's chain is broken
    ├── StoreError                       the node's Redis store is unreachable or failed
    │   ├── RequestNotFoundError         no stored request under that id (never, or expired)
    │   └── RequestConflictError         a different document already holds that request id
    ├── RelayError                       the node's relay refused a call or could not be reached
    ├── MissingAPIKeyError               a provider's API key variable is not set
    ├── LLMError                         a call to an LLM provider failed (unreachable, refused, 5xx)
    │   ├── LLMRateLimitError            the provider still answered 429 after every retry
    │   ├── LLMAuthenticationError       the provider refused the API key (401) or the access (403)
    │   └── LLMResponseError             the provider's reply is malformed or not what its API documents
    └── WorkspaceLockConflictError       another live process holds the workspace lock

Each message is the sentence a user reads: the CLI prints ``str(error)`` and nothing else.
Every spec exception is also importable from the module the specification names
(``teaagent.policy.ApprovalDeniedError``, ``teaagent.tools.ToolNotFoundError`` and so on).
"""

from __future__ import annotations

__all__ = [
    "ApprovalDeniedError",
    "AuditVerificationError",
    "BudgetExceededError",
    "ConfigError",
    "CostCapError",
    "LLMAuthenticationError",
    "LLMError",
    "LLMRateLimitError",
    "LLMResponseError",
    "MissingAPIKeyError",
    "QuorumError",
    "RelayError",
    "RequestConflictError",
    "RequestNotFoundError",
    "RunLimitError",
    "SchemaValidationError",
    "SignatureError",
    "StatementError",
    "StatementMismatchError",
    "StatementTimeError",
    "StoreError",
    "TeaAgentError",
    "ToolError",
    "ToolNotFoundError",
    "ToolRateLimitError",
    "WorkspaceEscapeError",
    "WorkspaceLockConflictError",
]


class TeaAgentError(Exception):
    """The root of every error teaagent raises on purpose."""


class ConfigError(TeaAgentError, ValueError):
    """A configuration file or setting is wrong; the message names the file and the key."""


class ApprovalDeniedError(TeaAgentError):
    """A tool call was blocked by the approval policy or by the peers' quorum."""


class BudgetExceededError(TeaAgentError):
    """A run budget limit (iterations, tool calls or cost) was reached."""


class RunLimitError(BudgetExceededError):
    """The run reached its iteration or tool-call limit."""


class CostCapError(BudgetExceededError):
    """The estimated cost of the run exceeds its cap."""


class ToolError(TeaAgentError):
    """A tool could not be called."""


class ToolNotFoundError(ToolError, LookupError):
    """No tool is registered under that name."""


class ToolRateLimitError(ToolError):
    """The tool's rate-limit window is full."""


class SchemaValidationError(ToolError, ValueError):
    """A JSON Schema, a tool's arguments or a tool's result is invalid."""


class WorkspaceEscapeError(ToolError, PermissionError):
    """A path given to a workspace tool leaves the workspace root."""


class SignatureError(TeaAgentError, ValueError):
    """An SSH key or SSHSIG signature is malformed, of a refused kind, or does not verify."""


class QuorumError(TeaAgentError):
    """A quorum certificate does not prove that the quorum approved the call."""


class StatementError(QuorumError):
    """A signed approval, denial or withdrawal is not one its request allows (PROTOCOL.md rules 3, 4).

    The message is a sentence; a counter that lists refusals reads ``clause``, the same words
    without the capital and the final period.

    Attributes:
        clause: The message as a clause (``the statement's v does not match request ...``).
    """

    def __init__(self, clause: str) -> None:
        self.clause = clause.strip().rstrip(".")
        super().__init__(self.clause[:1].upper() + self.clause[1:] + ".")


class StatementMismatchError(StatementError):
    """A carried statement is not the one rebuilt from its request (a field, its type, or its kind)."""


class StatementTimeError(StatementError):
    """A statement's ``signed_at`` is before its request was made, after it expired, or in the future."""


class AuditVerificationError(TeaAgentError):
    """An audit log's hash chain or HMAC does not verify."""


class StoreError(TeaAgentError):
    """The node's Redis store is unreachable, timed out or refused a command."""


class RequestNotFoundError(StoreError, LookupError):
    """No request is stored under that id: it never arrived, or it expired and was removed."""


class RequestConflictError(StoreError):
    """A different document is already stored under that request id; the new one is refused."""


class RelayError(TeaAgentError):
    """The node's relay refused a call (its ``ErrorOut`` code) or could not be reached.

    Attributes:
        status_code: The relay's HTTP status, or None when no HTTP answer arrived.
        code: The relay's stable error code (``forbidden``, ``not_found``...), or None.
    """

    def __init__(self, message: str, *, status_code: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code


class MissingAPIKeyError(TeaAgentError):
    """The environment variable holding a provider's API key is not set."""


class LLMError(TeaAgentError):
    """A call to an LLM provider failed: unreachable, refused, or answered with something unusable.

    The message never contains the API key.

    Attributes:
        status_code: The provider's HTTP status, or None when no HTTP answer arrived.
    """

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class LLMRateLimitError(LLMError):
    """The provider kept answering 429 (rate limited) until the adapter ran out of attempts."""


class LLMAuthenticationError(LLMError):
    """The provider refused the API key (401) or refused the key access to what was asked (403)."""


class LLMResponseError(LLMError):
    """The provider's reply is malformed JSON or lacks what its documented format promises."""


class WorkspaceLockConflictError(TeaAgentError):
    """Another live process holds the workspace lock."""
