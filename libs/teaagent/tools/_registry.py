"""The tool registry: registration with schema checks, and the call path through the gate."""

from __future__ import annotations

import copy
import re
import threading
from dataclasses import dataclass
from typing import Any, Final

from teaagent.errors import SchemaValidationError, ToolNotFoundError, ToolRateLimitError
from teaagent.tools._definitions import ToolAnnotations, ToolDefinition, ToolHandler, ToolRateLimit
from teaagent.tools._ratelimit import InMemoryRateLimiter, RateLimiter
from teaagent.tools._schema import CompiledSchema, check_schema

__all__ = ["RATE_LIMIT_KEY_PREFIX", "TOOL_NAME_PATTERN", "ToolRegistry"]

TOOL_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""Tool names: what LLM providers and MCP accept, and safe inside glob patterns and Redis keys."""

RATE_LIMIT_KEY_PREFIX: Final = "tool:"
"""The registry counts a tool's calls under ``tool:<name>``, so one limiter can serve other keys too."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """A definition with what ``call`` needs ready: compiled schemas and the rate-limit key."""

    definition: ToolDefinition
    arguments: CompiledSchema
    result: CompiledSchema
    rate_key: str


class ToolRegistry:
    """The tools an agent may call, each behind schema checks and its rate limit.

    ``call`` does, in order: find the tool; check the arguments against its input schema; count the
    call against its rate limit (a call refused for bad arguments is not counted); run the handler;
    check the result against its output schema. Nothing runs the handler without passing the first
    three. The registry is safe to share between threads.
    """

    def __init__(self, *, rate_limiter: RateLimiter | None = None) -> None:
        """Create an empty registry.

        Args:
            rate_limiter: Where rate-limit windows are counted; a fresh
                :class:`~teaagent.tools.InMemoryRateLimiter` when None. Registries sharing a limiter
                (a Redis one, across agents) share the windows of same-named tools.
        """
        self._rate_limiter: RateLimiter = rate_limiter if rate_limiter is not None else InMemoryRateLimiter()
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    @property
    def rate_limiter(self) -> RateLimiter:
        """The limiter that counts this registry's calls."""
        return self._rate_limiter

    def register(
        self,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        output_schema: dict[str, Any],
        annotations: ToolAnnotations,
        handler: ToolHandler,
        rate_limit: ToolRateLimit | None = None,
        capability_manifest: dict[str, Any] | None = None,
        allow_override: bool = False,
    ) -> None:
        """Register a tool.

        The schemas are copied, checked against the Draft 2020-12 meta-schema and compiled once;
        later changes to the dicts passed in do not reach the registry. Replacing a tool keeps its
        place in :meth:`list_tools`.

        Args:
            name: Unique tool name (letters, digits, ``_``, ``.``, ``-``; at most 128 characters).
            description: Human-readable description for the model.
            input_schema: JSON Schema for the tool's arguments.
            output_schema: JSON Schema for the tool's return value.
            annotations: Security and behaviour annotations.
            handler: Callable invoked with the validated arguments dict.
            rate_limit: Optional per-tool rate limit.
            capability_manifest: Optional description of what the tool may touch.
            allow_override: If True, silently replaces an existing registration.

        Raises:
            ValueError: Duplicate name and allow_override is False, or the name is not a valid tool name.
            TypeError: annotations, handler or rate_limit is not of the expected kind.
            SchemaValidationError: input_schema or output_schema is invalid JSON Schema.
        """
        if not isinstance(name, str) or TOOL_NAME_PATTERN.fullmatch(name) is None:
            raise ValueError(
                f"tool name {name!r} is not valid: use 1 to 128 letters, digits, '_', '.' or '-'"
            )
        if not isinstance(annotations, ToolAnnotations):
            raise TypeError(
                f"{name}: annotations must be a ToolAnnotations, not {type(annotations).__name__}"
            )
        if not callable(handler):
            raise TypeError(f"{name}: handler must be callable")
        if rate_limit is not None and not isinstance(rate_limit, ToolRateLimit):
            raise TypeError(
                f"{name}: rate_limit must be a ToolRateLimit or None, not {type(rate_limit).__name__}"
            )
        check_schema(input_schema, tool_name=name, which="input_schema")
        check_schema(output_schema, tool_name=name, which="output_schema")
        definition = ToolDefinition(
            name=name,
            description=description,
            input_schema=copy.deepcopy(input_schema),
            output_schema=copy.deepcopy(output_schema),
            annotations=annotations,
            handler=handler,
            rate_limit=rate_limit,
            capability_manifest=copy.deepcopy(capability_manifest),
        )
        entry = _Entry(
            definition=definition,
            arguments=CompiledSchema(definition.input_schema),
            result=CompiledSchema(definition.output_schema),
            rate_key=RATE_LIMIT_KEY_PREFIX + name,
        )
        with self._lock:
            if name in self._entries and not allow_override:
                raise ValueError(
                    f"a tool named {name!r} is already registered; pass allow_override=True to replace it"
                )
            self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove the tool ``name``.

        Raises:
            ToolNotFoundError: No tool of that name is registered.
        """
        with self._lock:
            if self._entries.pop(name, None) is None:
                raise ToolNotFoundError(f"no tool named {name!r} is registered")

    def lookup(self, name: str) -> ToolDefinition | None:
        """Return the ToolDefinition for name, or None if not registered."""
        entry = self._entries.get(name)
        return None if entry is None else entry.definition

    def list_tools(self) -> list[ToolDefinition]:
        """Return all registered tools in registration order."""
        return [entry.definition for entry in list(self._entries.values())]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def validate_arguments(self, tool_name: str, arguments: dict[str, Any]) -> ToolDefinition:
        """Check ``arguments`` against the tool's input schema without calling it.

        A policy gate uses it to refuse a malformed call before asking for approval.

        Returns:
            The tool's definition.

        Raises:
            ToolNotFoundError: tool_name not registered.
            SchemaValidationError: arguments fail input_schema validation.
        """
        entry = self._entry(tool_name)
        self._check_arguments(entry, arguments)
        return entry.definition

    def call(self, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Invoke a tool by name.

        Args:
            tool_name: Registered tool name.
            arguments: Arguments dict, validated against input_schema.

        Returns:
            dict validated against output_schema.

        Raises:
            ToolNotFoundError: tool_name not registered.
            SchemaValidationError: arguments fail input_schema validation, or the handler's result
                fails output_schema validation.
            ToolRateLimitError: Rate limit exceeded; the handler did not run.
            Exception: Any exception raised by the handler (or by the rate limiter's store).
        """
        entry = self._entry(tool_name)
        self._check_arguments(entry, arguments)
        definition = entry.definition
        limit = definition.rate_limit
        if limit is not None:
            decision = self._rate_limiter.hit(entry.rate_key, limit)
            if not decision.allowed:
                raise ToolRateLimitError(
                    f"{tool_name}: rate limit of {limit.describe()} reached; "
                    f"retry in {decision.retry_after:.1f} s"
                )
        result = definition.handler(arguments)
        self._check_result(entry, result)
        return result

    def validate_result(self, tool_name: str, result: Any) -> None:
        """Check a result against the tool's output schema, as :meth:`call` does with its handler's.

        For a caller that ran the tool another way (an MCP gateway awaiting its upstream).

        Raises:
            ToolNotFoundError: tool_name not registered.
            SchemaValidationError: The result is not an object that matches the output schema.
        """
        self._check_result(self._entry(tool_name), result)

    def _entry(self, tool_name: str) -> _Entry:
        entry = self._entries.get(tool_name)
        if entry is None:
            raise ToolNotFoundError(f"no tool named {tool_name!r} is registered")
        return entry

    @staticmethod
    def _check_result(entry: _Entry, result: Any) -> None:
        if not (isinstance(result, dict) and entry.result.is_valid(result)):
            name = entry.definition.name
            raise SchemaValidationError(f"{name}: the tool's result is invalid{_why(entry.result, result)}")

    @staticmethod
    def _check_arguments(entry: _Entry, arguments: dict[str, Any]) -> None:
        if not (isinstance(arguments, dict) and entry.arguments.is_valid(arguments)):
            name = entry.definition.name
            raise SchemaValidationError(f"{name}: arguments are invalid{_why(entry.arguments, arguments)}")


def _why(schema: CompiledSchema, instance: Any) -> str:
    if not isinstance(instance, dict):
        return f": expected a JSON object, got {type(instance).__name__}"
    reason = schema.find_error(instance)
    # The compiled check refused what the reference accepts: fail closed all the same, and say so.
    return reason if reason is not None else ": it fails the tool's schema"
