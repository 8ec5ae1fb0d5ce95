"""schemathesis against the agent service's own OpenAPI document, served by a real ``teaagent agent serve``.

For every operation, generated inputs (valid and invalid) never get a 5xx, and every refusal is an
``ErrorOut``. Models that the generated bodies add point at a closed loopback port, so that no run,
doctor or side question ever sends a byte off this machine; a call that reaches such a model gets
the documented 502 ``run`` (the model failed), the one 5xx allowed here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from agent_support import AgentNode, AgentProcess, write_node
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

# A minute on a quiet two-core host; several on a loaded one: the suite's 120 s would cut it short.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXAMPLES = 20  # per operation and mode: about 1,300 calls in all
DEAD_LOOPBACK = "http://127.0.0.1:9/v1"  # the discard port: nothing listens, nothing leaves the host


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentNode]:
    folder = tmp_path_factory.mktemp("agent-schema")
    node = write_node(folder / "alpha", turns=[{"content": "Done."}])
    with AgentProcess(node, folder, env={"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}):
        yield node


def error_out(response: Any) -> None:
    """A refusal's body is exactly ``{"error": str, "message": str}``."""
    body = json.loads(response.content)
    assert isinstance(body, dict), body
    assert set(body) == {"error", "message"}, body
    assert isinstance(body["error"], str)
    assert isinstance(body["message"], str)
    assert body["message"]


def dead_model(response: Any) -> bool:
    """The documented 502 ``run`` of a model that this test pointed at its dead port (an input that
    made such a model the current one, then asked it something): the model failed, not the service."""
    if response.status_code != 502:
        return False
    error_out(response)
    body = json.loads(response.content)
    return bool(body["error"] == "run" and DEAD_LOOPBACK.removesuffix("/v1") in body["message"])


def operations(agent: AgentNode) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{agent.url}/openapi.json", headers=agent.headers)
    return [result.ok() for result in schema.get_all_operations()]


# The schemathesis pytest plugin does not run under this pytest; each operation is driven with
# hypothesis directly, with both of schemathesis's generation modes.
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda mode: mode.value)
def test_no_input_gets_a_5xx_and_every_refusal_is_an_error_out(agent: AgentNode, mode: Any) -> None:
    checked = []
    for operation in operations(agent):

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def check(case: Any) -> None:
            if case.path in ("/models", "/models/{name}") and isinstance(case.body, dict):
                case.body["base_url"] = DEAD_LOOPBACK
            response = case.call(headers=agent.headers, timeout=60)
            where = (case.method, case.path, response.status_code, response.text[:300])
            if dead_model(response):
                return
            assert response.status_code < 500, where
            if response.status_code >= 400:
                error_out(response)
            case.validate_response(
                response, checks=[schemathesis.checks.not_a_server_error], headers=agent.headers
            )

        try:
            check()
        except Unsatisfiable:
            # An operation with no input to get wrong (GET /health, GET /models) has no negative case.
            assert mode is schemathesis.GenerationMode.NEGATIVE, operation.path
            continue
        checked.append(f"{operation.method.upper()} {operation.path}")
    assert len(checked) >= (30 if mode is schemathesis.GenerationMode.POSITIVE else 15), checked


def test_unknown_routes_and_methods_are_error_outs_too(agent: AgentNode) -> None:
    import httpx

    with httpx.Client(base_url=agent.url, headers=agent.headers) as client:
        for method, path in (("GET", "/nowhere"), ("PUT", "/health"), ("POST", "/sessions/current/history")):
            response = client.request(method, path)
            assert response.status_code in (404, 405)
            error_out(response)
