"""SSHSIG signatures, byte for byte what ``ssh-keygen -Y sign`` writes and ``-Y verify`` accepts.

The format is OpenSSH's ``PROTOCOL.sshsig``. The binary blob (all integers big-endian, a ``string``
being a uint32 length followed by that many bytes)::

    byte[6]  "SSHSIG"                  magic preamble
    uint32   1                         version
    string   public key                the signer's key blob, exactly as in its .pub line
    string   namespace                 e.g. "teaagent-approval"; never empty
    string   reserved                  empty
    string   hash algorithm            "sha512" (we sign with it) or "sha256"
    string   signature                 an SSH signature field: string algorithm, string sig[, ...]

The signature inside is made over the *signed data*, which binds the namespace and hashes the message
so that a signature over one kind of document can never pass as another::

    byte[6]  "SSHSIG"
    string   namespace
    string   reserved                  empty
    string   hash algorithm
    string   H(message)                SHA-512 (or SHA-256) of the data being signed

Armored, the blob is base64 between ``-----BEGIN SSH SIGNATURE-----`` and ``-----END SSH SIGNATURE-----``
in lines of 70 characters, with a final newline. On the teaagent wire a signature is the *bare* form:
the same base64 on one line, with padding (:func:`signature_to_wire`).

Verification (:func:`sshsig_verify`) is strict and fails closed; its steps are numbered in the code:
base64, magic, version, fields, no trailing bytes, the expected namespace, an allowed hash, the
embedded key equal (as a blob) to the expected key, the signature algorithm allowed for that key, and
the cryptographic check. Every failure is a :class:`~teaagent.errors.SignatureError` with one sentence.
"""

from __future__ import annotations

import binascii
import hashlib
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass

from teaagent.errors import SignatureError
from teaagent.signing._keys import (
    Signer,
    SSHPublicKey,
    _blob_fingerprint,
    _shown,
    parse_public_key,
    public_key_from_blob,
)
from teaagent.signing._wire import WireReader, pack_u32, put_string, unpack_u32

__all__ = [
    "ARMOR_BEGIN",
    "ARMOR_END",
    "ARMOR_LINE_CHARS",
    "HASH_ALGORITHMS",
    "MAX_SIGNATURE_CHARS",
    "SIGNING_HASH",
    "SSHSig",
    "armor",
    "parse_sshsig",
    "signature_to_wire",
    "sshsig_sign",
    "sshsig_verify",
]

MAGIC = b"SSHSIG"
VERSION = 1
ARMOR_BEGIN = "-----BEGIN SSH SIGNATURE-----"
ARMOR_END = "-----END SSH SIGNATURE-----"
ARMOR_LINE_CHARS = 70  # what ssh-keygen writes (sshbuf_dtob64 wraps at 70)
SIGNING_HASH = "sha512"  # ssh-keygen's default, and the only one we sign with
HASH_ALGORITHMS: dict[str, Callable[[bytes], bytes]] = {
    "sha512": lambda data: hashlib.sha512(data).digest(),
    "sha256": lambda data: hashlib.sha256(data).digest(),
}
MAX_SIGNATURE_CHARS = 32 * 1024  # a 16384-bit RSA SSHSIG is about 5.6 KB of base64; nothing larger is real
MAX_NAMESPACE_BYTES = 256  # namespaces are short identifiers such as "teaagent-approval"

_HEADER = MAGIC + pack_u32(VERSION)
_EMPTY_STRING = pack_u32(0)
_SIGNED_PREFIX_CACHE: dict[tuple[str, bytes], bytes] = {}
_HASH_BY_NAME = {name.encode("ascii"): function for name, function in HASH_ALGORITHMS.items()}


@dataclass(frozen=True, kw_only=True)
class SSHSig:
    """The fields of a well-formed SSHSIG blob (not yet verified)."""

    public_key_blob: bytes
    namespace: str
    hash_algorithm: str
    signature: bytes  # the SSH signature field
    blob: bytes  # the whole binary SSHSIG

    @property
    def signer_fingerprint(self) -> str:
        """The fingerprint of the embedded public key blob."""
        return _blob_fingerprint(self.public_key_blob)

    def public_key(self) -> SSHPublicKey:
        """Parse the embedded public key.

        Raises:
            SignatureError: The embedded key is malformed or of a refused type.
        """
        return public_key_from_blob(self.public_key_blob)


