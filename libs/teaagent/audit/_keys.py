"""The chain key: its file beside the log, and the HMAC the logger computes with it."""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path

from teaagent._files import sync_folder
from teaagent.errors import ConfigError

__all__ = [
    "KEY_BYTES",
    "KEY_FILE_SUFFIX",
    "MIN_KEY_BYTES",
    "ChainMac",
    "check_chain_key",
    "default_key_path",
    "load_or_create_key",
    "read_key_file",
    "sync_folder",
]

_log = logging.getLogger("teaagent.audit")

KEY_BYTES = 32  # a new key has the 256 bits of HMAC-SHA256's output
MIN_KEY_BYTES = 16  # below 128 bits a key is within reach of a guessing attack
KEY_FILE_SUFFIX = ".key"
_MAX_KEY_FILE_BYTES = 4096  # a hex key and a newline; anything bigger is not a key file
_SHA256_BLOCK = 64


def default_key_path(log_path: str | os.PathLike[str]) -> Path:
    """Return where the chain key of ``log_path`` is kept: the log's path followed by ``.key``."""
    return Path(os.fspath(log_path) + KEY_FILE_SUFFIX)


def check_chain_key(key: object) -> bytes:
    """Return ``key`` as bytes after checking that it can serve as a chain key.

    Raises:
        TypeError: ``key`` is not bytes.
        ValueError: ``key`` is shorter than :data:`MIN_KEY_BYTES`.
    """
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"an audit chain key must be bytes, not {type(key).__name__}.")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"an audit chain key must be at least {MIN_KEY_BYTES} bytes long.")
    return bytes(key)


def read_key_file(path: str | os.PathLike[str]) -> bytes:
    """Read a chain key file: the key in hex on one line.

    Args:
        path: The key file.

    Returns:
        The key.

    Raises:
        FileNotFoundError: The file does not exist.
        ConfigError: The file cannot be read, or does not hold a hex key of at least
            :data:`MIN_KEY_BYTES` bytes.
    """
    try:
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_mode & 0o077:
                _log.warning("the audit key file %s can be read by other users; chmod 600 it", path)
            raw = handle.read(_MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise FileNotFoundError(f"the audit key file {path} does not exist.") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the audit key file {path}: {exc.strerror or exc}.") from None
    try:
        key = bytes.fromhex(raw.decode("ascii").strip()) if len(raw) <= _MAX_KEY_FILE_BYTES else b""
    except ValueError:  # UnicodeDecodeError is one too
        key = b""
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"the audit key file {path} does not hold a hex key of at least {MIN_KEY_BYTES} bytes."
        )
    return key


def load_or_create_key(path: Path) -> bytes:
    """Return the key kept in ``path``, creating the file with a fresh random key when it is missing.

    The new file appears whole or not at all: the key is written to a temporary file created
    with ``O_CREAT | O_EXCL`` and mode 0600, then hard-linked to ``path``. Linking fails if another
    process won the race, and then both use the winner's key.

    Raises:
        OSError: The file cannot be created (the folder is missing, read-only, full...).
        ConfigError: The existing file cannot be read or holds no key.
    """
    try:
        return read_key_file(path)
    except FileNotFoundError:
        pass
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.write(descriptor, (secrets.token_hex(KEY_BYTES) + "\n").encode("ascii"))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        try:
            os.link(temporary, path)
            sync_folder(path.parent)  # a log whose key was lost with a crash could never be verified
        except FileExistsError:
            pass
    finally:
        os.unlink(temporary)
    return read_key_file(path)


class ChainMac:
    """HMAC-SHA256 under one key, with the key's two padded blocks hashed once (RFC 2104).

    ``hmac.digest`` pads and hashes the key again for every message; keeping the two hash states and
    copying them halves the cost of the MAC on the logger's hot path. The verifier uses the standard
    library's ``hmac`` instead, so each checks the other.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) > _SHA256_BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(bytes(byte ^ 0x36 for byte in key))
        self._outer = hashlib.sha256(bytes(byte ^ 0x5C for byte in key))

    def hexdigest(self, data: bytes) -> str:
        """Return the hex HMAC-SHA256 of ``data``."""
        inner = self._inner.copy()
        inner.update(data)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()
