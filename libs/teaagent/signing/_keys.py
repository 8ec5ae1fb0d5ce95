"""SSH public keys: parsing, fingerprints, and verification of one SSH signature field.

A public key is kept as the exact wire blob OpenSSH writes in ``.pub`` files (base64-decoded), its
type name and its comment. The cryptography key object and the per-type verification closure are built
once, when the key is parsed, so verifying many signatures with one configured key pays no parsing cost.

Wire formats (RFC 4253 6.6, RFC 5656 3.1, RFC 8332, RFC 8709, OpenSSH ``PROTOCOL.u2f``)::

    ssh-ed25519            string "ssh-ed25519", string pk[32]
    ecdsa-sha2-nistpN      string type, string curve ("nistpN"), string Q (uncompressed point)
    ssh-rsa                string "ssh-rsa", mpint e, mpint n
    sk-ssh-ed25519@...     string type, string pk[32], string application
    sk-ecdsa-sha2-...@...  string type, string "nistp256", string Q, string application

A signature field is ``string algorithm, string signature`` (plus ``byte flags, uint32 counter`` for
security keys; ECDSA signatures are ``mpint r, mpint s`` inside the string).
"""

from __future__ import annotations

import binascii
import functools
import hashlib
from base64 import b64encode
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from teaagent.errors import SignatureError
from teaagent.signing._wire import WireReader, pack_u32, put_string

__all__ = [
    "ECDSA_NISTP256",
    "ECDSA_NISTP384",
    "ECDSA_NISTP521",
    "ECDSA_SK",
    "ED25519",
    "ED25519_SK",
    "MAX_KEY_LINE_CHARS",
    "MAX_RSA_BITS",
    "MIN_RSA_BITS",
    "RSA",
    "SK_USER_PRESENCE",
    "SUPPORTED_KEY_TYPES",
    "CryptographyPublicKey",
    "KeyHolder",
    "SSHPublicKey",
    "Signer",
    "fingerprint",
    "parse_public_key",
    "public_key_from_blob",
]

ED25519 = "ssh-ed25519"
ECDSA_NISTP256 = "ecdsa-sha2-nistp256"
ECDSA_NISTP384 = "ecdsa-sha2-nistp384"
ECDSA_NISTP521 = "ecdsa-sha2-nistp521"
RSA = "ssh-rsa"
ED25519_SK = "sk-ssh-ed25519@openssh.com"
ECDSA_SK = "sk-ecdsa-sha2-nistp256@openssh.com"
SUPPORTED_KEY_TYPES = frozenset(
    {ED25519, ECDSA_NISTP256, ECDSA_NISTP384, ECDSA_NISTP521, RSA, ED25519_SK, ECDSA_SK}
)

MIN_RSA_BITS = 2048  # smaller RSA moduli are within reach of a determined attacker (NIST SP 800-131A)
MAX_RSA_BITS = 16384  # OpenSSH's own ceiling; larger moduli only make verification a denial of service
MAX_KEY_LINE_CHARS = 16 * 1024  # a 16384-bit RSA public key line is about 2.8 KB; leave room for a comment
SK_USER_PRESENCE = 0x01  # PROTOCOL.u2f: the token saw a touch for this very signature
_RSA_IDENTITY_EXPONENT = 65537  # the exponent an RSA key's identity is written with: only n counts
RSA_SIGNATURE_ALGORITHMS = {"rsa-sha2-256": hashes.SHA256, "rsa-sha2-512": hashes.SHA512}

CryptographyPublicKey = Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey
Verifier = Callable[[bytes, bytes], None]