# --- text forms -------------------------------------------------------------------------------------


def armor(blob: bytes) -> str:
    """Armor a binary SSHSIG blob exactly as ``ssh-keygen -Y sign`` writes its ``.sig`` file.

    Args:
        blob: The binary SSHSIG.

    Returns:
        The armored text, 70-character lines, ending with a newline.
    """
    text = b64encode(blob).decode("ascii")
    lines = [text[i : i + ARMOR_LINE_CHARS] for i in range(0, len(text), ARMOR_LINE_CHARS)]
    return "\n".join([ARMOR_BEGIN, *lines, ARMOR_END]) + "\n"


def _decode_base64(text: str | bytes) -> bytes:
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise SignatureError("the signature is not valid base64.") from None


def _dearmor(text: str) -> bytes:
    lines = text.strip().splitlines()
    if lines[0].strip() != ARMOR_BEGIN:
        raise SignatureError(f"the armored signature does not start with '{ARMOR_BEGIN}'.")
    if len(lines) < 2 or lines[-1].strip() != ARMOR_END:
        raise SignatureError(f"the armored signature does not end with '{ARMOR_END}'.")
    body = "".join(line.strip() for line in lines[1:-1])
    if not body:
        raise SignatureError("the armored signature is empty.")
    return _decode_base64(body)


def _signature_blob(signature: str | bytes) -> bytes:
    """Step 1: the binary blob from armored text, bare base64, or (as bytes) the blob itself."""
    if isinstance(signature, bytes | bytearray | memoryview):
        raw = bytes(signature)
        if len(raw) > MAX_SIGNATURE_CHARS:
            raise SignatureError(f"the signature is longer than {MAX_SIGNATURE_CHARS} bytes.")
        if raw.startswith(MAGIC):
            return raw
        try:
            signature = raw.decode("ascii")
        except UnicodeDecodeError:
            raise SignatureError("the signature is neither an SSHSIG blob nor base64 text.") from None
    if not isinstance(signature, str):
        raise SignatureError(f"a signature must be text or bytes, not {type(signature).__name__}.")
    if len(signature) > MAX_SIGNATURE_CHARS:
        raise SignatureError(f"the signature is longer than {MAX_SIGNATURE_CHARS} characters.")
    if signature.startswith("-----") or "\n" in signature.strip():
        if "-----" not in signature:
            raise SignatureError("the signature has line breaks but no armor lines.")
        return _dearmor(signature)
    if not signature.strip():
        raise SignatureError("the signature is empty.")
    return _decode_base64(signature.strip())


def signature_to_wire(signature: str | bytes) -> str:
    """The on-wire form of a signature: standard base64 of the SSHSIG blob, one line, padded.

    Args:
        signature: Armored text (any line width), bare base64, or the binary blob.

    Returns:
        The bare base64 text.

    Raises:
        SignatureError: The armor or the base64 is malformed, or the blob is not an SSHSIG.
    """
    blob = _signature_blob(signature)
    if not blob.startswith(MAGIC):
        raise SignatureError("the signature does not start with the SSHSIG magic preamble.")
    return b64encode(blob).decode("ascii")


# --- parsing ----------------------------------------------------------------------------------------


def _parse(blob: bytes) -> SSHSig:
    # 2. magic and version
    if not blob.startswith(MAGIC):
        raise SignatureError("the signature does not start with the SSHSIG magic preamble.")
    if len(blob) < len(_HEADER):
        raise SignatureError("the signature is truncated: it ends before the version.")
    (version,) = unpack_u32(blob, len(MAGIC))
    if version != VERSION:
        raise SignatureError(f"the signature has version {version} but only version {VERSION} is supported.")
    # 3. the five fields, then nothing
    reader = WireReader(blob[len(_HEADER) :], "signature")
    key_blob = reader.string("public key")
    namespace = reader.text("namespace")
    reserved = reader.string("reserved field")
    hash_algorithm = reader.text("hash algorithm")
    signature = reader.string("signature field")
    reader.finish()
    if reserved:
        # OpenSSH signs with an empty reserved field and verifies as if it were empty, so a
        # non-empty one can only be a forgery attempt or a future format we do not know.
        raise SignatureError("the signature's reserved field is not empty.")
    return SSHSig(
        public_key_blob=key_blob,
        namespace=namespace,
        hash_algorithm=hash_algorithm,
        signature=signature,
        blob=blob,
    )


