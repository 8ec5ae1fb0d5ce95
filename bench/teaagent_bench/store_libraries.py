"""Redis client libraries side by side, as a relay calls Redis: ``bench relay``'s ``lib_*`` figures.

Issue 29 asks which Redis client the store should use, measured fairly in the project's own
benches. ``bench_redis_libraries(url, tcp_url, seconds)`` runs, at ``CALLERS`` concurrent callers on
uvloop, the two calls a relay makes on every quorum, an ``EVALSHA`` of a one-line ``SET ... EX``
script and a ``MULTI`` of three reads (a document and two hashes), through each library as its
documentation has it used:

- ``redispy``: redis-py's asyncio client with hiredis (its parser whenever hiredis is installed) on a
  ``BlockingConnectionPool`` of ``CALLERS`` connections (one per call in flight, so no caller ever
  waits for one), the script as a ``Script`` object (``register_script``: EVALSHA, loaded on
  NOSCRIPT) and the reads in ``pipeline(transaction=True)``;
- ``coredis``: coredis's ``Redis`` on its default pool, whose connections are multiplexed (a
  connection goes back to the pool once its command is sent, so callers share a few), its
  ``Script`` object and its transaction pipeline;
- ``glide``: valkey-glide's ``GlideClient`` (one multiplexed connection, a Rust core) with its
  ``Script`` and an atomic ``Batch``. Glide speaks TCP only, so it runs against the same server's
  TCP port (``tcp_url``), beside ``redispy_tcp``, redis-py as above on that port;

Each figure is the client process's CPU microseconds per call (user and system, every thread, so
glide's Rust threads count): ``lib_<call>_client_cpu_us_<variant>``; the floor is the same calls
as RESP bytes over ``CALLERS`` kept connections read by hiredis (``_raw``), and
``lib_<call>_ratio_to_raw_<variant>`` is each figure over it. The contenders run in interleaved
rounds (``ROUND_SECONDS``) and each figure is the median of its rounds.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from teaagent.store._connection import converting
from teaagent_bench._resp import RespConnection, pack
from teaagent_bench.store import CALLERS, _interleaved

__all__ = ["bench_redis_libraries"]

_SCRIPT = "return redis.call('SET', KEYS[1], ARGV[1], 'EX', 600)"
_Call = Callable[[int], Awaitable[object]]


def _script_and_pipeline(
    client: Any, *, pipeline_awaited: bool
) -> Callable[[str, str, str, str], tuple[_Call, _Call]]:
    """The two calls through a library with redis-py's interface: a ``Script`` object and a transaction.

    ``pipeline_awaited``: the library's ``pipeline()`` is a coroutine (coredis), not a context manager.
    """
    script = client.register_script(_SCRIPT)

    def calls(doc: str, outcome: str, decisions: str, value: str) -> tuple[_Call, _Call]:
        async def write(_index: int) -> object:
            return await script(keys=[doc], args=[value])

        async def reads(_index: int) -> object:
            pipeline = client.pipeline(transaction=True)
            async with await pipeline if pipeline_awaited else pipeline as pipe:
                pipe.get(doc)
                pipe.hgetall(outcome)
                pipe.hgetall(decisions)
                return await pipe.execute()

        return write, reads

    return calls


async def _redispy(url: str) -> tuple[Any, Callable[[str, str, str, str], tuple[_Call, _Call]]]:
    import redis.asyncio

    client = redis.asyncio.Redis(
        connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=CALLERS, timeout=10, socket_timeout=5
        )
    )
    return client, _script_and_pipeline(client, pipeline_awaited=False)


async def _coredis(url: str) -> tuple[Any, Callable[[str, str, str, str], tuple[_Call, _Call]]]:
    import coredis

    client: Any = coredis.Redis.from_url(url)
    return client, _script_and_pipeline(client, pipeline_awaited=True)


async def _glide(url: str) -> tuple[Any, Callable[[str, str, str, str], tuple[_Call, _Call]]]:
    from glide import Batch, GlideClient, GlideClientConfiguration, NodeAddress, Script, ServerCredentials

    parts = urlsplit(url)
    credentials = ServerCredentials(parts.password) if parts.password else None
    client: Any = await GlideClient.create(
        GlideClientConfiguration(
            [NodeAddress(parts.hostname or "127.0.0.1", parts.port or 6379)],
            credentials=credentials,
            request_timeout=5000,
        )
    )
    script = Script(_SCRIPT)  # type: ignore[no-untyped-call]

    def calls(doc: str, outcome: str, decisions: str, value: str) -> tuple[_Call, _Call]:
        async def write(_index: int) -> object:
            return await client.invoke_script(script, keys=[doc], args=[value])

        async def reads(_index: int) -> object:
            batch = Batch(is_atomic=True)
            batch.get(doc)
            batch.hgetall(outcome)
            batch.hgetall(decisions)
            return await client.exec(batch, raise_on_error=True)

        return write, reads

    return client, calls


async def _close(client: Any) -> None:
    closing = getattr(client, "aclose", None) or getattr(client, "close", None)
    if closing is not None:
        result = closing()
        if asyncio.iscoroutine(result):
            await result
    pool = getattr(client, "connection_pool", None)
    if pool is not None and hasattr(pool, "disconnect") and not hasattr(client, "aclose"):
        pool.disconnect()


async def _bench(url: str, tcp_url: str | None, seconds: float, variants: tuple[str, ...]) -> dict[str, Any]:

    prefix = f"bench:{uuid.uuid4().hex[:12]}"
    doc, outcome, decisions = (f"{prefix}:{{libs}}:{name}" for name in ("doc", "outcome", "decisions"))
    value = "v" * 400
    makers = {"redispy": _redispy, "coredis": _coredis}
    clients: list[Any] = []
    contenders: dict[str, _Call] = {}
    figures: dict[str, Any] = {"lib_callers": CALLERS}
    raw: list[RespConnection] = []  # the floor: one kept connection per caller
    try:
        for _ in range(CALLERS):
            raw.append(await RespConnection.open(url))
        await raw[0].call(pack("HSET", outcome, "state", "pending", "required", "2"))
        await raw[0].call(pack("HSET", decisions, "approval:beta", value))
        sha = await raw[0].call(pack("SCRIPT", "LOAD", _SCRIPT))
        raw_write = pack("EVALSHA", sha, 1, doc, value)
        raw_reads = b"".join(
            pack(*command)
            for command in (("MULTI",), ("GET", doc), ("HGETALL", outcome), ("HGETALL", decisions), ("EXEC",))
        )
        contenders["lib_evalsha_client_cpu_us_raw"] = lambda index: raw[index].call(raw_write)
        contenders["lib_multi3_client_cpu_us_raw"] = lambda index: raw[index].call(raw_reads, 5)
        chosen: list[tuple[str, str, Callable[[str], Awaitable[Any]]]] = [
            (name, url, makers[name]) for name in variants if name in makers
        ]
        if tcp_url is not None:
            if "glide" in variants:
                chosen.append(("glide", tcp_url, _glide))
            if "redispy" in variants:
                chosen.append(("redispy_tcp", tcp_url, _redispy))
        for name, where, maker in chosen:
            try:
                client, calls = await maker(where)
            except Exception as exc:  # a library missing or refusing: a figure left out, with why
                figures[f"lib_{name}_omitted"] = f"{type(exc).__name__}: {exc}"
                continue
            clients.append(client)
            write, reads = calls(doc, outcome, decisions, value)
            contenders[f"lib_evalsha_client_cpu_us_{name}"] = write
            contenders[f"lib_multi3_client_cpu_us_{name}"] = reads
        figures.update(await _interleaved(contenders, seconds))
    finally:
        if raw:
            await raw[0].call(pack("DEL", doc, outcome, decisions))
        for kept in raw:
            kept.close()
        for client in clients:
            await _close(client)
    for kind in ("evalsha", "multi3"):
        floor = figures[f"lib_{kind}_client_cpu_us_raw"]
        for key in list(figures):
            if key.startswith(f"lib_{kind}_client_cpu_us_") and not key.endswith("_raw"):
                variant = key.removeprefix(f"lib_{kind}_client_cpu_us_")
                figures[f"lib_{kind}_ratio_to_raw_{variant}"] = figures[key] / floor
    return figures


def bench_redis_libraries(
    url: str,
    tcp_url: str | None = None,
    seconds: float = 2.0,
    variants: tuple[str, ...] = ("redispy", "coredis", "glide"),
) -> dict[str, Any]:
    """Client CPU per EVALSHA and per MULTI of three through each Redis library (see the module docstring).

    ``url`` is the server (a Unix socket or TCP); ``tcp_url`` the same server's TCP address, for the
    libraries that speak TCP only (glide), None to leave them out. A library that cannot be used
    here has ``lib_<variant>_omitted`` with the reason instead of figures.

    Raises:
        StoreError: Redis is unreachable or failed.
        ValueError: ``seconds`` is not positive.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    import uvloop

    with converting(url):
        return uvloop.run(_bench(url, tcp_url, seconds, variants))
