"""The library's HTTP clients share one default SSL context per process (httpx builds one per client)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from typing import Any

import aiohttp  # noqa: F401  (imported here: its import makes SSL contexts of its own)
import pytest

from teaagent import _http
from teaagent._http import BENCH_CLIENT_ENV, client_verify
from teaagent.approver_client import ApproverClient, AsyncApproverClient
from teaagent.relay_client import AsyncRelayClient, RelayClient


def test_true_is_the_one_default_context_and_the_rest_pass_through() -> None:
    private = ssl.create_default_context()
    assert isinstance(client_verify(), ssl.SSLContext)
    assert client_verify(True) is client_verify()
    assert client_verify(private) is private
    assert client_verify(False) is False


@pytest.mark.anyio
async def test_forty_clients_build_the_default_context_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []
    original = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(kwargs)
        return original(*args, **kwargs)

    # Every verifying context, httpx's (for a client given verify=True) or the library's own, is
    # made by ssl.create_default_context; aiohttp made its own when it was imported, above.
    monkeypatch.setattr(ssl, "create_default_context", counting)
    _http._default_context.cache_clear()

    async def make_async() -> None:
        for _ in range(10):
            await AsyncRelayClient("http://127.0.0.1:9", token="t").aclose()
            await AsyncApproverClient("http://127.0.0.1:9").aclose()

    for _ in range(10):
        RelayClient("https://relay.example:8443", token="t").close()
        ApproverClient("http://127.0.0.1:9").close()
    await make_async()

    # Each client passed the shared context, which httpx uses as it is (it builds none itself).
    assert len(built) == 1, built


@pytest.mark.parametrize(
    ("variant", "loaded", "left"), [("", "aiohttp", "httpx"), ("httpx", "httpx", "aiohttp")]
)
def test_load_client_imports_the_library_the_pools_are_made_of_and_only_it(
    variant: str, loaded: str, left: str
) -> None:
    # In a fresh interpreter: this one has imported both long ago.
    code = (
        "import sys; from teaagent._http import load_client; "
        f"assert {loaded!r} not in sys.modules; load_client(); "
        f"print({loaded!r} in sys.modules, {left!r} in sys.modules)"
    )
    environment = {**os.environ, BENCH_CLIENT_ENV: variant}
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]
