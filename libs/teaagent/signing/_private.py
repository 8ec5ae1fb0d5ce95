"""SSH private keys from OpenSSH key files (passphrase-protected ones included), and signing with them.

``cryptography`` reads the ``openssh-key-v1`` format; decrypting a passphrase-protected file needs
the bcrypt KDF, which it takes from the ``bcrypt`` package (a dependency of teaagent).
"""

from __future__ import annotations

import os
from base64 import b64decode
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from teaagent.errors import ConfigError, SignatureError
from teaagent.signing._keys import (
    _ECDSA_CURVES,
    ECDSA_SK,
    ED25519,
    ED25519_SK,
    SUPPORTED_KEY_TYPES,
    KeyHolder,
    SSHPublicKey,
    public_key_from_blob,
)
from teaagent.signing._wire import WireReader, put_mpint, put_string

__all__ = ["MAX_PRIVATE_KEY_BYTES", "SSHPrivateKey", "load_private_key"]

MAX_PRIVATE_KEY_BYTES = 64 * 1024  # a 16384-bit RSA key file is about 12 KB

PrivateKeyTypes = Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
_OPENSSH_ARMOR = b"-----BEGIN OPENSSH PRIVATE KEY-----"
_OPENSSH_MAGIC = b"openssh-key-v1\x00"