# name -> (curve name in the blob, curve, hash, coordinate bytes)
_ECDSA_CURVES: dict[str, tuple[bytes, ec.EllipticCurve, type[hashes.HashAlgorithm], int]] = {
    ECDSA_NISTP256: (b"nistp256", ec.SECP256R1(), hashes.SHA256, 32),
    ECDSA_NISTP384: (b"nistp384", ec.SECP384R1(), hashes.SHA384, 48),
    ECDSA_NISTP521: (b"nistp521", ec.SECP521R1(), hashes.SHA512, 66),
}
_ED25519_SIG_PREFIX = put_string(ED25519.encode()) + pack_u32(64)
_ED25519_SIG_LEN = len(_ED25519_SIG_PREFIX) + 64
_SHOWN_CHARS = 60  # how much of an attacker-chosen name a message repeats


def _shown(text: str | bytes) -> str:
    """A name from untrusted input, clipped and made printable for an error sentence."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def _blob_fingerprint(blob: bytes) -> str:
    return "SHA256:" + b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


class SSHPublicKey:
    """An SSH public key: its type, exact wire blob and comment, with its verifier built once.

    Build one with :func:`parse_public_key` (an ``authorized_keys``-style line) or
    :func:`public_key_from_blob`. Two keys are equal when their wire blobs are equal; the comment is
    informative and takes no part in identity.

    Equality is of the exact key (type included), which is what a signature must embed. Whether
    two keys are *the same key*, as PROTOCOL.md "Key identity" means it, is :attr:`identity`:
    an Ed25519 key as ``ssh-ed25519`` and as ``sk-ssh-ed25519@openssh.com``, or a P-256 key as
    ``ecdsa-sha2-nistp256`` and as ``sk-ecdsa-sha2-nistp256@openssh.com``, are two keys but one
    identity, since whoever holds the private key can sign in either form. An RSA key's identity
    is its modulus (PROTOCOL.md "RSA key identity"): the same modulus with another public exponent
    is the same private key.
    """

    __slots__ = (
        "_application",
        "_bits",
        "_blob",
        "_comment",
        "_crypto",
        "_fingerprint",
        "_identity",
        "_type",
        "_verify",
    )

    def __init__(
        self,
        *,
        key_type: str,
        blob: bytes,
        comment: str,
        bits: int,
        crypto_key: CryptographyPublicKey,
        verifier: Verifier,
        application: str | None = None,
    ) -> None:
        self._type = key_type
        self._blob = bytes(blob)
        self._comment = comment
        self._bits = bits
        self._crypto = crypto_key
        self._verify = verifier
        self._application = application
        self._fingerprint = _blob_fingerprint(self._blob)
        # The key material alone, in one encoding for every type: the DER SubjectPublicKeyInfo
        # names the algorithm (and curve) and holds the public key, and knows nothing of the SSH
        # type name or of a security key's application string.
        identity_key: CryptographyPublicKey = crypto_key
        if isinstance(crypto_key, rsa.RSAPublicKey):
            # An RSA key is its modulus: whoever factored n signs under any public exponent, so
            # (n, 65537) and (n, 3) are one private key. The exponent is set to 65537 here, so
            # that the identity of the usual key is its own DER, and every exponent gives it.
            modulus = crypto_key.public_numbers().n
            identity_key = rsa.RSAPublicNumbers(_RSA_IDENTITY_EXPONENT, modulus).public_key()
        self._identity = identity_key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)

    @property
    def identity(self) -> bytes:
        """The key material, the same for every SSH form of one key (PROTOCOL.md "Key identity").

        Compare identities, never blobs or fingerprints, to decide whether two configured keys
        are one key: ``ssh-ed25519 X`` and ``sk-ssh-ed25519@openssh.com X ssh:`` have different
        blobs and fingerprints but one private key, and so have two RSA keys with one modulus
        and two exponents.
        """
        return self._identity

    @property
    def key_type(self) -> str:
        """The SSH key type name, e.g. ``ssh-ed25519``."""
        return self._type

    @property
    def blob(self) -> bytes:
        """The exact wire encoding of the key (what the base64 of a ``.pub`` line decodes to)."""
        return self._blob

    @property
    def comment(self) -> str:
        """The comment of the ``.pub`` line, empty when there was none."""
        return self._comment

    @property
    def bits(self) -> int:
        """The key size in bits (RSA modulus, curve size, 256 for Ed25519)."""
        return self._bits

    @property
    def application(self) -> str | None:
        """The FIDO application of a security key (usually ``ssh:``), None for other keys."""
        return self._application

    @property
    def fingerprint(self) -> str:
        """``SHA256:<base64 without padding>``, as ``ssh-keygen -lf`` prints it."""
        return self._fingerprint

    @property
    def cryptography_key(self) -> CryptographyPublicKey:
        """The loaded ``cryptography`` public key (for security keys: the underlying key)."""
        return self._crypto

    @property
    def is_security_key(self) -> bool:
        """Whether this is a FIDO security-key type (``sk-...@openssh.com``)."""
        return self._application is not None

    def to_line(self, comment: str | None = None) -> str:
        """The ``TYPE BASE64 [COMMENT]`` line of a ``.pub`` file (without a newline)."""
        comment = self._comment if comment is None else comment
        line = f"{self._type} {b64encode(self._blob).decode('ascii')}"
        return f"{line} {comment}" if comment else line

    def verify_ssh_signature(self, signature: bytes, data: bytes) -> None:
        """Verify one SSH signature field (``string algorithm, string signature, ...``) over ``data``.

        This is the raw SSH signature of RFC 4253, not an SSHSIG: :func:`sshsig_verify` calls it
        with the SSHSIG signed data.

        Args:
            signature: The signature field, as an SSH agent returns it.
            data: The exact bytes that were signed.

        Raises:
            SignatureError: The field is malformed, uses an algorithm refused for this key type
                (``ssh-rsa`` SHA-1 among them), lacks a security key's user-presence flag, or does
                not verify.
        """
        self._verify(bytes(signature), data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SSHPublicKey):
            return NotImplemented
        return self._blob == other._blob

    def __hash__(self) -> int:
        return hash(self._blob)

    def __repr__(self) -> str:
        comment = f", comment={self._comment!r}" if self._comment else ""
        return f"SSHPublicKey({self._type!r}, {self._fingerprint!r}{comment})"

    def __str__(self) -> str:
        return self.to_line()


class KeyHolder:
    """The public face a signer shows (:class:`SSHPrivateKey`, :class:`AgentSigner`): its key and type."""

    __slots__ = ("_public",)

    _public: SSHPublicKey

    @property
    def public_key(self) -> SSHPublicKey:
        """The public half of the key that signs."""
        return self._public

    @property
    def key_type(self) -> str:
        """The SSH key type name, e.g. ``ssh-ed25519``."""
        return self._public.key_type


@runtime_checkable
class Signer(Protocol):
    """Anything that signs with an SSH key: a loaded private key or an ssh-agent."""

    @property
    def public_key(self) -> SSHPublicKey:
        """The public half of the signing key."""
        ...

    def sign(self, data: bytes) -> bytes:
        """Sign ``data`` and return the SSH signature field (``string algorithm, string signature``)."""
        ...


# --- verification closures, one per key type -------------------------------------------------------


def _bad_signature(fp: str) -> SignatureError:
    return SignatureError(f"bad signature: it does not verify over the signed data with key {fp}.")


def _read_algorithm(reader: WireReader, expected: str) -> None:
    algorithm = reader.text("signature algorithm")
    if algorithm != expected:
        raise SignatureError(
            f"the signature algorithm is '{_shown(algorithm)}' but a {expected} key signs with '{expected}'."
        )


def _ecdsa_der(reader: WireReader) -> bytes:
    inner = WireReader(reader.string("ECDSA signature"), "ECDSA signature")
    r = inner.mpint("r value")
    s = inner.mpint("s value")
    inner.finish()
    return encode_dss_signature(r, s)


def _sk_message(app_hash: bytes, flags: int, counter: int, data: bytes) -> bytes:
    # PROTOCOL.u2f: SHA256(application) || flags || counter || SHA256(message); no extensions defined.
    return app_hash + bytes((flags,)) + pack_u32(counter) + hashlib.sha256(data).digest()


def _require_presence(flags: int) -> None:
    if not flags & SK_USER_PRESENCE:
        raise SignatureError(
            "the security-key signature was made without user presence (no touch), which is refused."
        )


def _ed25519_verifier(key: Ed25519PublicKey, fp: str) -> Verifier:
    def verify(signature: bytes, data: bytes) -> None:
        # The hot path: one exact layout, checked by length and prefix without a reader object.
        if len(signature) == _ED25519_SIG_LEN and signature.startswith(_ED25519_SIG_PREFIX):
            raw = signature[len(_ED25519_SIG_PREFIX) :]
        else:
            reader = WireReader(signature, "signature field")
            _read_algorithm(reader, ED25519)
            raw = reader.string("Ed25519 signature")
            reader.finish()
            if len(raw) != 64:
                raise SignatureError(f"the Ed25519 signature is {len(raw)} bytes long instead of 64.")
        try:
            key.verify(raw, data)
        except InvalidSignature:
            raise _bad_signature(fp) from None

    return verify


def _ecdsa_verifier(
    key: ec.EllipticCurvePublicKey, key_type: str, hash_type: type[hashes.HashAlgorithm], fp: str
) -> Verifier:
    algorithm = ec.ECDSA(hash_type())

    def verify(signature: bytes, data: bytes) -> None:
        reader = WireReader(signature, "signature field")
        _read_algorithm(reader, key_type)
        der = _ecdsa_der(reader)
        reader.finish()
        try:
            key.verify(der, data, algorithm)
        except InvalidSignature:
            raise _bad_signature(fp) from None

    return verify


def _rsa_verifier(key: rsa.RSAPublicKey, fp: str) -> Verifier:
    modulus_bytes = (key.key_size + 7) // 8

    def verify(signature: bytes, data: bytes) -> None:
        reader = WireReader(signature, "signature field")
        algorithm = reader.text("signature algorithm")
        hash_type = RSA_SIGNATURE_ALGORITHMS.get(algorithm)
        if hash_type is None:
            if algorithm == RSA:
                raise SignatureError(
                    "RSA signatures with SHA-1 ('ssh-rsa') are refused; "
                    "sign with rsa-sha2-512 or rsa-sha2-256."
                )
            raise SignatureError(
                f"the signature algorithm is '{_shown(algorithm)}' but an RSA key signs with "
                "'rsa-sha2-512' or 'rsa-sha2-256'."
            )
        raw = reader.string("RSA signature")
        reader.finish()
        if len(raw) > modulus_bytes:
            raise SignatureError("the RSA signature is longer than the key's modulus.")
        # OpenSSH accepts (and some signers write) signatures without their leading zero bytes.
        raw = raw.rjust(modulus_bytes, b"\x00")
        try:
            key.verify(raw, data, padding.PKCS1v15(), hash_type())
        except InvalidSignature:
            raise _bad_signature(fp) from None

    return verify


def _sk_ed25519_verifier(key: Ed25519PublicKey, app_hash: bytes, fp: str) -> Verifier:
    def verify(signature: bytes, data: bytes) -> None:
        reader = WireReader(signature, "signature field")
        _read_algorithm(reader, ED25519_SK)
        raw = reader.string("Ed25519 signature")
        flags = reader.u8("security-key flags")
        counter = reader.u32("security-key counter")
        reader.finish()
        if len(raw) != 64:
            raise SignatureError(f"the Ed25519 signature is {len(raw)} bytes long instead of 64.")
        try:
            key.verify(raw, _sk_message(app_hash, flags, counter, data))
        except InvalidSignature:
            raise _bad_signature(fp) from None
        _require_presence(flags)

    return verify


def _sk_ecdsa_verifier(key: ec.EllipticCurvePublicKey, app_hash: bytes, fp: str) -> Verifier:
    algorithm = ec.ECDSA(hashes.SHA256())

    def verify(signature: bytes, data: bytes) -> None:
        reader = WireReader(signature, "signature field")
        name = reader.text("signature algorithm")
        if name != ECDSA_SK:
            if name == "webauthn-" + ECDSA_SK:
                raise SignatureError("WebAuthn security-key signatures are not supported.")
            raise SignatureError(
                f"the signature algorithm is '{_shown(name)}' but a {ECDSA_SK} key signs with '{ECDSA_SK}'."
            )
        der = _ecdsa_der(reader)
        flags = reader.u8("security-key flags")
        counter = reader.u32("security-key counter")
        reader.finish()
        try:
            key.verify(der, _sk_message(app_hash, flags, counter, data), algorithm)
        except InvalidSignature:
            raise _bad_signature(fp) from None
        _require_presence(flags)

    return verify


# --- parsing ----------------------------------------------------------------------------------------


def _ed25519_key(raw: bytes) -> Ed25519PublicKey:
    if len(raw) != 32:
        raise SignatureError(f"the Ed25519 public key is {len(raw)} bytes long instead of 32.")
    return Ed25519PublicKey.from_public_bytes(raw)


def _ec_point(key_type: str, reader: WireReader) -> ec.EllipticCurvePublicKey:
    curve_name, curve, _, coordinate = _ECDSA_CURVES[key_type]
    got = reader.string("curve name")
    if got != curve_name:
        raise SignatureError(
            f"the {key_type} key names curve '{_shown(got)}' instead of '{curve_name.decode()}'."
        )
    point = reader.string("curve point")
    if len(point) != 1 + 2 * coordinate or point[0] != 4:
        raise SignatureError(
            f"the {key_type} key's curve point is not an uncompressed {curve_name.decode()} point."
        )
    try:
        return ec.EllipticCurvePublicKey.from_encoded_point(curve, point)
    except ValueError:
        raise SignatureError(f"the {key_type} key's curve point is not on the curve.") from None


def public_key_from_blob(blob: bytes, comment: str = "") -> SSHPublicKey:
    """Parse the wire encoding of an SSH public key.

    Args:
        blob: The key blob (the base64-decoded middle field of a ``.pub`` line).
        comment: A comment to keep with the key.

    Returns:
        The parsed key, its cryptography key and verifier built.

    Raises:
        SignatureError: The blob is truncated, has trailing bytes, holds an invalid key, is of a
            refused or unknown type (DSA, certificates), or is an RSA key outside 2048-16384 bits.
    """
    blob = bytes(blob)
    fp = _blob_fingerprint(blob)
    reader = WireReader(blob, "public key")
    key_type = reader.text("key type")
    crypto: CryptographyPublicKey
    application: str | None = None
    verifier: Verifier
    if key_type == ED25519:
        crypto = _ed25519_key(reader.string("Ed25519 key"))
        reader.finish()
        bits = 256
        verifier = _ed25519_verifier(crypto, fp)
    elif key_type in _ECDSA_CURVES:
        crypto = _ec_point(key_type, reader)
        reader.finish()
        bits = crypto.curve.key_size
        verifier = _ecdsa_verifier(crypto, key_type, _ECDSA_CURVES[key_type][2], fp)
    elif key_type == RSA:
        e = reader.mpint("RSA exponent")
        n = reader.mpint("RSA modulus")
        reader.finish()
        bits = n.bit_length()
        if bits < MIN_RSA_BITS:
            raise SignatureError(
                f"RSA keys of {bits} bits are refused: at least {MIN_RSA_BITS} bits are required."
            )
        if bits > MAX_RSA_BITS:
            raise SignatureError(
                f"RSA keys of {bits} bits are refused: at most {MAX_RSA_BITS} bits are allowed."
            )
        try:
            crypto = rsa.RSAPublicNumbers(e, n).public_key()
        except ValueError:
            raise SignatureError("the RSA public key is not valid (bad exponent or modulus).") from None
        verifier = _rsa_verifier(crypto, fp)
    elif key_type == ED25519_SK:
        crypto = _ed25519_key(reader.string("Ed25519 key"))
        application = reader.text("security-key application")
        reader.finish()
        bits = 256
        verifier = _sk_ed25519_verifier(crypto, hashlib.sha256(application.encode()).digest(), fp)
    elif key_type == ECDSA_SK:
        crypto = _ec_point(ECDSA_NISTP256, reader)
        application = reader.text("security-key application")
        reader.finish()
        bits = 256
        verifier = _sk_ecdsa_verifier(crypto, hashlib.sha256(application.encode()).digest(), fp)
    elif key_type.endswith("-cert-v01@openssh.com"):
        raise SignatureError("SSH certificates are not accepted; use the plain public key.")
    elif key_type == "ssh-dss":
        raise SignatureError("DSA keys (ssh-dss) are refused; use an ed25519 key.")
    else:
        raise SignatureError(f"unsupported SSH key type '{_shown(key_type)}'.")
    return SSHPublicKey(
        key_type=key_type,
        blob=blob,
        comment=comment,
        bits=bits,
        crypto_key=crypto,
        verifier=verifier,
        application=application,
    )


def parse_public_key(line: str) -> SSHPublicKey:
    """Parse one public key line: ``TYPE BASE64 [COMMENT]`` (a ``.pub`` file or ``authorized_keys`` line).

    The bare ``TYPE BASE64`` form is accepted. Leading ``authorized_keys`` options are refused,
    because some of them (``no-touch-required``) would change what a signature proves. Parsed keys
    are cached by line, so calling this on every verification costs a dictionary look-up.

    Args:
        line: The key line; surrounding white space is ignored.

    Returns:
        The parsed key, comment included.

    Raises:
        SignatureError: The line is empty or too long, has options or no key data, its base64 is
            invalid, the type it names differs from the key inside, or the key itself is refused
            (see :func:`public_key_from_blob`).
    """
    if not isinstance(line, str):
        raise SignatureError(f"an SSH public key line must be text, not {type(line).__name__}.")
    return _parse_line(line.strip())


@functools.lru_cache(maxsize=1024)
def _parse_line(line: str) -> SSHPublicKey:
    if not line:
        raise SignatureError("the SSH public key line is empty.")
    if len(line) > MAX_KEY_LINE_CHARS:
        raise SignatureError(f"the SSH public key line is longer than {MAX_KEY_LINE_CHARS} characters.")
    parts = line.split(None, 2)
    if parts[0] not in SUPPORTED_KEY_TYPES and any(p in SUPPORTED_KEY_TYPES for p in line.split()[1:]):
        raise SignatureError("options before the key type (authorized_keys options) are not supported.")
    if len(parts) < 2:
        raise SignatureError(
            f"the SSH public key line has no key data after '{_shown(parts[0])}' (expected 'TYPE BASE64')."
        )
    try:
        blob = binascii.a2b_base64(parts[1], strict_mode=True)
    except (binascii.Error, ValueError):
        raise SignatureError("the SSH public key's base64 data is not valid.") from None
    comment = parts[2].strip() if len(parts) == 3 else ""
    key = public_key_from_blob(blob, comment)
    if key.key_type != parts[0]:
        raise SignatureError(
            f"the key line says '{_shown(parts[0])}' but its data holds a '{key.key_type}' key."
        )
    return key


def fingerprint(key: SSHPublicKey | Signer | str) -> str:
    """The ``SHA256:<base64 without padding>`` fingerprint that ``ssh-keygen -lf`` prints.

    Args:
        key: A public key, anything with a ``public_key`` (a loaded private key, an agent signer),
            or a public key line.

    Returns:
        The fingerprint, e.g. ``SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s``.

    Raises:
        SignatureError: ``key`` is a line that does not parse.
    """
    if isinstance(key, str):
        key = parse_public_key(key)
    if isinstance(key, SSHPublicKey):
        return key.fingerprint
    return key.public_key.fingerprint
