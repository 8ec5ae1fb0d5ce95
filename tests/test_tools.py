"""teaagent.tools: definitions, the registry, and rate limits through the registry."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from teaagent import errors
from teaagent.tools import (
    RATE_LIMIT_KEY_PREFIX,
    InMemoryRateLimiter,
    RateDecision,
    RateLimiter,
    SchemaValidationError,
    ToolAnnotations,
    ToolDefinition,
    ToolError,
    ToolNotFoundError,
    ToolRateLimit,
    ToolRateLimitError,
    ToolRegistry,
)

INPUT = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "minLength": 1},
        "max_bytes": {"type": "integer", "minimum": 1},
    },
    "required": ["path"],
    "additionalProperties": False,
}
OUTPUT = {
    "type": "object",
    "properties": {"content": {"type": "string"}, "size": {"type": "integer", "minimum": 0}},
    "required": ["content", "size"],
    "additionalProperties": False,
}
READ_ONLY = ToolAnnotations(read_only=True, idempotent=True, security_tier="Low")


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """A handler that records its calls and returns a fixed result."""

    def __init__(self, result: Any = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.result = {"content": "hello", "size": 5} if result is None else result

    def __call__(self, arguments: dict[str, Any]) -> Any:
        self.calls.append(arguments)
        return self.result


def make_registry(**kwargs: Any) -> tuple[ToolRegistry, Recorder]:
    registry = ToolRegistry(rate_limiter=kwargs.pop("rate_limiter", None))
    handler = Recorder(kwargs.pop("result", None))
    registry.register("fs.read", "Read a file.", INPUT, OUTPUT, READ_ONLY, handler, **kwargs)
    return registry, handler


# -- the public face ----------------------------------------------------------------------------------


def test_spec_errors_are_the_errors_module_classes() -> None:
    assert ToolNotFoundError is errors.ToolNotFoundError
    assert ToolRateLimitError is errors.ToolRateLimitError
    assert SchemaValidationError is errors.SchemaValidationError
    assert issubclass(SchemaValidationError, ToolError)


# -- ToolAnnotations, ToolRateLimit, ToolDefinition ---------------------------------------------------


def test_annotations_defaults_follow_the_spec() -> None:
    annotations = ToolAnnotations()
    assert (annotations.read_only, annotations.destructive, annotations.idempotent, annotations.stateful) == (
        False,
        False,
        False,
        False,
    )
    assert annotations.security_tier == "Medium"


@pytest.mark.parametrize("tier", ["Low", "Medium", "High", "Critical"])
def test_annotations_accept_the_four_tiers(tier: str) -> None:
    assert ToolAnnotations(security_tier=tier).security_tier == tier


def test_annotations_refuse_an_unknown_tier() -> None:
    with pytest.raises(
        ValueError, match=r"^security_tier must be one of Low, Medium, High, Critical, got 'low'$"
    ):
        ToolAnnotations(security_tier="low")


def test_annotations_refuse_read_only_and_destructive_together() -> None:
    with pytest.raises(ValueError, match=r"^a tool cannot be both read-only and destructive$"):
        ToolAnnotations(read_only=True, destructive=True)


def test_annotations_are_frozen() -> None:
    annotations = ToolAnnotations()
    with pytest.raises(AttributeError):
        annotations.destructive = True  # type: ignore[misc]


def test_rate_limit_default_window_is_a_minute() -> None:
    assert ToolRateLimit(3).window_seconds == 60.0


@pytest.mark.parametrize(
    ("max_calls", "window", "message"),
    [
        (0, 60.0, r"^max_calls must be at least 1, got 0$"),
        (-1, 60.0, r"^max_calls must be at least 1, got -1$"),
        (1, 0.0, r"^window_seconds must be a finite number above 0, got 0.0$"),
        (1, -5, r"^window_seconds must be a finite number above 0, got -5$"),
        (1, float("inf"), r"^window_seconds must be a finite number above 0, got inf$"),
        (1, float("nan"), r"^window_seconds must be a finite number above 0, got nan$"),
    ],
)
def test_rate_limit_refuses_values_out_of_range(max_calls: int, window: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ToolRateLimit(max_calls, window)


def test_rate_limit_boundary_values_are_accepted() -> None:
    limit = ToolRateLimit(1, 1e-9)
    assert (limit.max_calls, limit.window_seconds) == (1, 1e-9)


@pytest.mark.parametrize("max_calls", [True, 2.0, "3"])
def test_rate_limit_refuses_a_max_calls_that_is_not_an_integer(max_calls: Any) -> None:
    with pytest.raises(TypeError, match=r"^max_calls must be an integer"):
        ToolRateLimit(max_calls)


def test_rate_limit_refuses_a_window_that_is_not_a_number() -> None:
    with pytest.raises(TypeError, match=r"^window_seconds must be a number, got '60'$"):
        ToolRateLimit(1, "60")  # type: ignore[arg-type]


def test_definition_reports_its_security_tier() -> None:
    registry, _ = make_registry()
    definition = registry.lookup("fs.read")
    assert definition is not None
    assert definition.get_security_tier() == "Low"
    high = ToolDefinition(
        name="x",
        description="",
        input_schema={},
        output_schema={},
        annotations=ToolAnnotations(destructive=True, security_tier="High"),
        handler=lambda arguments: {},
        rate_limit=None,
        capability_manifest=None,
    )
    assert high.get_security_tier() == "High"


# -- register, lookup, list_tools -----------------------------------------------------------------------


def test_lookup_returns_the_definition_or_none() -> None:
    registry, handler = make_registry(rate_limit=ToolRateLimit(3), capability_manifest={"scope": "workspace"})
    definition = registry.lookup("fs.read")
    assert definition is not None
    assert definition.name == "fs.read"
    assert definition.description == "Read a file."
    assert definition.input_schema == INPUT
    assert definition.output_schema == OUTPUT
    assert definition.annotations is READ_ONLY
    assert definition.handler is handler
    assert definition.rate_limit == ToolRateLimit(3)
    assert definition.capability_manifest == {"scope": "workspace"}
    assert registry.lookup("fs.reed") is None


def test_list_tools_keeps_registration_order() -> None:
    registry = ToolRegistry()
    for name in ["zeta", "alpha", "mid.tool"]:
        registry.register(name, name, INPUT, OUTPUT, READ_ONLY, Recorder())
    assert [tool.name for tool in registry.list_tools()] == ["zeta", "alpha", "mid.tool"]
    assert len(registry) == 3
    assert "alpha" in registry
    assert "beta" not in registry


def test_list_tools_of_an_empty_registry_is_empty() -> None:
    assert ToolRegistry().list_tools() == []


def test_duplicate_registration_is_refused() -> None:
    registry, handler = make_registry()
    with pytest.raises(
        ValueError,
        match=r"^a tool named 'fs.read' is already registered; pass allow_override=True to replace it$",
    ):
        registry.register("fs.read", "Other.", INPUT, OUTPUT, READ_ONLY, Recorder())
    definition = registry.lookup("fs.read")
    assert definition is not None
    assert definition.handler is handler


def test_allow_override_replaces_the_tool_in_its_place() -> None:
    registry, _ = make_registry()
    registry.register("other", "Other.", INPUT, OUTPUT, READ_ONLY, Recorder())
    replacement = Recorder({"content": "new", "size": 3})
    registry.register("fs.read", "Replaced.", INPUT, OUTPUT, READ_ONLY, replacement, allow_override=True)
    assert [tool.description for tool in registry.list_tools()] == ["Replaced.", "Other."]
    assert registry.call("fs.read", {"path": "a"}) == {"content": "new", "size": 3}


@pytest.mark.parametrize("name", ["", "has space", "semi;colon", "x" * 129, "ünicode"])
def test_invalid_tool_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"^tool name .* is not valid: use 1 to 128 letters"):
        ToolRegistry().register(name, "", INPUT, OUTPUT, READ_ONLY, Recorder())


def test_the_longest_tool_name_is_accepted() -> None:
    registry = ToolRegistry()
    registry.register("x" * 128, "", INPUT, OUTPUT, READ_ONLY, Recorder())
    assert registry.lookup("x" * 128) is not None


def test_register_checks_the_kinds_of_its_arguments() -> None:
    registry = ToolRegistry()
    with pytest.raises(TypeError, match=r"^t: annotations must be a ToolAnnotations, not dict$"):
        registry.register("t", "", INPUT, OUTPUT, {"read_only": True}, Recorder())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^t: handler must be callable$"):
        registry.register("t", "", INPUT, OUTPUT, READ_ONLY, "handler")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^t: rate_limit must be a ToolRateLimit or None, not int$"):
        registry.register("t", "", INPUT, OUTPUT, READ_ONLY, Recorder(), rate_limit=3)  # type: ignore[arg-type]
    assert registry.list_tools() == []


def test_an_invalid_input_schema_is_refused_at_registration() -> None:
    bad = {"type": "object", "properties": {"path": {"type": "strin"}}}
    with pytest.raises(
        SchemaValidationError,
        match=r"^fs.read: input_schema is not a valid JSON Schema \(Draft 2020-12\) "
        r"at \$.properties.path.type: ",
    ):
        ToolRegistry().register("fs.read", "", bad, OUTPUT, READ_ONLY, Recorder())


def test_an_invalid_output_schema_is_refused_at_registration() -> None:
    with pytest.raises(
        SchemaValidationError,
        match=r"^fs.read: output_schema is not a valid JSON Schema \(Draft 2020-12\) at \$.minLength: "
        r"-1 is less than the minimum of 0$",
    ):
        ToolRegistry().register("fs.read", "", INPUT, {"minLength": -1}, READ_ONLY, Recorder())


def test_a_schema_with_an_invalid_regular_expression_is_refused() -> None:
    with pytest.raises(
        SchemaValidationError, match=r"^t: input_schema is not a valid JSON Schema .* at \$.pattern"
    ):
        ToolRegistry().register("t", "", {"pattern": "(unclosed"}, OUTPUT, READ_ONLY, Recorder())


def test_a_schema_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(
        SchemaValidationError, match=r"^t: input_schema must be a JSON Schema object, not list$"
    ):
        ToolRegistry().register("t", "", [], OUTPUT, READ_ONLY, Recorder())  # type: ignore[arg-type]


def test_a_refused_registration_leaves_the_registry_unchanged() -> None:
    registry, handler = make_registry()
    with pytest.raises(SchemaValidationError):
        registry.register("fs.read", "", {"type": 3}, OUTPUT, READ_ONLY, Recorder(), allow_override=True)
    definition = registry.lookup("fs.read")
    assert definition is not None
    assert definition.handler is handler


def test_schemas_are_copied_at_registration() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    registry = ToolRegistry()
    registry.register("t", "", schema, {"type": "object"}, READ_ONLY, lambda arguments: {})
    schema["properties"]["n"]["type"] = "string"  # a later change by the caller
    with pytest.raises(
        SchemaValidationError, match=r"^t: arguments are invalid at \$.n: 'x' is not of type 'integer'$"
    ):
        registry.call("t", {"n": "x"})
    definition = registry.lookup("t")
    assert definition is not None
    assert definition.input_schema["properties"]["n"]["type"] == "integer"


def test_unregister_removes_a_tool() -> None:
    registry, _ = make_registry()
    registry.unregister("fs.read")
    assert registry.lookup("fs.read") is None
    with pytest.raises(ToolNotFoundError, match=r"^no tool named 'fs.read' is registered$"):
        registry.unregister("fs.read")


# -- call -----------------------------------------------------------------------------------------------


def test_call_runs_the_handler_with_the_arguments_and_returns_its_result() -> None:
    registry, handler = make_registry()
    assert registry.call("fs.read", {"path": "a.txt", "max_bytes": 10}) == {"content": "hello", "size": 5}
    assert handler.calls == [{"path": "a.txt", "max_bytes": 10}]


def test_call_of_an_unknown_tool_is_refused() -> None:
    registry, handler = make_registry()
    with pytest.raises(ToolNotFoundError, match=r"^no tool named 'fs.reed' is registered$"):
        registry.call("fs.reed", {"path": "a"})
    assert handler.calls == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, r"^fs.read: arguments are invalid: 'path' is a required property$"),
        ({"path": 3}, r"^fs.read: arguments are invalid at \$.path: 3 is not of type 'string'$"),
        ({"path": ""}, r"^fs.read: arguments are invalid at \$.path: '' should be non-empty$"),
        (
            {"path": "a", "max_bytes": 0},
            r"^fs.read: arguments are invalid at \$.max_bytes: 0 is less than the minimum of 1$",
        ),
        (
            {"path": "a", "max_bytes": True},
            r"^fs.read: arguments are invalid at \$.max_bytes: True is not of type 'integer'$",
        ),
        (
            {"path": "a", "mode": "w"},
            r"^fs.read: arguments are invalid: "
            r"Additional properties are not allowed \('mode' was unexpected\)$",
        ),
    ],
)
def test_call_refuses_invalid_arguments_without_running_the_handler(
    arguments: dict[str, Any], message: str
) -> None:
    registry, handler = make_registry()
    with pytest.raises(SchemaValidationError, match=message):
        registry.call("fs.read", arguments)
    assert handler.calls == []


def test_call_refuses_arguments_that_are_not_an_object() -> None:
    registry, handler = make_registry()
    with pytest.raises(
        SchemaValidationError, match=r"^fs.read: arguments are invalid: expected a JSON object, got list$"
    ):
        registry.call("fs.read", ["a"])  # type: ignore[arg-type]
    assert handler.calls == []


def test_a_long_offending_value_is_clipped_in_the_message() -> None:
    registry, _ = make_registry()
    with pytest.raises(SchemaValidationError) as caught:
        registry.call("fs.read", {"path": ["x" * 10_000]})
    assert len(str(caught.value)) < 400
    assert str(caught.value).endswith("…")


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"content": "x"}, r"^fs.read: the tool's result is invalid: 'size' is a required property$"),
        (
            {"content": "x", "size": -1},
            r"^fs.read: the tool's result is invalid at \$.size: -1 is less than the minimum of 0$",
        ),
        (
            {"content": b"x", "size": 1},
            r"^fs.read: the tool's result is invalid at \$.content: b'x' is not of type 'string'$",
        ),
        ("text", r"^fs.read: the tool's result is invalid: expected a JSON object, got str$"),
        (None, r"^fs.read: the tool's result is invalid: expected a JSON object, got NoneType$"),
    ],
)
def test_an_invalid_result_is_refused_after_the_handler_ran(result: Any, message: str) -> None:
    registry = ToolRegistry()
    handler = Recorder()
    handler.result = result
    registry.register("fs.read", "", INPUT, OUTPUT, READ_ONLY, handler)
    with pytest.raises(SchemaValidationError, match=message):
        registry.call("fs.read", {"path": "a"})
    assert len(handler.calls) == 1


def test_handler_exceptions_pass_through() -> None:
    def broken(arguments: dict[str, Any]) -> dict[str, Any]:
        raise FileNotFoundError("no such file: a")

    registry = ToolRegistry()
    registry.register("fs.read", "", INPUT, OUTPUT, READ_ONLY, broken)
    with pytest.raises(FileNotFoundError, match=r"^no such file: a$"):
        registry.call("fs.read", {"path": "a"})


def test_a_schema_outside_the_fast_subset_is_still_enforced() -> None:
    schema = {
        "type": "object",
        "$defs": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
        "properties": {"name": {"$ref": "#/$defs/name"}},
        "required": ["name"],
    }
    registry = ToolRegistry()
    registry.register("t", "", schema, {"type": "object"}, READ_ONLY, lambda arguments: {"ok": True})
    assert registry.call("t", {"name": "abc"}) == {"ok": True}
    with pytest.raises(
        SchemaValidationError,
        match=r"^t: arguments are invalid at \$.name: 'ABC' does not match '\^\[a-z\]\+\$'$",
    ):
        registry.call("t", {"name": "ABC"})


def test_an_unresolvable_reference_fails_closed_with_a_sentence() -> None:
    registry = ToolRegistry()
    registry.register(
        "t", "", {"$ref": "#/$defs/missing"}, {"type": "object"}, READ_ONLY, lambda arguments: {}
    )
    with pytest.raises(
        SchemaValidationError, match=r"^t: arguments are invalid: it cannot be checked against the schema"
    ):
        registry.call("t", {})


def test_validate_arguments_checks_without_calling() -> None:
    registry, handler = make_registry()
    definition = registry.validate_arguments("fs.read", {"path": "a"})
    assert definition.name == "fs.read"
    with pytest.raises(
        SchemaValidationError, match=r"^fs.read: arguments are invalid: 'path' is a required property$"
    ):
        registry.validate_arguments("fs.read", {})
    with pytest.raises(ToolNotFoundError):
        registry.validate_arguments("nope", {})
    assert handler.calls == []


# -- rate limits through the registry -------------------------------------------------------------------


def test_rate_limit_boundary_the_last_call_of_the_burst_passes_the_next_is_refused() -> None:
    clock = FakeClock()
    registry, handler = make_registry(
        rate_limiter=InMemoryRateLimiter(clock=clock), rate_limit=ToolRateLimit(3, 60)
    )
    for _ in range(3):
        registry.call("fs.read", {"path": "a"})  # a burst of 3 at t=1000; a refill every 20 s
    clock.now += 8.0
    with pytest.raises(
        ToolRateLimitError, match=r"^fs.read: rate limit of 3 calls per 60 s reached; retry in 12.0 s$"
    ):
        registry.call("fs.read", {"path": "a"})
    assert len(handler.calls) == 3


def test_rate_limit_refills_one_call_per_interval() -> None:
    clock = FakeClock()
    registry, handler = make_registry(
        rate_limiter=InMemoryRateLimiter(clock=clock), rate_limit=ToolRateLimit(2, 10)
    )
    registry.call("fs.read", {"path": "a"})  # t=0
    registry.call("fs.read", {"path": "a"})  # t=0: the bucket of 2 is empty, a refill every 5 s
    clock.now += 4.999  # t=4.999: a millisecond short of the first refill
    with pytest.raises(ToolRateLimitError, match=r"retry in 0.0 s$"):
        registry.call("fs.read", {"path": "a"})
    clock.now += 0.001  # t=5: one call has come back
    registry.call("fs.read", {"path": "a"})
    with pytest.raises(
        ToolRateLimitError, match=r"^fs.read: rate limit of 2 calls per 10 s reached; retry in 5.0 s$"
    ):
        registry.call("fs.read", {"path": "a"})
    assert len(handler.calls) == 3


def test_rate_limit_message_uses_the_singular_for_one_call() -> None:
    clock = FakeClock()
    registry, _ = make_registry(
        rate_limiter=InMemoryRateLimiter(clock=clock), rate_limit=ToolRateLimit(1, 0.5)
    )
    registry.call("fs.read", {"path": "a"})
    with pytest.raises(
        ToolRateLimitError, match=r"^fs.read: rate limit of 1 call per 0.5 s reached; retry in 0.5 s$"
    ):
        registry.call("fs.read", {"path": "a"})


def test_invalid_arguments_do_not_use_up_the_rate_limit() -> None:
    clock = FakeClock()
    registry, _ = make_registry(
        rate_limiter=InMemoryRateLimiter(clock=clock), rate_limit=ToolRateLimit(1, 60)
    )
    for _ in range(3):
        with pytest.raises(SchemaValidationError):
            registry.call("fs.read", {})
    assert registry.call("fs.read", {"path": "a"}) == {"content": "hello", "size": 5}


def test_tools_without_a_rate_limit_never_consult_the_limiter() -> None:
    class Refusing:
        def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
            raise AssertionError("the limiter was consulted")

    registry, handler = make_registry(rate_limiter=Refusing())
    for _ in range(100):
        registry.call("fs.read", {"path": "a"})
    assert len(handler.calls) == 100


def test_the_registry_counts_under_the_tool_key_and_a_refusal_skips_the_handler() -> None:
    seen: list[tuple[str, ToolRateLimit]] = []

    class Recording:
        def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
            seen.append((key, limit))
            return RateDecision(False, 0, 2.25)

    registry, handler = make_registry(rate_limiter=Recording(), rate_limit=ToolRateLimit(5, 30))
    with pytest.raises(
        ToolRateLimitError, match=r"^fs.read: rate limit of 5 calls per 30 s reached; retry in 2.2 s$"
    ):
        registry.call("fs.read", {"path": "a"})
    assert seen == [(RATE_LIMIT_KEY_PREFIX + "fs.read", ToolRateLimit(5, 30))]
    assert handler.calls == []


def test_a_failing_limiter_fails_closed() -> None:
    class Down:
        def hit(self, key: str, limit: ToolRateLimit) -> RateDecision:
            raise ConnectionError("redis is down")

    registry, handler = make_registry(rate_limiter=Down(), rate_limit=ToolRateLimit(5))
    with pytest.raises(ConnectionError):
        registry.call("fs.read", {"path": "a"})
    assert handler.calls == []


def test_registries_sharing_a_limiter_share_the_window() -> None:
    clock = FakeClock()
    shared = InMemoryRateLimiter(clock=clock)
    first, _ = make_registry(rate_limiter=shared, rate_limit=ToolRateLimit(2, 60))
    second, _ = make_registry(rate_limiter=shared, rate_limit=ToolRateLimit(2, 60))
    first.call("fs.read", {"path": "a"})
    second.call("fs.read", {"path": "a"})
    with pytest.raises(ToolRateLimitError):
        first.call("fs.read", {"path": "a"})
    assert first.rate_limiter is shared


def test_in_memory_limiter_satisfies_the_protocol() -> None:
    assert isinstance(InMemoryRateLimiter(), RateLimiter)
    assert isinstance(ToolRegistry().rate_limiter, InMemoryRateLimiter)


# -- InMemoryRateLimiter on its own ---------------------------------------------------------------------


def test_limiter_decisions_count_down_then_refuse_with_the_wait() -> None:
    clock = FakeClock()
    limiter = InMemoryRateLimiter(clock=clock)
    limit = ToolRateLimit(3, 60)  # a bucket of 3, a refill every 20 s
    assert limiter.hit("k", limit) == RateDecision(True, 2, 0.0)
    assert limiter.hit("k", limit) == RateDecision(True, 1, 0.0)
    assert limiter.hit("k", limit) == RateDecision(True, 0, 0.0)
    clock.now += 10
    assert limiter.hit("k", limit) == RateDecision(False, 0, 10.0)  # half way to the first refill
    clock.now += 10
    assert limiter.hit("k", limit) == RateDecision(True, 0, 0.0)
    assert limiter.hit("other", limit) == RateDecision(True, 2, 0.0)  # keys are independent
    clock.now += 60
    assert limiter.hit("k", limit) == RateDecision(True, 2, 0.0)  # idle a whole window: full again


def test_limiter_refused_calls_are_not_counted() -> None:
    clock = FakeClock()
    limiter = InMemoryRateLimiter(clock=clock)
    limit = ToolRateLimit(1, 10)
    assert limiter.hit("k", limit).allowed
    for _ in range(5):
        clock.now += 1
        assert not limiter.hit("k", limit).allowed
    clock.now = 1010.0  # ten seconds after the only counted call
    assert limiter.hit("k", limit).allowed


def test_limiter_handles_a_lowered_limit_on_the_same_key() -> None:
    clock = FakeClock()
    limiter = InMemoryRateLimiter(clock=clock)
    for step in range(4):
        clock.now = 1000.0 + step
        assert limiter.hit("k", ToolRateLimit(4, 60)).allowed  # the bucket is full again at 1060
    decision = limiter.hit("k", ToolRateLimit(2, 60))
    # Now a refill is 30 s and the bucket 60 s: one more refill fits once the TAT is 1030, 27 s away.
    assert decision == RateDecision(False, 0, 1030.0 - 1003.0)


def test_limiter_reset_forgets_a_key_or_all() -> None:
    limiter = InMemoryRateLimiter(clock=FakeClock())
    limit = ToolRateLimit(1, 60)
    limiter.hit("a", limit)
    limiter.hit("b", limit)
    limiter.reset("a")
    assert limiter.hit("a", limit).allowed
    assert not limiter.hit("b", limit).allowed
    limiter.reset()
    assert limiter.hit("b", limit).allowed


def test_limiter_is_exact_under_threads() -> None:
    limiter = InMemoryRateLimiter()
    limit = ToolRateLimit(500, 3600)
    allowed: list[bool] = []
    lock = threading.Lock()

    def worker() -> None:
        results = [limiter.hit("k", limit).allowed for _ in range(100)]
        with lock:
            allowed.extend(results)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert allowed.count(True) == 500
    assert allowed.count(False) == 300
