"""The rate-limit benchmark runs and reports every figure (targets are for `make bench`, not tests)."""

from __future__ import annotations

import pytest
import redis

from teaagent.store import StoreError
from teaagent_bench.store import bench_async_client, bench_ratelimit
from teaagent_bench.store_libraries import bench_redis_libraries


@pytest.mark.slow
def test_bench_ratelimit_reports_every_figure_and_leaves_no_keys(redis_url: str) -> None:
    figures = bench_ratelimit(redis_url, 0.3)
    for name in (
        "ratelimit_per_s",
        "ratelimit_async_per_s",
        "raw_evalsha_per_s",
        "raw_evalsha_wire_per_s",
        "limits_moving_window_per_s",
        "limits_moving_window_redispy_per_s",
    ):
        assert figures[name] > 0, name
        assert figures[name.removesuffix("_per_s") + "_client_cpu_us"] > 0, name
    assert figures["ratio_to_raw_evalsha"] == figures["ratelimit_per_s"] / figures["raw_evalsha_per_s"]
    assert (
        figures["ratio_to_raw_evalsha_wire"] == figures["ratelimit_per_s"] / figures["raw_evalsha_wire_per_s"]
    )
    assert figures["ratio_to_limits"] == figures["ratelimit_per_s"] / figures["limits_moving_window_per_s"]
    client = redis.Redis.from_url(redis_url)
    assert list(client.scan_iter(match="bench:*")) == []
    client.close()


def test_bench_ratelimit_refuses_a_non_positive_duration() -> None:
    with pytest.raises(ValueError, match="seconds must be positive, not 0"):
        bench_ratelimit("redis://127.0.0.1:1/0", 0)


def test_bench_ratelimit_on_an_unreachable_server_is_a_store_error() -> None:
    with pytest.raises(StoreError, match=r"^Redis at redis://127\.0\.0\.1:1/0 is unreachable"):
        bench_ratelimit("redis://127.0.0.1:1/0", 0.1)


@pytest.mark.slow
def test_bench_async_client_measures_the_store_client_against_its_floor_and_leaves_no_keys(
    redis_url: str,
) -> None:
    figures = bench_async_client(redis_url, 0.3)
    for call in ("evalsha", "multi3"):
        for way in ("", "_redispy", "_raw"):
            assert figures[f"async_{call}{way}_client_cpu_us"] > 0, (call, way)
        raw = figures[f"async_{call}_raw_client_cpu_us"]
        assert figures[f"async_{call}_ratio_to_raw"] == figures[f"async_{call}_client_cpu_us"] / raw
        redispy = figures[f"async_{call}_redispy_client_cpu_us"]
        assert figures[f"async_{call}_redispy_ratio_to_raw"] == redispy / raw
    client = redis.Redis.from_url(redis_url)
    assert list(client.scan_iter(match="bench:*")) == []
    client.close()


def test_bench_async_client_refuses_a_non_positive_duration() -> None:
    with pytest.raises(ValueError, match="seconds must be positive, not 0"):
        bench_async_client("redis://127.0.0.1:1/0", 0)


def test_bench_async_client_on_an_unreachable_server_is_a_store_error() -> None:
    with pytest.raises(StoreError, match=r"^Redis at redis://127\.0\.0\.1:1/0 is unreachable"):
        bench_async_client("redis://127.0.0.1:1/0", 0.1)


@pytest.mark.slow
def test_bench_redis_libraries_measures_each_library_against_the_wire_and_leaves_no_keys(
    redis_url: str,
) -> None:
    figures = bench_redis_libraries(redis_url, None, 0.3, ("redispy", "coredis"))
    for call in ("evalsha", "multi3"):
        raw = figures[f"lib_{call}_client_cpu_us_raw"]
        assert raw > 0
        for variant in ("redispy", "coredis"):
            cpu = figures[f"lib_{call}_client_cpu_us_{variant}"]
            assert cpu > 0, (call, variant)
            assert figures[f"lib_{call}_ratio_to_raw_{variant}"] == cpu / raw
    assert not any("glide" in key for key in figures)  # no TCP address given: left out
    client = redis.Redis.from_url(redis_url)
    assert list(client.scan_iter(match="bench:*")) == []
    client.close()


@pytest.mark.anyio
async def test_the_benches_floor_connection_answers_pipelined_commands_and_says_a_refusal(
    redis_url: str, redis_prefix: str
) -> None:
    from teaagent_bench._resp import RespConnection, pack

    floor = await RespConnection.open(redis_url)
    try:
        key = f"{redis_prefix}floor"
        both = pack("SET", key, "v") + pack("GET", key)
        assert await floor.call(both, 2) == b"v"  # two commands written at once: the last reply
        assert await floor.call(pack("DEL", key)) == 1
        with pytest.raises(RuntimeError, match=r"^Redis refused a floor command: "):
            await floor.call(pack("NOSUCHCOMMAND"))
    finally:
        floor.close()
