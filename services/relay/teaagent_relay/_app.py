"""The relay service's application factory and its lifespan (store, delivery worker)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from teaagent._tasks import cancel_and_wait
from teaagent.config import NodeConfig, load_config
from teaagent.service import service_app
from teaagent.store import Store, open_node_store
from teaagent_relay._errors import ERRORS
from teaagent_relay._fast import RelayApp, hot_routes
from teaagent_relay._metrics import RelayMetrics
from teaagent_relay._relay import Relay
from teaagent_relay._routes import deliveries_router, inbox_router, operations_router, requests_router
from teaagent_relay._settings import MAX_BODY_BYTES, Settings
from teaagent_relay._worker import DeliveryWorker

__all__ = ["create_app"]

logger = logging.getLogger("teaagent.relay")


DESCRIPTION = f"""\
A teaagent node's mailbox. It sends this node's approval requests to the peers' relays, receives
the peers' requests for this node's approver, and counts the signed decisions that come back
(PROTOCOL.md). Relays are untrusted transport: every document is signed, and the origin verifies
the quorum certificate itself.

Calls of the node itself (its agent, approver and operators) carry the node's bearer token;
calls of peer relays (`POST /v1/inbox`, `POST /v1/requests/{{id}}/decisions`, their withdrawals
and settlements, and `POST /v1/deliveries`, several of those at once) carry none: what they send
is signed and verified against this node's configuration. Bodies are limited to {MAX_BODY_BYTES}
bytes. Every failure is an `ErrorOut` `{{"error": code, "message": sentence}}`.
"""


async def _open_store(stack: AsyncExitStack, config: NodeConfig, prefix: str) -> Store:
    """Open the node's store (a Redis Cluster with ``redis_cluster = true``), waiting for it however long."""
    return await stack.enter_async_context(
        open_node_store(config, prefix=prefix, service=f"relay of {config.agent_id}")
    )


def _lifespan(
    settings: Settings, config: NodeConfig, metrics: RelayMetrics, prefix: str
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            store = await _open_store(stack, config, prefix)
            relay = Relay(
                config=config,
                store=store,
                settings=settings,
                metrics=metrics,
                stopping=app.state.stopping,
                trust=app.state.trust,
            )
            task: asyncio.Task[None] | None = None
            if settings.deliver:
                worker = DeliveryWorker(
                    relay,
                    min_idle_seconds=settings.delivery_min_idle_seconds,
                    batches=settings.delivery_batches,
                )
                stack.push_async_callback(worker.aclose)
                task = asyncio.create_task(worker.run(), name="teaagent-relay-deliveries")
            app.state.relay = relay
            app.state.delivery_task = task  # /ready checks that it runs
            logger.info(
                "relay of %s serving (store %r, delivery worker %s)",
                config.agent_id,
                store,
                "on" if task else "off",
            )
            try:
                yield
            finally:
                app.state.relay = None
                app.state.delivery_task = None
                await relay.close_settlements()  # queued while the store is open
                if task is not None:
                    await cancel_and_wait(task)

    return lifespan


def create_app(settings: Settings | None = None) -> RelayApp:
    """Build the relay service's application.

    The node configuration is loaded here, so a broken file fails before the server starts; the
    store is opened (and the embedded Redis started, with ``redis_url = "embedded"``) and the
    delivery worker started when the application starts, and both stopped when it stops.

    Args:
        settings: The service settings; read from the environment when None.

    Returns:
        The FastAPI application.

    Raises:
        ConfigError: The node configuration is missing or wrong, this node's public key cannot be
            read, its token file cannot be read or created, or the key prefix is malformed.
    """
    settings = settings or Settings()
    config = load_config(settings.config)
    # Read now, not in the lifespan: a missing key (and an unusable token file: service_app) fails
    # before serving.
    config.own_public_key()
    metrics = RelayMetrics()
    app = service_app(
        RelayApp,
        "relay",
        description=DESCRIPTION,
        lifespan=_lifespan(settings, config, metrics, settings.store_prefix(config)),
        settings=settings,
        config=config,
        errors=ERRORS,
        metrics=metrics,
        body_limit=MAX_BODY_BYTES,
        routers=(requests_router, inbox_router, deliveries_router, operations_router),
        reloads_trust=True,
        # The relay's own metrics count and time every call (/metrics); FastAPI's OpenTelemetry
        # hooks stay off rather than look for a provider on every call.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.relay = None
    # The quorum's hot calls (the decisions among them): routes at the head of the one router,
    # each handing what it does not read exactly as documented to its FastAPI route (_fast.py).
    app.router.routes[:0] = hot_routes(requests_router, inbox_router, deliveries_router)
    return app
