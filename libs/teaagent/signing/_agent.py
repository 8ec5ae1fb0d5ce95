"""Signing through a running ``ssh-agent`` (the key never leaves the agent).

The agent protocol (draft-miller-ssh-agent) over the unix socket named by ``SSH_AUTH_SOCK``: each
message is ``uint32 length, byte type, contents``. Two requests are used here::

    SSH_AGENTC_REQUEST_IDENTITIES (11)  ->  SSH_AGENT_IDENTITIES_ANSWER (12):
                                            uint32 n, n x (string key blob, string comment)
    SSH_AGENTC_SIGN_REQUEST (13):           string key blob, string data, uint32 flags
                                        ->  SSH_AGENT_SIGN_RESPONSE (14): string signature field
    any request                         ->  SSH_AGENT_FAILURE (5) when the agent refuses

For RSA keys the flag ``SSH_AGENT_RSA_SHA2_512`` (4) asks for ``rsa-sha2-512`` instead of SHA-1.
Every signature the agent returns is verified before it is used, so a misbehaving agent (or one that
ignored the flag) cannot produce a document that peers would refuse later.
"""

from __future__ import annotations

import os
import socket

from teaagent.errors import SignatureError
from teaagent.signing._keys import RSA, KeyHolder, SSHPublicKey, parse_public_key, public_key_from_blob
from teaagent.signing._wire import WireReader, pack_u32, put_string, unpack_u32

__all__ = ["AGENT_TIMEOUT_SECONDS", "AgentSigner", "agent_identities"]

SSH_AGENT_FAILURE = 5
SSH_AGENTC_REQUEST_IDENTITIES = 11
SSH_AGENT_IDENTITIES_ANSWER = 12
SSH_AGENTC_SIGN_REQUEST = 13
SSH_AGENT_SIGN_RESPONSE = 14
SSH_AGENT_RSA_SHA2_512 = 0x04

AGENT_TIMEOUT_SECONDS = 30.0  # an agent may wait for a confirmation (ssh-add -c) or a token touch
MAX_AGENT_MESSAGE_BYTES = 256 * 1024  # OpenSSH's own AGENT_MAX_LEN


def _socket_path(socket_path: str | os.PathLike[str] | None) -> str:
    if socket_path is not None:
        return os.fspath(socket_path)
    path = os.environ.get("SSH_AUTH_SOCK")
    if not path:
        raise SignatureError("SSH_AUTH_SOCK is not set, so there is no ssh-agent to sign with.")
    return path


def _recv_exactly(conn: socket.socket, count: int, path: str) -> bytes:
    chunks = []
    while count:
        chunk = conn.recv(count)
        if not chunk:
            raise SignatureError(f"the ssh-agent at {path} closed the connection mid-answer.")
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _request(path: str, message_type: int, contents: bytes, timeout: float) -> tuple[int, bytes]:
    """Send one request and return the answer's (type, contents)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(path)
            conn.sendall(pack_u32(len(contents) + 1) + bytes((message_type,)) + contents)
            (length,) = unpack_u32(_recv_exactly(conn, 4, path))
            if not 1 <= length <= MAX_AGENT_MESSAGE_BYTES:
                raise SignatureError(f"the ssh-agent at {path} sent an answer of invalid length {length}.")
            answer = _recv_exactly(conn, length, path)
    except TimeoutError:
        raise SignatureError(f"the ssh-agent at {path} did not answer within {timeout:g} seconds.") from None
    except OSError as exc:
        raise SignatureError(f"cannot reach the ssh-agent at {path}: {exc.strerror or exc}.") from None
    return answer[0], answer[1:]


def agent_identities(
    socket_path: str | os.PathLike[str] | None = None, *, timeout: float = AGENT_TIMEOUT_SECONDS
) -> list[SSHPublicKey]:
    """The public keys an ssh-agent holds (what ``ssh-add -L`` lists), refused key types left out.

    Args:
        socket_path: The agent's socket; ``SSH_AUTH_SOCK`` when None.
        timeout: Seconds to wait for the agent.

    Returns:
        The keys, with the comments the agent keeps.

    Raises:
        SignatureError: There is no agent to reach, or it answered something malformed.
    """
    path = _socket_path(socket_path)
    kind, contents = _request(path, SSH_AGENTC_REQUEST_IDENTITIES, b"", timeout)
    if kind != SSH_AGENT_IDENTITIES_ANSWER:
        raise SignatureError(f"the ssh-agent at {path} refused to list its keys.")
    reader = WireReader(contents, "ssh-agent's key list")
    keys = []
    for _ in range(reader.u32("key count")):
        blob = reader.string("key blob")
        comment = reader.text("key comment")
        try:
            keys.append(public_key_from_blob(blob, comment))
        except SignatureError:
            continue  # DSA, certificates and small RSA keys are simply not candidates
    reader.finish()
    return keys


class AgentSigner(KeyHolder):
    """Signs with a key held by ``ssh-agent``; same interface as a loaded private key.

    Args:
        public_key: The key to sign with (a parsed key or its public key line).
        socket_path: The agent's socket; ``SSH_AUTH_SOCK`` when None.
        timeout: Seconds to wait for the agent (it may wait for a confirmation or a touch).

    Raises:
        SignatureError: The public key line does not parse, or no socket is named and
            ``SSH_AUTH_SOCK`` is not set.
    """

    __slots__ = ("_path", "_timeout")

    def __init__(
        self,
        public_key: SSHPublicKey | str,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        timeout: float = AGENT_TIMEOUT_SECONDS,
    ) -> None:
        self._public = parse_public_key(public_key) if isinstance(public_key, str) else public_key
        self._path = _socket_path(socket_path)
        self._timeout = timeout

    @property
    def socket_path(self) -> str:
        """The agent socket used."""
        return self._path

    def sign(self, data: bytes) -> bytes:
        """Ask the agent to sign ``data``; return the SSH signature field, verified.

        Raises:
            SignatureError: The agent cannot be reached, does not hold the key, refuses to sign,
                or returns a malformed or invalid signature.
        """
        flags = SSH_AGENT_RSA_SHA2_512 if self._public.key_type == RSA else 0
        request = put_string(self._public.blob) + put_string(bytes(data)) + pack_u32(flags)
        kind, contents = _request(self._path, SSH_AGENTC_SIGN_REQUEST, request, self._timeout)
        if kind != SSH_AGENT_SIGN_RESPONSE:
            if self._public not in agent_identities(self._path, timeout=self._timeout):
                raise SignatureError(
                    f"the ssh-agent at {self._path} does not hold the key {self._public.fingerprint}; "
                    "add it with ssh-add."
                )
            raise SignatureError(
                f"the ssh-agent at {self._path} refused to sign with the key {self._public.fingerprint}."
            )
        reader = WireReader(contents, "ssh-agent's signature")
        signature = reader.string("signature field")
        reader.finish()
        self._public.verify_ssh_signature(signature, bytes(data))
        return signature

    def __repr__(self) -> str:
        return f"AgentSigner({self._public.key_type!r}, {self._public.fingerprint!r}, socket={self._path!r})"
