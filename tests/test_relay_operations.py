"""The relay service in-process: the outcome by long-poll, health, metrics, the documented API, errors
as ``ErrorOut``, a broken configuration refused, and statements of any JSON type."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from relay_support import (
    Node,
    approval,
    decisions_path,
    denial,
    error,
    fixture_nodes,  # noqa: F401 - the nodes fixture
    in_process,
    submit,
    write_cluster,
)

from teaagent.errors import ConfigError
from teaagent_relay import MAX_WAIT_SECONDS, Settings, create_app

# -- the outcome, by long-poll ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_outcome_long_poll_returns_when_the_quorum_is_reached(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        url = f"/v1/requests/{request['request_id']}/outcome"
        at_once = await client.get(url, params={"wait": 0}, headers=alpha.headers)

        async def peers_approve() -> None:
            await asyncio.sleep(0.3)
            for peer in ("beta", "gamma"):
                await client.post(decisions_path(request), json=approval(request, peer))

        started = time.monotonic()
        waited, _ = await asyncio.gather(
            client.get(url, params={"wait": 20}, headers=alpha.headers), peers_approve()
        )
        elapsed = time.monotonic() - started

    assert at_once.json()["state"] == "pending"
    assert waited.json()["state"] == "approved"
    assert waited.json()["certificate"]["request"] == request
    assert elapsed < 15  # it returned on the outcome event, not at the end of the wait


@pytest.mark.anyio
async def test_the_long_poll_is_capped(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        response = await client.get(
            f"/v1/requests/{request['request_id']}/outcome",
            params={"wait": MAX_WAIT_SECONDS + 1},
            headers=alpha.headers,
        )
        unknown = await client.get(
            f"/v1/requests/{'f' * 32}/outcome", params={"wait": 1}, headers=alpha.headers
        )

    assert error(response) == (422, "invalid", "Wait: Input should be less than or equal to 60.")
    assert error(unknown)[:2] == (404, "not_found")


# -- operations ---------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_health_metrics_and_the_documented_api(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False, settlement_grace_seconds=0) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        await client.post(decisions_path(request), json=approval(request, "beta"))
        await client.post(decisions_path(request), json=approval(request, "beta"))
        await client.post(decisions_path(request), json=approval(request, "mallory"))
        await client.post(decisions_path(request), json=approval(request, "gamma"))
        await client.get("/v1/inbox")  # no token
        await client.get("/v1/nothing")
        health = await client.get("/health")
        metrics = (await client.get("/metrics")).text
        schema = (await client.get("/openapi.json")).json()

    assert health.json()["status"] == "ok"
    assert health.json()["agent_id"] == "alpha"
    for line in (
        'teaagent_relay_decisions_total{result="counted",source="peer"} 2.0',
        'teaagent_relay_decisions_total{result="duplicate",source="peer"} 1.0',
        'teaagent_relay_decisions_total{result="rejected",source="peer"} 1.0',
        'teaagent_relay_outcomes_total{state="approved"} 1.0',
        'teaagent_relay_quorum_requests_total{result="created",source="own"} 1.0',
        'teaagent_relay_http_requests_total{method="POST",route="/v1/requests/{request_id}/decisions",'
        'status="200"} 3.0',
        # The request for each of the 3 peers, then its settlement (the certificate) for delta, the
        # one peer that did not decide it (no grace: queued with the deciding count).
        'teaagent_relay_queue_entries{kind="length",queue="deliveries"} 4.0',
        # Refusals by their ErrorOut code: mallory is no peer, a call without the token, no such path.
        'teaagent_relay_refusals_total{code="forbidden"} 1.0',
        'teaagent_relay_refusals_total{code="unauthorized"} 1.0',
        'teaagent_relay_refusals_total{code="not_found"} 1.0',
    ):
        assert line in metrics, line
    assert "teaagent_relay_http_request_duration_seconds_bucket" in metrics
    assert set(schema["paths"]) == {
        "/v1/requests",
        "/v1/requests/{request_id}",
        "/v1/requests/{request_id}/outcome",
        "/v1/requests/{request_id}/decisions",
        "/v1/requests/{request_id}/withdrawal",
        "/v1/inbox",
        "/v1/inbox/{request_id}",
        "/v1/inbox/{request_id}/decision",
        "/v1/inbox/decisions",
        "/v1/inbox/{request_id}/withdrawal",
        "/v1/inbox/{request_id}/settled",
        "/v1/deliveries",
        "/v1/deliveries/dead",
        "/health",
        "/ready",
        "/metrics",
        "/v1/reload",
    }
    batch = schema["paths"]["/v1/inbox/decisions"]["post"]
    batch_body = batch["requestBody"]["content"]["application/json"]["schema"]["$ref"].rpartition("/")[2]
    assert schema["components"]["schemas"][batch_body]["properties"]["decisions"]["maxItems"] == 64
    delivered = schema["paths"]["/v1/deliveries"]["post"]
    delivered_body = delivered["requestBody"]["content"]["application/json"]["schema"]["$ref"].rpartition(
        "/"
    )[2]
    assert schema["components"]["schemas"][delivered_body]["properties"]["deliveries"]["maxItems"] == 64
    assert "security" not in delivered  # a peer's relay: each delivery is signed, no token
    decisions = schema["paths"]["/v1/requests/{request_id}/decisions"]["post"]
    assert decisions["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/SignedDecisionIn"
    )
    assert "ErrorOut" in schema["components"]["schemas"]
    outcome = {
        parameter["name"]
        for parameter in schema["paths"]["/v1/requests/{request_id}/outcome"]["get"]["parameters"]
    }
    assert {"wait", "approvals", "denials"} <= outcome


@pytest.mark.anyio
async def test_unknown_paths_and_methods_answer_error_out(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    async with in_process(alpha, deliver=False) as client:
        missing = await client.get("/v2/nothing")
        method = await client.delete("/v1/requests")

    assert error(missing) == (404, "not_found", "There is no such resource on this relay.")
    assert error(method)[:2] == (405, "method_not_allowed")


def test_the_app_refuses_a_broken_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEAAGENT_CONFIG", raising=False)
    with pytest.raises(
        ConfigError, match=r"no configuration file was given: pass --config PATH or set TEAAGENT_CONFIG\."
    ):
        create_app(Settings())
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        create_app(Settings(config=str(tmp_path / "missing.toml")))
    node = write_cluster(tmp_path, ["alpha", "beta"], redis_url="embedded", prefix="p", required=1)["alpha"]
    with pytest.raises(ConfigError, match=r"^TEAAGENT_RELAY_REDIS_PREFIX is not usable: key prefix 'a\{b\}'"):
        create_app(node.settings(redis_prefix="a{b}"))


@pytest.mark.anyio
async def test_development_signatures_count_only_where_the_configuration_allows_them(
    tmp_path: Path, redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    lax, strict = (
        write_cluster(
            tmp_path / name,
            ["alpha", "beta"],
            redis_url=redis_url,
            prefix=f"{redis_prefix}:{name}",
            required=1,
            allow_dev_signatures=name == "lax",  # strict: the default, False
        )["alpha"]
        for name in ("lax", "strict")
    )
    request = lax.request()
    statement = approval(request, "beta")["statement"]
    async with in_process(lax, deliver=False) as client:
        submitted = await client.post(
            "/v1/requests", json={"request": request, "signature": "dev:alpha"}, headers=lax.headers
        )
        counted = await client.post(
            decisions_path(request), json={"statement": statement, "signature": "dev:beta"}
        )
    async with in_process(strict, deliver=False) as client:
        refused_request = await client.post(
            "/v1/requests", json={"request": request, "signature": "dev:alpha"}, headers=strict.headers
        )

    assert submitted.status_code == 201
    assert (counted.json()["counted"], counted.json()["state"]) == (True, "approved")
    assert "without any cryptography" in caplog.text
    assert error(refused_request) == (
        403,
        "bad_signature",
        "The request signature is a development signature, which this node's own key cannot verify.",
    )


NASTY_VALUES: list[Any] = [None, True, 1.5, -1, 2**70, "", "x" * 300, [], [1], {}, {"a": [1]}]


@pytest.mark.anyio
async def test_no_statement_field_of_any_json_type_makes_the_relay_fail(nodes: dict[str, Node]) -> None:
    alpha = nodes["alpha"]
    answers: list[tuple[str, Any, int]] = []
    async with in_process(alpha, deliver=False) as client:
        request = alpha.request()
        await submit(client, alpha, request)
        document = denial(request, "beta")
        for name in [*document["statement"], "extra"]:
            for value in NASTY_VALUES:
                statement = dict(document["statement"], **{name: value})
                response = await client.post(
                    decisions_path(request), json={"statement": statement, "signature": document["signature"]}
                )
                answers.append((name, value, response.status_code))
        for value in NASTY_VALUES:
            response = await client.post(
                "/v1/inbox", json={"request": dict(request, origin=value), "signature": "x"}
            )
            answers.append(("origin", value, response.status_code))

    failures = [answer for answer in answers if not 400 <= answer[2] < 500]
    assert failures == []