def parse_sshsig(signature: str | bytes) -> SSHSig:
    """Parse an SSHSIG without verifying it (to see which key and namespace it claims).

    Args:
        signature: Armored text, bare base64, or the binary blob.

    Returns:
        The parsed fields.

    Raises:
        SignatureError: The signature is malformed in any way (base64, magic, version, truncation,
            trailing bytes, a non-empty reserved field).
    """
    return _parse(_signature_blob(signature))


def _check_namespace(namespace: str) -> bytes:
    if not isinstance(namespace, str) or not namespace:
        raise SignatureError(
            "the signature namespace must be a non-empty string such as 'teaagent-approval'."
        )
    encoded = namespace.encode("utf-8")
    if len(encoded) > MAX_NAMESPACE_BYTES:
        raise SignatureError(f"the signature namespace is longer than {MAX_NAMESPACE_BYTES} bytes.")
    return encoded


def _signed_data(namespace: str, hash_algorithm: bytes, digest: bytes) -> bytes:
    """The bytes the key signs: magic, namespace, reserved, hash name, then the message digest."""
    key = (namespace, hash_algorithm)
    prefix = _SIGNED_PREFIX_CACHE.get(key)
    if prefix is None:
        prefix = (
            MAGIC
            + put_string(namespace.encode("utf-8"))
            + _EMPTY_STRING
            + put_string(hash_algorithm)
            + pack_u32(len(digest))
        )
        if len(_SIGNED_PREFIX_CACHE) < 64:  # a handful of namespaces in practice; never unbounded
            _SIGNED_PREFIX_CACHE[key] = prefix
    return prefix + digest


# --- sign and verify --------------------------------------------------------------------------------


def sshsig_sign(data: bytes, key: Signer, namespace: str) -> str:
    """Sign ``data`` as ``ssh-keygen -Y sign -n NAMESPACE`` does: SHA-512, armored.

    RSA keys sign with ``rsa-sha2-512``. For an Ed25519 key the output is byte-identical to
    ssh-keygen's, since Ed25519 signatures are deterministic.

    Args:
        data: The exact bytes to sign.
        key: A loaded private key (:func:`load_private_key`) or an :class:`AgentSigner`.
        namespace: The namespace, e.g. ``teaagent-approval``.

    Returns:
        The armored signature text, as ssh-keygen writes it to ``FILE.sig``.

    Raises:
        SignatureError: The namespace is empty, or the signer (an ssh-agent) could not sign.
    """
    encoded_namespace = _check_namespace(namespace)
    digest = HASH_ALGORITHMS[SIGNING_HASH](bytes(data))
    signature = key.sign(_signed_data(namespace, SIGNING_HASH.encode("ascii"), digest))
    blob = b"".join(
        [
            _HEADER,
            put_string(key.public_key.blob),
            put_string(encoded_namespace),
            _EMPTY_STRING,
            put_string(SIGNING_HASH.encode("ascii")),
            put_string(signature),
        ]
    )
    return armor(blob)


