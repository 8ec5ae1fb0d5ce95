"""What every httpx client of the library verifies TLS servers with.

httpx builds an SSL context for each client it makes (for ``http://`` URLs too), loading the CA
bundle each time: about 30 ms of CPU per client, more than a hundred of the calls it then makes.
Gates, command-line calls and services make clients often, so the default context is built once
per process and shared (an ``SSLContext`` may serve many connections and threads at once). The
CA bundle and ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are read when the first client is made.
"""

from __future__ import annotations

import functools
import ssl

import httpx

__all__ = ["client_verify"]


@functools.cache
def _default_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def client_verify(verify: ssl.SSLContext | bool = True) -> ssl.SSLContext | bool:
    """httpx's ``verify=`` for ``verify``: the process's one default context in place of True."""
    return _default_context() if verify is True else verify