class SSHPrivateKey(KeyHolder):
    """A private key that signs SSH signature fields; build it with :func:`load_private_key`.

    It satisfies the :class:`Signer` protocol, like :class:`AgentSigner`.
    """

    __slots__ = ("_key", "_path")

    def __init__(
        self, *, private_key: PrivateKeyTypes, public_key: SSHPublicKey, path: Path | None = None
    ) -> None:
        self._key = private_key
        self._public = public_key
        self._path = path

    @classmethod
    def from_cryptography(cls, private_key: PrivateKeyTypes, *, comment: str = "") -> SSHPrivateKey:
        """Wrap a ``cryptography`` private key (Ed25519, ECDSA P-256/384/521, RSA >= 2048 bits).

        Raises:
            SignatureError: The key type or size is refused.
        """
        if not isinstance(private_key, Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise SignatureError(f"{type(private_key).__name__} keys are not supported for signing.")
        try:
            line = private_key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        except ValueError:
            raise SignatureError("this private key's type is not supported for SSH signing.") from None
        public = public_key_from_blob(b64decode(line.split()[1]), comment)
        return cls(private_key=private_key, public_key=public)

    @property
    def path(self) -> Path | None:
        """The file the key was loaded from, if any."""
        return self._path

    def sign(self, data: bytes) -> bytes:
        """Sign ``data``; return the SSH signature field (``string algorithm, string signature``).

        RSA keys sign with ``rsa-sha2-512``; ECDSA keys with the curve's hash (RFC 5656).
        """
        key = self._key
        if isinstance(key, Ed25519PrivateKey):
            return put_string(ED25519.encode()) + put_string(key.sign(data))
        if isinstance(key, ec.EllipticCurvePrivateKey):
            key_type = self._public.key_type
            r, s = decode_dss_signature(key.sign(data, ec.ECDSA(_ECDSA_CURVES[key_type][2]())))
            return put_string(key_type.encode()) + put_string(put_mpint(r) + put_mpint(s))
        raw = key.sign(data, padding.PKCS1v15(), hashes.SHA512())
        return put_string(b"rsa-sha2-512") + put_string(raw)

    def __repr__(self) -> str:
        where = f", path={str(self._path)!r}" if self._path else ""
        return f"SSHPrivateKey({self._public.key_type!r}, {self._public.fingerprint!r}{where})"


def _openssh_header(data: bytes) -> tuple[str, str] | None:
    """The cipher name and key type in the clear header of an ``openssh-key-v1`` file, None if unreadable."""
    if not data.lstrip().startswith(_OPENSSH_ARMOR):
        return None
    body = b"".join(line.strip() for line in data.strip().splitlines()[1:-1])
    try:
        decoded = b64decode(body, validate=True)
        if not decoded.startswith(_OPENSSH_MAGIC):
            return None
        reader = WireReader(decoded[len(_OPENSSH_MAGIC) :], "private key file")
        cipher = reader.text("cipher name")
        for field in ("KDF name", "KDF options"):
            reader.string(field)
        if reader.u32("key count") != 1:
            return None
        return cipher, WireReader(reader.string("public key"), "public key").text("key type")
    except (ValueError, SignatureError):
        return None


def _is_encrypted(data: bytes, openssh_header: tuple[str, str] | None) -> bool:
    """Whether the key file says it is passphrase-protected (in its clear header, before any decryption).

    PKCS#8 files say so by their armor, traditional PEM files by their ``Proc-Type`` header, and
    ``openssh-key-v1`` files by a cipher other than ``none``.
    """
    if openssh_header is not None:
        return openssh_header[0] != "none"
    return b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data or b"Proc-Type: 4,ENCRYPTED" in data


def _is_public_key(data: bytes) -> bool:
    """Whether ``data`` is an OpenSSH public key file (``TYPE BASE64 [COMMENT]``), not a private key."""
    first = data.lstrip().split(None, 1)[:1]
    return bool(first) and first[0].decode("ascii", "replace") in SUPPORTED_KEY_TYPES


def _public_half_sentence(path: Path) -> str:
    """The sentence for a public key file given where the private key file belongs."""
    private = path.with_suffix("") if path.suffix == ".pub" else None
    where = f" ({private})" if private is not None and private.is_file() else ""
    return f"{path} is the public half of the key; give the private key file{where}."


def _load(path: Path, data: bytes, password: bytes | None) -> object:
    openssh = data.lstrip().startswith(_OPENSSH_ARMOR)
    load = serialization.load_ssh_private_key if openssh else serialization.load_pem_private_key
    try:
        return load(data, password)
    except TypeError:
        # cryptography's way of saying "encrypted but no password" (or the reverse)
        if password is None:
            raise ConfigError(
                f"the private key {path} is protected by a passphrase, and none was given."
            ) from None
        return load(data, None)
    except UnsupportedAlgorithm as exc:
        if not openssh:
            raise
        raise ConfigError(f"the private key {path} is of an unsupported kind ({exc}).") from None


def load_private_key(path: str | os.PathLike[str], passphrase: str | bytes | None = None) -> SSHPrivateKey:
    """Load an OpenSSH private key file (``ssh-keygen`` output), passphrase-protected or not.

    PEM files (``ssh-keygen -m PEM``) are accepted too. The comment is taken from ``PATH.pub`` when
    that file exists and holds the same key.

    Args:
        path: The private key file.
        passphrase: The passphrase, when the file is protected.

    Returns:
        A key whose :meth:`SSHPrivateKey.sign` makes SSH signature fields.

    Raises:
        ConfigError: The file cannot be read, is too large, is the public half of a key (the
            sentence says to give the private key file) or not a private key; it is protected
            and no passphrase was given, or the passphrase is wrong; or the key is of a refused
            type (DSA, a security key whose secret lives on a token, RSA below 2048 bits).
    """
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_PRIVATE_KEY_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"the private key file {path} does not exist.") from None
    except OSError as exc:
        raise ConfigError(f"cannot read the private key file {path}: {exc.strerror or exc}.") from None
    if len(data) > MAX_PRIVATE_KEY_BYTES:
        raise ConfigError(f"the private key file {path} is larger than {MAX_PRIVATE_KEY_BYTES} bytes.")
    if _is_public_key(data):
        raise ConfigError(_public_half_sentence(path))
    header = _openssh_header(data)
    header_type = header[1] if header is not None else None
    if header_type == "ssh-dss":
        raise ConfigError(
            f"the private key {path} is refused: DSA keys (ssh-dss) are refused; use an ed25519 key."
        )
    if header_type in (ED25519_SK, ECDSA_SK):
        raise ConfigError(
            f"the private key {path} is a security key whose secret stays on the token; "
            "add it to ssh-agent and sign through the agent instead."
        )
    password = passphrase.encode("utf-8") if isinstance(passphrase, str) else passphrase
    if password == b"":
        password = None
    try:
        key = _load(path, data, password)
    except ConfigError:
        raise
    except ValueError as exc:
        # Decided by the file's clear header, not by the library's message: a wrong passphrase
        # leaves valid CBC padding about once in 256 tries, and the message is then a parse error.
        if password is not None and _is_encrypted(data, header):
            raise ConfigError(f"the passphrase for the private key {path} is wrong.") from None
        raise ConfigError(f"the file {path} is not a usable private key ({exc}).") from None
    except UnsupportedAlgorithm as exc:
        raise ConfigError(f"the private key {path} is of an unsupported kind ({exc}).") from None
    if not isinstance(key, Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ConfigError(f"the private key {path} is a {type(key).__name__}, which is not supported.")
    comment = ""
    try:
        wrapped = SSHPrivateKey.from_cryptography(key)
    except SignatureError as exc:
        raise ConfigError(f"the private key {path} is refused: {exc}") from None
    pub_path = path.with_name(path.name + ".pub")
    try:
        parts = pub_path.read_text(encoding="utf-8").split(None, 2)
        if len(parts) == 3 and b64decode(parts[1], validate=True) == wrapped.public_key.blob:
            comment = parts[2].strip()
    except (OSError, ValueError):
        pass  # the comment is informative only
    public = public_key_from_blob(wrapped.public_key.blob, comment)
    return SSHPrivateKey(private_key=key, public_key=public, path=path)
