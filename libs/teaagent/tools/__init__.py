"""The tool registry and the built-in workspace tools.

A :class:`ToolRegistry` holds :class:`ToolDefinition` objects; :meth:`ToolRegistry.call` checks the
arguments against the tool's JSON Schema (Draft 2020-12), counts the call against its
:class:`ToolRateLimit` through a :class:`RateLimiter`, runs the handler, and checks the result
against the output schema. :func:`workspace_registry` builds a registry holding the built-in tools
``fs.read``, ``fs.write``, ``fs.list``, ``fs.search``, ``fs.delete`` and ``shell.run``, every path
confined to the workspace root.
"""

from __future__ import annotations

from teaagent.errors import (
    SchemaValidationError,
    ToolError,
    ToolNotFoundError,
    ToolRateLimitError,
    WorkspaceEscapeError,
)
from teaagent.tools._definitions import (
    SECURITY_TIERS,
    ToolAnnotations,
    ToolDefinition,
    ToolHandler,
    ToolRateLimit,
)
from teaagent.tools._ratelimit import InMemoryRateLimiter, RateDecision, RateLimiter
from teaagent.tools._registry import RATE_LIMIT_KEY_PREFIX, ToolRegistry
from teaagent.tools._shell import (
    DEFAULT_SHELL_TIMEOUT,
    MAX_SHELL_OUTPUT_BYTES,
    MAX_SHELL_TIMEOUT,
    TIMEOUT_EXIT_CODE,
)
from teaagent.tools._workspace import (
    STATE_DIR_NAME,
    WORKSPACE_TOOL_NAMES,
    Workspace,
    register_workspace_tools,
    workspace_registry,
)
from teaagent.tools._workspace_schemas import (
    MAX_LIST_ENTRIES,
    MAX_READ_BYTES,
    MAX_SEARCH_FILE_BYTES,
    MAX_SEARCH_FILES,
    MAX_SEARCH_LINE_CHARS,
    MAX_SEARCH_MATCHES,
    MAX_WRITE_CHARS,
)

__all__ = [
    "DEFAULT_SHELL_TIMEOUT",
    "MAX_LIST_ENTRIES",
    "MAX_READ_BYTES",
    "MAX_SEARCH_FILES",
    "MAX_SEARCH_FILE_BYTES",
    "MAX_SEARCH_LINE_CHARS",
    "MAX_SEARCH_MATCHES",
    "MAX_SHELL_OUTPUT_BYTES",
    "MAX_SHELL_TIMEOUT",
    "MAX_WRITE_CHARS",
    "RATE_LIMIT_KEY_PREFIX",
    "SECURITY_TIERS",
    "STATE_DIR_NAME",
    "TIMEOUT_EXIT_CODE",
    "WORKSPACE_TOOL_NAMES",
    "InMemoryRateLimiter",
    "RateDecision",
    "RateLimiter",
    "SchemaValidationError",
    "ToolAnnotations",
    "ToolDefinition",
    "ToolError",
    "ToolHandler",
    "ToolNotFoundError",
    "ToolRateLimit",
    "ToolRateLimitError",
    "ToolRegistry",
    "Workspace",
    "WorkspaceEscapeError",
    "register_workspace_tools",
    "workspace_registry",
]
