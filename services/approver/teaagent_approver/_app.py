"""The approver service's application factory and its lifespan (store, relay client, engine)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI

from teaagent._tasks import cancel_and_wait
from teaagent.config import NodeConfig, load_config
from teaagent.errors import ConfigError, SignatureError
from teaagent.relay_client import AsyncRelayClient
from teaagent.service import service_app
from teaagent.signing import Signer
from teaagent.store import Store, open_node_store
from teaagent_approver._audit import AUDIT_FILE_NAME, DecisionAudit
from teaagent_approver._engine import Engine, Notifies
from teaagent_approver._errors import ERRORS
from teaagent_approver._metrics import ApproverMetrics
from teaagent_approver._routes import operations_router, requests_router
from teaagent_approver._settings import MAX_BODY_BYTES, Settings
from teaagent_approver._wire import DecisionPoster

__all__ = ["create_app"]

logger = logging.getLogger("teaagent.approver")


DESCRIPTION = f"""\
A teaagent node's signing authority and its operators' inbox. It applies the node's
`[[approver.rules]]` to the requests that reach the node's relay, signs approvals and denials
(with the node key, or accepts ones signed with an operator's own key), records each decision
atomically before it is signed, so that the node never signs two different decisions on one
request, audits it, and hands it to the relay, which forwards it to the request's origin.

Every call but `/health` and `/metrics` carries the node's bearer token; the operators' web
inbox under `/web` takes it once, at sign-in, and then a session cookie (docs/operators.md).
Bodies are limited to {MAX_BODY_BYTES} bytes. Every failure is an `ErrorOut`
`{{"error": code, "message": sentence}}`.
A decision here is this node's own; the request's outcome is counted by its origin.
"""


async def _open_store(stack: AsyncExitStack, config: NodeConfig, prefix: str) -> Store:
    """Open the node's store (a Redis Cluster with ``redis_cluster = true``), waiting for it however long.

    Only the relay owns the node's embedded server: an approver that started it would stop it on
    exit, under the relay's feet; this one uses its socket, waiting until the relay runs it.
    """
    return await stack.enter_async_context(
        open_node_store(config, prefix=prefix, start_embedded=False, service=f"approver of {config.agent_id}")
    )


def _notifier(config: NodeConfig) -> Any:
    """The notifier of ``[approver] notify``, or None (none configured, or the module is absent)."""
    settings = config.approver.notify
    if settings is None:
        return None
    try:
        from teaagent_approver._notify import Notifier
    except ImportError:  # pragma: no cover - the module ships with the service
        logger.warning("[approver] notify is set but this approver has no notifier; nobody is told")
        return None
    return Notifier.for_node(config, settings)


def _lifespan(
    settings: Settings,
    config: NodeConfig,
    signer: Signer,
    metrics: ApproverMetrics,
    prefix: str,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            token = app.state.token
            store = await _open_store(stack, config, prefix)
            relay_url = settings.relay_url or config.relay_url
            verify = config.tls.client_verify()
            relay = AsyncRelayClient(relay_url, token=token, verify=verify)
            stack.push_async_callback(relay.aclose)
            poster = DecisionPoster(
                relay_url,
                token=token,
                connections=settings.concurrency,
                ssl_context=verify if isinstance(verify, ssl.SSLContext) else None,
            )
            stack.push_async_callback(poster.aclose)
            audit = DecisionAudit(config.data_dir / AUDIT_FILE_NAME, fsync=settings.audit_fsync)
            stack.callback(audit.close)
            notifier = _notifier(config)
            if notifier is not None:
                stack.push_async_callback(notifier.aclose)
            notifies: Notifies | None = notifier
            engine = Engine(
                node=config,
                store=store,
                relay=relay,
                poster=poster,
                audit=audit,
                metrics=metrics,
                settings=settings,
                signer=signer,
                notifier=notifies,
                trust=app.state.trust,
            )
            task = (
                asyncio.create_task(engine.run(), name="teaagent-approver-engine")
                if settings.engine
                else None
            )
            app.state.engine = engine
            logger.info(
                "approver of %s serving (store %r, relay %s, rules %s, audit %s)",
                config.agent_id,
                store,
                relay.base_url,
                "applied" if task else "off",
                audit.path,
            )
            try:
                yield
            finally:
                app.state.engine = None
                if task is not None:
                    # Cancelled again while it runs on: a cancellation lost inside a Redis call
                    # (Python 3.11) left the engine's loop running and this shutdown waiting forever.
                    await cancel_and_wait(task)

    return lifespan


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the approver service's application.

    The node configuration, its token and its signing key are loaded here, so a broken file, an
    unreadable token or a key that needs a passphrase fails before the server starts; the store
    is connected and the engine started when the application starts, and both stopped when it
    stops.

    Args:
        settings: The service settings; read from the environment when None.

    Returns:
        The FastAPI application.

    Raises:
        ConfigError: The node configuration is missing or wrong, its token file cannot be read or
            created, its private key cannot be loaded, or the key prefix is malformed.
    """
    settings = settings or Settings()
    config = load_config(settings.config)
    try:
        signer = config.signer()
    except SignatureError as exc:
        raise ConfigError(f"{config.path}: the node key cannot sign: {exc}") from exc
    metrics = ApproverMetrics()
    app = service_app(
        FastAPI,
        "approver",
        description=DESCRIPTION,
        lifespan=_lifespan(settings, config, signer, metrics, settings.store_prefix(config)),
        settings=settings,
        config=config,
        errors=ERRORS,
        metrics=metrics,
        body_limit=MAX_BODY_BYTES,
        routers=(requests_router, operations_router),
        reloads_trust=True,
    )
    app.state.engine = None
    if settings.web:
        from teaagent_approver._web import install_web

        install_web(app, settings.web_session_seconds)  # the operators' web inbox, under /web
    return app