def _fast_fields(blob: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """The hot path's parse: (key, namespace, hash, signature) of a well-formed blob, else None.

    It accepts exactly what :func:`_parse` accepts (so a None sends the caller to the slow path,
    which finds the sentence to raise); it merely skips the reader object and the dataclass.
    """
    end = len(blob)
    if end < 34 or blob[:10] != _HEADER:  # 34: the header and five empty strings
        return None
    # Slicing past the end yields short fields rather than errors; the final offset check (and
    # the length check before each read) catches every truncation.
    (length,) = unpack_u32(blob, 10)
    key_end = 14 + length
    if key_end + 16 > end:  # four more length fields must follow
        return None
    (length,) = unpack_u32(blob, key_end)
    namespace_end = key_end + 4 + length
    if namespace_end + 12 > end:
        return None
    (reserved,) = unpack_u32(blob, namespace_end)
    if reserved:
        return None
    (length,) = unpack_u32(blob, namespace_end + 4)
    hash_end = namespace_end + 8 + length
    if hash_end + 4 > end:
        return None
    (length,) = unpack_u32(blob, hash_end)
    if hash_end + 4 + length != end:
        return None
    return (
        blob[14:key_end],
        blob[key_end + 4 : namespace_end],
        blob[namespace_end + 8 : hash_end],
        blob[hash_end + 4 :],
    )


def sshsig_verify(
    data: bytes, signature: str | bytes, public_key: SSHPublicKey | str, namespace: str
) -> None:
    """Verify an SSHSIG over ``data`` made by ``public_key`` in ``namespace``.

    Args:
        data: The exact bytes that were signed.
        signature: Armored text (any line width), bare base64 (the wire form), or the binary blob.
        public_key: The key the signature must come from (or its public key line). The key
            embedded in the signature must equal it blob for blob.
        namespace: The namespace the signature must carry, exactly.

    Raises:
        SignatureError: The expected namespace is empty; the signature is not valid base64 or
            armor; it is truncated, has trailing bytes, a wrong magic, a version other than 1 or a
            non-empty reserved field; its namespace differs from ``namespace``; its hash is not
            sha256 or sha512; it was made by another key; its algorithm is refused for the key
            (``ssh-rsa`` SHA-1 among them); a security key's signature lacks user presence; or it
            does not verify over ``data``.
    """
    if not namespace or not isinstance(namespace, str):
        _check_namespace(namespace)
    if isinstance(public_key, str):
        public_key = parse_public_key(public_key)
    elif not isinstance(public_key, SSHPublicKey):
        raise TypeError(
            f"public_key must be an SSHPublicKey or a public key line, not {type(public_key).__name__}"
        )
    # The fast path: a well-formed blob (bare base64 decoded inline) whose namespace, hash and key
    # all match. Anything else takes the slow path, which makes the same checks one by one and
    # raises the sentence that fits.
    blob: bytes | None = None
    if type(signature) is str and 0 < len(signature) <= MAX_SIGNATURE_CHARS and signature[0] != "-":
        try:
            blob = binascii.a2b_base64(signature, strict_mode=True)
        except (binascii.Error, ValueError):
            blob = None
    if blob is None:
        blob = _signature_blob(signature)  # 1. armor or base64, with its own sentences
    fields = _fast_fields(blob)
    if fields is not None:
        key_blob, got_namespace, hash_name, signature_field = fields
        hash_function = _HASH_BY_NAME.get(hash_name)
        if (
            hash_function is not None
            and key_blob == public_key.blob
            and got_namespace == namespace.encode("utf-8", "surrogatepass")
        ):
            public_key._verify(signature_field, _signed_data(namespace, hash_name, hash_function(data)))
            return
    _verify_slowly(data, blob, public_key, namespace)


def _verify_slowly(data: bytes, blob: bytes, public_key: SSHPublicKey, namespace: str) -> None:
    # 2-3. magic, version, fields, nothing trailing
    sig = _parse(blob)
    # 4. the namespace, exactly
    if sig.namespace != namespace:
        raise SignatureError(
            f"signature namespace is '{_shown(sig.namespace)}' but '{_shown(namespace)}' was expected."
        )
    # 5. an allowed hash
    hash_function = HASH_ALGORITHMS.get(sig.hash_algorithm)
    if hash_function is None:
        raise SignatureError(
            f"the signature uses hash algorithm '{_shown(sig.hash_algorithm)}' "
            "but only 'sha256' and 'sha512' are allowed."
        )
    # 6. the embedded key is the expected key, compared as exact blobs
    if sig.public_key_blob != public_key.blob:
        raise SignatureError(
            f"the signature was made by key {sig.signer_fingerprint} "
            f"but key {public_key.fingerprint} was expected."
        )
    # 7-8. the algorithm allowed for this key, then the signature over the signed data
    public_key._verify(
        sig.signature,
        _signed_data(namespace, sig.hash_algorithm.encode("ascii"), hash_function(data)),
    )
